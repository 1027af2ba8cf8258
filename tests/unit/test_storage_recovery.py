"""Opening a partition: clean reopen, crash recovery (torn, zero-filled, corrupt tails), rebuilt
indexes, leftovers and strays, and the producer state brought back from snapshots and replay."""
from __future__ import annotations

import logging
import os

import pytest

from broker.storage import Log
from eos.config import TopicConfig
from eos.errors import OutOfOrderSequenceError
from tests.storage_batches import batch_of_size, make_batch
from tests.unit.test_storage_log import dir_state, whole_batches

CONFIG = TopicConfig(segment_bytes=1_200, index_interval_bytes=100)


def fill(path, batches: int = 20, config: TopicConfig = CONFIG) -> tuple[Log, list[tuple[int, int]]]:
    log = Log.open(str(path), config, now_ms=0)
    ranges = []
    for i in range(batches):
        info = log.append_as_leader(make_batch(1 + i % 3, value_bytes=40, timestamp_ms=1_000 + i), now_ms=0)
        ranges.append((info.first_offset, info.last_offset))
    return log, ranges


def reopen(path, *, clean: bool, recovery_point: int = 0, config: TopicConfig = CONFIG, **kw) -> Log:
    return Log.open(str(path), config, recovery_point=recovery_point, clean_shutdown=clean, now_ms=0, **kw)


def everything(log: Log) -> bytes:
    """The whole log, read as a consumer would (one segment per read at most)."""
    parts, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 30).records
        parts.append(data)
        offset = whole_batches(data)[-1].next_offset
    return b"".join(parts)


def segment_file(log_or_path, base_offset: int, suffix: str) -> str:
    directory = log_or_path.directory if isinstance(log_or_path, Log) else str(log_or_path)
    return os.path.join(directory, f"{base_offset:020d}{suffix}")


def test_reopen_after_a_clean_shutdown_keeps_everything(tmp_path):
    path = tmp_path / "t-0"
    log, ranges = fill(path)
    before_bytes = everything(log)
    before_indexes = [(s.base_offset, s.offset_index.entries(), s.time_index.entries()) for s in log.segments]
    before_max = [s.max_timestamp_ms for s in log.segments]
    log.close()
    files = dir_state(path)
    again = reopen(path, clean=True, recovery_point=log.log_end_offset)
    assert dir_state(path) == files                  # opening wrote nothing
    assert (again.log_start_offset, again.log_end_offset, again.recovery_point) == (0, ranges[-1][1] + 1,
                                                                                     ranges[-1][1] + 1)
    assert everything(again) == before_bytes
    assert [(s.base_offset, s.offset_index.entries(), s.time_index.entries()) for s in again.segments] == before_indexes
    assert [s.max_timestamp_ms for s in again.segments] == before_max
    for first, last in ranges:
        assert whole_batches(again.read(last, 1).records)[0].base_offset == first
    assert again.append_as_leader(make_batch(1), now_ms=0).first_offset == ranges[-1][1] + 1
    assert again.offset_for_timestamp(1_019) == (ranges[19][0], 1_019)


def _crash(log: Log) -> None:
    log.close(clean=False)


def test_log_cut_in_the_middle_of_a_batch_recovers_to_the_last_whole_batch(tmp_path):
    path = tmp_path / "t-0"
    log, ranges = fill(path)
    active = log.active_segment
    last_batch = whole_batches(log.read(ranges[-1][0], 1 << 20).records)[0]
    _crash(log)
    cut_at = active.size_bytes - last_batch.size_bytes + 20      # 20 bytes into the last batch
    os.truncate(segment_file(path, active.base_offset, ".log"), cut_at)
    again = reopen(path, clean=False, recovery_point=0)
    assert again.log_end_offset == ranges[-2][1] + 1
    assert os.path.getsize(segment_file(path, active.base_offset, ".log")) == cut_at - 20
    assert [h.last_offset for h in whole_batches(everything(again))][-1] == ranges[-2][1]
    info = again.append_as_leader(make_batch(2), now_ms=0)
    assert info.first_offset == ranges[-2][1] + 1
    assert again.recovery_point == ranges[-2][1] + 1


def test_zero_filled_tail_is_cut(tmp_path):
    path = tmp_path / "t-0"
    log, ranges = fill(path)
    base, size = log.active_segment.base_offset, log.active_segment.size_bytes
    _crash(log)
    with open(segment_file(path, base, ".log"), "ab") as f:
        f.write(b"\0" * 4096)       # preallocated blocks that never got data
    again = reopen(path, clean=False, recovery_point=base)
    assert again.log_end_offset == ranges[-1][1] + 1
    assert os.path.getsize(segment_file(path, base, ".log")) == size


