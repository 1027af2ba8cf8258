"""Sealed segments' indexes open lazily (mapped or read at first use): the same answers as
indexes read eagerly, a corrupt one rebuilt from the log at first use, one load when readers
race, and the files on disk byte for byte what eager indexes wrote."""
from __future__ import annotations

import hashlib
import os
import threading

import pytest

import broker.storage.index as index_module
from broker.storage import Log, OffsetIndex, TimeIndex
from eos.config import TopicConfig
from tests.storage_batches import make_batch

CONFIG = TopicConfig(segment_bytes=1_200, index_interval_bytes=100)
ACCESSES = ["mmap", "read"]


def fill(path, batches: int = 40) -> Log:
    """`batches` batches of 1-3 records; batch i's records all have timestamp 1000 + 10 i."""
    log = Log.open(str(path), CONFIG, now_ms=0)
    for i in range(batches):
        log.append_as_leader(make_batch(1 + i % 3, value_bytes=40, timestamp_ms=1_000 + 10 * i), now_ms=0)
    return log


def first_offsets(batches: int = 40) -> list[int]:
    """The first offset of each batch `fill` wrote."""
    offsets, offset = [], 0
    for i in range(batches):
        offsets.append(offset)
        offset += 1 + i % 3
    return offsets


def reopen(path) -> Log:
    return Log.open(str(path), CONFIG, recovery_point=10**9, clean_shutdown=True, now_ms=0)


def eager_indexes(segment, next_offset):
    """The segment's indexes read the old way: whole, checked, into memory, now."""
    offset_index = OffsetIndex(segment.offset_index.path, segment.base_offset, CONFIG.segment_index_bytes)
    offset_index.load(segment.size_bytes)
    time_index = TimeIndex(segment.time_index.path, segment.base_offset, CONFIG.segment_index_bytes)
    time_index.load(next_offset)
    return offset_index, time_index


@pytest.fixture(params=ACCESSES)
def access(request, monkeypatch):
    monkeypatch.setattr(index_module, "SEALED_INDEX_ACCESS", request.param)
    return request.param


