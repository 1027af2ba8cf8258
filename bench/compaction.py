"""python -m bench.compaction [--quick] [--systems kafka,eos] [--out DIR]: log compaction, eos beside Kafka.

Theory of operation
-------------------
One run measures Apache Kafka (one KRaft node, `bench.kafka`: the same jars as `python -m
bench`) and then eos (one `python -m broker` process), one after the other, never at once.
Each broker is started, stopped cleanly (SIGTERM) and started again on the same data
directory, so that its own start-up and its own log cleaner are what is timed. Both run with
the same settings (Kafka's names): the cleaner is switched with log.cleaner.enable, wakes
every log.cleaner.backoff.ms = 1000 when idle, and keeps its default dedupe buffer (128 MiB).

1. Cleaner throughput. A compacted topic, one partition (cleanup.policy=compact,
   segment.bytes 1 MiB, min.cleanable.dirty.ratio 0.01, delete.retention.ms default,
   segment.ms 1000 so that a record sent a second after the fill rolls the active segment),
   is filled with N records (1,000,000; 200,000 with --quick): 100-byte values over 10,000
   keys, with each system's own producer (eos.Producer.send_batch; confluent-kafka's
   per-record produce(): librdkafka has no bulk call), acks=1, linger 5 ms, so both logs
   are batches of about 1 MB in 1 MiB segments. The broker runs with
   log.cleaner.enable=false while it is filled, so the cleaner cannot start on a half-filled
   log. After the fill and the rolling record, the broker is stopped and started with the
   cleaner on; its first pass then covers the whole log. The figure is what the broker's own
   cleaner reports for that log, MB of log read by the cleaning pass / the pass's seconds
   (index building included), in MB = 10^6 bytes:
   - eos logs "compacted-0: cleaned 120.3 MB in 5.61 s (21.4 MB/s): 10000 of 1000001
     records kept, ..." (broker.storage.cleaner, LogCleaner.clean_once, INFO);
   - Kafka's cleaner thread logs "Log cleaner thread 0 cleaned log compacted-0 (dirty
     section = [0, N]) / X MB of log processed in S seconds (Y MB/sec)" (its MB are MiB:
     converted) at INFO on the logger org.apache.kafka.storage.internals.log.LogCleaner$
     CleanerThread, which this harness switches on in slf4j-simple (stderr, which
     KafkaBroker writes to server.log).
   A pass that keeps anything but the 10,000 last records, or reads fewer records than were
   written, makes the row WRONG; so does a complaint from Apache Kafka's own
   DumpLogSegments (--deep-iteration), run over every file of the partition eos cleaned.
   Kafka's cleaner runs seconds after its JVM started, with a cold JIT; that is what a
   restarted Kafka broker does too. Beside both: eos's Cleaner in
   this process (`broker.storage.cleaner.Cleaner.clean` on a `broker.storage.Log` filled
   with `Log.append_as_leader` of ~1 MB batches, N records, rolled), the cleaner without the
   broker around it (eos only), and the raw disk write speed (`bench/disk.py`).

2. Broker start with M offset commits (1,000,000; 200,000 with --quick) of one consumer
   group: a fresh broker (offsets.topic.segment.bytes 1 MiB, so the cleaner has sealed
   segments to work on; log.cleaner.enable=false) and a topic of 100 partitions; each
   OffsetCommit request commits all 100 partitions' offsets (one record each in
   __consumer_offsets), M / 100 requests one after the other, synchronous, through each
   system's consumer API (eos.Consumer.commit; confluent-kafka Consumer.commit). The
   offset committed for partition p in round r is (r + 1) * 1000 + p. Then:
   - before compaction: stop, start again with the cleaner off, and time from launching the
     process until an OffsetFetch of the group (the system's own consumer, `committed()`,
     asked as soon as the port accepts) answers; the offsets must be the last ones
     committed, else the row says WRONG;
   - compaction: stop, start with the cleaner on, wait until the cleaner has cleaned the
     group's __consumer_offsets partition (its log line) and the topic's .log bytes shrank;
   - after compaction: stop, start again (cleaner on) and time the same way.
   Beside the times: the __consumer_offsets bytes before and after cleaning and how many
   records each start replayed (eos: "group coordinator loaded N record(s)"; Kafka: its
   coordinator runtime's "Loaded N records", logger
   org.apache.kafka.coordinator.common.runtime, also switched to INFO), and the commit rate
   (offset records/s, a side figure).

Each figure is one run (a fill of a million records is the cost; the in-process cleaner
runs 3 times, once with --quick): on this shared 2-core machine read a ratio under ~1.5x as
noise. Results: `bench/results/compaction-<UTC date>-<host>.{json,md}` and
`compaction-latest.*` for a full run of both systems, `bench/results/tmp/` otherwise; a
table is printed (ratio > 1 = eos better).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from bench.kafka import KafkaBroker, free_port, port_accepts, stop_process, wait_until
from bench.host_speed import python_probe_ms
from bench.report import python_probe_sentence, write_run

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"

KEYS = 10_000
VALUE_BYTES = 100
SEGMENT_BYTES = 1 << 20
ROLL_MS = 1000                 # segment.ms of the cleaned topic
BACKOFF_MS = 1000              # log.cleaner.backoff.ms
COMMIT_PARTITIONS = 100        # offsets per OffsetCommit request
OFFSETS_SEGMENT_BYTES = 1 << 20
BATCH_BYTES = 1_000_000        # the in-process log's batches (librdkafka's default batch.size)
STOP_TIMEOUT_S = 90.0          # a clean stop: never SIGKILL a broker we restart
WAIT_S = 600.0
CLEANED_TOPIC = "compacted"
COMMIT_TOPIC = "committed"
GROUP = "bench-compaction-group"
OFFSETS_TOPIC = "__consumer_offsets"
KAFKA_MIB = 1024 * 1024 / 1e6  # Kafka's cleaner prints MiB

CLEANER_OFF = {"log.cleaner.enable": "false"}
CLEANER_ON = {"log.cleaner.enable": "true", "log.cleaner.backoff.ms": str(BACKOFF_MS)}
BROKER_BASE = {"offsets.topic.segment.bytes": str(OFFSETS_SEGMENT_BYTES)}
TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES),
                "min.cleanable.dirty.ratio": "0.01", "segment.ms": str(ROLL_MS)}


class Wrong(Exception):
    """The system answered, but not what was written (offsets, records kept)."""


def _wait(condition, what: str, timeout_s: float = WAIT_S, interval_s: float = 0.05):
    return wait_until(condition, what, timeout_s, interval_s)


def key_of(i: int) -> bytes:
    return b"key-%05d" % (i % KEYS)


def value_of(i: int) -> bytes:
    return (b"%010d" % i).ljust(VALUE_BYTES, b"v")


def committed_offset(round_: int, partition: int) -> int:
    return (round_ + 1) * 1000 + partition


def log_bytes(directory: Path) -> int:
    """.log bytes of one partition directory (not .cleaned/.swap/.deleted files)."""
    try:
        return sum(p.stat().st_size for p in directory.iterdir() if p.name.endswith(".log"))
    except FileNotFoundError:
        return 0


def segment_count(directory: Path) -> int:
    try:
        return sum(1 for p in directory.iterdir() if p.name.endswith(".log"))
    except FileNotFoundError:
        return 0


def topic_log_bytes(data_dir: Path, topic: str) -> int:
    return sum(log_bytes(d) for d in data_dir.glob(f"{topic}-*") if d.is_dir()
               and d.name[len(topic) + 1:].isdigit())


# ---- log parsing ----------------------------------------------------------------------------------

EOS_CLEANED = re.compile(
    r"(?P<log>\S+): cleaned (?P<mb>[\d.]+) MB in (?P<s>[\d.]+) s \((?P<mb_s>[\d.]+) MB/s\): "
    r"(?P<kept>\d+) of (?P<read>\d+) records kept")
EOS_LOADED = re.compile(r"group coordinator loaded (?P<records>\d+) record\(s\) of __consumer_offsets"
                        r".*? in (?P<ms>\d+) ms")
KAFKA_CLEANED = re.compile(
    r"Log cleaner thread \d+ cleaned log (?P<log>\S+) \(dirty section = \[(?P<first>-?\d+), (?P<end>-?\d+)\]\)\s*"
    r"(?P<mb>[\d,.]+) MB of log processed in (?P<s>[\d,.]+) seconds \((?P<mb_s>[\d,.]+) MB/sec\)"
    r"(?:.*?Start size: (?P<start_mb>[\d,.]+) MB \((?P<read>[\d,]+) messages\)"
    r"\s*End size: (?P<end_mb>[\d,.]+) MB \((?P<kept>[\d,]+) messages\))?", re.S)
KAFKA_LOADED = re.compile(r"Finished loading of metadata from (?P<tp>\S+) with epoch \d+ in (?P<ms>\d+)ms.*?"
                          r"Loaded (?P<records>\d+) records which total to (?P<bytes>\d+) bytes")


def _num(text: str | None) -> float:
    return float(text.replace(",", "")) if text else 0.0


def eos_cleaner_passes(text: str) -> list[dict]:
    return [{"log": m["log"], "mb": float(m["mb"]), "seconds": float(m["s"]), "mb_s": float(m["mb_s"]),
             "records_read": int(m["read"]), "records_kept": int(m["kept"])} for m in EOS_CLEANED.finditer(text)]


def kafka_cleaner_passes(text: str) -> list[dict]:
    """Kafka's passes in MB = 10^6 bytes (it prints MiB, to 0.1)."""
    passes = []
    for m in KAFKA_CLEANED.finditer(text):
        passes.append({"log": m["log"], "mb": _num(m["mb"]) * KAFKA_MIB, "seconds": _num(m["s"]),
                       "mb_s": _num(m["mb_s"]) * KAFKA_MIB, "dirty_section": [int(m["first"]), int(m["end"])],
                       "records_read": int(_num(m["read"])) if m["read"] else None,
                       "records_kept": int(_num(m["kept"])) if m["kept"] else None,
                       "mb_after": _num(m["end_mb"]) * KAFKA_MIB if m["end_mb"] else None})
    return passes


