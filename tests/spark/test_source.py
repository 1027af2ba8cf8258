"""The eos Spark source: planning (pure) and reads through a real local[2] Spark session
against a real broker.

The pure tests drive spark_sink.offsets directly. The Spark tests produce known records,
read them back through `spark.read` / `spark.readStream` and compare exactly. Nothing
waits on time: produces are flushed before a read starts, streams use
trigger(availableNow=True) and awaitTermination with a bound.
"""
from __future__ import annotations

import json

import pytest

from eos.types import TopicPartition
from tests.spark.helpers import produce, run_available_now
from spark_sink.offsets import (
    DataLossError,
    OffsetRange,
    OffsetSpec,
    SourceOptionError,
    check_start,
    from_json_dict,
    limit_by_records,
    parse_options,
    plan_ranges,
    plan_tasks,
    resolve_offsets,
    to_json_dict,
)

A0, A1, A2 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("a", 2)
B0 = TopicPartition("b", 0)
BASE = {"bootstrap": "127.0.0.1:9092", "subscribe": "a"}


# ---- options ----------------------------------------------------------------------------

def test_options_defaults_follow_sparks_kafka_source():
    stream = parse_options(BASE, streaming=True)
    batch = parse_options(BASE, streaming=False)
    assert stream.starting.kind == "latest" and stream.ending is None
    assert batch.starting.kind == "earliest" and batch.ending.kind == "latest"
    assert stream.isolation == "read_committed" and stream.fail_on_data_loss is True
    assert stream.max_records_per_trigger is None and stream.max_records_per_partition is None


def test_option_names_are_case_insensitive_and_values_parsed():
    options = parse_options({"BOOTSTRAP": "h:1", "Subscribe": " a , b ", "maxrecordspertrigger": "7",
                             "MAXRECORDSPERPARTITION": "3", "Isolation": "READ_UNCOMMITTED",
                             "failondataloss": "False",
                             "startingOffsets": '{"a": {"0": 5, "1": -2}, "b": {"0": -1}}'},
                            streaming=True)
    assert options.topics == ("a", "b")
    assert options.max_records_per_trigger == 7 and options.max_records_per_partition == 3
    assert options.isolation == "read_uncommitted" and options.fail_on_data_loss is False
    assert options.starting == OffsetSpec("specific", {A0: 5, A1: -2, B0: -1})


@pytest.mark.parametrize("options, streaming, words", [
    ({"subscribe": "a"}, True, "bootstrap is required"),
    ({"bootstrap": "h:1"}, True, "subscribe is required"),
    ({**BASE, "subscribe": "a,,b"}, True, "comma-separated"),
    ({**BASE, "subscribe": "a,a"}, True, "more than once"),
    ({**BASE, "startingOffsets": "{not json"}, True, "startingOffsets must be earliest or latest or JSON"),
    ({**BASE, "startingOffsets": '{"a": {"0": -3}}'}, True, "offset -3 of a-0 is negative"),
    ({**BASE, "startingOffsets": '{"a": {"x": 1}}'}, True, "'x' of topic 'a' is not a partition number"),
    ({**BASE, "startingOffsets": '{"a": {"0": "1"}}'}, True, "must be an integer"),
    ({**BASE, "startingOffsets": '["a"]'}, True, "JSON object of topics"),
    ({**BASE, "endingOffsets": "latest"}, True, "endingOffsets is for batch reads"),
    ({**BASE, "endingOffsets": '{"a": {"0": -2}}'}, False, "only negative values allowed here are -1"),
    ({**BASE, "endingOffsets": "earliest"}, False, "endingOffsets must be latest or JSON"),
    ({**BASE, "startingOffsets": "latest"}, False, "makes a batch read empty"),
    ({**BASE, "maxRecordsPerTrigger": "0"}, True, "maxRecordsPerTrigger must be a positive integer"),
    ({**BASE, "maxRecordsPerTrigger": "5"}, False, "maxRecordsPerTrigger is for streaming"),
    ({**BASE, "maxRecordsPerPartition": "ten"}, False, "maxRecordsPerPartition must be a positive integer"),
    ({**BASE, "minPartitions": "0"}, True, "minPartitions must be a positive integer"),
    ({**BASE, "numPartitions": "-2"}, False, "numPartitions must be a positive integer"),
    ({**BASE, "numPartitions": "2", "minPartitions": "4"}, True, "cannot be combined with minPartitions"),
    ({**BASE, "numPartitions": "2", "maxRecordsPerPartition": "4"}, False,
     "cannot be combined with maxRecordsPerPartition"),
    ({**BASE, "isolation": "serializable"}, True, "isolation must be read_committed or read_uncommitted"),
    ({**BASE, "failOnDataLoss": "maybe"}, True, "failOnDataLoss must be true or false"),
    ({**BASE, "subscrib": "a"}, True, "unknown option(s) of the eos source: subscrib"),
])
def test_bad_options_are_refused_naming_the_problem(options, streaming, words):
    with pytest.raises(SourceOptionError) as info:
        parse_options(options, streaming=streaming)
    assert words in str(info.value)


