"""`eos demo`: an exactly-once Spark pipeline, killed hard in the middle, checked exactly.

Theory of operation
-------------------
1. Start an embedded broker in a subprocess (`python -m broker --port 0`, a temp data dir).
2. Seed `orders` with N records: key = customer, value = "order_id,customer,amount_cents".
3. Run a two-stage pipeline (`pipeline_app`) in a child process, each stage an
   exactly-once streaming query with `maxRecordsPerTrigger` so it takes several batches:
      enrich: orders -> orders_enriched, joined with a static customers table (region)
      price:  orders_enriched -> orders_priced, joined with a static tax table
4. While stage 1 runs, watch its output topic; as soon as a transaction is open with
   records written but not committed (the read_uncommitted end is past the
   read_committed end) -- or, failing that, once stage 1 is half done -- kill the child's
   whole process group with SIGKILL (driver, JVM and Python workers at once).
5. Start the pipeline again on the same checkpoints; it fences the dead driver's
   transaction (aborting what it wrote), replays the interrupted batch and runs to the end.
6. Read `orders_priced` (and `orders_enriched`) back read_committed and compare with what
   the seeded orders must give: the count, no order twice, and the total per region.

The progress bar counts committed output records of both stages. `python -m eos.demo
pipeline ...` is the child's entry point (also used by the crash tests).

With `--brokers 3` step 1 starts a local cluster instead (its own ZooKeeper, three broker
processes; topics with replication factor 3 and min.insync.replicas 2), and step 4 first
kills, with SIGKILL and in the middle of an open transaction of stage 1, the broker that
leads most of stage 1's output partitions, then restarts it; the pipeline is killed later,
in another open transaction, as on one broker. The report is the same.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ORDERS, ENRICHED, PRICED = "orders", "orders_enriched", "orders_priced"
PARTITIONS = 3
CUSTOMERS = 97
REGIONS = ("north", "south", "east", "west", "central")
TAX_PERCENT = {"north": 8, "south": 6, "east": 10, "west": 7, "central": 5}
BROKER_READY_TIMEOUT_S = 60
CLUSTER_SESSION_TIMEOUT_MS = 6000     # a killed broker's leaderships move after this
PIPELINE_TIMEOUT_S = 900
_LISTENING = re.compile(r"eos broker listening on (\S+):(\d+)")


# ---- the data and what it must give -------------------------------------------------------------

def customer_of(order_id: int) -> str:
    return f"c{order_id % CUSTOMERS:03d}"


def region_of(customer: str) -> str:
    return REGIONS[int(customer[1:]) % len(REGIONS)]


def amount_of(order_id: int) -> int:
    return (order_id * 7919) % 10_000 + 1


def order_records(first: int, count: int) -> tuple[list[bytes], list[bytes]]:
    keys, values = [], []
    for order_id in range(first, first + count):
        customer = customer_of(order_id)
        keys.append(customer.encode())
        values.append(f"{order_id},{customer},{amount_of(order_id)}".encode())
    return keys, values


def expected_totals(records: int) -> dict[str, int]:
    """Total price (amount plus the region's tax, rounded down per order) per region."""
    totals: dict[str, int] = collections.defaultdict(int)
    for order_id in range(records):
        region = region_of(customer_of(order_id))
        totals[region] += amount_of(order_id) * (100 + TAX_PERCENT[region]) // 100
    return dict(totals)


@dataclasses.dataclass
class Check:
    ok: bool
    problems: list[str]
    enriched: int
    priced: int
    duplicates: int
    totals: dict[str, int]


def check_output(bootstrap: str, records: int, *, timeout_s: float = 120.0) -> Check:
    """Compare the read_committed outputs with what `records` seeded orders must give."""
    from spark_sink.readback import read_committed

    problems = []
    enriched = read_committed(bootstrap, ENRICHED, timeout_s=timeout_s)
    priced = read_committed(bootstrap, PRICED, timeout_s=timeout_s)
    totals: dict[str, int] = collections.defaultdict(int)
    seen: collections.Counter = collections.Counter()
    for record in priced:
        order_id, region, total = record.value.decode().split(",")
        seen[int(order_id)] += 1
        totals[region] += int(total)
        if record.key != region.encode():
            problems.append(f"order {order_id}: key {record.key!r} is not its region {region!r}")
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    enriched_ids = collections.Counter(int(r.value.decode().split(",")[0]) for r in enriched)
    if len(enriched) != records or set(enriched_ids) != set(range(records)):
        problems.append(f"{ENRICHED}: {len(enriched)} records for {records} orders "
                        f"({sum(n - 1 for n in enriched_ids.values() if n > 1)} duplicates)")
    if len(priced) != records:
        problems.append(f"{PRICED}: {len(priced)} records, expected {records}")
    if duplicates:
        problems.append(f"{PRICED}: {duplicates} duplicate orders")
    missing = records - len(set(seen) & set(range(records)))
    if missing:
        problems.append(f"{PRICED}: {missing} orders missing")
    expected = expected_totals(records)
    if dict(totals) != expected:
        wrong = {r: (totals.get(r, 0), expected.get(r, 0)) for r in sorted(set(totals) | set(expected))
                 if totals.get(r, 0) != expected.get(r, 0)}
        problems.append(f"{PRICED}: totals per region differ (got, expected): {wrong}")
    return Check(not problems, problems, len(enriched), len(priced), duplicates, dict(totals))


# ---- the pipeline -------------------------------------------------------------------------------

def _split_value(df, names: list[str]):
    from pyspark.sql import functions as F

    fields = F.split(F.col("value").cast("string"), ",")
    return df.select(*[fields[i].alias(name) for i, name in enumerate(names)])


def pipeline_app(bootstrap: str, checkpoint_dir: str, *, max_records_per_trigger: int | None = None, spark=None):
    """The demo's two stages as an `eos.App` (not started)."""
    from pyspark.sql import functions as F

    from spark_sink.app import App

    app = App(bootstrap, spark=spark, checkpoint_dir=checkpoint_dir, max_records_per_trigger=max_records_per_trigger)

    @app.stage(source=ORDERS, sink=ENRICHED, group="demo-enricher")
    def enrich(orders):
        customers = orders.sparkSession.createDataFrame(
            [(f"c{i:03d}", region_of(f"c{i:03d}")) for i in range(CUSTOMERS)], "customer string, region string")
        parsed = _split_value(orders, ["order_id", "customer", "amount_cents"])
        joined = parsed.join(F.broadcast(customers), "customer")
        return joined.select(F.col("customer").alias("key"),
                             F.concat_ws(",", "order_id", "customer", "region", "amount_cents").alias("value"))

    @app.stage(source=ENRICHED, sink=PRICED, group="demo-pricer")
    def price(enriched):
        taxes = enriched.sparkSession.createDataFrame(sorted(TAX_PERCENT.items()), "region string, tax_pct long")
        parsed = _split_value(enriched, ["order_id", "customer", "region", "amount_cents"])
        joined = parsed.join(F.broadcast(taxes), "region")
        total = F.expr("(cast(amount_cents as long) * (100 + tax_pct)) div 100")
        return joined.select(F.col("region").alias("key"),
                             F.concat_ws(",", "order_id", "region", total.cast("string")).alias("value"))

    return app


def run_pipeline(argv: list[str] | None = None) -> int:
    """`python -m eos.demo pipeline --bootstrap B --checkpoint-dir D [--max-records-per-trigger N]`:
    run the demo pipeline until both stages drained their input."""
    parser = argparse.ArgumentParser(prog="python -m eos.demo pipeline")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--checkpoint-dir", required=True)
    parser.add_argument("--max-records-per-trigger", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("eos").setLevel(logging.INFO)
    app = pipeline_app(args.bootstrap, args.checkpoint_dir, max_records_per_trigger=args.max_records_per_trigger)
    app.run(available_now=True, timeout_s=PIPELINE_TIMEOUT_S)
    for name, sink in app.sinks.items():
        written = [r for r in sink.reports if not r.skipped]
        print(f"stage {name}: {len(written)} batches, {sum(r.records for r in written)} records, "
              f"{sum(1 for r in sink.reports if r.skipped)} replayed batches skipped", flush=True)
    return 0


# ---- processes ----------------------------------------------------------------------------------

class BrokerProcess:
    """An embedded broker in a subprocess on a free port, its output in a log file."""

    def __init__(self, data_dir: Path, log_path: Path):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "broker", "--data-dir", str(data_dir), "--port", "0"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + BROKER_READY_TIMEOUT_S
        while True:
            found = _LISTENING.search(log_path.read_text(errors="replace"))
            if found:
                self.address = f"{found.group(1)}:{found.group(2)}"
                break
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the broker did not start; its log:\n{_tail(log_path)}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


def start_pipeline(bootstrap: str, checkpoint_dir: Path, log_path: Path, *, max_records_per_trigger: int,
                   env: dict | None = None) -> subprocess.Popen:
    """The pipeline in a child process that leads its own process group (so one killpg
    takes the driver, its JVM and its Python workers down together)."""
    command = [sys.executable, "-m", "eos.demo", "pipeline", "--bootstrap", bootstrap,
               "--checkpoint-dir", str(checkpoint_dir), "--max-records-per-trigger", str(max_records_per_trigger)]
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})


