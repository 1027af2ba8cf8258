"""python -m bench.cluster [--quick] [--systems kafka,eos] [--out DIR]: 3-broker clusters side by side.

Theory of operation
-------------------
One run starts Apache Kafka's 3-node KRaft cluster (`bench.kafka_cluster`), measures every
figure, stops it, then does the same on eos's 3-broker cluster (`eos.local_cluster`:
ZooKeeper and three broker processes); the two never share the machine. Both sides' data
stays on disk until the run ends: on ext4 without a journal, as here, creating a file scans
past the inodes freed in the last minute or more, so removing one side's tens of thousands
of files would slow the file creation of the side measured next (bench/README, "Files
kept to the end, a session's waiter, the metadata index"). Both sides run at
the same session timeout (6 s: eos's zookeeper.session.timeout.ms, Kafka's
broker.session.timeout.ms with a 1 s heartbeat), RF 3, min.insync.replicas 2.

Figures (median of 3 runs; 1 with --quick):
- failover after kill -9: an idempotent acks=all producer sends a record every 2 ms to a
  one-partition topic; the leader is killed with SIGKILL; the figure is the longest pause
  between two acknowledgements from the last one before the kill to the 200th after it: how
  long writes could not complete while leadership moved. Every acknowledged record must read
  back exactly once, else the row says LOST.
- failover after a controlled shutdown: the same with SIGTERM.
- metadata propagation: from the CreateTopics call for 1,000 partitions (RF 3) until every
  broker's Metadata answer shows them all with a leader.
- produce acks=all (RF 3), 100-byte values: records/s of eos's bulk path (`send_batch`) and
  of per-record `send()`; Kafka's figure for both is librdkafka's per-record `produce()`
  loop (it has no bulk call). Replication MB/s restates the bulk figure as what the two
  followers copied (values only: a lower bound), beside the raw disk speed of this machine.
- produce latency p50/p99: send to acknowledgement at 5,000 records/s, acks=all RF 3.
- consume read_committed: records/s reading the bulk figure's topic from the start.
- end to end p50/p99: idempotent acks=all producer at 1,000 records/s, a read_committed
  reader on the same machine; send call to arrival at the reader.
- broker start with N partitions (10,000; 1,000 with --quick; RF 1 over the 3 brokers): one
  broker stopped cleanly and started again; the time until the cluster lists it live.
- transactions on the cluster (issue 13), every topic RF 3 with min.insync.replicas 2 and
  the internal topics too:
  - transactional copier: 200,000 records of 100 B (50,000 with --quick) read
    read_committed from one partition and written to another, each transaction up to 100 ms
    or 5,000 records with its input offsets (send_offsets_to_transaction); records/s, and
    the output's count and the group's offset are checked.
  - commit_transaction p50/p99: 300 short transactions back to back (one 100 B record
    each); the time of the commit call alone.
  - coordinator failover: short transactions back to back; the broker that coordinates
    the transactional id is killed with SIGKILL; the time from the kill to the end of the
    first transaction that began after it and committed. Every committed record must read
    back exactly once.

Results: `bench/results/cluster-<UTC date>-<host>.{json,md}` and `cluster-latest.*` for a
full run, `bench/results/tmp/` otherwise; a table is printed (ratio > 1 = eos better).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from bench.cluster_sides import EosSide, KafkaSide
from bench.kafka import wait_until
from bench.host_speed import python_probe_ms
from bench.report import python_probe_sentence, write_run

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
SEND_INTERVAL_S = 0.002
WAIT_S = 120.0


class Lost(Exception):
    pass


def _wait(condition, what: str, timeout_s: float = WAIT_S):
    return wait_until(condition, what, timeout_s)


def commit_latency_ms(side, topic: str, transactions: int = 300) -> tuple[float, float]:
    side.create(topic, 1, 3, {"min.insync.replicas": "2"})
    _full_isr(side, topic)
    txn = side.txn(f"bench-commit-{topic}")
    try:
        seconds = [txn.one_record(topic, str(i).encode()) for i in range(transactions)]
    finally:
        txn.close()
    return _p50_p99_ms(seconds)


def coordinator_failover_ms(side, topic: str) -> float:
    """kill -9 of the transaction coordinator: the time to the next transaction that began
    after the kill and committed (see the module doc)."""
    side.create(topic, 1, 3, {"min.insync.replicas": "2"})
    _full_isr(side, topic)
    transactional_id = f"bench-failover-{topic}"
    txn = side.txn(transactional_id)
    commits: list[tuple[float, float, bytes]] = []     # (began, committed, value)
    failures: list[str] = []
    stop = threading.Event()

    def loop():
        n = 0
        while not stop.is_set():
            value = str(n).encode()
            n += 1
            began = time.monotonic()
            try:
                txn.one_record(topic, value)
                commits.append((began, time.monotonic(), value))
            except Exception as exc:       # retried with the next transaction
                failures.append(f"{type(exc).__name__}: {exc}")
                time.sleep(0.05)
    thread = threading.Thread(target=loop, daemon=True)
    try:
        thread.start()
        _wait(lambda: len(commits) >= 20, "steady transactions")
        coordinator = side.txn_coordinator(transactional_id)
        killed_at = time.monotonic()
        os.killpg(side.pid(coordinator), signal.SIGKILL)
        after = _wait(lambda: next((c for c in commits if c[0] >= killed_at), None),
                      "a transaction begun after the kill to commit", timeout_s=180)
        _wait(lambda: len([c for c in commits if c[0] >= killed_at]) >= 5, "more transactions")
    finally:
        stop.set()
        thread.join(150)
        txn.close()
    values = side.read_values(topic, len(commits))
    committed = {v for *_, v in commits}
    if len(values) != len(set(values)) or not committed <= set(values):
        raise Lost(f"{len(commits)} transactions committed, {len(set(values))} records read back, "
                   f"{len(values) - len(set(values))} duplicates")
    side.wait_exit(coordinator)
    side.restart(coordinator)
    _full_isr(side, topic)
    return (after[1] - killed_at) * 1000


def copier_records_per_s(side, source: str, sink: str, count: int) -> float:
    side.create(source, 1, 3, {"min.insync.replicas": "2"})
    side.create(sink, 1, 3, {"min.insync.replicas": "2"})
    _full_isr(side, source)
    _full_isr(side, sink)
    side.bulk_produce(source, count, b"c" * 100)
    elapsed_s, group_offset = side.copy(source, sink, f"group-{source}", count)
    if group_offset != count:
        raise Lost(f"the copier's group offset is {group_offset}, the input has {count}")
    copied, _ = side.consume_count(sink, count)
    if copied != count:
        raise Lost(f"the output holds {copied} committed records, the input {count}")
    return count / elapsed_s


# ---- figures -------------------------------------------------------------------------------------------

def _full_isr(side, topic):
    return _wait(lambda: (lambda ps: ps if ps and all(len(p["isr"]) == len(p["replicas"]) and p["leader"] >= 0
                                                      for p in ps) else None)(side.partitions(topic)),
                 f"{topic} with full ISRs")


def failover_ms(side, topic: str, sig: int) -> float:
    side.create(topic, 1, 3, {"min.insync.replicas": "2"})
    leader = _full_isr(side, topic)[0]["leader"]
    acked: list[tuple[bytes, float]] = []
    errors: list = []
    lock = threading.Lock()

    def on_ack(value, error):
        with lock:
            if error is None:
                acked.append((value, time.monotonic()))
            else:
                errors.append(error)

    send, pump, close = side.producer(on_ack)
    stop = threading.Event()

    def loop():
        n = 0
        while not stop.is_set():
            send(topic, str(n).encode())
            n += 1
            pump()
            time.sleep(SEND_INTERVAL_S)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    _wait(lambda: len(acked) >= 200, "steady acknowledgements")
    killed_at = time.monotonic()
    os.killpg(side.pid(leader), sig)
    before = len([1 for _, t in list(acked) if t <= killed_at])
    _wait(lambda: len(acked) >= before + 200, "200 acknowledgements after the kill")
    stop.set()
    thread.join(10)
    close()
    if errors:
        raise Lost(f"the producer saw errors: {errors[:3]}")
    values = side.read_values(topic, len(acked))
    if len(values) != len(set(values)) or not {v for v, _ in acked} <= set(values):
        raise Lost(f"{len(acked)} acknowledged, {len(set(values))} read back, {len(values) - len(set(values))} duplicates")
    side.wait_exit(leader)
    side.restart(leader)
    _full_isr(side, topic)
    # The longest pause in acknowledgements from the last one before the kill on: how long
    # writes could not complete while leadership moved (an old leader still serving during
    # a controlled shutdown counts as serving, as it is).
    times = sorted(t for _, t in acked)
    window = [t for t in times if t > killed_at][:200]
    last_before = max((t for t in times if t <= killed_at), default=killed_at)
    points = [last_before, *window]
    return max(b - a for a, b in zip(points, points[1:])) * 1000


def metadata_propagation_ms(side, topic: str, partitions: int) -> float:
    started = time.monotonic()
    thread = threading.Thread(target=lambda: side.create(topic, partitions, 3), daemon=True)
    thread.start()
    for broker in side.brokers():
        _wait(lambda: (lambda ps: len(ps) == partitions and all(p["leader"] >= 0 for p in ps))(
            side.partitions(topic, broker)), f"{partitions} partitions on broker {broker}", timeout_s=600)
    elapsed = time.monotonic() - started
    thread.join(600)
    return elapsed * 1000


def restart_s(side, partitions: int) -> float:
    per_topic = 1000
    for i in range(max(1, partitions // per_topic)):
        side.create(f"many-{i}", min(per_topic, partitions), 1)
    broker = side.brokers()[0]
    os.killpg(side.pid(broker), signal.SIGTERM)
    side.wait_exit(broker)
    started = time.monotonic()
    side.restart(broker)
    return time.monotonic() - started


def produce_records_per_s(side, topic: str, count: int, *, bulk: bool = True) -> float:
    side.create(topic, 1, 3, {"min.insync.replicas": "2"})
    _full_isr(side, topic)
    run = side.bulk_produce if bulk else side.per_record_produce
    elapsed = run(topic, count, b"x" * 100)
    return count / elapsed


def consume_records_per_s(side, topic: str, count: int) -> float:
    """read_committed from the start of a topic an earlier figure filled."""
    seen, elapsed = side.consume_count(topic, count)
    if seen < count:
        raise Lost(f"read {seen} of {count} records")
    return seen / elapsed


def end_to_end_ms(side, topic: str, rate_per_s: int = 1000, duration_s: float = 5.0) -> tuple[float, float]:
    """Idempotent acks=all RF 3 producer at a fixed rate, a read_committed reader on the same
    machine: send call to the record's arrival at the reader; (p50, p99)."""
    side.create(topic, 1, 3, {"min.insync.replicas": "2"})
    _full_isr(side, topic)
    sent_at: dict[bytes, float] = {}
    arrived: list[float] = []
    total = int(rate_per_s * duration_s)
    stop = threading.Event()

    def reader():
        for value, now in side.tail(topic, total, stop):
            if value in sent_at:
                arrived.append(now - sent_at[value])
    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    time.sleep(1.0)      # the reader is positioned at the log end before the first send
    _send_paced(side, topic, total, rate_per_s, sent_at, lambda value, error: None)
    thread.join(60)
    stop.set()
    if len(arrived) < total:
        raise Lost(f"the reader saw {len(arrived)} of {total} records")
    return _p50_p99_ms(arrived)