def test_offsets_json_round_trip():
    offsets = {A1: 7, A0: 3, B0: 0}
    document = to_json_dict(offsets)
    assert json.dumps(document) == '{"a": {"0": 3, "1": 7}, "b": {"0": 0}}'
    assert from_json_dict(json.loads(json.dumps(document))) == offsets


# ---- resolving and data loss ------------------------------------------------------------

def test_resolve_specific_offsets_with_sentinels():
    spec = OffsetSpec("specific", {A0: -2, A1: -1, A2: 4})
    earliest, latest = {A0: 1, A1: 2, A2: 3}, {A0: 10, A1: 20, A2: 30}
    assert resolve_offsets(spec, [A0, A1, A2], earliest, latest, option="startingOffsets") == {A0: 1, A1: 20, A2: 4}
    assert resolve_offsets(OffsetSpec.earliest(), [A0], earliest, latest, option="x") == {A0: 1}
    assert resolve_offsets(OffsetSpec.latest(), [A0], earliest, latest, option="x") == {A0: 10}


def test_resolve_requires_exactly_the_subscribed_partitions():
    earliest = latest = {A0: 0, A1: 0}
    with pytest.raises(SourceOptionError, match="missing: a-1"):
        resolve_offsets(OffsetSpec("specific", {A0: 1}), [A0, A1], earliest, latest, option="startingOffsets")
    with pytest.raises(SourceOptionError, match="names b-0, which the query does not read"):
        resolve_offsets(OffsetSpec("specific", {A0: 1, A1: 1, B0: 1}), [A0, A1], earliest, latest,
                        option="startingOffsets")


def test_check_start_fails_on_data_loss_by_default():
    with pytest.raises(DataLossError, match=r"a-0: offsets 2..4 were deleted .*failOnDataLoss=false"):
        check_start({A0: 2}, [A0], {A0: 5}, {A0: 9}, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match="ends at 3"):
        check_start({A0: 8}, [A0], {A0: 0}, {A0: 3}, fail_on_data_loss=True)
    with pytest.raises(DataLossError, match="a-1 no longer exist"):
        check_start({A0: 0, A1: 0}, [A0], {A0: 0}, {A0: 3}, fail_on_data_loss=True)


def test_check_start_skips_the_loss_when_asked_and_reports_it():
    checked = check_start({A0: 2, A1: 8, A2: 1}, [A0, A1, A2, B0], {A0: 5, A1: 0, A2: 0, B0: 0},
                          {A0: 9, A1: 3, A2: 4, B0: 6}, fail_on_data_loss=False)
    # a-2 is fine, b-0 is new (starts at 0), a-0 moves past the deleted head, a-1 to its end
    assert checked.start == {A0: 5, A1: 3, A2: 1, B0: 0}
    assert len(checked.problems) == 2