def test_corruption_in_an_older_segment_cuts_the_log_there_and_drops_later_segments(tmp_path):
    path = tmp_path / "t-0"
    log, ranges = fill(path)
    assert len(log.segments) >= 3
    victim = log.segments[1]
    batches = whole_batches(victim.read_bytes(0, victim.size_bytes))
    _crash(log)
    with open(segment_file(path, victim.base_offset, ".log"), "r+b") as f:
        f.seek(batches[2].position + 70)  # inside the third batch's records
        f.write(b"\xff\xff")
    again = reopen(path, clean=False, recovery_point=0)
    assert again.log_end_offset == batches[1].next_offset
    assert [s.base_offset for s in again.segments] == [0, victim.base_offset]
    assert not any(n.endswith(".log") and int(n[:20]) > victim.base_offset for n in os.listdir(path))
    assert again.append_as_leader(make_batch(1), now_ms=0).first_offset == batches[1].next_offset


def test_recovery_checks_only_past_the_recovery_point(tmp_path):
    path = tmp_path / "t-0"
    log, _ = fill(path)
    first = log.segments[0]
    batches = whole_batches(first.read_bytes(0, first.size_bytes))
    end = log.log_end_offset
    _crash(log)
    with open(segment_file(path, 0, ".log"), "r+b") as f:   # bit rot below the recovery point
        f.seek(batches[1].position + 70)
        f.write(b"\xff")
    trusting = reopen(path, clean=False, recovery_point=log.segments[2].base_offset)
    assert trusting.log_end_offset == end
    trusting.close(clean=False)
    checking = reopen(path, clean=False, recovery_point=0)
    assert checking.log_end_offset == batches[0].next_offset


@pytest.mark.parametrize("damage", ["missing", "torn", "garbage"])
def test_missing_or_damaged_indexes_are_rebuilt(tmp_path, damage):
    path = tmp_path / "t-0"
    log, ranges = fill(path, 40)
    segment = log.segments[1]
    offset_entries, time_entries = segment.offset_index.entries(), segment.time_index.entries()
    assert offset_entries and time_entries
    log.close()
    index, time_index = segment_file(path, segment.base_offset, ".index"), segment_file(path, segment.base_offset, ".timeindex")
    if damage == "missing":
        os.unlink(index)
        os.unlink(time_index)
    elif damage == "torn":
        os.truncate(index, os.path.getsize(index) - 3)
        os.truncate(time_index, os.path.getsize(time_index) - 5)
    else:
        with open(index, "r+b") as f:
            f.write(b"\xff" * 8)          # an entry far past the end of the log
    again = reopen(path, clean=True, recovery_point=log.log_end_offset)
    rebuilt = again.segments[1]
    assert rebuilt.offset_index.entries() == offset_entries
    assert rebuilt.time_index.entries() == time_entries
    with open(index, "rb") as f:
        assert len(f.read()) == 8 * len(offset_entries)
    for first, last in ranges:
        assert whole_batches(again.read(last, 1).records)[0].base_offset == first


def test_leftovers_are_removed_and_stray_files_left_alone(tmp_path, caplog):
    path = tmp_path / "t-0"
    log, _ = fill(path, 5)
    log.close()
    for name in ("00000000000000000000.log.deleted", "00000000000000000099.index.swap", "x.cleaned",
                 "00000000000000000500.index", "notes.txt"):
        (path / name).write_bytes(b"junk")
    with caplog.at_level(logging.WARNING, logger="broker.storage.log"):
        again = reopen(path, clean=True, recovery_point=log.log_end_offset)
    names = set(os.listdir(path))
    assert "notes.txt" in names and "stray file notes.txt" in caplog.text
    assert not names & {"00000000000000000000.log.deleted", "00000000000000000099.index.swap", "x.cleaned",
                        "00000000000000000500.index"}
    assert again.log_end_offset == log.log_end_offset


def test_an_empty_directory_starts_at_the_log_start_offset(tmp_path):
    log = Log.open(str(tmp_path / "t-3"), CONFIG, log_start_offset=42, now_ms=0)
    assert (log.topic, log.partition) == ("t", 3)
    assert (log.log_start_offset, log.log_end_offset) == (42, 42)
    assert log.append_as_leader(make_batch(1), now_ms=0).first_offset == 42


def test_a_log_start_offset_beyond_the_end_starts_afresh_there(tmp_path):
    path = tmp_path / "t-0"
    log, _ = fill(path, 3)
    log.close()
    again = Log.open(str(path), CONFIG, log_start_offset=1_000, clean_shutdown=True, now_ms=0)
    assert (again.log_start_offset, again.log_end_offset, [s.base_offset for s in again.segments]) == \
        (1_000, 1_000, [1_000])