def kill_hard(process: subprocess.Popen) -> None:
    """SIGKILL the pipeline's driver, its JVM and its Python workers at once."""
    from eos.processes import kill_tree

    kill_tree(process)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _group_progress(bootstrap: str, group: str, topic: str) -> int:
    """The sum of the group's committed offsets on `topic` (pending commits not waited for)."""
    from eos.types import TopicPartition
    from spark_sink.owner import group_offsets

    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    return sum(group_offsets(bootstrap, group, tps, require_stable=False).values())


def _ends(admin, topic: str) -> tuple[int, int]:
    """(read_committed end, log end), summed over the partitions of `topic`."""
    from eos.types import TopicPartition

    tps = {TopicPartition(topic, p): "latest" for p in range(PARTITIONS)}
    committed = admin.list_offsets(tps, isolation_level="read_committed")
    uncommitted = admin.list_offsets(tps, isolation_level="read_uncommitted")
    return sum(committed.values()), sum(uncommitted.values())


# ---- the demo -----------------------------------------------------------------------------------

class ClusterBrokers:
    """`--brokers N`: a local cluster (eos.local_cluster) with its own ZooKeeper."""

    def __init__(self, work: Path, brokers: int, out):
        from eos.local_cluster import LocalCluster

        self.replication_factor = min(3, brokers)
        self.cluster = LocalCluster(work / "cluster", brokers=brokers, broker_config={
            "zookeeper.session.timeout.ms": str(CLUSTER_SESSION_TIMEOUT_MS)})
        print(f"  starting ZooKeeper and {brokers} brokers ...", file=out, flush=True)
        self.cluster.start(progress=lambda b: print(f"  broker {b} up", file=out, flush=True))
        self.address = self.cluster.bootstrap

    def topic_config(self) -> dict[str, str]:
        return {"min.insync.replicas": str(min(2, self.replication_factor))}

    def busiest_leader(self, admin, topic: str) -> int:
        leaders = [p["leader"] for p in admin.describe_topic(topic)["partitions"] if p["leader"] >= 0]
        return max(sorted(set(leaders)), key=leaders.count)

    def stop(self) -> None:
        self.cluster.stop()


