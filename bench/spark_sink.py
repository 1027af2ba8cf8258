"""python -m bench.spark_sink: one Spark stage with the exactly-once sink against the same
stage with a plain at-least-once sink, in the same run (issue 6, "Measure").

Theory of operation
-------------------
A broker subprocess (temp dir, free port) and one local[2] SparkSession. The input topic
is seeded with `--records` records (100-byte values, keyed) in 3 partitions. The stage
reads it with the eos source (read_committed), upper-cases the value, and writes to a
fresh output topic through either sink, with trigger(availableNow=True) and
maxRecordsPerTrigger = `--batch` so the run is many micro-batches. Rounds alternate the
two sinks (exactly-once first, then at-least-once, `--rounds` times) so that drift in the
machine's load hits both alike. Reported per sink: records/s over the query's wall time
(first batch to termination; Spark start-up excluded), the median over rounds; for the
exactly-once sink also the commit latency of a micro-batch -- offsets + EndTxn on the
driver, from the end of the executors' writes to the decision -- p50/p99 over every batch
of every round, and the whole batch (write + commit) p50/p99. The output of every run is
read back (read_committed) and counted, so a broken sink cannot post a speed.

``python -m bench.spark_sink stage --spec FILE`` is the driver side of the harness's
"spark" workload (bench/workloads/spark.py), run in a child process so that the workload
can SIGKILL it: one SparkSession, then the same stage -- read the input topic, upper-case
the value, write the output topic, availableNow with a per-trigger cap -- through either
Spark's own Kafka source and sink (``system: kafka``; the connector jars come in the spec)
or the eos source and ExactlyOnceSink (``system: eos``). The spec (JSON) names an optional
warm-up run, the measured runs and a last run (the one the workload kills, or, in a standby
driver, the restart of it: that one waits for a "go" file before its last run); after each
run the driver rewrites the result file with every wall time so far (and, for the measured
runs, their `query_phases`: start() to the first micro-batch, and the pace of the batches
after it, from Spark's progress reports), so a killed driver leaves what it finished.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from spark_sink.spark_home import prepare_python_workers

STAGE_INPUT = "bench_in"
PARTITIONS = 3
VALUE_BYTES = 100


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def seed(address: str, records: int, topic: str = STAGE_INPUT) -> None:
    from producer import Producer

    with Producer(address, linger_ms=20) as producer:
        chunk = 20_000
        for first in range(0, records, chunk):
            count = min(chunk, records - first)
            keys = [f"key-{i % 1000}".encode() for i in range(first, first + count)]
            values = [(f"value-{i}-".encode() + b"x" * VALUE_BYTES)[:VALUE_BYTES] for i in range(first, first + count)]
            producer.send_batch(topic, values, keys=keys).result(120)


def _epoch_s(timestamp: str) -> float:
    """A progress report's "timestamp" (ISO 8601, UTC, e.g. 2026-11-27T12:00:01.250Z) in
    seconds since the epoch."""
    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def query_phases(progress: list, started_epoch_s: float) -> dict:
    """Where a finished query's time went, from Spark's own progress reports (so the same
    for either source and sink): `to_first_batch_s`, from start() (`started_epoch_s`) to
    the start of the first micro-batch that read records -- what the query pays before
    any work (on eos mostly the Python worker Spark starts for a Python streaming source);
    `first_batch_s`, that batch's triggerExecution; `later_records` and `later_s`, the
    records and summed triggerExecution of the micro-batches after it (the steady pace).
    None of them when no batch read anything."""
    batches = sorted((p for p in progress if p["numInputRows"] > 0), key=lambda p: p["batchId"])
    if not batches:
        return {}
    first, later = batches[0], batches[1:]
    return {"to_first_batch_s": _epoch_s(first["timestamp"]) - started_epoch_s,
            "first_batch_s": first["durationMs"]["triggerExecution"] / 1000,
            "later_records": sum(p["numInputRows"] for p in later),
            "later_s": sum(p["durationMs"]["triggerExecution"] for p in later) / 1000}


def run_stage(spark, address: str, sink, checkpoint: str, batch: int, source: str = STAGE_INPUT) -> float:
    """Run the stage to the end of the input; return its wall time in seconds."""
    from pyspark.sql import functions as F

    stream = (spark.readStream.format("eos").option("bootstrap", address).option("subscribe", source)
              .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", str(batch)).load())
    staged = stream.select("key", F.upper(F.col("value").cast("string")).alias("value"))
    started = time.perf_counter()
    query = (staged.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    _await(query, 1800)
    return time.perf_counter() - started


def _await(query, timeout_s: float) -> None:
    try:
        if not query.awaitTermination(timeout_s):
            raise TimeoutError(f"the benchmark stage did not finish in {timeout_s:.0f} s")
        if query.exception() is not None:
            raise RuntimeError(f"the stage failed: {query.exception()}")
    finally:
        query.stop()


def run_kafka_stage(spark, bootstrap: str, source: str, output: str, checkpoint: str,
                    per_trigger: int, timeout_s: float) -> dict:
    """The stage through Spark's built-in Kafka source and sink: its wall time in seconds
    (`wall_s`) and its `query_phases`.

    The source reads read_committed (the eos source's default; Kafka's consumer default
    is read_uncommitted) and caps each micro-batch at `per_trigger` offsets; the sink is
    Spark's: a Kafka producer per task, no transaction, so a replayed batch is written
    again."""
    from pyspark.sql import functions as F

    stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(per_trigger))
              .option("kafka.isolation.level", "read_committed").load())
    staged = stream.select("key", F.upper(F.col("value").cast("string")).alias("value"))
    started, started_epoch_s = time.perf_counter(), time.time()
    query = (staged.writeStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("topic", output).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    _await(query, timeout_s)
    return {"wall_s": time.perf_counter() - started, **query_phases(query.recentProgress, started_epoch_s)}


def run_eos_stage(spark, bootstrap: str, source: str, output: str, checkpoint: str,
                  per_trigger: int, timeout_s: float) -> dict:
    """The stage through the eos source and ExactlyOnceSink: its wall time in seconds
    (`wall_s`) and its `query_phases`.

    The transactional id and the group are named after the output topic, so a restarted
    driver on the same checkpoint fences the killed one and recognises its batches."""
    from pyspark.sql import functions as F

    from spark_sink.sink import ExactlyOnceSink

    stream = (spark.readStream.format("eos").option("bootstrap", bootstrap).option("subscribe", source)
              .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", str(per_trigger)).load())
    staged = stream.select("key", F.upper(F.col("value").cast("string")).alias("value"))
    sink = ExactlyOnceSink(bootstrap, output, transactional_id=f"bench-spark-{output}",
                           group_id=f"bench-spark-{output}", checkpoint_location=checkpoint)
    try:
        started, started_epoch_s = time.perf_counter(), time.time()
        query = (staged.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        _await(query, timeout_s)
        return {"wall_s": time.perf_counter() - started, **query_phases(query.recentProgress, started_epoch_s)}
    finally:
        sink.close()


def _session(app_name: str, jars: list[str]):
    from pyspark.sql import SparkSession

    prepare_python_workers()      # both systems' drivers: workers import the installed pyspark
    builder = (SparkSession.builder.master("local[2]").appName(app_name)
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.python.worker.reuse", "true")
               .config("spark.ui.showConsoleProgress", "false"))
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    return builder.getOrCreate()


def _wait_for_file(path: Path, timeout_s: float) -> None:
    """A standby driver (started and warmed up while another driver still runs on the
    same checkpoint) starts its last run only when the workload says the other is gone."""
    print(f"waiting for {path}", flush=True)
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)


def stage_main(argv: list[str]) -> int:
    """The harness's Spark driver: the runs of one spec (see the module doc), timed."""
    parser = argparse.ArgumentParser(prog="python -m bench.spark_sink stage")
    parser.add_argument("--spec", type=Path, required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.spec.read_text())
    system = spec["system"]
    if system not in ("kafka", "eos"):
        raise SystemExit(f"spec: system must be kafka or eos, got {system!r}")
    result_path = Path(spec["result_path"])
    run_fn = run_kafka_stage if system == "kafka" else run_eos_stage
    spark = _session(f"eos-bench-spark-{system}", spec.get("jars", []))
    try:
        spark.sparkContext.setLogLevel("ERROR")
        if system == "eos":
            import spark_sink

            spark_sink.register(spark)
        # `phases`: the query_phases of each measured run ("wall_s"), in the same order
        results: dict[str, list] = {"warmup_s": [], "wall_s": [], "last_s": [], "phases": []}
        for kind, runs in (("warmup_s", spec.get("warmup", [])), ("wall_s", spec.get("runs", [])),
                           ("last_s", spec.get("last", []))):
            if kind == "last_s" and spec.get("go_file"):
                _wait_for_file(Path(spec["go_file"]), float(spec.get("timeout_s", 600)))
            for run in runs:
                timing = run_fn(spark, spec["bootstrap"], run["input"], run["output"], run["checkpoint"],
                                int(spec["per_trigger"]), float(spec.get("timeout_s", 600)))
                if kind == "wall_s":
                    results["phases"].append({k: v for k, v in timing.items() if k != "wall_s"})
                results[kind].append(timing["wall_s"])
                print(f"{kind[:-2]} {run['output']}: {timing['wall_s']:.2f} s", flush=True)
                result_path.write_text(json.dumps(results))
    finally:
        spark.stop()
    return 0