def test_nothing_lost_means_no_problems():
    checked = check_start({A0: 5}, [A0], {A0: 5}, {A0: 5}, fail_on_data_loss=True)
    assert checked == ({A0: 5}, [])


# ---- admission control ------------------------------------------------------------------

def test_limit_shares_in_proportion_and_exactly():
    start = {A0: 0, A1: 100, A2: 7}
    available = {A0: 60, A1: 130, A2: 17}      # waiting 60, 30, 10
    end = limit_by_records(start, available, 10)
    assert end == {A0: 6, A1: 103, A2: 8}
    assert sum(end[tp] - start[tp] for tp in start) == 10


def test_limit_is_a_no_op_when_everything_fits():
    assert limit_by_records({A0: 0, A1: 0}, {A0: 3, A1: 4}, 7) == {A0: 3, A1: 4}


def test_limit_always_makes_progress_and_never_passes_the_bound():
    start = {A0: 0, A1: 0, A2: 0}
    available = {A0: 1, A1: 1, A2: 5}
    total = 0
    while start != available:
        end = limit_by_records(start, available, 1)
        assert all(start[tp] <= end[tp] <= available[tp] for tp in start)
        assert sum(end[tp] - start[tp] for tp in start) == 1
        start, total = end, total + 1
    assert total == 7


def test_limit_counts_new_partitions_from_zero():
    end = limit_by_records({A0: 10}, {A0: 20, A1: 10}, 10)
    assert end == {A0: 15, A1: 5}


# ---- splitting ----------------------------------------------------------------------------

def test_plan_ranges_one_per_partition_and_drops_empty():
    ranges = plan_ranges({A0: 0, A1: 5, A2: 9}, {A0: 4, A1: 5, A2: 3})
    assert ranges == [OffsetRange("a", 0, 0, 4)]


def test_plan_ranges_splits_large_ranges_evenly_and_covers_them():
    ranges = plan_ranges({A0: 3}, {A0: 13}, max_records_per_partition=4)
    assert ranges == [OffsetRange("a", 0, 3, 7), OffsetRange("a", 0, 7, 10), OffsetRange("a", 0, 10, 13)]
    assert plan_ranges({A0: 0}, {A0: 4}, max_records_per_partition=4) == [OffsetRange("a", 0, 0, 4)]


def test_plan_ranges_new_partition_starts_at_zero():
    assert plan_ranges({A0: 2}, {A0: 2, A1: 3}) == [OffsetRange("a", 1, 0, 3)]


def covered(tasks) -> list[tuple[TopicPartition, int]]:
    """Every (partition, offset) the tasks read, in reading order."""
    return [(r.tp, offset) for task in tasks for r in task for offset in range(r.start_offset, r.end_offset_exclusive)]


def test_plan_tasks_defaults_to_one_range_per_task():
    assert plan_tasks({A0: 0, A1: 2}, {A0: 4, A1: 2, A2: 3}) == [
        (OffsetRange("a", 0, 0, 4),), (OffsetRange("a", 2, 0, 3),)]


def test_min_partitions_halves_the_largest_ranges_until_there_are_enough():
    tasks = plan_tasks({A0: 0, A1: 0}, {A0: 100, A1: 10}, min_partitions=4)
    assert all(len(task) == 1 for task in tasks)
    assert sorted(task[0].offset_count for task in tasks) == [10, 25, 25, 50]
    assert sorted(covered(tasks)) == sorted(covered([(r,) for r in plan_ranges({A0: 0, A1: 0}, {A0: 100, A1: 10})]))
    # a range of one offset cannot be cut: fewer tasks than asked, nothing lost
    assert plan_tasks({A0: 0}, {A0: 1}, min_partitions=3) == [(OffsetRange("a", 0, 0, 1),)]


