"""The exactly-once foreachBatch sink through a real local[2] Spark session and a real broker.

Each micro-batch is written by the executors as participants of the driver's transaction
and committed with the batch's input offsets in one decision; a replayed batch id writes
nothing; a crashed attempt's open transaction (participants and all) is aborted by the next
driver. Streams run with trigger(availableNow=True) and a bounded awaitTermination; output
is read back read_committed once no transaction is open (spark_sink.readback)."""
from __future__ import annotations

import collections
import json
import uuid
from pathlib import Path

import pytest

from eos.types import TopicPartition
from spark_sink.owner import TransactionOwner
from spark_sink.readback import read_committed
from spark_sink.sink import ExactlyOnceSink, TaskWrite, batch_metadata, committed_batch, parse_offset_log, tasks_report
from tests.spark.helpers import STREAM_TIMEOUT_S, produce


# ---- pure parts ----------------------------------------------------------------------------------

def test_offset_log_lines_of_eos_sources_are_read_and_others_skipped():
    text = "\n".join(["v1", '{"batchWatermarkMs":0,"conf":{}}', '{"a":{"0":5,"1":7}}', "42",
                      '{"logOffset": "x"}', '{"b":{"2":0}}'])
    assert parse_offset_log(text) == {TopicPartition("a", 0): 5, TopicPartition("a", 1): 7, TopicPartition("b", 2): 0}
    with pytest.raises(ValueError, match="version line"):
        parse_offset_log("")


def test_committed_batch_reads_only_this_querys_metadata():
    tp = TopicPartition("a", 0)
    assert committed_batch({tp: (5, batch_metadata("q1", 3))}, "q1") == 3
    assert committed_batch({tp: (5, batch_metadata("q0", 3))}, "q1") is None        # another checkpoint
    assert committed_batch({tp: (5, "not json"), TopicPartition("a", 1): (1, "")}, "q1") is None


# ---- through Spark -------------------------------------------------------------------------------

def upper_values(df):
    from pyspark.sql import functions as F

    return df.select("key", F.upper(F.col("value").cast("string")).alias("value"))


def run_stage(spark, address: str, source: str, sink, checkpoint: str, **options):
    stream = (spark.readStream.format("eos").option("bootstrap", address).option("subscribe", source)
              .option("startingOffsets", "earliest"))
    for name, value in options.items():
        stream = stream.option(name, value)
    query = (upper_values(stream.load()).writeStream.foreachBatch(sink)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(STREAM_TIMEOUT_S), "the availableNow query did not finish"
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
    finally:
        query.stop()


def expected_upper(produced: dict) -> collections.Counter:
    return collections.Counter((key, value.decode().upper().encode() if value is not None else None)
                               for key, value, _ in produced.values())


def got(records) -> collections.Counter:
    return collections.Counter((r.key, r.value) for r in records)


def test_each_micro_batch_is_written_exactly_once_with_its_offsets(spark, eos_broker, admin, tmp_path):
    admin.create_topic("eo_in", partitions=3)
    admin.create_topic("eo_out", partitions=2)
    produced = produce(eos_broker.address, "eo_in", {0: 120, 1: 100, 2: 80})
    checkpoint = str(tmp_path / "cp")
    from prometheus_client import CollectorRegistry

    from tests.integration.test_client_metrics import scrape, value

    registry = CollectorRegistry()
    sink = ExactlyOnceSink(eos_broker.address, "eo_out", transactional_id="eo-stage", group_id="eo-group",
                           checkpoint_location=checkpoint, metrics=registry)
    run_stage(spark, eos_broker.address, "eo_in", sink, checkpoint, maxRecordsPerTrigger="100")
    assert [(r.batch_id, r.skipped, r.records) for r in sink.reports] == [
        (0, False, 100), (1, False, 100), (2, False, 100)]
    assert all(r.participants >= 1 for r in sink.reports)
    samples = scrape(registry)                  # the driver's figures of the three micro-batches
    assert value(samples, "eos_sink_records_written_total", client_id="eo-stage") == 300
    assert value(samples, "eos_sink_batches_committed_total", client_id="eo-stage") == 3
    assert value(samples, "eos_sink_batches_skipped_total", client_id="eo-stage") == 0
    assert value(samples, "eos_sink_batch_commit_seconds_count", client_id="eo-stage") == 3
    assert value(samples, "eos_sink_batch_commit_seconds_sum", client_id="eo-stage") == pytest.approx(
        sum(r.commit_ms for r in sink.reports) / 1000)
    assert value(samples, "eos_sink_batch_write_seconds_count", client_id="eo-stage") == 3
    assert got(read_committed(eos_broker.address, "eo_out")) == expected_upper(produced)
    owner = TransactionOwner(eos_broker.address, "reader-only")
    try:
        committed = owner.committed("eo-group", [TopicPartition("eo_in", p) for p in range(3)])
    finally:
        owner.close()
    assert {tp: offset for tp, (offset, _) in committed.items()} == {
        TopicPartition("eo_in", 0): 120, TopicPartition("eo_in", 1): 100, TopicPartition("eo_in", 2): 80}
    assert {json.loads(meta)["batch"] for _, meta in committed.values()} == {2}
    sink.close()


def hand_made_checkpoint(path: Path, batches: dict[int, dict]) -> str:
    """A checkpoint as Spark writes it: metadata with a query id and offsets/<batch_id>."""
    (path / "offsets").mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}))
    for batch_id, offsets in batches.items():
        (path / "offsets" / str(batch_id)).write_text("\n".join(["v1", "{}", json.dumps(offsets)]))
    return str(path)


