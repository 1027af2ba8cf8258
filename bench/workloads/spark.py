"""Spark: one pipeline stage on each system, its speed, then one hard kill and restart.

Theory of operation
-------------------
The stage is the same on both systems: read a keyed input topic (3 partitions, 100-byte
values, seeded before any clock starts), upper-case the value, write an output topic,
trigger(availableNow) with a per-trigger cap (Kafka: maxOffsetsPerTrigger; eos:
maxRecordsPerTrigger) of a tenth of the input, so a run is ten micro-batches. On Kafka it
runs through Spark's built-in Kafka source (read_committed) and sink; on eos through the
eos source and ExactlyOnceSink in foreachBatch. The Spark driver always runs in a child
process (``python -m bench.spark_sink stage``, bench/spark_sink.py) that leads its own
process group: the harness stays free of a JVM, and a kill can take the driver, its JVM
and its Python workers down together (`Driver.kill`: the group and every descendant, as
pyspark's worker daemons leave the group).

Spark's Kafka connector is not part of pyspark. `resolve_connector` resolves
``spark-sql-kafka-0-10_2.13`` with Maven (the helpers of bench/kafka.py) into
``<cache>/spark-kafka-<pyspark version>/libs``: the connector of pyspark's own version if
Maven Central has it, else the newest 4.x release before it; the token-provider module it
depends on is pinned to the newest release Maven Central has at or before the connector's
version. Only the jars pyspark does not ship already (`jars_to_add`: compared by artifact
name, version ignored) go into ``spark.jars``.

Throughput: one driver runs a small warm-up stage (first-query costs: class loading, code
generation, Python workers), then `Sizes.repeats` measured runs, each into a fresh output
topic from a fresh checkpoint. A run's time is the query's wall time from start() to
termination (Spark start-up excluded); records/s is the median. Every output is read back
and must hold each input record exactly once. That time is also split in two, from Spark's
own progress reports (the same on both systems): start() to the first micro-batch (what a
query pays before any work), and the records/s of the micro-batches after the first (the
pace a long-running query keeps).

Kill and restart: after its measured runs the same driver runs the stage once more, into a
fresh output topic, while the harness polls the output's end offsets with the system's own
client. (A second driver starts at the same moment in standby -- Spark start-up and a
warm-up of its own, then it waits for a "go" file -- so that the restart does not add a
second Spark start-up to the workload's time.) The kill is placed inside a
micro-batch: `in_flight_records` is what the batch being written has put in the log so far
(Kafka, whose sink writes no transactions: the high watermarks summed, modulo the batch
size; eos: log end minus last stable offset, summed -- the open transaction's records),
and `partly_written` holds when that is strictly between 0 and the batch size. Then the
driver and everything under it get SIGKILL, the go file appears, and the standby driver
runs the same query from the same checkpoint to the end. The output is read back
read_committed and tallied against the expected values (`tally`): extra copies are
duplicates, absent values missing. Duplicates
on Kafka are what an at-least-once sink does and are reported, not raised; missing records
on either system, or any duplicate on eos, raise RecordsLost.
"""
from __future__ import annotations

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from bench.workloads import (Metric, NotAvailable, RecordsLost, RunContext, Workload, median_low,
                             register)
from bench.workloads.clients import eos_create_topic, kafka_create_topic
from eos.processes import kill_tree

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PARTITIONS = 3
VALUE_BYTES = 100
KEYS = 1000
BATCHES_PER_RUN = 10              # the per-trigger cap is a tenth of the input
MAX_RECORDS = 100_000             # full mode; a tenth of Sizes.records, up to this
WARMUP_RECORDS = 3_000
POLL_INTERVAL_S = 0.01            # end-offset polls while waiting to place the kill
DRIVER_TIMEOUT_S = 300.0          # bound on a whole driver process (start-up included)
KILL_WAIT_TIMEOUT_S = 180.0       # bound on waiting for a partly written batch
READ_TIMEOUT_S = 120.0

SPARK_GROUP = "org.apache.spark"
CONNECTOR = "spark-sql-kafka-0-10_2.13"
TOKEN_PROVIDER = "spark-token-provider-kafka-0-10_2.13"
CONNECTOR_CANDIDATES = 3          # releases tried before giving up


# ---------------------------------------------------------------- pure parts

