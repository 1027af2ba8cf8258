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