def eos_loaded_records(text: str) -> int | None:
    found = [int(m["records"]) for m in EOS_LOADED.finditer(text)]
    return found[-1] if found else None


def kafka_loaded_records(text: str) -> int | None:
    found = [int(m["records"]) for m in KAFKA_LOADED.finditer(text) if m["tp"].startswith(OFFSETS_TOPIC)]
    return sum(found) if found else None


# ---- the two brokers, restartable on one data directory --------------------------------------------

class KafkaNode(KafkaBroker):
    """bench.kafka.KafkaBroker with extra server properties, the cleaner's and the group
    coordinator's INFO lines switched on, and a stop/start that keeps the data directory."""

    LOGGERS = ("org.apache.kafka.storage.internals.log.LogCleaner$CleanerThread",
               "org.apache.kafka.coordinator.common.runtime")

    def __init__(self, dist, config: dict, base_dir: str):
        super().__init__(dist, base_dir=base_dir)
        self.config = dict(config)

    def _properties(self) -> str:
        return super()._properties() + "".join(f"{k}={v}\n" for k, v in self.config.items())

    def _java(self, main: str, *args: str, heap: str = "-Xmx256m") -> list[str]:
        command = super()._java(main, *args, heap=heap)
        levels = [f"-Dorg.slf4j.simpleLogger.log.{name}=info" for name in self.LOGGERS]
        return command[:2] + levels + command[2:]

    def halt(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, STOP_TIMEOUT_S)
            self.proc = None

    def launch(self, config: dict) -> float:
        """Start the server again on the same directory and ports; returns the monotonic
        time just before the process was launched (not waiting for readiness)."""
        self.halt()
        self.config = dict(config)
        properties = self.tmp / "server.properties"
        properties.write_text(self._properties())
        with open(self.server_log, "ab") as log:
            started = time.monotonic()
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(properties), heap=self.heap),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.tmp, start_new_session=True)
        return started

    def wait_ready(self) -> None:
        self._wait_ready()