_JAR_NAME = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+(?:\.\d+)+(?:[-.][0-9A-Za-z]+)*)\.jar$")


def jar_artifact(file_name: str) -> str:
    """The artifact of a Maven jar file name: 'kafka-clients-3.9.2.jar' -> 'kafka-clients'."""
    match = _JAR_NAME.match(file_name)
    return match.group("artifact") if match else file_name


def jars_to_add(resolved: Iterable[str], shipped: Iterable[str]) -> list[str]:
    """The resolved jar file names whose artifact pyspark does not ship (any version):
    adding a second copy of a jar Spark has would put two versions on one classpath."""
    have = {jar_artifact(name) for name in shipped}
    return sorted(name for name in resolved
                  if name.endswith(".jar") and jar_artifact(name) not in have)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version))


def connector_candidates(spark_version: str, released: Iterable[str]) -> list[str]:
    """Released connector versions to try for `spark_version`, best first: the same
    version, else the newest of the same major version before it."""
    major = _version_key(spark_version)[0]
    wanted = _version_key(spark_version)
    fitting = [v for v in set(released)
               if _version_key(v)[0] == major and _version_key(v) <= wanted]
    return sorted(fitting, key=_version_key, reverse=True)


def token_provider_for(connector_version: str, released: Iterable[str]) -> str | None:
    """The token-provider release to pin: the connector's own version, else the newest
    release before it; None if Maven lists none."""
    fitting = [v for v in set(released) if _version_key(v) <= _version_key(connector_version)]
    return max(fitting, key=_version_key) if fitting else None


def in_flight_records(system: str, log_end: int, stable_end: int, batch_records: int) -> int:
    """Records of the micro-batch being written that are in the output log so far.

    `log_end` and `stable_end` are the output's end offsets summed over its partitions, at
    read_uncommitted (log end / high watermark) and read_committed (last stable offset).
    Spark's Kafka sink writes no transactions and no markers, and every batch but the last
    is exactly `batch_records`, so the partial batch is the remainder. The eos sink writes
    each batch in one transaction: its records are those past the last stable offset."""
    if batch_records <= 0:
        raise ValueError(f"batch_records must be positive, got {batch_records}")
    if system == "kafka":
        return log_end % batch_records
    if system == "eos":
        return log_end - stable_end
    raise ValueError(f"unknown system {system!r}")


def partly_written(in_flight: int, batch_records: int) -> bool:
    """A batch has begun to reach the output and has not all reached it."""
    return 0 < in_flight < batch_records


@dataclass(frozen=True)
class Tally:
    """The output against the expected values: `duplicates` counts extra copies (a value
    seen three times is two duplicates), `missing` expected values never seen, and
    `unexpected` records whose value was not expected at all."""
    records: int
    duplicates: int
    missing: int
    unexpected: int


def tally(seen: Iterable[bytes], expected: Iterable[bytes]) -> Tally:
    wanted = set(expected)
    counts = collections.Counter(seen)
    records = sum(counts.values())
    unexpected = sum(n for value, n in counts.items() if value not in wanted)
    duplicates = sum(n - 1 for value, n in counts.items() if value in wanted and n > 1)
    missing = sum(1 for value in wanted if value not in counts)
    return Tally(records, duplicates, missing, unexpected)


def input_value(index: int) -> bytes:
    return (f"value-{index}-".encode() + b"x" * VALUE_BYTES)[:VALUE_BYTES]


def expected_output(records: int) -> list[bytes]:
    """What the stage makes of the input: every value upper-cased."""
    return [input_value(i).upper() for i in range(records)]


# ---------------------------------------------------------------- the connector

@dataclass(frozen=True)
class ConnectorJars:
    connector_version: str
    token_provider_version: str
    jars: list[str]                 # paths for spark.jars


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _version_in(libs: Path, artifact: str) -> str:
    for jar in libs.glob(f"{artifact}-*.jar"):
        match = _JAR_NAME.match(jar.name)
        if match and match.group("artifact") == artifact:
            return match.group("version")
    return "?"