def test_task_slots_pack_only_a_batch_of_more_ranges_than_slots():
    start = {A0: 0, A1: 0, A2: 0}
    three = {A0: 30, A1: 30, A2: 30}
    packed = plan_tasks(start, three, task_slots=2)
    assert [sum(r.offset_count for r in task) for task in packed] == [45, 45]
    assert covered(packed) == covered([(r,) for r in plan_ranges(start, three)])
    # as many slots as ranges, or more: one task per range, as without slots
    assert plan_tasks(start, three, task_slots=3) == plan_tasks(start, three)
    assert plan_tasks(start, {A0: 30, A1: 0, A2: 30}, task_slots=2) == [
        (OffsetRange("a", 0, 0, 30),), (OffsetRange("a", 2, 0, 30),)]
    # an explicit task option wins over the session's slots
    assert len(plan_tasks(start, three, task_slots=2, min_partitions=4)) == 4
    assert len(plan_tasks(start, three, task_slots=2, max_records_per_partition=10)) == 9
    assert len(plan_tasks(start, three, task_slots=2, num_partitions=3)) == 3


@pytest.mark.parametrize("counts,tasks", [((3334, 3333, 3333), 2), ((100, 1, 1, 1, 50), 3), ((7,), 3),
                                          ((2, 0, 1), 5), ((10, 10), 1)])
def test_num_partitions_packs_ranges_into_tasks_of_near_equal_size(counts, tasks):
    start = {TopicPartition("a", p): 0 for p in range(len(counts))}
    end = {TopicPartition("a", p): n for p, n in enumerate(counts)}
    planned = plan_tasks(start, end, num_partitions=tasks)
    total = sum(counts)
    assert len(planned) == min(tasks, total)
    sizes = [sum(r.offset_count for r in task) for task in planned]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == total
    # each offset once, in partition order, and the pieces of one partition contiguous
    assert covered(planned) == covered([(r,) for r in plan_ranges(start, end)])
    assert all(r.offset_count > 0 for task in planned for r in task)


# ---- through Spark, against a real broker ---------------------------------------------------