class EosNode:
    """`python -m broker` on a data directory that outlives its restarts (bench/eos_server.py's
    EosBroker, which makes a fresh directory at each start, with stop/start kept apart)."""

    READY_LINE = b"eos broker listening on"

    def __init__(self, base_dir: str):
        self.tmp = Path(tempfile.mkdtemp(prefix="eos-bench-compaction-", dir=base_dir))
        self.data_dir = self.tmp / "data"
        self.server_log = self.tmp / "server.log"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def launch(self, config: dict) -> float:
        self.halt()
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env.pop("EOS_LOG_LEVEL", None)           # INFO: the cleaner's and the coordinator's lines
        args = [sys.executable, "-m", "broker", "--data-dir", str(self.data_dir), "--port", str(self.port)]
        for name, value in config.items():
            args += ["--config", f"{name}={value}"]
        self._ready = threading.Event()
        started = time.monotonic()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=REPO_ROOT, env=env, start_new_session=True)
        self._reader = threading.Thread(target=self._pump, args=(self.proc, self._ready), daemon=True,
                                        name="eos-broker-log")
        self._reader.start()
        return started

    def _pump(self, proc: subprocess.Popen, ready: threading.Event) -> None:
        with open(self.server_log, "ab") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if self.READY_LINE in line:
                    ready.set()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            if self._reader is not None:
                self._reader.join(2)
            tail = "\n".join(self.server_log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"the eos broker exited with code {self.proc.returncode}:\n{tail}")

    def wait_ready(self) -> None:
        _wait(lambda: (self.check_alive(), self._ready.is_set())[1], "the eos broker's ready line", 300)

    def halt(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, STOP_TIMEOUT_S)
            if self._reader is not None:
                self._reader.join(10)
            self.proc.stdout.close()
            self.proc = None

    def stop(self) -> None:
        try:
            self.halt()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


class Side:
    """What the figures need from a system; `node` is a KafkaNode or an EosNode."""

    name = ""

    def __init__(self, tmp_dir: str):
        self.tmp_dir = tmp_dir
        self.node = None

    # -- the process --
    def fresh(self, config: dict) -> None:
        raise NotImplementedError

    def launch(self, config: dict) -> float:
        return self.node.launch(config)

    def wait_ready(self) -> None:
        self.node.wait_ready()

    def halt(self) -> None:
        self.node.halt()

    def close(self) -> None:
        if self.node is not None:
            self.node.stop()
            self.node = None

    def log_mark(self) -> int:
        try:
            return self.node.server_log.stat().st_size
        except FileNotFoundError:
            return 0

    def log_since(self, mark: int) -> str:
        with open(self.node.server_log, "rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")

    @property
    def bootstrap(self) -> str:
        return self.node.bootstrap

    def wait_port(self, deadline_s: float = WAIT_S) -> None:
        _wait(lambda: (self.node.check_alive(), port_accepts("127.0.0.1", self.node.port, 0.2))[1],
              "the broker's port", deadline_s, interval_s=0.01)


class EosSide(Side):
    name = "eos"

    def fresh(self, config: dict) -> None:
        self.close()
        self.node = EosNode(self.tmp_dir)
        self.node.launch(config)
        self.node.wait_ready()

    @property
    def data_dir(self) -> Path:
        return self.node.data_dir

    def passes(self, text: str) -> list[dict]:
        return eos_cleaner_passes(text)

    def loaded_records(self, text: str) -> int | None:
        return eos_loaded_records(text)

    def create_topic(self, name: str, partitions: int, config: dict) -> None:
        import eos
        with eos.Admin(bootstrap=self.bootstrap) as admin:
            admin.create_topic(name, partitions=partitions, config=config)

    def fill(self, topic: str, count: int) -> float:
        import eos
        producer = eos.Producer(bootstrap=self.bootstrap, acks="1", linger_ms=5)
        chunk = 10_000
        futures = []
        try:
            started = time.perf_counter()
            for start in range(0, count, chunk):
                n = min(chunk, count - start)
                futures.append(producer.send_batch(topic, [value_of(i) for i in range(start, start + n)],
                                                   [key_of(i) for i in range(start, start + n)], partition=0))
            producer.flush(600)
            elapsed = time.perf_counter() - started
            for future in futures:
                future.result(60)
        finally:
            producer.close()
        return elapsed

    def produce_one(self, topic: str, key: bytes, value: bytes) -> None:
        import eos
        producer = eos.Producer(bootstrap=self.bootstrap, acks="1")
        try:
            producer.send(topic, value=value, key=key, partition=0).result(60)
        finally:
            producer.close()

    def end_offset(self, topic: str) -> int:
        from bench.workloads.clients import eos_end_offset
        return eos_end_offset(self.bootstrap, topic)

    def commit(self, group: str, topic: str, rounds: range) -> None:
        import eos
        consumer = eos.Consumer(bootstrap=self.bootstrap, group_id=group)
        try:
            tps = [eos.TopicPartition(topic, p) for p in range(COMMIT_PARTITIONS)]
            for r in rounds:
                consumer.commit({tp: committed_offset(r, tp.partition) for tp in tps}, timeout_ms=60_000)
        finally:
            consumer.close()

    def committed(self, group: str, topic: str, timeout_s: float) -> dict[int, int | None]:
        import eos
        consumer = eos.Consumer(bootstrap=self.bootstrap, group_id=group,
                                config={"retry.backoff.ms": 10, "retry.backoff.max.ms": 50})
        try:
            answer = consumer.committed([eos.TopicPartition(topic, p) for p in range(COMMIT_PARTITIONS)],
                                        timeout_ms=int(timeout_s * 1000))
        finally:
            consumer.close()
        return {tp.partition: offset for tp, offset in answer.items()}