def run_demo(records: int = 200_000, keep_data: bool = False, *, out=None, brokers: int = 1) -> int:
    """The whole demo (see the module doc). Returns the exit code: 0 when the output is exact."""
    from eos.admin import Admin
    from eos.progress import ProgressBar
    from producer import Producer

    out = out or sys.stdout
    if records < 1000:
        print("eos demo: --records must be at least 1000", file=sys.stderr)
        return 2
    if brokers < 1:
        print("eos demo: --brokers must be at least 1", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="eos-demo-"))
    started = time.monotonic()
    broker = pipeline = None
    per_trigger = max(500, records // 8)
    try:
        where = "an embedded broker" if brokers == 1 else f"a {brokers}-broker cluster"
        print(f"eos demo: {records:,} orders through a two-stage exactly-once Spark pipeline on {where} "
              f"(work dir {work})", file=out, flush=True)
        if brokers == 1:
            broker = BrokerProcess(work / "data", work / "broker.log")
            cluster = None
        else:
            broker = cluster = ClusterBrokers(work, brokers, out)
        print(f"  {'broker' if cluster is None else 'cluster'} up at {broker.address}", file=out, flush=True)
        with Admin(broker.address) as admin:
            for topic in (ORDERS, ENRICHED, PRICED):
                if cluster is None:
                    admin.create_topic(topic, partitions=PARTITIONS)
                else:
                    admin.create_topic(topic, partitions=PARTITIONS, replication_factor=cluster.replication_factor,
                                       config=cluster.topic_config())
        with Producer(broker.address, linger_ms=20) as producer, ProgressBar(records, "  seed orders") as bar:
            chunk = 20_000
            for first in range(0, records, chunk):
                keys, values = order_records(first, min(chunk, records - first))
                producer.send_batch(ORDERS, values, keys=keys).result(120)
                bar.advance(len(values))

        checkpoints = work / "checkpoints"
        pipeline_log = work / "pipeline.log"
        kill_note = "the pipeline finished before it could be killed"
        broker_note = None if cluster is None else "the pipeline finished before a broker could be killed"
        with Admin(broker.address) as admin, ProgressBar(2 * records, "  pipeline (records through both stages)") as bar:
            def progress() -> tuple[int, int]:
                """(stage-1 records committed, records written in stage 1's open transaction)."""
                stage1 = _group_progress(broker.address, "demo-enricher", ORDERS)
                stage2_offsets = _group_progress(broker.address, "demo-pricer", ENRICHED)
                enriched_committed_end, enriched_end = _ends(admin, ENRICHED)
                # the enriched log holds markers too: count stage 2 as a share of it
                stage2 = records * stage2_offsets // enriched_end if enriched_end else 0
                bar.advance(max(0, stage1 + stage2 - bar.done))
                return stage1, enriched_end - enriched_committed_end

            pipeline = start_pipeline(broker.address, checkpoints, pipeline_log, max_records_per_trigger=per_trigger)
            deadline = time.monotonic() + PIPELINE_TIMEOUT_S
            broker_killed_at = None
            while pipeline.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the first pipeline run did not reach the kill point in time")
                stage1, open_records = progress()
                if cluster is not None and broker_killed_at is None and (
                        (stage1 >= records // 8 and open_records > 0) or stage1 >= records // 4):
                    victim = cluster.busiest_leader(admin, ENRICHED)
                    cluster.cluster.kill(victim)
                    broker_killed_at = stage1
                    broker_note = (f"killed broker {victim} (leader of {ENRICHED} partitions) with SIGKILL with "
                                   f"{stage1:,} orders through stage 1 and {open_records:,} records written in "
                                   f"its open transaction; restarted it")
                    print(f"\n  {broker_note}", file=out, flush=True)
                    # not waited for here: the restarted broker registers only once its old
                    # ZooKeeper session expired (seconds), and the pipeline goes on meanwhile;
                    # a loop blocked that long could miss the pipeline's kill point
                    cluster.cluster.restart(victim, wait=False)
                    continue
                if cluster is not None and (broker_killed_at is None or stage1 <= broker_killed_at):
                    time.sleep(0.05)
                    continue     # on a cluster the pipeline dies after the broker, at a later point
                if (stage1 >= records // 4 and open_records > 0) or stage1 >= records // 2:
                    kill_hard(pipeline)
                    kill_note = (f"killed the pipeline with SIGKILL (driver, JVM and workers) with "
                                 f"{stage1:,} of {records:,} orders through stage 1 and {open_records:,} "
                                 f"records written in its open transaction")
                    break
                time.sleep(0.05)
            first_exit = pipeline.returncode
            if broker_killed_at is not None:
                cluster.cluster.wait_broker_started(victim)
            if first_exit not in (None, 0, -signal.SIGKILL):
                raise RuntimeError(f"the pipeline failed (exit {first_exit}); its log:\n{_tail(pipeline_log)}")
            print(f"\n  {kill_note}", file=out, flush=True)

            pipeline = start_pipeline(broker.address, checkpoints, pipeline_log, max_records_per_trigger=per_trigger)
            while pipeline.poll() is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the restarted pipeline did not finish in time")
                progress()
                time.sleep(0.2)
            if pipeline.returncode != 0:
                raise RuntimeError(f"the restarted pipeline failed (exit {pipeline.returncode}); its log:\n"
                                   f"{_tail(pipeline_log)}")
            progress()
        check = check_output(broker.address, records)
        elapsed_s = time.monotonic() - started
        print("", file=out)
        print("eos demo report", file=out)
        print(f"  orders seeded:            {records:,}", file=out)
        print(f"  {ENRICHED + ':':26}{check.enriched:,} records (read_committed)", file=out)
        print(f"  {PRICED + ':':26}{check.priced:,} records, {check.duplicates} duplicates", file=out)
        for region in sorted(check.totals):
            print(f"  total {region + ':':20}{check.totals[region]:,} cents "
                  f"(expected {expected_totals(records)[region]:,})", file=out)
        print(f"  crash:                    {kill_note}", file=out)
        if broker_note is not None:
            print(f"  broker crash:             {broker_note}", file=out)
        print(f"  time:                     {elapsed_s:.1f} s", file=out)
        if check.ok:
            print("  result: EXACTLY ONCE -- every order once, totals exact", file=out)
            return 0
        print("  result: WRONG", file=out)
        for problem in check.problems:
            print(f"    - {problem}", file=out)
        return 1
    except Exception as exc:
        print(f"\neos demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if pipeline is not None and pipeline.poll() is None:
            kill_hard(pipeline)
        if broker is not None:
            broker.stop()
        if keep_data:
            print(f"  data kept in {work}", file=out)
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["pipeline"]:
        return run_pipeline(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m eos.demo")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keep-data", action="store_true")
    parser.add_argument("--brokers", type=int, default=1,
                        help="1: an embedded broker (default); 3: a local cluster with ZooKeeper")
    args = parser.parse_args(argv)
    return run_demo(records=args.records, keep_data=args.keep_data, brokers=args.brokers)


if __name__ == "__main__":
    sys.exit(main())