def rows_by_position(rows) -> dict:
    return {(r.partition, r.offset): (r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in rows}


def reader(spark, eos_broker, topic: str, **options):
    read = spark.read.format("eos").option("bootstrap", eos_broker.address).option("subscribe", topic)
    for name, value in options.items():
        read = read.option(name, value)
    return read.load()


def test_batch_read_returns_exactly_what_was_produced(spark, eos_broker, admin):
    admin.create_topic("batch3", partitions=3)
    produced = produce(eos_broker.address, "batch3", {0: 120, 1: 75, 2: 0}, headers_every=10)
    df = reader(spark, eos_broker, "batch3")
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    rows = df.collect()
    assert len(rows) == len(produced) == 195
    assert any(r.value is None for r in rows) and any(r.headers for r in rows)
    assert rows_by_position(rows) == produced
    assert {r.topic for r in rows} == {"batch3"} and {r.timestampType for r in rows} == {0}
    assert all(r.timestamp is not None for r in rows)
    # one task per non-empty partition without maxRecordsPerPartition
    assert df.rdd.getNumPartitions() == 2


def test_batch_read_with_starting_and_ending_offsets_json(spark, eos_broker, admin):
    admin.create_topic("ranges", partitions=2)
    produced = produce(eos_broker.address, "ranges", {0: 30, 1: 30})
    df = reader(spark, eos_broker, "ranges",
                startingOffsets=json.dumps({"ranges": {"0": 5, "1": -2}}),
                endingOffsets=json.dumps({"ranges": {"0": -1, "1": 12}}))
    got = rows_by_position(df.collect())
    expected = {pos: v for pos, v in produced.items()
                if (pos[0] == 0 and pos[1] >= 5) or (pos[0] == 1 and pos[1] < 12)}
    assert got == expected and len(got) == 25 + 12


def test_num_partitions_packs_the_partitions_into_that_many_tasks(spark, eos_broker, admin):
    admin.create_topic("packed", partitions=3)
    produced = produce(eos_broker.address, "packed", {0: 40, 1: 41, 2: 9})
    df = reader(spark, eos_broker, "packed", numPartitions="2")
    assert df.rdd.getNumPartitions() == 2
    rows = df.collect()
    assert rows_by_position(rows) == produced and len(rows) == 90


def test_registered_source_packs_more_partitions_than_cores_into_one_wave(spark, eos_broker, admin):
    # spark_sink.register read local[2]'s default parallelism: 3 partitions make 2 tasks
    assert spark.sparkContext.defaultParallelism == 2
    admin.create_topic("slots", partitions=3)
    produced = produce(eos_broker.address, "slots", {0: 30, 1: 31, 2: 29})
    df = reader(spark, eos_broker, "slots")
    assert df.rdd.getNumPartitions() == 2
    rows = df.collect()
    assert rows_by_position(rows) == produced and len(rows) == 90
    # Kafka's one task per partition, when asked for
    assert reader(spark, eos_broker, "slots", minPartitions="1").rdd.getNumPartitions() == 3


def test_large_ranges_are_split_into_several_input_partitions(spark, eos_broker, admin):
    admin.create_topic("split", partitions=2)
    produced = produce(eos_broker.address, "split", {0: 100, 1: 7})
    df = reader(spark, eos_broker, "split", maxRecordsPerPartition="30")
    assert df.rdd.getNumPartitions() == 4 + 1
    rows = df.collect()
    assert rows_by_position(rows) == produced and len(rows) == 107


class _FlakyAdmin:
    """describe_topic answers "unknown topic" `unknown_answers` times, then the topic: what a
    broker that has just restarted answers before the controller's metadata reaches it."""

    def __init__(self, unknown_answers: int):
        self.unknown_answers = unknown_answers
        self.calls = 0

    def describe_topic(self, topic):
        from eos.errors import UnknownTopicOrPartitionError

        self.calls += 1
        if self.calls <= self.unknown_answers:
            raise UnknownTopicOrPartitionError(f"{topic} unknown")
        return {"partitions": [{"partition": 0}, {"partition": 1}]}


def test_the_planner_asks_again_for_a_topic_it_has_seen_but_fails_at_once_for_one_it_never_saw():
    from eos.errors import UnknownTopicOrPartitionError
    from spark_sink.source import _BrokerOffsets

    planner = _BrokerOffsets(parse_options({**BASE, "subscribe": "a"}, streaming=True))
    planner._admin = _FlakyAdmin(unknown_answers=1)
    with pytest.raises(UnknownTopicOrPartitionError, match="topic 'a' .* does not exist"):
        planner.partitions()
    assert planner._admin.calls == 1
    assert planner.partitions() == [A0, A1]               # seen now
    planner._admin = _FlakyAdmin(unknown_answers=3)         # a broker restarted under it
    assert planner.partitions() == [A0, A1] and planner._admin.calls == 4


def test_a_task_reads_its_ranges_together_in_order_from_inside_big_batches(eos_broker, admin):
    """read_ranges, the executor side, straight: partitions read together, several ranges of
    one partition (adjacent ones as one), ranges that start and end inside a batch of
    thousands of records, each partition's records in offset order, nothing else."""
    import eos
    from spark_sink.source import read_ranges

    admin.create_topic("together", partitions=2)
    with eos.Producer(eos_broker.address, linger_ms=5) as producer:
        for partition in (0, 1):
            # one send_batch call: batches of thousands of records each
            values = [b"p%d-%05d" % (partition, i) for i in range(5_000)]
            producer.send_batch("together", values, partition=partition).result(60)
    options = parse_options({"bootstrap": eos_broker.address, "subscribe": "together"}, streaming=True)
    ranges = [OffsetRange("together", 0, 1_234, 1_900), OffsetRange("together", 1, 4_400, 4_401),
              OffsetRange("together", 0, 2_500, 2_600), OffsetRange("together", 0, 1_900, 2_000),
              OffsetRange("together", 1, 10, 4_321), OffsetRange("together", 1, 7, 7)]
    by_partition: dict[int, list] = {0: [], 1: []}
    for batch in read_ranges(options, ranges):
        rows = batch.to_pydict()
        assert batch.num_rows and len(set(rows["partition"])) == 1     # a batch is one partition's
        by_partition[rows["partition"][0]] += list(zip(rows["offset"], rows["value"]))
    expected_offsets = {0: [*range(1_234, 2_000), *range(2_500, 2_600)], 1: [*range(10, 4_321), 4_400]}
    for partition, got in by_partition.items():
        assert [offset for offset, _ in got] == expected_offsets[partition]
        assert [value for _, value in got] == [b"p%d-%05d" % (partition, o) for o in expected_offsets[partition]]


def test_stream_max_records_per_trigger_gives_several_micro_batches(spark, eos_broker, admin, tmp_path):
    admin.create_topic("trig", partitions=3)
    produced = produce(eos_broker.address, "trig", {0: 50, 1: 30, 2: 20})
    batches = run_available_now(spark, eos_broker.address, "trig", str(tmp_path / "cp"),
                                startingOffsets="earliest", maxRecordsPerTrigger="25")
    sizes = [len(rows) for _, rows in batches if rows]
    assert sizes == [25, 25, 25, 25]
    seen = [(p, o) for _, rows in batches for p, o, _ in rows]
    assert sorted(seen) == sorted(produced)            # every record once, none twice

    # A restart from the same checkpoint resumes after the last batch: only new records.
    more = produce(eos_broker.address, "trig", {1: 10})
    new_offsets = sorted(more)
    again = run_available_now(spark, eos_broker.address, "trig", str(tmp_path / "cp"),
                              startingOffsets="earliest", maxRecordsPerTrigger="25")
    assert sorted((p, o) for _, rows in again for p, o, _ in rows) == new_offsets
    assert min(batch_id for batch_id, _ in again) > max(batch_id for batch_id, _ in batches)


def test_stream_starting_latest_skips_what_was_there(spark, eos_broker, admin, tmp_path):
    admin.create_topic("late", partitions=1)
    produce(eos_broker.address, "late", {0: 10})
    batches = run_available_now(spark, eos_broker.address, "late", str(tmp_path / "cp"))
    assert [row for _, rows in batches for row in rows] == []


@pytest.fixture(scope="module")
def errs_topic(admin):
    admin.create_topic("errs", partitions=2)
    return "errs"


@pytest.mark.parametrize("options, words", [
    ({"subscribe": "x"}, "option bootstrap is required"),
    ({"bootstrap": "{broker}", "subscribe": "no_such_topic"}, "topic 'no_such_topic' (option subscribe) does not exist"),
    ({"bootstrap": "{broker}", "subscribe": "errs", "startingOffsets": "{bad"}, "startingOffsets must be earliest"),
    ({"bootstrap": "{broker}", "subscribe": "errs", "startingOffsets": '{"errs": {"0": 0}}'}, "missing: errs-1"),
    ({"bootstrap": "{broker}", "subscribe": "errs", "endingOffsets": '{"errs": {"0": 999, "1": -1}}'},
     "offset 999 of errs-0 is past the end"),
])
def test_batch_read_errors_name_the_problem(spark, eos_broker, errs_topic, options, words):
    read = spark.read.format("eos")
    for name, value in options.items():
        read = read.option(name, value.replace("{broker}", eos_broker.address))
    with pytest.raises(Exception) as info:
        read.load().collect()
    assert words in str(info.value)


def test_stream_past_the_end_is_data_loss_unless_allowed(spark, eos_broker, admin, tmp_path):
    admin.create_topic("lost", partitions=1)
    produce(eos_broker.address, "lost", {0: 5})
    beyond = json.dumps({"lost": {"0": 50}})
    with pytest.raises(Exception) as info:
        run_available_now(spark, eos_broker.address, "lost", str(tmp_path / "cp1"), startingOffsets=beyond)
    assert "failOnDataLoss" in str(info.value) and "ends at 5" in str(info.value)
    # failOnDataLoss=false: start again from where the partition ends, and go on
    batches = run_available_now(spark, eos_broker.address, "lost", str(tmp_path / "cp2"), startingOffsets=beyond,
                                failOnDataLoss="false")
    assert [row for _, rows in batches for row in rows] == []


# ---- read_committed: transactions in the input -----------------------------------------------

def plain(address: str, topic: str, prefix: str, count: int) -> list[bytes]:
    import eos

    values = [f"{prefix}-{i}".encode() for i in range(count)]
    with eos.Producer(address) as producer:
        for value in values:
            producer.send(topic, value=value, partition=0)
        producer.flush(60)
    return values


def in_transaction(address: str, topic: str, prefix: str, count: int, transactional_id: str):
    """Write `count` records in one open transaction; returns (owner, participant id, values)."""
    from spark_sink.owner import TransactionOwner
    from spark_sink.participant import ParticipantWriter

    owner = TransactionOwner(address, transactional_id)
    owner.init()
    writer = ParticipantWriter(owner.identity(), topic)
    values = [f"{prefix}-{i}".encode() for i in range(count)]
    writer.write([None] * count, values)
    return owner, writer.close().producer_id, values


def values_read(spark, eos_broker, topic: str, **options) -> list[bytes]:
    return sorted(r.value for r in reader(spark, eos_broker, topic, **options).select("value").collect())


def test_aborted_input_never_reaches_the_pipeline(spark, eos_broker, admin, tmp_path):
    admin.create_topic("rc_abort", partitions=1)
    first = plain(eos_broker.address, "rc_abort", "p1", 10)
    owner, participant, aborted = in_transaction(eos_broker.address, "rc_abort", "aborted", 20, "rc-abort-1")
    owner.abort()
    second = plain(eos_broker.address, "rc_abort", "p2", 10)
    owner2, participant2, committed = in_transaction(eos_broker.address, "rc_abort", "committed", 15, "rc-abort-2")
    owner2.commit([participant2])
    wanted = sorted(first + second + committed)
    from spark_sink.readback import settled_end_offsets

    settled_end_offsets(eos_broker.address, "rc_abort")       # every marker is in
    assert values_read(spark, eos_broker, "rc_abort") == wanted
    assert values_read(spark, eos_broker, "rc_abort", isolation="read_uncommitted") == sorted(wanted + aborted)
    batches = run_available_now(spark, eos_broker.address, "rc_abort", str(tmp_path / "cp"),
                                startingOffsets="earliest", maxRecordsPerTrigger="7")
    assert sorted(v for _, rows in batches for _, _, v in rows) == wanted
    for o in (owner, owner2):
        o.close()


def test_an_open_input_transaction_holds_the_batch_boundary(spark, eos_broker, admin, tmp_path):
    admin.create_topic("rc_open", partitions=1)
    before = plain(eos_broker.address, "rc_open", "before", 10)
    owner, participant, held = in_transaction(eos_broker.address, "rc_open", "held", 5, "rc-open")
    after = plain(eos_broker.address, "rc_open", "after", 10)
    checkpoint = str(tmp_path / "cp")
    batches = run_available_now(spark, eos_broker.address, "rc_open", checkpoint, startingOffsets="earliest")
    # the batch ends at the open transaction's first offset: nothing of it or after it
    assert sorted(v for _, rows in batches for _, _, v in rows) == sorted(before)
    assert values_read(spark, eos_broker, "rc_open") == sorted(before)
    owner.commit([participant])
    from spark_sink.readback import settled_end_offsets

    settled_end_offsets(eos_broker.address, "rc_open")
    again = run_available_now(spark, eos_broker.address, "rc_open", checkpoint, startingOffsets="earliest")
    assert sorted(v for _, rows in again for _, _, v in rows) == sorted(held + after)
    owner.close()