class KafkaSide(Side):
    name = "kafka"

    def __init__(self, tmp_dir: str):
        super().__init__(tmp_dir)
        from bench.kafka import resolve_kafka
        self.dist = resolve_kafka(os.environ.get("EOS_BENCH_KAFKA_VERSION", "latest"))

    def fresh(self, config: dict) -> None:
        self.close()
        self.node = KafkaNode(self.dist, config, self.tmp_dir)
        self.node.start()

    @property
    def data_dir(self) -> Path:
        return self.node.log_dir

    def passes(self, text: str) -> list[dict]:
        return kafka_cleaner_passes(text)

    def loaded_records(self, text: str) -> int | None:
        return kafka_loaded_records(text)

    def create_topic(self, name: str, partitions: int, config: dict) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                                config=config)], operation_timeout=60)
        futures[name].result(timeout=120)
        _wait(lambda: (lambda t: t is not None and t.error is None and len(t.partitions) == partitions
                       and all(p.leader >= 0 for p in t.partitions.values()))(
            admin.list_topics(topic=name, timeout=10).topics.get(name)), f"{name} with leaders", 60)

    def fill(self, topic: str, count: int) -> float:
        from confluent_kafka import Producer
        errors = []
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "1", "linger.ms": 5,
                             "enable.idempotence": False, "queue.buffering.max.messages": 1_000_000,
                             "delivery.report.only.error": True, "log_level": 0})
        produce = producer.produce
        on_delivery = lambda err, msg: errors.append(err) if err is not None else None   # noqa: E731
        started = time.perf_counter()
        for i in range(count):
            while True:
                try:
                    produce(topic, value=value_of(i), key=key_of(i), partition=0, on_delivery=on_delivery)
                    break
                except BufferError:
                    producer.poll(0.01)
            if i % 10_000 == 0:
                producer.poll(0)
        left = producer.flush(600)
        elapsed = time.perf_counter() - started
        if left or errors:
            raise RuntimeError(f"the Kafka producer left {left} records undelivered, errors: {errors[:3]}")
        return elapsed

    def produce_one(self, topic: str, key: bytes, value: bytes) -> None:
        from confluent_kafka import Producer
        errors = []
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "1", "log_level": 0})
        producer.produce(topic, value=value, key=key, partition=0,
                         on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
        if producer.flush(60) or errors:
            raise RuntimeError(f"the rolling record was not delivered: {errors}")

    def end_offset(self, topic: str) -> int:
        from bench.workloads.clients import kafka_end_offset
        return kafka_end_offset(self.bootstrap, topic)

    def commit(self, group: str, topic: str, rounds: range) -> None:
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group,
                             "enable.auto.commit": False, "log_level": 0})
        try:
            for r in rounds:
                consumer.commit(offsets=[TopicPartition(topic, p, committed_offset(r, p))
                                         for p in range(COMMIT_PARTITIONS)], asynchronous=False)
        finally:
            consumer.close()

    def committed(self, group: str, topic: str, timeout_s: float) -> dict[int, int | None]:
        from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group,
                             "enable.auto.commit": False, "log_level": 0,
                             "retry.backoff.ms": 10, "retry.backoff.max.ms": 50,
                             "reconnect.backoff.ms": 10, "reconnect.backoff.max.ms": 50})
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                # librdkafka gives up on NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS, which a
                # restarted Kafka answers until its coordinator has loaded: ask again (the
                # Java client retries these itself, as eos's consumer does)
                try:
                    answer = consumer.committed([TopicPartition(topic, p) for p in range(COMMIT_PARTITIONS)],
                                                timeout=max(0.1, deadline - time.monotonic()))
                    break
                except KafkaException as exc:
                    error = exc.args[0]
                    if time.monotonic() > deadline or not (error.retriable() or error.code() in (
                            KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                            KafkaError.COORDINATOR_NOT_AVAILABLE)):
                        raise
                    time.sleep(0.01)
        finally:
            consumer.close()
        result = {}
        for tp in answer:
            if tp.error is not None:
                raise RuntimeError(f"OffsetFetch for {tp.topic}-{tp.partition}: {tp.error}")
            result[tp.partition] = tp.offset if tp.offset >= 0 else None
        return result


# ---- figures ---------------------------------------------------------------------------------------