def _send_paced(side, topic: str, total: int, rate_per_s: int, sent_at: dict, on_ack) -> None:
    """Send `total` numbered records at `rate_per_s`, noting each one's send time."""
    send, pump, close = side.producer(on_ack)
    started = time.perf_counter()
    for i in range(total):
        due = started + i / rate_per_s
        while time.perf_counter() < due:
            pump()
            time.sleep(0.0005)
        value = str(i).encode()
        sent_at[value] = time.perf_counter()
        send(topic, value)
    close()


def _p50_p99_ms(seconds: list[float]) -> tuple[float, float]:
    ordered = sorted(seconds)
    return ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.99)] * 1000


def latency_percentiles_ms(side, topic: str, rate_per_s: int = 5000, duration_s: float = 5.0) -> tuple[float, float]:
    """acks=all RF 3: send call to acknowledgement at a fixed rate; (p50, p99)."""
    side.create(topic, 1, 3, {"min.insync.replicas": "2"})
    _full_isr(side, topic)
    sent_at: dict[bytes, float] = {}
    latencies: list[float] = []
    lock = threading.Lock()

    def on_ack(value, error):
        now = time.perf_counter()
        with lock:
            if error is None and value in sent_at:
                latencies.append(now - sent_at[value])
    total = int(rate_per_s * duration_s)
    _send_paced(side, topic, total, rate_per_s, sent_at, on_ack)
    if len(latencies) < total:
        raise Lost(f"{total - len(latencies)} of {total} records not acknowledged")
    return _p50_p99_ms(latencies)