def resolve_connector(spark_version: str) -> ConnectorJars:
    """Spark's Kafka connector for `spark_version` and what it needs, cached (module doc)."""
    from bench.kafka import cache_dir, copy_dependencies, maven_pom, released_versions

    home = cache_dir() / f"spark-kafka-{spark_version}"
    libs: Path | None = home / "libs" if (home / ".complete").exists() else None
    tried: list[str] = []
    if libs is None:
        candidates = connector_candidates(spark_version, released_versions(SPARK_GROUP, CONNECTOR))
        providers = released_versions(SPARK_GROUP, TOKEN_PROVIDER)
        for version in candidates[:CONNECTOR_CANDIDATES]:
            provider = token_provider_for(version, providers) or version
            tried.append(f"{version} (token provider {provider})")
            libs = copy_dependencies(home, maven_pom(
                "spark-kafka-runtime", [(SPARK_GROUP, CONNECTOR, version)],
                managed=[(SPARK_GROUP, TOKEN_PROVIDER, provider)]), f"{CONNECTOR}-*.jar")
            if libs is not None:
                break
    if libs is None:
        raise RuntimeError(f"Maven could not resolve {SPARK_GROUP}:{CONNECTOR} for Spark "
                           f"{spark_version}; tried {', '.join(tried) or 'no version'} "
                           f"(see {home / 'maven.log'})")
    shipped = [jar.name for jar in _pyspark_jars().glob("*.jar")]
    chosen = jars_to_add([jar.name for jar in libs.glob("*.jar")], shipped)
    return ConnectorJars(_version_in(libs, CONNECTOR), _version_in(libs, TOKEN_PROVIDER),
                         [str(libs / name) for name in chosen])


# ---------------------------------------------------------------- the systems' clients