def cleaner_on_broker(side: Side, records: int, progress) -> dict:
    """Fill with the cleaner off, roll, restart with the cleaner on; the broker's own figure."""
    topic = CLEANED_TOPIC
    side.fresh({**BROKER_BASE, **CLEANER_OFF})
    side.create_topic(topic, 1, TOPIC_CONFIG)
    fill_s = side.fill(topic, records)
    progress(f"{side.name}: filled {topic} with {records:,} records in {fill_s:.1f} s "
             f"({records / fill_s:,.0f} records/s)")
    time.sleep(ROLL_MS / 1000 + 0.5)
    side.produce_one(topic, b"roll", value_of(records))      # rolls the active segment (segment.ms)
    end = side.end_offset(topic)
    if end != records + 1:
        raise Wrong(f"{topic} ends at offset {end:,}, {records + 1:,} records were written")
    partition_dir = side.data_dir / f"{topic}-0"
    before_bytes, before_segments = log_bytes(partition_dir), segment_count(partition_dir)
    side.halt()
    mark = side.log_mark()
    side.launch({**BROKER_BASE, **CLEANER_ON})
    side.wait_ready()
    passes = _wait(lambda: [p for p in side.passes(side.log_since(mark)) if p["log"] == f"{topic}-0"],
                   f"the cleaner's pass over {topic}-0")
    time.sleep(BACKOFF_MS / 1000 * 2 + 0.5)                 # a second pass, if the first stopped short
    passes = [p for p in side.passes(side.log_since(mark)) if p["log"] == f"{topic}-0"]
    after_bytes, after_segments = log_bytes(partition_dir), segment_count(partition_dir)
    side.halt()
    dump = kafka_dump_log_segments(partition_dir) if side.name == "eos" else None
    side.close()
    mb = sum(p["mb"] for p in passes)
    seconds = sum(p["seconds"] for p in passes)
    # one pass: take the cleaner's own MB/s (its MB and seconds are printed rounded)
    mb_s = passes[0]["mb_s"] if len(passes) == 1 else (mb / seconds if seconds else 0.0)
    read = sum(p["records_read"] or 0 for p in passes)
    kept = passes[-1]["records_kept"]
    detail = {"records": records, "fill_s": round(fill_s, 2), "passes": passes,
              "log_bytes_before": before_bytes, "segments_before": before_segments,
              "log_bytes_after": after_bytes, "segments_after": after_segments,
              "mb_cleaned": round(mb, 2), "seconds": round(seconds, 3), "kafka_dump_log_segments": dump}
    progress(f"{side.name}: cleaner: {len(passes)} pass(es), {mb:,.1f} MB in {seconds:.2f} s "
             f"= {mb_s:,.1f} MB/s; {before_bytes / 1e6:,.1f} MB in {before_segments} segments -> "
             f"{after_bytes / 1e6:,.2f} MB in {after_segments}; kept {kept} of {read} records read")
    if dump is not None:
        progress(f"{side.name}: Kafka's DumpLogSegments on the cleaned segments: {dump}")
        if dump.get("status") == "wrong":
            raise Wrong(f"Kafka's DumpLogSegments does not read eos's cleaned segments: {dump['detail']}", detail)
    if passes[0]["records_read"] is not None and read < records:
        raise Wrong(f"the cleaner read {read:,} records of the {records:,} written", detail)
    if kept is not None and kept != KEYS:
        raise Wrong(f"the cleaner kept {kept:,} records, not the {KEYS:,} keys' last ones", detail)
    return {"value": mb_s, "detail": detail}


def kafka_dump_log_segments(partition_dir: Path) -> dict:
    """Apache Kafka's own DumpLogSegments (--deep-iteration) over every segment file of a
    partition eos cleaned: "ok" when it reads them all, each record and its index entries,
    with no complaint; the records it counted. "unavailable" when Kafka's jars are not."""
    from bench.kafka import KAFKA_GROUP, KafkaUnavailable, cache_dir, copy_dependencies, maven_pom, resolve_kafka
    try:
        dist = resolve_kafka(os.environ.get("EOS_BENCH_KAFKA_VERSION", "latest"))
        # Kafka 4 moved the tool to org.apache.kafka:kafka-tools, which the broker does not need
        tools = copy_dependencies(cache_dir() / f"kafka-tools-{dist.version}",
                                  maven_pom("kafka-tools-runtime", [(KAFKA_GROUP, "kafka-tools", dist.version)]),
                                  "kafka-tools-*.jar")
    except KafkaUnavailable as exc:
        return {"status": "unavailable", "detail": str(exc)}
    if tools is None:
        return {"status": "unavailable", "detail": f"Maven could not resolve kafka-tools {dist.version}"}
    files = sorted(str(p) for p in partition_dir.iterdir()
                   if p.suffix in (".log", ".index", ".timeindex", ".txnindex"))
    classpath = os.pathsep.join([str(tools / "*"), dist.classpath])
    done = subprocess.run(["java", "-Xmx512m", "-cp", classpath, "org.apache.kafka.tools.DumpLogSegments",
                           "--deep-iteration", "--files", ",".join(files)],
                          capture_output=True, text=True, timeout=600)
    out = done.stdout
    complaints = [line for line in (out + done.stderr).splitlines()
                  if re.search(r"invalid bytes|Exception|mismatch|isvalid: false|corrupt", line, re.I)]
    records = len(re.findall(r"^\| offset: ", out, re.M))
    result = {"status": "ok", "files": len(files), "records": records, "kafka": dist.version}
    if done.returncode != 0 or complaints:
        return {**result, "status": "wrong", "detail": f"exit {done.returncode}: " + " / ".join(complaints[:5])}
    return result