FIGURES = [
    ("produce_rf3_per_record_rps", "produce acks=all RF 3, per record (send/produce), 100 B", "records/s", True),
    ("latency_p50_ms", "produce latency p50, acks=all RF 3, 5k rec/s", "ms", False),
    ("latency_p99_ms", "produce latency p99, acks=all RF 3, 5k rec/s", "ms", False),
    ("consume_rf3_rps", "consume read_committed from a RF 3 topic", "records/s", True),
    ("e2e_p50_ms", "end to end p50, idempotent acks=all RF 3, 1k rec/s, read_committed", "ms", False),
    ("e2e_p99_ms", "end to end p99, idempotent acks=all RF 3, 1k rec/s, read_committed", "ms", False),
    ("replication_mb_s", "replication to the 2 followers during the bulk produce (disk: see notes)", "MB/s", True),
    ("failover_kill_ms", "failover after kill -9 (longest ack pause)", "ms", False),
    ("failover_shutdown_ms", "failover after SIGTERM, controlled shutdown (longest ack pause)", "ms", False),
    ("metadata_1000_ms", "metadata of 1,000 new partitions on every broker", "ms", False),
    ("produce_rf3_rps", "produce acks=all RF 3, bulk, 100 B", "records/s", True),
    ("restart_s", "broker restart with N partitions (until listed live)", "s", False),
    ("copier_rps", "transactional copier, RF 3, offsets in the transaction", "records/s", True),
    ("commit_p50_ms", "commit_transaction p50, 1-record transactions, RF 3", "ms", False),
    ("commit_p99_ms", "commit_transaction p99, 1-record transactions, RF 3", "ms", False),
    ("coordinator_failover_ms", "transaction coordinator kill -9 to the next committed transaction", "ms", False),
]