def _warm_up(spark, address: str, work: Path) -> None:
    """Not measured: the first queries of a session pay for Python workers, class loading
    and code generation; neither sink should be charged for them."""
    from eos.admin import Admin
    from spark_sink.sink import AtLeastOnceSink, ExactlyOnceSink

    with Admin(address) as admin:
        for topic in ("warmup_in", "warmup_out_eo", "warmup_out_plain"):
            admin.create_topic(topic, partitions=PARTITIONS)
    seed(address, 3000, "warmup_in")
    for name, sink in (("eo", ExactlyOnceSink(address, "warmup_out_eo", transactional_id="warmup",
                                              group_id="warmup", checkpoint_location=str(work / "cp-warm-eo"))),
                       ("plain", AtLeastOnceSink(address, "warmup_out_plain"))):
        run_stage(spark, address, sink, str(work / f"cp-warm-{name}"), 1000, "warmup_in")
        sink.close()


def _measured_run(spark, address: str, work: Path, kind: str, round_index: int, records: int, batch: int):
    """One measured stage into a fresh output through `kind`'s sink, read back and counted:
    (records/s, the sink's per-batch reports)."""
    from eos.admin import Admin
    from spark_sink.readback import read_committed
    from spark_sink.sink import AtLeastOnceSink, ExactlyOnceSink

    output = f"bench_out_{kind}_{round_index}"
    with Admin(address) as admin:
        admin.create_topic(output, partitions=PARTITIONS)
    checkpoint = str(work / f"cp-{kind}-{round_index}")
    if kind == "exactly_once":
        sink = ExactlyOnceSink(address, output, transactional_id=f"bench-{round_index}",
                               group_id=f"bench-{round_index}", checkpoint_location=checkpoint)
    else:
        sink = AtLeastOnceSink(address, output)
    try:
        wall_s = run_stage(spark, address, sink, checkpoint, batch)
    finally:
        sink.close()
    written = len(read_committed(address, output, timeout_s=300))
    if written != records:
        raise RuntimeError(f"{kind} round {round_index}: {written} records in the output, expected {records}")
    rate = records / wall_s
    print(f"round {round_index} {kind:14} {records:,} records in {wall_s:6.1f} s: {rate:10,.0f} records/s",
          flush=True)
    return rate, sink.reports