def cleaner_in_process(tmp_dir: str, records: int) -> dict:
    """eos's Cleaner on a broker.storage.Log in this process (no broker, no client)."""
    from broker.storage.cleaner import Cleaner, CleanerConfig, plan_cleaning
    from broker.storage.log import Log
    from eos.config import TopicConfig
    from eos.records.codec import encode_batch

    per_record = len(encode_batch([value_of(0)] * 2, [key_of(0)] * 2)) - len(encode_batch([value_of(0)], [key_of(0)]))
    per_batch = max(1, (BATCH_BYTES - 61) // per_record)
    base = tempfile.mkdtemp(prefix="eos-bench-cleaner-", dir=tmp_dir)
    try:
        config = TopicConfig.from_overrides(TOPIC_CONFIG)
        log = Log.open(os.path.join(base, f"{CLEANED_TOPIC}-0"), config, now_ms=int(time.time() * 1000))
        try:
            for start in range(0, records, per_batch):
                idx = range(start, min(records, start + per_batch))
                log.append_as_leader(encode_batch([value_of(i) for i in idx], [key_of(i) for i in idx]),
                                     int(time.time() * 1000))
            log.roll(int(time.time() * 1000))
            before = log.size_bytes
            now_ms = int(time.time() * 1000)
            plan = plan_cleaning(log, 0, now_ms)
            os.sync()     # the cleaner reads what the appends left in the page cache; no writeback backlog
            stats, _ = Cleaner(CleanerConfig()).clean(log, plan)
            after = log.size_bytes
        finally:
            log.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    detail = {"records": records, "records_per_batch": per_batch, "log_bytes_before": before,
              "log_bytes_after": after, "bytes_read": stats.bytes_read, "seconds": round(stats.seconds, 3),
              "records_read": stats.records_read, "records_kept": stats.records_kept,
              "segments_replaced": stats.segments_replaced, "segments_written": stats.segments_written}
    if stats.records_read != records or stats.records_kept != KEYS:
        raise Wrong(f"kept {stats.records_kept:,} of {stats.records_read:,} records read "
                    f"({records:,} written, {KEYS:,} keys)", detail)
    return {"value": stats.bytes_read / stats.seconds / 1e6, "detail": detail}


def timed_start(side: Side, config: dict, group: str, topic: str, expected: dict[int, int]) -> dict:
    """Launch; the seconds until an OffsetFetch of `group` answers; WRONG if not `expected`."""
    side.halt()
    mark = side.log_mark()
    started = side.launch(config)
    side.wait_port()
    answer = side.committed(group, topic, WAIT_S)
    elapsed = time.monotonic() - started
    side.wait_ready()
    time.sleep(0.5)     # the coordinator's load line may follow its first answer (Kafka)
    loaded = side.loaded_records(side.log_since(mark))
    if answer != expected:
        diff = [(p, answer.get(p), expected[p]) for p in sorted(expected) if answer.get(p) != expected[p]]
        raise Wrong(f"OffsetFetch after the restart: {len(diff)} of {len(expected)} partitions differ, "
                    f"e.g. (partition, got, committed) {diff[:3]}", {"seconds": round(elapsed, 3)})
    return {"value": elapsed, "detail": {"records_replayed": loaded}}


def offset_commits(side: Side, commits: int, progress, results: dict) -> None:
    """Part 2: commits, restart before compaction, compaction, restart after compaction."""
    rounds = max(1, commits // COMMIT_PARTITIONS)
    side.fresh({**BROKER_BASE, **CLEANER_OFF})
    side.create_topic(COMMIT_TOPIC, COMMIT_PARTITIONS, {})
    side.commit(GROUP, COMMIT_TOPIC, range(0, 1))           # finds the coordinator, creates __consumer_offsets
    started = time.perf_counter()
    side.commit(GROUP, COMMIT_TOPIC, range(1, rounds))
    elapsed = time.perf_counter() - started
    rate = (rounds - 1) * COMMIT_PARTITIONS / elapsed if rounds > 1 else 0.0
    results["commit_rps"] = {"status": "ok", "value": rate, "samples": [rate],
                             "detail": {"requests": rounds, "offsets_per_request": COMMIT_PARTITIONS}}
    progress(f"{side.name}: {rounds * COMMIT_PARTITIONS:,} offset commits ({rounds:,} requests) "
             f"in {elapsed:.1f} s = {rate:,.0f} offsets/s")
    expected = {p: committed_offset(rounds - 1, p) for p in range(COMMIT_PARTITIONS)}
    bytes_committed = topic_log_bytes(side.data_dir, OFFSETS_TOPIC)

    def measure(key, fn):
        try:
            outcome = fn()
            results[key] = {"status": "ok", "value": outcome["value"], "samples": [outcome["value"]],
                            "detail": outcome.get("detail", {})}
            progress(f"{side.name}: {key}: {outcome['value']:.2f} s {outcome.get('detail', {})}")
        except Wrong as exc:
            results[key] = {"status": "wrong", "detail": str(exc.args[0]),
                            **({"data": exc.args[1]} if len(exc.args) > 1 else {})}
            progress(f"{side.name}: {key}: WRONG: {exc.args[0]}")
    measure("start_before_s", lambda: timed_start(side, {**BROKER_BASE, **CLEANER_OFF}, GROUP, COMMIT_TOPIC, expected))
    results["start_before_s"].setdefault("detail", {})
    if isinstance(results["start_before_s"]["detail"], dict):
        results["start_before_s"]["detail"]["offsets_topic_bytes"] = bytes_committed

    # compaction: the cleaner on, until it has cleaned the group's partition and the topic shrank
    side.halt()
    mark = side.log_mark()
    side.launch({**BROKER_BASE, **CLEANER_ON})
    side.wait_ready()
    t0 = time.monotonic()
    _wait(lambda: any(p["log"].startswith(OFFSETS_TOPIC) for p in side.passes(side.log_since(mark)))
          and topic_log_bytes(side.data_dir, OFFSETS_TOPIC) < bytes_committed / 2,
          "the cleaner to shrink __consumer_offsets", interval_s=0.2)
    time.sleep(BACKOFF_MS / 1000 * 2 + 0.5)
    passes = [p for p in side.passes(side.log_since(mark)) if p["log"].startswith(OFFSETS_TOPIC)]
    bytes_cleaned = topic_log_bytes(side.data_dir, OFFSETS_TOPIC)
    progress(f"{side.name}: __consumer_offsets {bytes_committed / 1e6:,.1f} MB -> {bytes_cleaned / 1e6:,.2f} MB "
             f"({len(passes)} cleaner pass(es), {time.monotonic() - t0:.1f} s after the start)")
    results["offsets_compaction"] = {"status": "ok", "detail": {
        "bytes_before": bytes_committed, "bytes_after": bytes_cleaned, "passes": passes}}
    measure("start_after_s", lambda: timed_start(side, {**BROKER_BASE, **CLEANER_ON}, GROUP, COMMIT_TOPIC, expected))
    side.close()


FIGURES = [
    # key, label, unit, higher is better
    ("cleaner_mb_s", "cleaner throughput, the broker's own figure (MB of log cleaned / s)", "MB/s", True),
    ("cleaner_in_process_mb_s", "cleaner throughput, eos Cleaner.clean in this process (no broker)", "MB/s", True),
    ("start_before_s", "broker start until OffsetFetch answers, M commits, before compaction", "s", False),
    ("start_after_s", "broker start until OffsetFetch answers, M commits, after compaction", "s", False),
    ("commit_rps", "offset commits, 100 a request, synchronous (side figure)", "offsets/s", True),
]


def run_side(side: Side, records: int, commits: int, quick: bool, progress) -> dict:
    results: dict[str, dict] = {}

    def guarded(key, fn):
        try:
            fn()
        except Wrong as exc:
            results[key] = {"status": "wrong", "detail": str(exc.args[0]),
                            **({"data": exc.args[1]} if len(exc.args) > 1 else {})}
            progress(f"{side.name}: {key}: WRONG: {exc.args[0]}")
        except Exception as exc:
            traceback.print_exc()
            results[key] = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
            progress(f"{side.name}: {key}: error: {exc}")
        finally:
            try:
                side.close()
            except Exception:
                traceback.print_exc()

    def cleaner():
        outcome = cleaner_on_broker(side, records, progress)
        results["cleaner_mb_s"] = {"status": "ok", "value": outcome["value"], "samples": [outcome["value"]],
                                   "detail": outcome["detail"]}
    guarded("cleaner_mb_s", cleaner)
    if side.name == "eos":
        def in_process():
            samples, detail = [], None
            for run in range(1 if quick else 3):
                outcome = cleaner_in_process(side.tmp_dir, records)
                samples.append(outcome["value"])
                detail = outcome["detail"]
                progress(f"eos: in-process cleaner run {run + 1}: {outcome['value']:,.1f} MB/s "
                         f"({detail['bytes_read'] / 1e6:,.1f} MB in {detail['seconds']:.2f} s, "
                         f"kept {detail['records_kept']:,} of {detail['records_read']:,})")
            results["cleaner_in_process_mb_s"] = {"status": "ok", "value": statistics.median(samples),
                                                  "samples": samples, "detail": detail}
        guarded("cleaner_in_process_mb_s", in_process)

    def commits_part():
        offset_commits(side, commits, progress, results)
    guarded("start_before_s", commits_part)
    for key in ("start_before_s", "start_after_s", "commit_rps"):
        if key not in results and results.get("start_before_s", {}).get("status") in ("error", "wrong"):
            results[key] = dict(results["start_before_s"])
    return results


# ---- report -----------------------------------------------------------------------------------------

def _cell(outcome: dict | None, unit: str) -> str:
    if outcome is None:
        return "-"
    if outcome["status"] != "ok":
        return outcome["status"].upper()
    return f"{outcome['value']:,.2f} {unit}" if outcome["value"] < 100 else f"{outcome['value']:,.0f} {unit}"


def table(run: dict) -> str:
    lines = ["| figure | eos | Kafka | ratio (>1 = eos better) |", "| --- | ---: | ---: | ---: |"]
    for key, label, unit, higher in FIGURES:
        outcomes = [run["systems"].get(s, {}).get(key) for s in ("eos", "kafka")]
        values = [o["value"] for o in outcomes if o is not None and o["status"] == "ok"]
        ratio = "-"
        if len(values) == 2 and all(v > 0 for v in values):
            ratio = f"{values[0] / values[1] if higher else values[1] / values[0]:.2f}"
        label = label.replace("M commits", f"{run['commits']:,} commits")
        lines.append(f"| {label} | {_cell(outcomes[0], unit)} | {_cell(outcomes[1], unit)} | {ratio} |")
    disk = f"{run.get('disk_buffered_mb_s', 0):,.0f} MB/s buffered, {run.get('disk_fsync_mb_s', 0):,.0f} MB/s fsync"
    lines.append(f"| raw disk sequential write (bench/disk.py, 256 MiB) | {disk} | {disk} | - |")
    return "\n".join(lines)


def notes(run: dict) -> str:
    out = []
    for system in ("eos", "kafka"):
        results = run["systems"].get(system)
        if not results:
            continue
        cleaner = results.get("cleaner_mb_s", {})
        if cleaner.get("status") == "ok":
            d = cleaner["detail"]
            out.append(f"- {system} cleaner: {d['records']:,} records filled in {d['fill_s']:.1f} s; "
                       f"{d['log_bytes_before'] / 1e6:,.1f} MB in {d['segments_before']} segments -> "
                       f"{d['log_bytes_after'] / 1e6:,.2f} MB in {d['segments_after']} (active segment included); "
                       f"{len(d['passes'])} pass(es): " + "; ".join(
                           f"{p['mb']:,.1f} MB in {p['seconds']:.2f} s, kept {p['records_kept']} of "
                           f"{p['records_read']} records" for p in d["passes"]))
        in_process = results.get("cleaner_in_process_mb_s", {})
        if in_process.get("status") == "ok":
            d = in_process["detail"]
            out.append(f"- {system} in-process cleaner: {d['bytes_read'] / 1e6:,.1f} MB read, "
                       f"{d['records_per_batch']:,} records a batch, {d['segments_replaced']} segments into "
                       f"{d['segments_written']}; runs " + ", ".join(f"{s:,.1f}" for s in in_process["samples"])
                       + " MB/s")
        compaction = results.get("offsets_compaction", {})
        if compaction.get("status") == "ok":
            d = compaction["detail"]
            before = results.get("start_before_s", {}).get("detail", {})
            after = results.get("start_after_s", {}).get("detail", {})
            replayed = [x.get("records_replayed") if isinstance(x, dict) else None for x in (before, after)]
            out.append(f"- {system} __consumer_offsets: {d['bytes_before'] / 1e6:,.1f} MB -> "
                       f"{d['bytes_after'] / 1e6:,.2f} MB after {len(d['passes'])} cleaner pass(es) "
                       + "(" + "; ".join(f"{p['mb']:,.1f} MB in {p['seconds']:.2f} s = {p['mb_s']:,.1f} MB/s"
                                         for p in d["passes"]) + "); records replayed at start: "
                       f"{replayed[0] if replayed[0] is not None else '?'} before, "
                       f"{replayed[1] if replayed[1] is not None else '?'} after")
        for key, outcome in results.items():
            if isinstance(outcome, dict) and outcome.get("status") in ("wrong", "error"):
                out.append(f"- {system} {key}: {outcome['status'].upper()}: {outcome['detail']}")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200,000 records and commits (results in tmp/)")
    parser.add_argument("--systems", default="kafka,eos")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--records", type=int, help="records in the cleaned topic (default 1,000,000; quick 200,000)")
    parser.add_argument("--commits", type=int, help="offset commits (default 1,000,000; quick 200,000)")
    parser.add_argument("--tmp-dir", default=os.environ.get("EOS_BENCH_TMP", tempfile.gettempdir()))
    args = parser.parse_args(argv)
    records = args.records or (200_000 if args.quick else 1_000_000)
    commits = args.commits or (200_000 if args.quick else 1_000_000)
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()

    def progress(message):
        print(f"[{time.monotonic() - t0:6.1f}s] {message}", flush=True)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    run = {"command": "python -m bench.compaction " + " ".join(argv if argv is not None else sys.argv[1:]),
           "started_utc": started.isoformat(timespec="seconds"), "quick": args.quick, "records": records,
           "commits": commits, "keys": KEYS, "value_bytes": VALUE_BYTES,
           "loadavg_at_start": os.getloadavg(), "python_probe_ms_at_start": python_probe_ms(),
           "systems": {}}
    for system in systems:
        progress(f"{system}: start")
        try:
            side = KafkaSide(args.tmp_dir) if system == "kafka" else EosSide(args.tmp_dir)
            run["systems"][system] = run_side(side, records, commits, args.quick, progress)
        except Exception as exc:
            traceback.print_exc()
            run["systems"][system] = {key: {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
                                      for key, *_ in FIGURES if system == "eos" or key != "cleaner_in_process_mb_s"}
    from bench import disk
    speed = disk.measure(args.tmp_dir, 256)
    run["disk_buffered_mb_s"] = speed.buffered_mb_s
    run["disk_fsync_mb_s"] = speed.fsync_mb_s
    run["loadavg_at_end"] = os.getloadavg()
    run["python_probe_ms_at_end"] = python_probe_ms()
    run["duration_s"] = round(time.monotonic() - t0, 1)
    text = table(run)
    extra = notes(run)
    print()
    print(text)
    if extra:
        print()
        print(extra)
    partial = (args.quick or systems != ["kafka", "eos"] or args.records is not None
               or args.commits is not None)
    out = args.out or (RESULTS_DIR / "tmp" if partial else RESULTS_DIR)
    stem = f"compaction-{started:%Y-%m-%d}-{socket.gethostname()}"
    header = (f"# Log compaction benchmark\n\n`{run['command']}` at {run['started_utc']} "
              f"({run['duration_s']} s, load {run['loadavg_at_start'][0]:.1f} at start, "
              f"{run['loadavg_at_end'][0]:.1f} at end); {records:,} records of {VALUE_BYTES} B over {KEYS:,} keys "
              f"in the cleaned topic; {commits:,} offset commits. One run a figure (see bench/compaction.py)."
              + python_probe_sentence(run) + "\n\n")
    body = header + text + "\n" + (f"\n{extra}\n" if extra else "")
    write_run(out, stem, None if partial else "compaction-latest", run, body)
    failed = [(s, k) for s, figures in run["systems"].items() for k, o in figures.items()
              if isinstance(o, dict) and o.get("status") in ("wrong", "error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