def test_a_replayed_batch_id_writes_nothing_also_after_a_driver_restart(spark, eos_broker, admin, tmp_path):
    admin.create_topic("rp_in", partitions=2)
    admin.create_topic("rp_out", partitions=2)
    produced = produce(eos_broker.address, "rp_in", {0: 40, 1: 30})
    checkpoint = hand_made_checkpoint(tmp_path / "cp", {0: {"rp_in": {"0": 40, "1": 30}},
                                                        1: {"rp_in": {"0": 40, "1": 30}}})
    batch = upper_values(spark.read.format("eos").option("bootstrap", eos_broker.address)
                         .option("subscribe", "rp_in").load())
    first = ExactlyOnceSink(eos_broker.address, "rp_out", transactional_id="rp-stage", group_id="rp-group",
                            checkpoint_location=checkpoint)
    first(batch, 0)
    first(batch, 0)                                   # Spark replays batch 0
    restarted = ExactlyOnceSink(eos_broker.address, "rp_out", transactional_id="rp-stage", group_id="rp-group",
                                checkpoint_location=checkpoint)
    restarted(batch, 0)                               # ... also after a restart
    assert [r.skipped for r in first.reports] == [False, True]
    assert [r.skipped for r in restarted.reports] == [True]
    assert got(read_committed(eos_broker.address, "rp_out")) == expected_upper(produced)
    restarted(batch, 1)                               # the next batch id is written
    assert got(read_committed(eos_broker.address, "rp_out")) == expected_upper(produced) + expected_upper(produced)
    for sink in (first, restarted):
        sink.close()


def test_a_crashed_drivers_open_transaction_is_aborted_with_its_participants(spark, eos_broker, admin, tmp_path):
    admin.create_topic("cr_in", partitions=2)
    admin.create_topic("cr_out", partitions=3)
    produced = produce(eos_broker.address, "cr_in", {0: 25, 1: 25})
    checkpoint = hand_made_checkpoint(tmp_path / "cp", {0: {"cr_in": {"0": 25, "1": 25}}})
    batch = upper_values(spark.read.format("eos").option("bootstrap", eos_broker.address)
                         .option("subscribe", "cr_in").load())
    crashed = ExactlyOnceSink(eos_broker.address, "cr_out", transactional_id="cr-stage", group_id="cr-group",
                              checkpoint_location=checkpoint)
    crashed._owner.init()
    report = crashed._write(batch, 0, crashed._owner.identity(), transactional=True)   # written, never decided
    assert report["records"] == 50 and report["participants"]
    restarted = ExactlyOnceSink(eos_broker.address, "cr_out", transactional_id="cr-stage", group_id="cr-group",
                                checkpoint_location=checkpoint)
    restarted(batch, 0)
    assert got(read_committed(eos_broker.address, "cr_out")) == expected_upper(produced)   # once, not twice
    for sink in (crashed, restarted):
        sink.close()