def run_side(side, quick: bool, progress) -> dict:
    repeats = 1 if quick else 3
    results: dict[str, dict] = {}
    side.start()
    try:
        def measure(key, fn):
            samples = []
            try:
                for run in range(repeats):
                    samples.append(fn(run))
                    progress(f"{side.name}: {key} run {run + 1}: {samples[-1]:,.1f}")
                results[key] = {"status": "ok", "value": statistics.median(samples), "samples": samples}
            except Lost as exc:
                progress(f"{side.name}: {key}: LOST: {exc}")
                results[key] = {"status": "lost", "detail": str(exc)}
            except Exception as exc:
                traceback.print_exc()
                progress(f"{side.name}: {key}: error: {exc}")
                results[key] = {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
        measure("failover_kill_ms", lambda run: failover_ms(side, f"fk{run}", signal.SIGKILL))
        measure("failover_shutdown_ms", lambda run: failover_ms(side, f"fs{run}", signal.SIGTERM))
        measure("metadata_1000_ms", lambda run: metadata_propagation_ms(side, f"meta{run}", 1000))
        count = 200_000 if quick else 1_000_000
        measure("produce_rf3_rps", lambda run: produce_records_per_s(side, f"prod{run}", count))
        ok = results.get("produce_rf3_rps", {})
        if ok.get("status") == "ok":
            # every record is written twice more, by the two followers (value + ~70 B of batch
            # and record overhead counted as the value's 100 B only: a lower bound)
            results["replication_mb_s"] = {"status": "ok", "value": ok["value"] * 200 / 1e6,
                                           "samples": [s * 200 / 1e6 for s in ok["samples"]]}
        measure("consume_rf3_rps", lambda run: consume_records_per_s(side, f"prod{run}", count))
        measure("produce_rf3_per_record_rps",
                lambda run: produce_records_per_s(side, f"rec{run}", count // 4, bulk=False))
        latencies = []

        def one_latency_run(run):
            p50, p99 = latency_percentiles_ms(side, f"lat{run}")
            latencies.append(p99)
            return p50
        measure("latency_p50_ms", one_latency_run)
        if latencies:
            results["latency_p99_ms"] = {"status": "ok", "value": statistics.median(latencies), "samples": latencies}
        e2e_p99 = []

        def one_e2e_run(run):
            p50, p99 = end_to_end_ms(side, f"e2e{run}")
            e2e_p99.append(p99)
            return p50
        measure("e2e_p50_ms", one_e2e_run)
        if e2e_p99:
            results["e2e_p99_ms"] = {"status": "ok", "value": statistics.median(e2e_p99), "samples": e2e_p99}
        measure("copier_rps", lambda run: copier_records_per_s(side, f"cin{run}", f"cout{run}",
                                                               50_000 if quick else 200_000))
        commit_p99 = []

        def one_commit_run(run):
            p50, p99 = commit_latency_ms(side, f"commit{run}")
            commit_p99.append(p99)
            return p50
        measure("commit_p50_ms", one_commit_run)
        if commit_p99:
            results["commit_p99_ms"] = {"status": "ok", "value": statistics.median(commit_p99), "samples": commit_p99}
        measure("coordinator_failover_ms", lambda run: coordinator_failover_ms(side, f"cf{run}"))
        partitions = 1000 if quick else 10_000
        repeats_saved = repeats
        repeats = 1      # topics accumulate: one restart run
        measure("restart_s", lambda run: restart_s(side, partitions))
        repeats = repeats_saved
        results["restart_s"]["partitions"] = partitions
    finally:
        side.stop()
    return results


def table(run: dict) -> str:
    lines = ["| figure | eos | Kafka | ratio (>1 = eos better) |", "| --- | ---: | ---: | ---: |"]
    for key, label, unit, higher in FIGURES:
        cells = []
        values = {}
        for system in ("eos", "kafka"):
            outcome = run["systems"].get(system, {}).get(key)
            if outcome is None:
                cells.append("-")
            elif outcome["status"] != "ok":
                cells.append(outcome["status"].upper())
            else:
                values[system] = outcome["value"]
                samples = outcome["samples"]
                spread = f" ({min(samples):,.0f}-{max(samples):,.0f})" if len(samples) > 1 else ""
                cells.append(f"{outcome['value']:,.1f} {unit}{spread}")
        ratio = "-"
        if len(values) == 2 and values["eos"] > 0 and values["kafka"] > 0:
            r = values["eos"] / values["kafka"] if higher else values["kafka"] / values["eos"]
            ratio = f"{r:.2f}"
        lines.append(f"| {label} | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--systems", default="kafka,eos")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--tmp-dir", default=os.environ.get("EOS_BENCH_TMP", tempfile.gettempdir()))
    args = parser.parse_args(argv)
    started = dt.datetime.now(dt.timezone.utc)
    t0 = time.monotonic()

    def progress(message):
        print(f"[{time.monotonic() - t0:6.1f}s] {message}", flush=True)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    # every side's data goes here and is removed at the end, not as each side stops (above)
    data_dir = tempfile.mkdtemp(prefix="eos-bench-cluster-run-", dir=args.tmp_dir)
    run = {"command": "python -m bench.cluster " + " ".join(argv if argv is not None else sys.argv[1:]),
           "started_utc": started.isoformat(timespec="seconds"), "quick": args.quick,
           "loadavg_at_start": os.getloadavg(), "python_probe_ms_at_start": python_probe_ms(),
           "systems": {}}
    try:
        for system in systems:
            progress(f"{system}: starting a 3-broker cluster")
            try:
                side = KafkaSide(data_dir) if system == "kafka" else EosSide(data_dir)
                run["systems"][system] = run_side(side, args.quick, progress)
            except Exception as exc:
                traceback.print_exc()
                run["systems"][system] = {key: {"status": "error", "detail": f"{type(exc).__name__}: {exc}"}
                                          for key, *_ in FIGURES}
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    from bench import disk
    speed = disk.measure(args.tmp_dir, 256)
    run["disk_buffered_mb_s"] = speed.buffered_mb_s
    run["disk_fsync_mb_s"] = speed.fsync_mb_s
    run["loadavg_at_end"] = os.getloadavg()
    run["python_probe_ms_at_end"] = python_probe_ms()
    run["duration_s"] = round(time.monotonic() - t0, 1)
    text = table(run)
    print()
    print(text)
    partial = args.quick or systems != ["kafka", "eos"]
    out = args.out or (RESULTS_DIR / "tmp" if partial else RESULTS_DIR)
    stem = f"cluster-{started:%Y-%m-%d}-{socket.gethostname()}"
    header = (f"# Cluster benchmark\n\n`{run['command']}` at {run['started_utc']} "
              f"({run['duration_s']} s, load {run['loadavg_at_start'][0]:.1f} at start); raw disk here "
              f"{run['disk_buffered_mb_s']:,.0f} MB/s buffered, {run['disk_fsync_mb_s']:,.0f} MB/s with fsync."
              + python_probe_sentence(run) + "\n\n")
    write_run(out, stem, None if partial else "cluster-latest", run, header + text + "\n")
    failed = [(s, k) for s, figures in run["systems"].items() for k, o in figures.items()
              if isinstance(o, dict) and o.get("status") in ("lost", "error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
