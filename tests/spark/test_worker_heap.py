"""spark_sink.worker_heap: eos's tasks freeze what a reused Python worker keeps, so that the
gc.collect() pyspark's daemon runs after every task walks only what tasks made since."""
from __future__ import annotations

import gc

import pyarrow as pa

from spark_sink.worker_heap import freeze_worker_heap, in_daemon_worker


def test_outside_a_daemon_worker_nothing_is_frozen():
    before = gc.get_freeze_count()
    assert not in_daemon_worker()
    assert freeze_worker_heap() is False
    assert gc.get_freeze_count() == before


def test_in_a_daemon_worker_the_first_call_freezes_and_later_ones_do_nothing(spark):
    def probe(batches):
        import gc

        from spark_sink.worker_heap import freeze_worker_heap, in_daemon_worker
        for _ in batches:
            pass
        gc.unfreeze()      # this worker may have run an eos task already
        tracked_before = len(gc.get_objects())
        first = freeze_worker_heap()
        tracked_after = len(gc.get_objects())
        second = freeze_worker_heap()
        yield pa.RecordBatch.from_pydict({
            "daemon": pa.array([in_daemon_worker()]), "first": pa.array([first]),
            "second": pa.array([second]), "before": pa.array([tracked_before]),
            "after": pa.array([tracked_after]), "frozen": pa.array([gc.get_freeze_count()])})

    schema = "daemon boolean, first boolean, second boolean, before long, after long, frozen long"
    [row] = spark.range(1, numPartitions=1).mapInArrow(probe, schema).collect()
    assert row.daemon and row.first and not row.second
    # What a collection walks (the tracked objects of its generations) shrinks to a sliver.
    assert row.before > 10_000 and row.after < row.before // 10
    assert row.frozen > row.before // 2        # they went to the permanent generation


def test_the_sinks_and_the_sources_tasks_freeze_their_worker(spark):
    def tasks(batches):
        import gc

        from spark_sink.offsets import parse_options
        from spark_sink.participant import OwnerIdentity
        from spark_sink.sink import TaskWrite
        from spark_sink.source import read_ranges
        for _ in batches:
            pass
        counts = []
        # A task with no rows touches no broker; each still readies its worker first.
        gc.unfreeze()
        list(TaskWrite(OwnerIdentity("127.0.0.1:1", "", -1, -1), "out", False, 10_000, {})(iter(())))
        counts.append(gc.get_freeze_count())
        gc.unfreeze()
        list(read_ranges(parse_options({"bootstrap": "127.0.0.1:1", "subscribe": "in"}, streaming=True), []))
        counts.append(gc.get_freeze_count())
        yield pa.RecordBatch.from_pydict({"sink": pa.array([counts[0]]), "source": pa.array([counts[1]])})

    [row] = spark.range(1, numPartitions=1).mapInArrow(tasks, "sink long, source long").collect()
    assert row.sink > 0 and row.source > 0