def test_a_failed_task_aborts_the_whole_batch_and_the_next_attempt_writes_once(spark, eos_broker, admin, tmp_path):
    from pyspark.sql import functions as F

    admin.create_topic("fl_in", partitions=3)
    admin.create_topic("fl_out", partitions=2)
    produced = produce(eos_broker.address, "fl_in", {0: 30, 1: 30, 2: 30})
    checkpoint = hand_made_checkpoint(tmp_path / "cp", {0: {"fl_in": {"0": 30, "1": 30, "2": 30}}})
    # One task per partition (minPartitions=1; by default local[2] packs 3 partitions into 2
    # tasks that run at once): partitions 0 and 1 are the first wave, and one of them has
    # written all it had before partition 2's task starts and fails.
    source = (spark.read.format("eos").option("bootstrap", eos_broker.address).option("subscribe", "fl_in")
              .option("minPartitions", "1").load())

    @F.udf("string", useArrow=False)
    def fail_in_partition_2(partition, value):
        if partition == 2:
            raise ValueError("a task that fails after its neighbours wrote")
        return value

    failing = upper_values(source.withColumn("value", fail_in_partition_2("partition", F.col("value").cast("string"))))
    sink = ExactlyOnceSink(eos_broker.address, "fl_out", transactional_id="fl-stage", group_id="fl-group",
                           checkpoint_location=checkpoint)
    with pytest.raises(Exception, match="a task that fails"):
        sink(failing, 0)
    assert read_committed(eos_broker.address, "fl_out") == []     # settles: nothing is left open
    log_ends = admin.list_offsets({TopicPartition("fl_out", p): "latest" for p in range(2)})
    assert sum(log_ends.values()) > 0      # the tasks that ran first did write: all of it was aborted
    sink(upper_values(source), 0)
    assert got(read_committed(eos_broker.address, "fl_out")) == expected_upper(produced)
    assert [r.skipped for r in sink.reports] == [False]
    sink.close()


def test_columns_of_binary_or_string_go_to_the_tasks_as_they_are_and_others_are_cast(spark, eos_broker, admin,
                                                                                   tmp_path):
    from pyspark.sql import functions as F

    from eos.errors import EosError

    admin.create_topic("col_in", partitions=2)
    admin.create_topic("col_named", partitions=1)
    admin.create_topic("col_cast", partitions=1)
    produced = produce(eos_broker.address, "col_in", {0: 20, 1: 15})
    offsets = {0: {"col_in": {"0": 20, "1": 15}}}
    source = spark.read.format("eos").option("bootstrap", eos_broker.address).option("subscribe", "col_in").load()

    # Named columns, a string value: mapped as they are (no projection), the string sent as UTF-8.
    named = source.select(F.col("key").alias("k"), F.upper(F.col("value").cast("string")).alias("v"))
    sink = ExactlyOnceSink(eos_broker.address, "col_named", transactional_id="col-named", group_id="col-named",
                           checkpoint_location=hand_made_checkpoint(tmp_path / "named", offsets),
                           key_column="k", value_column="v")
    assert sink._key_value(named) == (named, "k", "v")
    sink(named, 0)
    assert got(read_committed(eos_broker.address, "col_named")) == expected_upper(produced)
    sink.close()

    # Other columns beside them: one projection keeps the two, cast to binary.
    extra = source.select(F.col("topic").alias("key"), "value", "partition", "offset")
    sink = ExactlyOnceSink(eos_broker.address, "col_cast", transactional_id="col-cast", group_id="col-cast",
                           checkpoint_location=hand_made_checkpoint(tmp_path / "cast", offsets))
    mapped, key_column, value_column = sink._key_value(extra)
    assert (mapped.columns, key_column, value_column) == (["key", "value"], "key", "value")
    assert [field.dataType.typeName() for field in mapped.schema.fields] == ["binary", "binary"]
    sink(extra, 0)
    assert got(read_committed(eos_broker.address, "col_cast")) == collections.Counter(
        (b"col_in", value) for _, value, _ in produced.values())
    with pytest.raises(EosError, match="no value column 'value'"):
        sink._key_value(source.select("key"))
    sink.close()