# ---- producer state --------------------------------------------------------------------------

def idempotent(sequence: int, count: int = 2, *, producer_id: int = 9, epoch: int = 0, **kw) -> bytes:
    return make_batch(count, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence, **kw)


def test_a_retried_batch_gets_its_original_offsets_and_is_not_written_again(tmp_path):
    log = Log.open(str(tmp_path / "t-0"), CONFIG, now_ms=0)
    log.append_as_leader(make_batch(3), now_ms=0)
    first = log.append_as_leader(idempotent(0), now_ms=0)
    second = log.append_as_leader(idempotent(2), now_ms=0)
    size = log.size_bytes
    retry = log.append_as_leader(idempotent(0), now_ms=0)
    assert retry.duplicate and (retry.first_offset, retry.last_offset) == (first.first_offset, first.last_offset)
    assert (log.log_end_offset, log.size_bytes) == (second.last_offset + 1, size)
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(idempotent(7), now_ms=0)
    assert log.append_as_leader(idempotent(4), now_ms=0).first_offset == second.last_offset + 1


def test_producer_state_survives_a_crash_through_snapshot_and_replay(tmp_path):
    path = tmp_path / "t-0"
    config = TopicConfig(segment_bytes=2 * len(batch_of_size(300)), index_interval_bytes=100)
    log = Log.open(str(path), config, now_ms=0)
    infos = []
    for sequence in range(0, 40, 2):
        infos.append(log.append_as_leader(idempotent(sequence, value_bytes=100), now_ms=0))
        log.append_as_leader(make_batch(1, value_bytes=100), now_ms=0)
    snapshots = sorted(n for n in os.listdir(path) if n.endswith(".snapshot"))
    assert snapshots == [f"{s.base_offset:020d}.snapshot" for s in log.segments[1:]]   # one per roll
    _crash(log)
    again = reopen(path, clean=False, recovery_point=0, config=config)
    last = again.append_as_leader(idempotent(38, value_bytes=100), now_ms=0)   # the last batch, retried
    assert last.duplicate and last.first_offset == infos[-1].first_offset
    with pytest.raises(OutOfOrderSequenceError):
        again.append_as_leader(idempotent(41), now_ms=0)
    assert not again.append_as_leader(idempotent(40), now_ms=0).duplicate
    # without any snapshot the whole log is replayed, with the same outcome
    again.close(clean=False)
    for name in os.listdir(path):
        if name.endswith(".snapshot"):
            os.unlink(path / name)
    replayed = reopen(path, clean=False, recovery_point=0, config=config)
    assert replayed.append_as_leader(idempotent(40), now_ms=0).duplicate
    assert replayed.append_as_leader(idempotent(42), now_ms=0).first_offset == replayed.log_end_offset - 2


def test_clean_shutdown_snapshots_the_producer_state_at_the_log_end(tmp_path):
    path = tmp_path / "t-0"
    log = Log.open(str(path), CONFIG, now_ms=0)
    info = log.append_as_leader(idempotent(0), now_ms=0)
    log.close()
    assert f"{log.log_end_offset:020d}.snapshot" in os.listdir(path)
    again = reopen(path, clean=True, recovery_point=log.log_end_offset)
    assert again.append_as_leader(idempotent(0), now_ms=0).first_offset == info.first_offset


def test_any_cut_of_the_active_segment_recovers_exactly_the_whole_batches_before_it(tmp_path):
    import random
    rng = random.Random(20_24)
    path = tmp_path / "t-0"
    log = Log.open(str(path), TopicConfig(index_interval_bytes=64), now_ms=0)
    ends = []   # (end position, next offset) after each batch
    for i in range(30):
        info = log.append_as_leader(make_batch(rng.randint(1, 4), value_bytes=rng.randint(0, 80)), now_ms=0)
        ends.append((log.active_segment.size_bytes, info.last_offset + 1))
    _crash(log)
    original = (path / f"{0:020d}.log").read_bytes()
    for cut in sorted(rng.sample(range(len(original)), 25)) + [0, len(original)]:
        (path / f"{0:020d}.log").write_bytes(original[:cut])
        again = reopen(path, clean=False, recovery_point=0, config=TopicConfig(index_interval_bytes=64))
        whole = [(end, next_offset) for end, next_offset in ends if end <= cut]
        expected_end = whole[-1][1] if whole else 0
        assert again.log_end_offset == expected_end, cut
        assert again.active_segment.size_bytes == (whole[-1][0] if whole else 0)
        if expected_end:
            assert whole_batches(again.read(0, 1 << 30).records)[-1].next_offset == expected_end
        again.close(clean=False)