class KafkaOutput:
    """Topics, seeding, end offsets and read-back on Kafka (confluent-kafka)."""

    def __init__(self, bootstrap: str):
        from confluent_kafka import Consumer

        self.bootstrap = bootstrap
        self._watermarks = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-spark-ends",
                                     "enable.auto.commit": False})

    def create(self, topic: str) -> None:
        kafka_create_topic(self.bootstrap, topic, PARTITIONS)

    def seed(self, topic: str, records: int) -> None:
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 20,
                             "queue.buffering.max.messages": 1_000_000})
        failures: list = []

        def delivered(error, _message) -> None:
            if error is not None:
                failures.append(error)

        for index in range(records):
            while True:
                try:
                    producer.produce(topic, value=input_value(index), key=f"key-{index % KEYS}".encode(),
                                     on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
        left = producer.flush(READ_TIMEOUT_S)
        if left or failures:
            raise RuntimeError(f"seeding {topic}: {left} records undelivered, errors {failures[:3]}")

    def ends(self, topic: str) -> tuple[int, int]:
        """(high watermarks summed, the same: no transactions are written here)."""
        from confluent_kafka import TopicPartition

        high = sum(self._watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(PARTITIONS))
        return high, high

    def read_values(self, topic: str) -> list[bytes]:
        """Every value in `topic`, read_committed, up to the high watermarks."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        ends = {p: self._watermarks.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(PARTITIONS)}
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-spark-read",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        values: list[bytes] = []
        try:
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends if ends[p] > 0])
            positions = {p: 0 for p in ends}
            deadline = time.monotonic() + READ_TIMEOUT_S
            while any(positions[p] < ends[p] for p in ends):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic}: at {positions} of {ends} after "
                                       f"{READ_TIMEOUT_S:.0f} s")
                for message in consumer.consume(num_messages=10_000, timeout=1.0):
                    if message.error() is not None:
                        continue
                    values.append(message.value())
                    positions[message.partition()] = message.offset() + 1
        finally:
            consumer.close()
        return values

    def close(self) -> None:
        self._watermarks.close()


class EosOutput:
    """Topics, seeding, end offsets and read-back on eos (eos's own clients)."""

    def __init__(self, bootstrap: str):
        from eos.admin import Admin

        self.bootstrap = bootstrap
        self._admin = Admin(bootstrap)

    def create(self, topic: str) -> None:
        eos_create_topic(self.bootstrap, topic, PARTITIONS)

    def seed(self, topic: str, records: int) -> None:
        from producer import Producer

        with Producer(self.bootstrap, linger_ms=20) as producer:
            chunk = 20_000
            for first in range(0, records, chunk):
                indexes = range(first, min(records, first + chunk))
                producer.send_batch(topic, [input_value(i) for i in indexes],
                                    keys=[f"key-{i % KEYS}".encode() for i in indexes]).result(READ_TIMEOUT_S)

    def ends(self, topic: str) -> tuple[int, int]:
        """(log end offsets summed, last stable offsets summed)."""
        from eos.types import TopicPartition

        tps = {TopicPartition(topic, p): "latest" for p in range(PARTITIONS)}
        log_end = self._admin.list_offsets(tps, isolation_level="read_uncommitted")
        stable = self._admin.list_offsets(tps, isolation_level="read_committed")
        return sum(log_end.values()), sum(stable.values())

    def read_values(self, topic: str) -> list[bytes]:
        from spark_sink.readback import read_committed

        return [record.value for record in read_committed(self.bootstrap, topic, timeout_s=READ_TIMEOUT_S)]

    def close(self) -> None:
        self._admin.close()


# ---------------------------------------------------------------- the driver process

@dataclass
class Driver:
    """One `python -m bench.spark_sink stage` child, leading its own process group."""
    process: subprocess.Popen
    log_path: Path
    result_path: Path

    @classmethod
    def start(cls, work: Path, name: str, spec: dict) -> "Driver":
        spec_path = work / f"{name}.spec.json"
        result_path = work / f"{name}.result.json"
        log_path = work / f"{name}.log"
        spec_path.write_text(json.dumps({**spec, "result_path": str(result_path)}))
        paths = [str(REPO_ROOT), *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable}
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "bench.spark_sink", "stage", "--spec", str(spec_path)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT,
                env=env, start_new_session=True)
        return cls(process, log_path, result_path)

    def kill(self) -> None:
        """SIGKILL to the driver, its JVM and its Python workers at once
        (`eos.processes.kill_tree`: the group and every descendant)."""
        kill_tree(self.process)

    def finish(self, timeout_s: float = DRIVER_TIMEOUT_S) -> dict:
        """Wait for a clean exit; the driver's results. Killed and raised on failure."""
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise TimeoutError(f"the Spark driver did not finish in {timeout_s:.0f} s:\n{self.tail()}")
        if code != 0:
            raise RuntimeError(f"the Spark driver exited with {code}:\n{self.tail()}")
        return json.loads(self.result_path.read_text())

    def tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


# ---------------------------------------------------------------- the workload

def _sizes(ctx: RunContext) -> tuple[int, int]:
    """(input records, records per trigger).

    The input is a multiple of KEYS * BATCHES_PER_RUN records: keys cycle through KEYS
    values, so each partition holds the same share of every block of KEYS records, and
    the Kafka source's proportional split of maxOffsetsPerTrigger over the partitions
    comes out whole -- every batch is exactly `per_trigger` records, which is what
    `in_flight_records` counts on for Kafka."""
    block = KEYS * BATCHES_PER_RUN
    records = max(block, min(MAX_RECORDS, ctx.sizes.records // 10) // block * block)
    return records, records // BATCHES_PER_RUN


def _check_exact(ctx: RunContext, what: str, counted: Tally, records: int) -> None:
    if counted.duplicates or counted.missing or counted.unexpected or counted.records != records:
        raise RecordsLost(f"{ctx.system} spark {what}: {counted}", records, counted.records)


def _run(ctx: RunContext, system: str) -> list[Metric]:
    try:
        import pyspark
    except ImportError as exc:
        raise NotAvailable(f"pyspark is not importable ({exc}); ./run bench installs it") from exc
    records, per_trigger = _sizes(ctx)
    jars: list[str] = []
    connector_note = ""
    if system == "kafka":
        connector = resolve_connector(pyspark.__version__)
        jars = connector.jars
        connector_note = (f"Spark {pyspark.__version__} with spark-sql-kafka "
                          f"{connector.connector_version} (token provider "
                          f"{connector.token_provider_version}) from Maven Central"
                          + ("" if connector.connector_version == pyspark.__version__ else
                             f": no {pyspark.__version__} connector on Maven Central") + "; ")
    client = KafkaOutput(ctx.bootstrap) if system == "kafka" else EosOutput(ctx.bootstrap)
    work = Path(tempfile.mkdtemp(prefix=f"eos-bench-spark-{system}-"))
    drivers: list[Driver] = []
    try:
        source, warm_source = ctx.topic_name("spark-in"), ctx.topic_name("spark-warm-in")
        for topic in (source, warm_source):
            client.create(topic)
        ctx.progress(f"  seeding {records:,} records ({VALUE_BYTES} B, {PARTITIONS} partitions); "
                     f"{per_trigger:,} per trigger")
        client.seed(source, records)
        client.seed(warm_source, WARMUP_RECORDS)
        expected = expected_output(records)

        # --- throughput, then the run that is killed, in one driver (one Spark start-up)
        warm_out, warm_again = ctx.topic_name("spark-warm-out"), ctx.topic_name("spark-warm-out")
        kill_out = ctx.topic_name("spark-kill-out")
        outputs = [ctx.topic_name("spark-out") for _ in range(ctx.sizes.repeats)]
        for topic in (warm_out, warm_again, kill_out, *outputs):
            client.create(topic)
        kill_run = {"input": source, "output": kill_out, "checkpoint": str(work / "cp-kill")}
        spec = {"system": system, "bootstrap": ctx.bootstrap, "jars": jars, "per_trigger": per_trigger,
                "timeout_s": DRIVER_TIMEOUT_S,
                "warmup": [{"input": warm_source, "output": warm_out, "checkpoint": str(work / "cp-warm")}],
                "runs": [{"input": source, "output": out, "checkpoint": str(work / f"cp-{out}")}
                         for out in outputs],
                "last": [kill_run]}
        ctx.progress(f"  one Spark driver: warm-up, {len(outputs)} measured run(s), then the run to kill")
        driver = Driver.start(work, "driver", spec)
        drivers.append(driver)
        wall_times, phases = _wait_measured(driver, len(outputs))
        # --- one hard kill inside a micro-batch, and a restart from the checkpoint. The
        # restarting driver starts now, in standby: its Spark start-up and a warm-up of its
        # own overlap the run to kill instead of adding to the workload's time; it begins
        # the query on the shared checkpoint only once the first driver is dead (go file).
        go_file = work / "go"
        standby = Driver.start(work, "restarted", {
            **spec, "warmup": [{"input": warm_source, "output": warm_again,
                                "checkpoint": str(work / "cp-warm-again")}],
            "runs": [], "go_file": str(go_file)})
        drivers.append(standby)
        ctx.progress("  kill: waiting for a partly written micro-batch (restart driver in standby)")
        seen_in_flight, (log_end, stable_end) = _wait_partly_written(system, client, driver, kill_out,
                                                                     per_trigger)
        driver.kill()
        go_file.touch()
        killed_at = time.monotonic()
        after_log_end, after_stable = client.ends(kill_out)
        placed = (f"SIGKILL with {seen_in_flight:,} of the {per_trigger:,} records of a micro-batch in "
                  f"the output log (" + (
                      f"high watermarks summed: {log_end:,} seen, {after_log_end:,} after the kill"
                      if system == "kafka" else
                      f"log end / last stable offset summed: {log_end:,} / {stable_end:,} seen, "
                      f"{after_log_end:,} / {after_stable:,} after the kill") + ")")
        ctx.progress(f"    {placed}; restarting from the checkpoint")
        for out, wall_s in zip(outputs, wall_times):
            _check_exact(ctx, f"run into {out}", tally(client.read_values(out), expected), records)
            ctx.progress(f"    measured run: {records / wall_s:,.0f} records/s ({records:,} in {wall_s:.2f} s)")
        rates = [records / wall_s for wall_s in wall_times]
        rate = median_low(rates)
        restart_s = standby.finish(DRIVER_TIMEOUT_S)["last_s"][0]
        ctx.progress(f"    restarted run finished in {restart_s:.1f} s "
                     f"({time.monotonic() - killed_at:.1f} s after the kill)")
        counted = tally(client.read_values(kill_out), expected)
        ctx.progress(f"    output after the restart: {counted.records:,} records, "
                     f"{counted.duplicates:,} duplicates, {counted.missing:,} missing")
        if counted.missing or counted.unexpected:
            raise RecordsLost(f"{system} spark after a kill and restart: {counted}", records,
                              counted.records)
        if system == "eos" and counted.duplicates:
            raise RecordsLost(f"eos spark after a kill and restart (ExactlyOnceSink): {counted}",
                              records, counted.records)
        sink = ("Spark's Kafka sink (at-least-once: the batch in flight is written again)"
                if system == "kafka" else "ExactlyOnceSink")
        return [
            Metric("spark.records_per_s", "Spark stage: records/s", round(rate), "records/s", True,
                   f"{connector_note}{records:,} records, {per_trigger:,} per trigger, wall time of "
                   f"the query", samples=tuple(round(r) for r in rates)),
            *_phase_metrics(phases),
            Metric("spark.duplicates_after_kill", "Spark stage, kill -9 + restart: duplicates",
                   float(counted.duplicates), "records", False,
                   f"{sink}; {placed}; read_committed"),
            Metric("spark.missing_after_kill", "Spark stage, kill -9 + restart: missing",
                   float(counted.missing), "records", False),
        ]
    finally:
        for driver in drivers:
            if driver.process.poll() is None:
                driver.kill()
        client.close()
        shutil.rmtree(work, ignore_errors=True)


def _phase_metrics(phases: list[dict]) -> list[Metric]:
    """The wall time's two parts (bench/spark_sink.query_phases), medians over the measured
    runs: start() to the first micro-batch, and the records/s of the micro-batches after
    it. A run whose query reported no batch to split is left out."""
    complete = [p for p in phases if p.get("later_s")]
    if not complete:
        return []
    to_first_ms = [p["to_first_batch_s"] * 1000 for p in complete]
    later_rates = [p["later_records"] / p["later_s"] for p in complete]
    first_ms = [p["first_batch_s"] * 1000 for p in complete]
    return [
        Metric("spark.to_first_batch_ms", "Spark stage: start() to the first micro-batch",
               round(median_low(to_first_ms)), "ms", False,
               "from Spark's progress reports: the first batch's start time less the time of "
               f"start(); the first batch itself then took {median_low(first_ms):,.0f} ms",
               samples=tuple(round(v) for v in to_first_ms)),
        Metric("spark.later_batches_records_per_s", "Spark stage, micro-batches after the first: records/s",
               round(median_low(later_rates)), "records/s", True,
               "their records over their summed triggerExecution (Spark's progress reports)",
               samples=tuple(round(v) for v in later_rates)),
    ]


def _wait_measured(driver: Driver, runs: int) -> tuple[list[float], list[dict]]:
    """The wall times and `query_phases` of the measured runs, once the driver has written
    them all. Polled slowly: a fast poll would take CPU from the runs being measured."""
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while True:
        try:
            written = json.loads(driver.result_path.read_text())
            wall_times, phases = written["wall_s"], written["phases"]
        except (OSError, ValueError, KeyError):
            wall_times, phases = [], []
        if len(wall_times) >= runs:
            return wall_times[:runs], phases[:runs]
        if driver.process.poll() is not None:
            raise RuntimeError(f"the Spark driver exited with {driver.process.returncode} after "
                               f"{len(wall_times)} of {runs} measured runs:\n{driver.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the Spark driver did not finish {runs} measured runs in "
                               f"{DRIVER_TIMEOUT_S:.0f} s:\n{driver.tail()}")
        time.sleep(0.2)


def _wait_partly_written(system: str, client, driver: Driver, topic: str,
                         per_trigger: int) -> tuple[int, tuple[int, int]]:
    """Poll the output's end offsets until a micro-batch is partly in the log (bounded)."""
    deadline = time.monotonic() + KILL_WAIT_TIMEOUT_S
    ends, last_error = (0, 0), None
    while True:
        try:
            ends = client.ends(topic)
        except Exception as exc:      # a client's transient error (metadata not yet current)
            last_error = exc
        else:
            in_flight = in_flight_records(system, ends[0], ends[1], per_trigger)
            if partly_written(in_flight, per_trigger):
                return in_flight, ends
        if driver.process.poll() is not None:
            raise RuntimeError(f"the Spark driver ended (code {driver.process.returncode}) before a "
                               f"partly written micro-batch was seen; ends {ends}:\n{driver.tail()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no partly written micro-batch within {KILL_WAIT_TIMEOUT_S:.0f} s; "
                               f"ends {ends}, last client error {last_error}:\n{driver.tail()}")
        time.sleep(POLL_INTERVAL_S)


def run_kafka(ctx: RunContext) -> list[Metric]:
    return _run(ctx, "kafka")


def run_eos(ctx: RunContext) -> list[Metric]:
    return _run(ctx, "eos")


register(Workload("spark", "Spark stage (source -> upper(value) -> sink): records/s, then kill -9 "
                  "and restart", {"kafka": run_kafka, "eos": run_eos}, default_on=True))
