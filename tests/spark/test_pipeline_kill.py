"""kill -9 of a running exactly-once pipeline at chosen and random points, then restarts:
the read_committed output equals the expected output exactly.

The pipeline is the demo's two stages (eos.demo.pipeline_app: orders -> orders_enriched,
joined with a static table -> orders_priced), run in a child process that leads its own
process group, with trigger availableNow and small micro-batches. Each run is killed with
SIGKILL to the whole group (driver, JVM, Python workers): at a named point of a batch
(EOS_SINK_CRASH_AT: after the executors wrote and before anything was committed -- in
either stage --, after the offsets joined the transaction, after the decision but before
Spark recorded the batch) or by the test at a random moment. The last run goes to the end; then the
outputs must hold every order exactly once, with exact totals per region."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import time

import pytest

from eos import demo
from spark_sink.sink import CRASH_ENV

RECORDS = 3000
PER_TRIGGER = 500
RUN_TIMEOUT_S = 300
RUNS = 6
# pytest-timeout's default (300 s, pyproject) would cut the whole test short under load --
# six pipeline runs, each starting a JVM -- before a run's own bound could name the
# stuck run with its log, and its teardown would stop the broker under the running pipeline.
TEST_TIMEOUT_S = RUNS * RUN_TIMEOUT_S + 300


def wait_for(process: subprocess.Popen, log_path, timeout_s: float = RUN_TIMEOUT_S) -> int:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        demo.kill_hard(process)
        raise AssertionError(f"a pipeline run did not end in {timeout_s} s; its log:\n{demo._tail(log_path)}")


@pytest.fixture
def seeded(eos_broker, admin):
    from producer import Producer

    for topic in (demo.ORDERS, demo.ENRICHED, demo.PRICED):
        admin.create_topic(topic, partitions=demo.PARTITIONS)
    keys, values = demo.order_records(0, RECORDS)
    with Producer(eos_broker.address) as producer:
        producer.send_batch(demo.ORDERS, values, keys=keys).result(60)
    return eos_broker.address


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_pipeline_killed_at_chosen_and_random_points_writes_everything_exactly_once(seeded, admin, tmp_path):
    address = seeded
    checkpoints = tmp_path / "checkpoints"
    log_path = tmp_path / "pipeline.log"
    seed = int(os.environ.get("EOS_TEST_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    context = f"(seed {seed}; log {log_path})"

    def run(crash_at: str | None = None, kill_after_s: float | None = None) -> int:
        env = {CRASH_ENV: crash_at} if crash_at else {CRASH_ENV: ""}
        process = demo.start_pipeline(address, checkpoints, log_path, max_records_per_trigger=PER_TRIGGER, env=env)
        if kill_after_s is not None:
            try:
                process.wait(kill_after_s)
            except subprocess.TimeoutExpired:
                demo.kill_hard(process)
        return wait_for(process, log_path)

    # 1. stage 1, batch 1: outputs written by the executors, nothing committed
    assert run("after_write:1") == -signal.SIGKILL, demo._tail(log_path)
    committed_end, log_end = demo._ends(admin, demo.ENRICHED)
    assert log_end > committed_end, "the kill should leave written but uncommitted output behind"
    # 2. stage 1, batch 2: decided, but Spark never recorded the batch (a replay must write nothing)
    assert run("after_commit:2") == -signal.SIGKILL, demo._tail(log_path)
    # 3. stage 1, batch 4: input offsets in the transaction, no decision
    assert run("after_offsets:4") == -signal.SIGKILL, demo._tail(log_path)
    # 4. stage 2, batch 1 (stage 1 is past its batch 1): between its writes and its commit
    assert run("after_write:1") == -signal.SIGKILL, demo._tail(log_path)
    assert "killing the driver at after_write of batch 1 of 'eos-app.demo-pricer.price'" in log_path.read_text()
    # 5. at a random moment
    run(kill_after_s=rng.uniform(5.0, 30.0))
    # 6. to the end
    assert run() == 0, f"the last run failed {context}:\n{demo._tail(log_path)}"

    check = demo.check_output(address, RECORDS)
    assert check.ok, f"{check.problems} {context}"
    assert (check.enriched, check.priced, check.duplicates) == (RECORDS, RECORDS, 0)
    # the groups' offsets are at the ends of their inputs: no lag left
    from eos.types import TopicPartition
    from spark_sink.owner import group_offsets

    orders = [TopicPartition(demo.ORDERS, p) for p in range(demo.PARTITIONS)]
    assert group_offsets(address, "demo-enricher", orders) == admin.list_offsets(
        {tp: "latest" for tp in orders}, isolation_level="read_committed")
