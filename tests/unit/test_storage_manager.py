"""LogManager (partitions under a data dir, checkpoints, clean-shutdown marker) and the
checkpoint and index files on their own."""
from __future__ import annotations

import logging
import os
import sys

import pytest

from broker.storage import CLEAN_SHUTDOWN_FILE, LogManager, OffsetCheckpointFile, OffsetIndex, TimeIndex
from broker.storage.index import IndexCorruptError
from eos.config import TopicConfig
from eos.errors import InvalidTopicError, StorageError
from tests.storage_batches import batch_of_size, make_batch


class FakeClock:
    def __init__(self, now_ms: int = 1_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_checkpoint_round_trip_in_kafkas_format(tmp_path):
    checkpoint = OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint"))
    assert checkpoint.read() == {}
    offsets = {("orders", 0): 1200, ("orders", 1): 980, ("a.b_c-d", 12): 0}
    checkpoint.write(offsets)
    assert checkpoint.read() == offsets
    assert (tmp_path / "recovery-point-offset-checkpoint").read_text() == \
        "0\n3\na.b_c-d 12 0\norders 0 1200\norders 1 980\n"
    assert not (tmp_path / "recovery-point-offset-checkpoint.tmp").exists()


@pytest.mark.parametrize("text, problem", [
    ("1\n0\n", "unsupported version"),
    ("0\n2\norders 0 5\n", "declares 2 entries, holds 1"),
    ("0\n1\norders zero 5\n", "line 3"),
    ("0\n", "needs a version and a count"),
])
def test_a_malformed_checkpoint_is_an_error_naming_the_problem(tmp_path, text, problem):
    path = tmp_path / "log-start-offset-checkpoint"
    path.write_text(text)
    with pytest.raises(StorageError, match=problem):
        OffsetCheckpointFile(str(path)).read()


def test_offset_index_lookup_and_corruption_checks(tmp_path):
    index = OffsetIndex(str(tmp_path / "00000000000000000100.index"), 100, max_index_bytes=32)
    index.reset([])
    assert index.lookup(150) == (100, 0)
    for offset, position in [(105, 400), (110, 900), (120, 1500)]:
        index.append(offset, position)
    assert [index.lookup(o) for o in (104, 105, 119, 120, 10**6)] == \
        [(100, 0), (105, 400), (110, 900), (120, 1500), (120, 1500)]
    assert not index.is_full
    index.append(130, 2000)
    assert index.is_full
    index.close()
    with open(index.path, "rb") as f:
        assert f.read()[:8] == bytes.fromhex("00000005 00000190")   # relative offset 5, position 400
    reloaded = OffsetIndex(index.path, 100, max_index_bytes=32)
    reloaded.load(log_size_bytes=3000)
    assert reloaded.entries() == index.entries()
    with pytest.raises(IndexCorruptError, match="points at byte 2000"):
        OffsetIndex(index.path, 100, 32).load(log_size_bytes=2000)
    os.truncate(index.path, 30)
    with pytest.raises(IndexCorruptError, match="whole number"):
        OffsetIndex(index.path, 100, 32).load(log_size_bytes=3000)


def test_time_index_keeps_only_growing_timestamps(tmp_path):
    index = TimeIndex(str(tmp_path / "00000000000000000000.timeindex"), 0, max_index_bytes=120)
    index.reset([])
    assert index.maybe_append(1_000, 3)
    assert not index.maybe_append(1_000, 5) and not index.maybe_append(900, 6)
    assert index.maybe_append(2_000, 7)
    assert [index.lookup(t) for t in (999, 1_000, 1_999, 5_000)] == [(-1, 0), (1_000, 3), (1_000, 3), (2_000, 7)]
    index.close()
    reloaded = TimeIndex(index.path, 0, 120)
    reloaded.load(next_offset=8)
    assert reloaded.entries() == [(1_000, 3), (2_000, 7)]
    with pytest.raises(IndexCorruptError):
        TimeIndex(index.path, 0, 120).load(next_offset=7)


def test_create_append_shutdown_and_load_again(tmp_path):
    clock = FakeClock()
    manager = LogManager(str(tmp_path), now_ms_fn=clock)
    manager.load({})
    config = TopicConfig(segment_bytes=1_000)
    orders0 = manager.create_log("orders", 0, config)
    orders1 = manager.create_log("orders", 1, config)
    assert manager.create_log("orders", 0, config) is orders0
    for i in range(20):
        orders0.append_as_leader(make_batch(2, value_bytes=30), now_ms=clock.now_ms)
    orders1.append_as_leader(make_batch(1), now_ms=clock.now_ms)
    ends = {(l.topic, l.partition): l.log_end_offset for l in manager.all_logs()}
    manager.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint")).read() == ends
    assert OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint")).read() == \
        {("orders", 0): 0, ("orders", 1): 0}

    again = LogManager(str(tmp_path), now_ms_fn=clock)
    again.load({"orders": config})
    assert again.had_clean_shutdown and not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert {(l.topic, l.partition): l.log_end_offset for l in again.all_logs()} == ends
    assert again.get_log("orders", 0).config == config
    assert again.get_log("orders", 2) is None
    assert len(again.get_log("orders", 0).segments) > 1
    # a crash now (no shutdown): the next load is unclean and checks the tails
    third = LogManager(str(tmp_path), now_ms_fn=clock)
    third.load({})
    assert not third.had_clean_shutdown
    assert third.get_log("orders", 0).log_end_offset == ends[("orders", 0)]
    assert third.get_log("orders", 0).config == TopicConfig()   # unknown topic config: defaults


def test_open_transactions_and_txn_indexes_survive_shutdown_and_crash(tmp_path):
    clock = FakeClock()
    manager = LogManager(str(tmp_path), now_ms_fn=clock, producer_id_expiration_ms=1_000)
    manager.load({})
    config = TopicConfig(segment_bytes=500)
    log = manager.create_log("t", 0, config)

    def txn(producer_id, sequence, epoch=0):
        return make_batch(2, value_bytes=30, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                          transactional=True)

    log.append_as_leader(txn(1, 0), now_ms=clock.now_ms)
    for round_ in range(6):
        log.append_as_leader(txn(2, 0, epoch=round_), now_ms=clock.now_ms)
        log.append_txn_marker(2, round_ + 1, 0, round_ % 2 == 1, now_ms=clock.now_ms)
    clock.now_ms += 10_000
    manager.run_housekeeping()                   # producer 1's open transaction keeps it from expiring

    def observed(current):
        return (current.last_stable_offset, current.open_transactions(),
                [s.txn_index.all_entries() for s in current.segments])

    before = observed(log)
    assert before[0] == 0 and before[1] == [(1, 0)] and sum(map(len, before[2])) == 3
    manager.shutdown()
    again = LogManager(str(tmp_path), now_ms_fn=clock)
    again.load({"t": config})
    assert observed(again.get_log("t", 0)) == before
    crashed = LogManager(str(tmp_path), now_ms_fn=clock)   # no shutdown of `again`: unclean
    crashed.load({"t": config})
    assert not crashed.had_clean_shutdown and observed(crashed.get_log("t", 0)) == before


def test_housekeeping_applies_retention_and_writes_checkpoints(tmp_path, caplog):
    clock = FakeClock(0)
    manager = LogManager(str(tmp_path), now_ms_fn=clock)
    manager.load({})
    batch = batch_of_size(200)
    log = manager.create_log("events", 0, TopicConfig(segment_bytes=2 * len(batch), retention_ms=5_000,
                                                      file_delete_delay_ms=0))
    for i in range(6):
        log.append_as_leader(make_batch(1, value_bytes=len(batch) - 70, timestamp_ms=1_000 * i), now_ms=0)
    assert [(s.base_offset, s.largest_timestamp_ms) for s in log.segments] == [(0, 1_000), (2, 3_000), (4, 5_000)]
    recovery_points = OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint"))
    start_offsets = OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint"))
    # Housekeeping swallows a partition's StorageError (logging it); a failure here must name it.
    with caplog.at_level(logging.WARNING, logger="broker.storage.log_manager"):
        manager.run_housekeeping(now_ms=6_000)      # nothing is older than 5 s yet
        # the rolled segments were fsynced: the recovery point reached the active segment
        assert (log.log_start_offset, log.recovery_point) == (0, 4)
        assert (start_offsets.read(), recovery_points.read()) == ({("events", 0): 0}, {("events", 0): 4})
        manager.run_housekeeping(now_ms=8_001)      # segments with max timestamps 1000 and 3000 are
        assert log.log_start_offset == 4            # older than 5 s
        assert (start_offsets.read(), recovery_points.read()) == ({("events", 0): 4}, {("events", 0): 4})
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert not any(n.endswith(".deleted") for n in os.listdir(log.directory))


def test_delete_log_removes_the_directory(tmp_path):
    manager = LogManager(str(tmp_path))
    manager.load({})
    log = manager.create_log("gone", 0, TopicConfig())
    log.append_as_leader(make_batch(1), now_ms=0)
    assert manager.delete_log("gone", 0)
    assert not manager.delete_log("gone", 0)
    assert manager.get_log("gone", 0) is None
    assert os.listdir(tmp_path) == [n for n in os.listdir(tmp_path) if not n.startswith("gone")]
    assert OffsetCheckpointFile(str(tmp_path / "recovery-point-offset-checkpoint")).read() == {}


def test_load_finishes_interrupted_deletes_and_ignores_strange_dirs(tmp_path, caplog):
    (tmp_path / "old-0.0123abcd-delete").mkdir()
    (tmp_path / "old-0.0123abcd-delete" / "00000000000000000000.log").write_bytes(b"")
    (tmp_path / "lost+found").mkdir()
    (tmp_path / "__topics").mkdir()            # the broker's topic registry
    (tmp_path / "__topics" / "t.json").write_text("{}")
    (tmp_path / "recovery-point-offset-checkpoint").write_text("garbage")
    manager = LogManager(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="broker.storage.log_manager"):
        manager.load({})
    assert sorted(os.listdir(tmp_path)) == ["__topics", "log-start-offset-checkpoint", "lost+found",
                                            "recovery-point-offset-checkpoint", "replication-offset-checkpoint"]
    assert (tmp_path / "__topics" / "t.json").read_text() == "{}"
    assert manager.all_logs() == []
    warned = [r.getMessage() for r in caplog.records if "not a <topic>-<partition>" in r.getMessage()]
    assert len(warned) == 1 and "lost+found" in warned[0]   # the broker's own directory is no stray


@pytest.mark.parametrize("topic", ["", "a b", "../x", ".", "x" * 250, "naïve"])
def test_create_log_refuses_bad_topic_names(tmp_path, topic):
    manager = LogManager(str(tmp_path))
    with pytest.raises(InvalidTopicError):
        manager.create_log(topic, 0, TopicConfig())


def test_storage_imports_no_rpc_or_spark():
    import subprocess
    code = ("import sys, broker.storage, broker.storage.log_manager, broker.storage.producer_state; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('grpc', 'google', 'asyncio', 'pyspark')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