def _print_summary(summary: dict, rounds: int) -> None:
    ratio = summary["exactly_once_records_per_s"] / summary["at_least_once_records_per_s"]
    print(f"\nexactly-once sink : {summary['exactly_once_records_per_s']:10,.0f} records/s (median of {rounds})")
    print(f"at-least-once sink: {summary['at_least_once_records_per_s']:10,.0f} records/s  (exactly-once / plain = "
          f"{ratio:.2f})")
    print(f"commit latency    : p50 {summary['commit_ms_p50']:.1f} ms, p99 {summary['commit_ms_p99']:.1f} ms "
          f"(offsets + EndTxn, {summary['batches']} batches)")
    print(f"whole batch       : p50 {summary['batch_ms_p50']:.0f} ms, p99 {summary['batch_ms_p99']:.0f} ms "
          f"(exactly-once: replay check + executor writes + commit); at-least-once p50 "
          f"{summary['plain_batch_ms_p50']:.0f} ms, p99 {summary['plain_batch_ms_p99']:.0f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_sink", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=25_000, help="maxRecordsPerTrigger")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)

    import spark_sink
    from eos.admin import Admin
    from eos.demo import BrokerProcess

    work = Path(tempfile.mkdtemp(prefix="eos-bench-spark-"))
    broker = BrokerProcess(work / "data", work / "broker.log")
    spark = None
    results: dict[str, list] = {"exactly_once": [], "at_least_once": []}
    commit_ms: list[float] = []
    batch_ms: list[float] = []
    plain_batch_ms: list[float] = []
    try:
        with Admin(broker.address) as admin:
            admin.create_topic(STAGE_INPUT, partitions=PARTITIONS)
        seed(broker.address, args.records)
        spark = _session("eos-bench-spark-sink", [])
        spark.sparkContext.setLogLevel("ERROR")
        spark_sink.register(spark)
        _warm_up(spark, broker.address, work)
        for round_index in range(args.rounds):
            for kind in ("exactly_once", "at_least_once"):
                rate, reports = _measured_run(spark, broker.address, work, kind, round_index, args.records,
                                              args.batch)
                results[kind].append(rate)
                if kind == "exactly_once":
                    commit_ms.extend(r.commit_ms for r in reports if not r.skipped)
                    batch_ms.extend(r.write_ms + r.commit_ms for r in reports if not r.skipped)
                else:
                    plain_batch_ms.extend(r.write_ms for r in reports)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
    summary = {
        "records": args.records, "batch": args.batch, "rounds": args.rounds, "value_bytes": VALUE_BYTES,
        "exactly_once_records_per_s": statistics.median(results["exactly_once"]),
        "at_least_once_records_per_s": statistics.median(results["at_least_once"]),
        "commit_ms_p50": _percentile(commit_ms, 0.50), "commit_ms_p99": _percentile(commit_ms, 0.99),
        "batch_ms_p50": _percentile(batch_ms, 0.50), "batch_ms_p99": _percentile(batch_ms, 0.99),
        "plain_batch_ms_p50": _percentile(plain_batch_ms, 0.50),
        "plain_batch_ms_p99": _percentile(plain_batch_ms, 0.99),
        "batches": len(commit_ms), "runs": results,
    }
    _print_summary(summary, args.rounds)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["stage"]:
        sys.exit(stage_main(sys.argv[2:]))
    sys.exit(main())