def test_a_task_takes_string_columns_as_their_utf8_bytes():
    import pyarrow as pa

    from spark_sink.participant import _as_bytes

    assert _as_bytes(pa.array(["é", None, ""], pa.string())) == ["é".encode(), None, b""]
    assert _as_bytes(pa.array(["x", None], pa.large_string())) == [b"x", None]
    assert _as_bytes(pa.array([b"\xff", None], pa.binary())) == [b"\xff", None]


def test_a_missing_output_topic_is_named_before_anything_runs(spark, eos_broker, admin, tmp_path):
    from eos.errors import UnknownTopicOrPartitionError

    admin.create_topic("mt_in", partitions=1)
    produce(eos_broker.address, "mt_in", {0: 3})
    checkpoint = hand_made_checkpoint(tmp_path / "cp", {0: {"mt_in": {"0": 3}}})
    batch = spark.read.format("eos").option("bootstrap", eos_broker.address).option("subscribe", "mt_in").load()
    sink = ExactlyOnceSink(eos_broker.address, "no_such_output", transactional_id="mt", group_id="mt",
                           checkpoint_location=checkpoint)
    with pytest.raises(UnknownTopicOrPartitionError, match="'no_such_output' does not exist"):
        sink(batch, 0)
    sink.close()


# ---- the executors' writer (spark_sink.participant over the producer's participant mode) ---------

def test_a_task_without_rows_makes_no_participant_and_connects_to_nothing():
    import pyarrow as pa

    from spark_sink.participant import OwnerIdentity, WriteResult, write_arrow_batches

    nowhere = OwnerIdentity("127.0.0.1:1", "t", 5, 0)          # nothing listens there
    empty = pa.RecordBatch.from_pydict({"key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())})
    assert write_arrow_batches(nowhere, "out", [empty, empty]) == WriteResult(-1, 0, 0)


def test_a_task_yields_one_row_and_the_driver_accepts_only_tasks_that_wrote():
    import pyarrow as pa

    from spark_sink.participant import OwnerIdentity

    nowhere = OwnerIdentity("127.0.0.1:1", "t", 5, 0)
    empty = pa.RecordBatch.from_pydict({"key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())})
    rows = list(TaskWrite(nowhere, "out", True, 1000, {})([empty]))
    assert [batch.to_pydict() for batch in rows] == [{"producer_id": [-1], "records": [0]}]
    assert tasks_report([(-1, 0), (17, 5), (9, 3)]) == {"participants": [9, 17], "records": 8, "tasks": 3}


@pytest.mark.parametrize("settings, problem", [
    ({"acks": 1}, "must not set acks"),
    ({"transactional.id": "x"}, "must not set transactional.id"),
    ({"lingerms": 5}, "unknown producer config: lingerms"),
    ({"linger.ms": -1}, "linger.ms"),
])
def test_bad_producer_settings_are_refused_when_the_sink_is_made(settings, problem):
    with pytest.raises(ValueError, match=problem):
        ExactlyOnceSink("127.0.0.1:1", "out", transactional_id="t", group_id="g", producer_config=settings)