def test_lazy_lookups_equal_eager_ones_across_sealed_segments(tmp_path, access):
    fill(tmp_path / "t-0").close()
    log = reopen(tmp_path / "t-0")
    sealed = log.segments[:-1]
    assert len(sealed) >= 3
    assert all(s.offset_index.is_lazy and s.time_index.is_lazy for s in sealed)   # nothing read at open
    assert not log.active_segment.offset_index.is_lazy
    for segment, successor in zip(sealed, log.segments[1:]):
        offset_index, time_index = eager_indexes(segment, successor.base_offset)
        offsets = range(segment.base_offset - 1, successor.base_offset + 2)
        assert [segment.offset_index.lookup(o) for o in offsets] == [offset_index.lookup(o) for o in offsets]
        timestamps = range(900, 1_000 + 10 * 41, 5)
        assert [segment.time_index.lookup(t) for t in timestamps] == [time_index.lookup(t) for t in timestamps]
        assert segment.offset_index.entries() == offset_index.entries() and offset_index.entry_count > 3
        assert segment.time_index.entries() == time_index.entries()
        assert segment.offset_index.last_entry() == offset_index.last_entry()
        assert (segment.max_timestamp_ms, segment.offset_of_max_timestamp) == time_index.last_entry()
    # the log answers as before: every offset readable, every timestamp found
    for offset in range(log.log_end_offset):
        assert log.read(offset, 1).records
    starts = first_offsets()
    for timestamp in range(990, 1_000 + 10 * 39, 7):
        batch = max(0, -(-(timestamp - 1_000) // 10))       # the first batch at or after it
        assert log.offset_for_timestamp(timestamp) == (starts[batch], 1_000 + 10 * batch)
    assert log.offset_for_timestamp(1_000 + 10 * 40) is None


@pytest.mark.parametrize("damage", ["missing", "torn", "disorder", "past the log", "time index disorder"])
def test_a_corrupt_sealed_index_is_rebuilt_from_the_log_at_first_use(tmp_path, access, damage, caplog):
    fill(tmp_path / "t-0").close()
    log = reopen(tmp_path / "t-0")
    segment = log.segments[1]
    good = eager_indexes(segment, log.segments[2].base_offset)
    good_bytes = {p: open(p, "rb").read() for p in (segment.offset_index.path, segment.time_index.path)}
    log.close()
    index_path, time_index_path = segment.offset_index.path, segment.time_index.path
    data = bytearray(good_bytes[index_path])
    if damage == "missing":
        os.unlink(index_path)
    elif damage == "torn":
        os.truncate(index_path, len(data) - 3)
    elif damage == "disorder":
        data[0:8], data[8:16] = data[8:16], data[0:8]
        open(index_path, "wb").write(data)
    elif damage == "past the log":
        data[-4:] = (10**6).to_bytes(4, "big")
        open(index_path, "wb").write(data)
    else:
        times = bytearray(good_bytes[time_index_path])
        times[0:12], times[12:24] = times[12:24], times[0:12]
        open(time_index_path, "wb").write(times)

    log = reopen(tmp_path / "t-0")     # a clean start: nothing noticed yet
    segment = log.segments[1]
    assert segment.offset_index.is_lazy
    assert segment.time_index.is_lazy
    with caplog.at_level("WARNING"):
        assert segment.offset_index.lookup(segment.base_offset + 5) == good[0].lookup(segment.base_offset + 5)
        assert segment.time_index.lookup(1_100) == good[1].lookup(1_100)
    assert "rebuilding the indexes" in caplog.text
    assert segment.offset_index.entries() == good[0].entries()
    assert segment.time_index.entries() == good[1].entries()
    log.close()
    assert {p: open(p, "rb").read() for p in good_bytes} == good_bytes    # the files rebuilt as they were


def test_readers_racing_to_the_first_use_load_it_once(tmp_path, access, monkeypatch):
    fill(tmp_path / "t-0").close()
    log = reopen(tmp_path / "t-0")
    segment = log.segments[0]
    opened = []
    real_open = index_module._open_entries
    second_load = threading.Event()

    def slow_open(path, layout, how):
        opened.append(path)
        if len(opened) == 1:
            # the first load holds on until a second one starts (which only a missing lock
            # allows) or a bound passes: the other readers are all waiting by then
            second_load.wait(2.0)
        else:
            second_load.set()
        return real_open(path, layout, how)

    monkeypatch.setattr(index_module, "_open_entries", slow_open)
    start = threading.Barrier(4)
    answers = []

    def reader():
        start.wait()
        answers.append(segment.offset_index.lookup(segment.base_offset + 3))

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert opened == [segment.offset_index.path]
    assert len(answers) == 4 and len(set(answers)) == 1


def test_a_deleted_segment_stays_readable_until_destroyed(tmp_path, access):
    fill(tmp_path / "t-0").close()
    log = reopen(tmp_path / "t-0")
    first = log.segments[0]
    used = log.segments[1]
    used.offset_index.lookup(used.base_offset + 1)         # mapped before the rename
    view = log.snapshot()
    log.delete_records_before(log.segments[2].base_offset, now_ms=0)   # file.delete.delay.ms: not yet removed
    assert first not in log.segments and os.path.exists(first.log_path + ".deleted")
    # a reader holding the old view still finds its batches, through both kinds of index
    for segment in (first, used):
        assert segment in view.segments
        assert segment.offset_index.lookup(segment.base_offset + 2)[0] >= segment.base_offset
        assert segment.find_batch(segment.base_offset + 2, segment.size_bytes) is not None
    assert not os.path.exists(first.offset_index.path[:-len(".deleted")])   # no index written at the old name
    log.close()


def scenario(directory: str) -> dict[str, str]:
    """Appends, rolls, a clean restart with lookups, more appends, a truncation, retention
    and a close: the sha256 of every index file left. Uses only the API that the eager
    indexes had, so that the same function run on that code gave GOLDEN below."""
    config = TopicConfig(segment_bytes=1_500, index_interval_bytes=120)
    log = Log.open(directory, config, now_ms=0)
    for i in range(60):
        log.append_as_leader(make_batch(1 + i % 4, value_bytes=30 + i % 7, timestamp_ms=5_000 + 3 * i), now_ms=0)
    log.close()
    log = Log.open(directory, config, recovery_point=10**9, clean_shutdown=True, now_ms=0)
    for offset in range(0, log.log_end_offset, 3):
        log.read(offset, 100)
    log.offset_for_timestamp(5_050)
    for i in range(20):
        log.append_as_leader(make_batch(2, value_bytes=25, timestamp_ms=6_000 + i), now_ms=0)
    log.truncate_to(log.segments[-2].base_offset + 3, now_ms=0)
    for i in range(10):
        log.append_as_leader(make_batch(1, value_bytes=25, timestamp_ms=7_000 + i), now_ms=0)
    log.delete_records_before(log.segments[1].base_offset, now_ms=10**9)
    log.close()
    return {name: hashlib.sha256(open(os.path.join(directory, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(directory)) if name.endswith((".index", ".timeindex"))}


# scenario() run on the eager indexes (commit eb565f8, before lazy indexes): every index
# file's sha256. Printed by: python -c "import sys; sys.path.insert(0, '<that tree>');
# from tests.unit.test_storage_lazy_index import scenario; print(scenario('/tmp/x/t-0'))"
GOLDEN: dict[str, str] = {
    '00000000000000000021.index': 'b35e9d8e2ffd4aa1637902b1b4b9ddc0cc7b56972d3eec25ce82044af912a08a',
    '00000000000000000021.timeindex': '3a2b92157024d74da101696b325949a78965332d95f308d354fe0f3dbfb9eefc',
    '00000000000000000043.index': '828173f6f381848ba64604e88efa4218a454e948da4e763435efecb38a9217cb',
    '00000000000000000043.timeindex': '0f0fae58c04ee4469eea3f63f08f345159f63e031f36c40e1f8a690684b02078',
    '00000000000000000066.index': '8a43e4f2ddecac3d2a0d46cd13f2fcecdad4d631edd1d8821c3aa12b78200a92',
    '00000000000000000066.timeindex': 'e323b68cfd601781d613c3f1a094880db3172b87de09ffce5ff21dedbe4fee16',
    '00000000000000000086.index': 'bd1dfc812e1e67ad84e89877639d1a38b5ee12ce02fbbe63ea4080e4cfbaaf7e',
    '00000000000000000086.timeindex': '8744d1fb80f82d59ce6c66576f7458627264869c537ea186f1a22c06efa26e4a',
    '00000000000000000110.index': '0195afb974853383ed81b19f9e26b93a963ed6091a7768fd4113071030d5f57f',
    '00000000000000000110.timeindex': '9b0c5d8b4d3d51e5ba15a12896c41a2e823d52c8cba2feb7a31ed5f005135915',
    '00000000000000000131.index': '79d62790f4766da08f5a1dbdc9308c4d92196118894311478e1617cedbe9e501',
    '00000000000000000131.timeindex': '91c8f7f33945b4c18376850f24ac29437596620ab53edab6200eb2e1ca3d5463',
    '00000000000000000154.index': '63423558a591609555cb3ca712d8eba6bd6047db5df2ae6548068572e2798ec7',
    '00000000000000000154.timeindex': 'c9bb5b1ab2118591163569bf0ae9cf1d7b8935ac390a34820d55c64ef9684845',
}


def test_index_files_are_byte_identical_to_what_eager_indexes_wrote(tmp_path, access):
    assert scenario(str(tmp_path / "t-0")) == GOLDEN
