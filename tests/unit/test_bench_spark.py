"""The pure parts of the Spark bench workload (bench/workloads/spark.py): the tally of an
output against the expected values, where the kill is placed, which connector jars and
versions are chosen, and how a query's wall time is split from its progress reports."""
from __future__ import annotations

import pytest

from bench.spark_sink import query_phases
from bench.workloads import RunContext, Sizes
from bench.workloads.spark import (
    BATCHES_PER_RUN,
    KEYS,
    Tally,
    _phase_metrics,
    _sizes,
    connector_candidates,
    expected_output,
    in_flight_records,
    input_value,
    jar_artifact,
    jars_to_add,
    partly_written,
    tally,
    token_provider_for,
)


# ---- tally

def test_tally_of_an_exact_output_has_no_duplicates_and_nothing_missing():
    expected = expected_output(50)
    assert tally(list(reversed(expected)), expected) == Tally(50, 0, 0, 0)


def test_tally_counts_extra_copies_not_values_seen_twice():
    expected = [b"A", b"B", b"C", b"D"]
    seen = [b"A", b"A", b"A", b"B", b"B", b"C", b"D"]       # A three times, B twice
    assert tally(seen, expected) == Tally(records=7, duplicates=3, missing=0, unexpected=0)


def test_tally_counts_missing_and_unexpected_apart_from_duplicates():
    expected = [b"A", b"B", b"C"]
    seen = [b"A", b"Z", b"Z", b"B"]                         # C missing, Z never expected
    counted = tally(seen, expected)
    assert (counted.missing, counted.unexpected, counted.duplicates) == (1, 2, 0)


def test_tally_of_an_empty_output_misses_everything():
    assert tally([], expected_output(7)) == Tally(0, 0, 7, 0)


def test_expected_output_is_the_upper_cased_input_of_distinct_100_byte_values():
    values = expected_output(1200)
    assert len(set(values)) == 1200
    assert all(len(v) == 100 for v in values)
    assert values[42] == input_value(42).upper() and values[42].startswith(b"VALUE-42-")


# ---- where the kill goes

def test_kafka_in_flight_is_the_high_watermark_past_the_last_whole_batch():
    assert in_flight_records("kafka", 0, 0, 1000) == 0
    assert in_flight_records("kafka", 2000, 2000, 1000) == 0          # two whole batches
    assert in_flight_records("kafka", 2345, 2345, 1000) == 345


def test_eos_in_flight_is_the_open_transaction_past_the_last_stable_offset():
    # log end 2351 = two committed batches (2000 records + 6 markers) + 345 uncommitted
    assert in_flight_records("eos", 2351, 2006, 1000) == 345
    assert in_flight_records("eos", 2006, 2006, 1000) == 0             # between batches


@pytest.mark.parametrize("in_flight, partly", [(0, False), (1, True), (999, True), (1000, False)])
def test_partly_written_means_strictly_inside_a_batch(in_flight, partly):
    assert partly_written(in_flight, 1000) is partly


def test_kill_condition_on_a_kafka_output_holds_only_between_batch_boundaries():
    marks = [in_flight_records("kafka", end, end, 500) for end in (0, 250, 500, 501, 1000)]
    assert [partly_written(m, 500) for m in marks] == [False, True, False, True, False]


def test_in_flight_rejects_bad_arguments():
    with pytest.raises(ValueError, match="batch_records"):
        in_flight_records("kafka", 10, 10, 0)
    with pytest.raises(ValueError, match="unknown system"):
        in_flight_records("pulsar", 10, 10, 5)


def test_sizes_make_every_kafka_batch_whole():
    for sizes in (Sizes(), Sizes.quick(), Sizes(records=1), Sizes(records=123_456_789)):
        records, per_trigger = _sizes(RunContext("kafka", "x", None, sizes))
        assert records == per_trigger * BATCHES_PER_RUN
        assert records % (KEYS * BATCHES_PER_RUN) == 0 and records > 0


# ---- the connector

