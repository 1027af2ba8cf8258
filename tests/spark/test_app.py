"""`eos.App` decorator stages: declaration rules (pure), and pipelines through the shared
local[2] session against a real broker -- chained stages drained with available_now, a
keyed aggregation whose state carries across runs, a new checkpoint that starts at the
group's offsets, and run() until stop()."""
from __future__ import annotations

import collections
import threading
import time

import pytest

import eos
from spark_sink.app import App
from spark_sink.readback import read_committed
from tests.spark.helpers import produce

WAIT_S = 120


def noop(df):
    return df


# ---- declaring (no Spark) ------------------------------------------------------------------------

def test_stages_run_after_the_stages_that_feed_them_and_the_decorator_keeps_the_function():
    app = App("127.0.0.1:1")
    second = app.stage(source="mid", sink="out", group="g2")(noop)
    assert second is noop
    app.stage(source="in", sink="mid", group="g1", name="first")(noop)
    assert [s.name for s in app.stages] == ["first", "noop"]
    assert app.stages[1].transactional_id == "eos-app.g2.noop"


@pytest.mark.parametrize("declare, words", [
    (lambda app: [app.stage(source="a", sink="b", group="g")(noop), app.stage(source="b", sink="a", group="g",
                                                                               name="back")(noop)], "cycle"),
    (lambda app: [app.stage(source="a", sink="b", group="g")(noop), app.stage(source="c", sink="d", group="g")(noop)],
     "already declared"),
    (lambda app: [app.stage(source="a", sink="b", group="g")(noop), app.stage(source="c", sink="b", group="g",
                                                                               name="other")(noop)],
     "already the sink"),
    (lambda app: app.stage(source="a", sink="a", group="g"), "the same topic"),
    (lambda app: app.stage(source="a", sink="b", group=""), "group must be a non-empty string"),
    (lambda app: app.stage(source="a", sink="b", group="g", output_mode="sometimes"), "output_mode"),
    (lambda app: app.stage(source="a", sink="b", group="g", name="no spaces")(noop), "may only hold"),
])
def test_bad_declarations_are_refused_naming_the_problem(declare, words):
    app = App("127.0.0.1:1")
    with pytest.raises(ValueError, match=words):
        declare(app)
        app.stages


def test_an_app_without_stages_refuses_to_run():
    with pytest.raises(ValueError, match="no stages"):
        App("127.0.0.1:1", spark=object()).run()


# ---- through Spark ------------------------------------------------------------------------------------

def upper(df):
    from pyspark.sql import functions as F

    return df.select("key", F.upper(F.col("value").cast("string")).alias("value"))


def reverse(df):
    from pyspark.sql import functions as F

    return df.select("key", F.reverse(F.col("value").cast("string")).alias("value"))


def values(address: str, topic: str) -> collections.Counter:
    return collections.Counter(r.value for r in read_committed(address, topic))


def test_chained_stages_drain_in_order_and_a_new_checkpoint_starts_at_the_groups_offsets(
        spark, eos_broker, admin, tmp_path):
    admin.create_topic("ch_in", partitions=3)
    produced = produce(eos_broker.address, "ch_in", {0: 60, 1: 50, 2: 40})
    app = App(eos_broker.address, spark=spark, checkpoint_dir=str(tmp_path / "cp1"), max_records_per_trigger=40)
    app.stage(source="ch_mid", sink="ch_out", group="ch-2", name="reverse")(reverse)   # declared first, runs second
    app.stage(source="ch_in", sink="ch_mid", group="ch-1", name="upper")(upper)
    app.run(available_now=True, timeout_s=WAIT_S * 2)
    expected = collections.Counter(v.decode().upper()[::-1].encode() if v is not None else None
                                   for _, v, _ in produced.values())
    assert values(eos_broker.address, "ch_out") == expected
    assert len(admin.describe_topic("ch_mid")["partitions"]) == 3        # created like its source
    assert sum(r.records for r in app.sinks["upper"].reports) == 150
    # The checkpoints are lost; a new app with the same groups resumes at the groups' offsets.
    more = produce(eos_broker.address, "ch_in", {1: 5}, tag="-late")
    again = App(eos_broker.address, spark=spark, checkpoint_dir=str(tmp_path / "cp2"))
    again.stage(source="ch_in", sink="ch_mid", group="ch-1", name="upper")(upper)
    again.stage(source="ch_mid", sink="ch_out", group="ch-2", name="reverse")(reverse)
    again.run(available_now=True, timeout_s=WAIT_S * 2)
    expected.update(v.decode().upper()[::-1].encode() if v is not None else None for _, v, _ in more.values())
    assert values(eos_broker.address, "ch_out") == expected


def test_a_keyed_aggregation_keeps_its_state_across_runs(spark, eos_broker, admin, tmp_path):
    from pyspark.sql import functions as F

    admin.create_topic("wc_lines", partitions=2)
    app = App(eos_broker.address, spark=spark, checkpoint_dir=str(tmp_path / "cp"))

    @app.stage(source="wc_lines", sink="wc_counts", group="wc", output_mode="update")
    def count_words(lines):
        words = lines.select(F.explode(F.split(F.col("value").cast("string"), " ")).alias("word"))
        return words.groupBy("word").count().select(F.col("word").alias("key"),
                                                    F.col("count").cast("string").alias("value"))

    lines = ["a b c", "a b", "a"] * 20
    for round_number in (1, 2):
        with eos.Producer(eos_broker.address) as producer:
            producer.send_batch("wc_lines", [line.encode() for line in lines]).result(60)
        app.run(available_now=True, timeout_s=WAIT_S * 2)
        latest = {r.key: int(r.value) for r in read_committed(eos_broker.address, "wc_counts")}
        assert latest == {b"a": 60 * round_number, b"b": 40 * round_number, b"c": 20 * round_number}


def test_run_goes_on_until_stopped(spark, eos_broker, admin, tmp_path):
    admin.create_topic("live_in", partitions=1)
    app = App(eos_broker.address, spark=spark, checkpoint_dir=str(tmp_path / "cp"), trigger_interval="200 milliseconds")
    app.stage(source="live_in", sink="live_out", group="live")(upper)
    errors = []

    def run():
        try:
            app.run()
        except BaseException as exc:   # reported by the test below
            errors.append(exc)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        produced = produce(eos_broker.address, "live_in", {0: 30})
        deadline = time.monotonic() + WAIT_S
        while written(admin, eos_broker.address, "live_out") < len(produced):
            assert time.monotonic() < deadline, "the running stage did not write the new records in time"
            assert runner.is_alive(), f"run() returned early: {errors}"
            time.sleep(0.2)
        assert runner.is_alive()
    finally:
        app.stop()
        runner.join(WAIT_S)
    assert not runner.is_alive() and errors == []
    assert sum(values(eos_broker.address, "live_out").values()) == len(produced)


def written(admin, address: str, topic: str) -> int:
    if topic not in admin.list_topics():
        return 0
    return sum(values(address, topic).values())