def test_jar_artifact_drops_the_version_only():
    assert jar_artifact("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert jar_artifact("kafka-clients-3.9.2.jar") == "kafka-clients"
    assert jar_artifact("zstd-jni-1.5.7-7.jar") == "zstd-jni"
    assert jar_artifact("scala-parallel-collections_2.13-1.2.0.jar") == "scala-parallel-collections_2.13"
    assert jar_artifact("notes.txt") == "notes.txt"


def test_jars_to_add_leaves_out_what_spark_ships_in_any_version():
    resolved = ["commons-pool2-2.13.1.jar", "hadoop-client-api-3.4.1.jar", "jsr305-3.0.0.jar",
                "kafka-clients-3.9.2.jar", "lz4-java-1.10.1.jar", "scala-library-2.13.15.jar",
                "slf4j-api-1.7.36.jar", "snappy-java-1.1.10.5.jar", "spark-sql-kafka-0-10_2.13-4.2.0.jar",
                "spark-tags_2.13-4.2.0.jar", "spark-token-provider-kafka-0-10_2.13-4.0.0.jar", "README"]
    shipped = ["hadoop-client-api-3.5.0.jar", "jsr305-3.0.0.jar", "lz4-java-1.11.0.jar",
               "scala-library-2.13.16.jar", "slf4j-api-2.0.17.jar", "snappy-java-1.1.10.8.jar",
               "spark-tags_2.13-4.3.0.jar", "spark-sql_2.13-4.3.0.jar", "commons-pool-1.5.4.jar"]
    assert jars_to_add(resolved, shipped) == [
        "commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-token-provider-kafka-0-10_2.13-4.0.0.jar"]


def test_connector_is_spark_own_version_when_released():
    assert connector_candidates("4.2.0", ["4.0.0", "4.2.0", "4.1.3"]) == ["4.2.0", "4.1.3", "4.0.0"]


def test_connector_falls_back_to_the_newest_release_before_spark_of_the_same_major():
    released = ["3.5.9", "4.0.0", "4.1.3", "4.2.0", "5.0.0"]
    assert connector_candidates("4.3.0", released) == ["4.2.0", "4.1.3", "4.0.0"]
    assert connector_candidates("4.1.10", ["4.1.2", "4.1.9", "4.1.11"]) == ["4.1.9", "4.1.2"]
    assert connector_candidates("4.3.0", ["3.5.9"]) == []


def test_token_provider_is_the_connector_version_or_the_newest_before_it():
    assert token_provider_for("4.2.0", ["4.0.0", "4.2.0"]) == "4.2.0"
    assert token_provider_for("4.2.0", ["3.5.4", "4.0.0", "4.3.0"]) == "4.0.0"
    assert token_provider_for("4.2.0", ["4.3.0"]) is None


# ---- the wall time's parts, from Spark's progress reports

def _progress(batch_id: int, timestamp: str, rows: int, trigger_ms: int) -> dict:
    # the keys of a StreamingQueryProgress that query_phases reads (a dict in PySpark 4)
    return {"batchId": batch_id, "timestamp": timestamp, "numInputRows": rows,
            "durationMs": {"triggerExecution": trigger_ms}}


def test_query_phases_splits_the_time_before_the_first_batch_from_the_later_batches():
    started = _epoch("2026-11-27T12:00:00.000Z")
    progress = [_progress(2, "2026-11-27T12:00:03.000Z", 5_000, 400),
                _progress(0, "2026-11-27T12:00:01.750Z", 10_000, 800),   # out of order on purpose
                _progress(1, "2026-11-27T12:00:02.550Z", 10_000, 450),
                _progress(3, "2026-11-27T12:00:03.400Z", 0, 5)]          # availableNow's empty last
    phases = query_phases(progress, started)
    assert phases["to_first_batch_s"] == pytest.approx(1.75)
    assert phases["first_batch_s"] == pytest.approx(0.8)
    assert phases["later_records"] == 15_000
    assert phases["later_s"] == pytest.approx(0.85)


def test_query_phases_of_a_query_that_read_nothing_is_empty():
    assert query_phases([_progress(0, "2026-11-27T12:00:01.000Z", 0, 10)], 0.0) == {}


def test_phase_metrics_are_medians_over_runs_and_skip_runs_without_later_batches():
    phases = [{"to_first_batch_s": 1.5, "first_batch_s": 0.6, "later_records": 9_000, "later_s": 4.5},
              {"to_first_batch_s": 2.5, "first_batch_s": 0.8, "later_records": 9_000, "later_s": 3.0},
              {"to_first_batch_s": 0.4, "first_batch_s": 0.7, "later_records": 0, "later_s": 0.0},
              {}]
    by_key = {m.key: m for m in _phase_metrics(phases)}
    assert by_key["spark.to_first_batch_ms"].value == 1500          # median_low of 1500, 2500
    assert by_key["spark.to_first_batch_ms"].higher_is_better is False
    assert by_key["spark.later_batches_records_per_s"].value == 2000   # median_low of 2000, 3000
    assert by_key["spark.later_batches_records_per_s"].samples == (2000, 3000)
    assert _phase_metrics([{}]) == []


def _epoch(timestamp: str) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
