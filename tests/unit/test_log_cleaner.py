"""Log compaction (broker/storage/cleaner.py) on real logs on disk: the last value of every
key at its offset, tombstones and markers after delete.retention.ms, transactions, codecs,
keys required, a reader during cleaning, and kill -9 at each step of a segment swap."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import pytest

from broker.storage import AppendOrigin, Log
from broker.storage.cleaner import (CLEANER_CHECKPOINT, Cleaner, CleanerConfig, LogCleaner, plan_cleaning,
                                    wants_cleaning)
from eos import cli as eos_cli
from eos.config import TopicConfig
from eos.errors import InvalidRecordError
from eos.records import compression
from eos.records.codec import decode_records, encode_batch, encode_control_batch
from eos.records.header import iter_headers
from tests.unit.test_storage_txn import committed_view

KEYS = 1_000
RECORDS = 100_000
PER_BATCH = 100
RETENTION_MS = 60_000


def compacted(**overrides) -> TopicConfig:
    return TopicConfig.from_overrides({"cleanup.policy": "compact", "segment.bytes": "65536",
                                       "delete.retention.ms": str(RETENTION_MS), **overrides})


class Clock:
    def __init__(self, now_ms: int = 1_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def read_everything(log: Log) -> list:
    """Every record a read_uncommitted reader from offset 0 sees, in order."""
    records, position = [], 0
    while True:
        data = log.read(position, 1 << 20)
        if not data.records:
            return records
        for header in iter_headers(data.records):
            records.extend(r for r in decode_records(data.records, header, "t", 0) if r.offset >= position)
            position = header.next_offset


def write_keyed(log: Log, clock: Clock, *, records: int = RECORDS, keys: int = KEYS, tombstone_every: int = 0,
                codec: int = 0) -> dict[bytes, tuple[int, bytes | None]]:
    """`records` records over `keys` keys; the last record of every `tombstone_every`-th key
    is a tombstone. Returns key -> (offset, value) of each key's last record."""
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for first in range(0, records, PER_BATCH):
        numbers = range(first, min(first + PER_BATCH, records))
        keys_ = [b"key-%04d" % (n % keys) for n in numbers]
        values = [None if tombstone_every and n >= records - keys and (n % keys) % tombstone_every == 0
                  else b"value-%07d" % n for n in numbers]
        info = log.append_as_leader(encode_batch(values, keys_, timestamps_ms=[clock.now_ms] * len(values),
                                                 compression=codec), clock.now_ms)
        for i, (key, value) in enumerate(zip(keys_, values)):
            last[key] = (info.first_offset + i, value)
    log.roll(clock.now_ms)      # the active segment is never cleaned: seal what was written
    return last


def clean(log: Log, clock: Clock, first_dirty: int = 0, **config):
    plan = plan_cleaning(log, first_dirty, clock.now_ms)
    return Cleaner(CleanerConfig(**config), clock).clean(log, plan)


def test_the_last_value_of_each_key_stays_at_its_offset_and_tombstones_go_after_delete_retention(tmp_path):
    clock = Clock()
    log = Log.open(str(tmp_path / "t-0"), compacted(), now_ms=clock.now_ms)
    last = write_keyed(log, clock, tombstone_every=10)
    size_before = log.size_bytes
    assert wants_cleaning(log, plan_cleaning(log, 0, clock.now_ms))
    stats, _ = clean(log, clock)
    assert stats.records_read == RECORDS and stats.records_kept == KEYS
    seen = read_everything(log)
    # exactly the last record of each key, at its original offset, tombstones still there
    assert [(r.key, r.offset, r.value) for r in seen] == sorted(
        ((k, o, v) for k, (o, v) in last.items()), key=lambda t: t[1])
    assert log.size_bytes < size_before / 50
    assert log.log_end_offset == RECORDS        # offsets never change
    # delete.retention.ms later the tombstones are gone; nothing else is
    clock.now_ms += RETENTION_MS + 1
    clean(log, clock)
    after = read_everything(log)
    assert [(r.key, r.offset, r.value) for r in after] == [(r.key, r.offset, r.value) for r in seen
                                                          if r.value is not None]
    assert len(after) == KEYS - KEYS // 10
    # and the cleaned log is whole after a restart
    log.close()
    reopened = Log.open(str(tmp_path / "t-0"), compacted(), now_ms=clock.now_ms)
    assert [(r.offset, r.value) for r in read_everything(reopened)] == [(r.offset, r.value) for r in after]
    assert reopened.log_end_offset == RECORDS
    reopened.close()


def test_a_tombstone_still_inside_delete_retention_makes_the_log_due_once_it_passes(tmp_path):
    clock = Clock()
    log = Log.open(str(tmp_path / "t-0"), compacted(), now_ms=clock.now_ms)
    write_keyed(log, clock, records=2_000, keys=100, tombstone_every=2)
    _, horizon_ms = clean(log, clock)
    assert horizon_ms == clock.now_ms + RETENTION_MS
    end = log.snapshot().segments[-1].base_offset
    assert not wants_cleaning(log, plan_cleaning(log, end, clock.now_ms, horizon_ms))   # nothing dirty, not due
    clock.now_ms = horizon_ms
    plan = plan_cleaning(log, end, clock.now_ms, horizon_ms)
    assert plan.overdue and wants_cleaning(log, plan)
    log.close()


def test_a_reader_during_cleaning_never_sees_an_older_value_after_a_newer_one(tmp_path):
    clock = Clock()
    log = Log.open(str(tmp_path / "t-0"), compacted(), now_ms=clock.now_ms)
    write_keyed(log, clock)
    problems: list[str] = []
    passes = [0]
    done = threading.Event()

    def reader():
        while not done.is_set() or passes[0] < 3:
            newest: dict[bytes, int] = {}
            previous_offset = -1
            for record in read_everything(log):
                version = int(record.value.split(b"-")[1])
                if record.offset <= previous_offset:
                    problems.append(f"offset {record.offset} after {previous_offset}")
                if version < newest.get(record.key, -1):
                    problems.append(f"{record.key!r}: value {version} after {newest[record.key]}")
                newest[record.key] = version
                previous_offset = record.offset
            passes[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        clean(log, clock)
        # a second pass merges the small cleaned segments while the reader goes on
        clean(log, clock)
    finally:
        done.set()
        thread.join(120)
    assert not thread.is_alive()
    assert passes[0] >= 3 and problems == []
    assert len(log.segments) < 5        # the cleaned segments were merged by the second pass
    log.close()


def test_aborted_records_go_committed_ones_stay_and_read_committed_sees_the_same(tmp_path, capsys):
    clock = Clock()
    log = Log.open(str(tmp_path / "t-0"), compacted(**{"segment.bytes": "4096"}), now_ms=clock.now_ms)
    epoch = {7: 0, 8: 0}

    def transaction(producer_id: int, keys: list[bytes], value: bytes, commit: bool):
        # transactions v2: the marker carries the bumped epoch, the next transaction starts
        # at sequence 0 of that epoch
        batch = encode_batch([value] * len(keys), keys, timestamps_ms=[clock.now_ms] * len(keys),
                             producer_id=producer_id, producer_epoch=epoch[producer_id], base_sequence=0,
                             transactional=True)
        log.append_as_leader(batch, clock.now_ms)
        epoch[producer_id] += 1
        log.append_txn_marker(producer_id, epoch[producer_id], 0, commit, clock.now_ms)

    for round_ in range(30):
        keys = [b"k%d" % (round_ % 5 * 3 + i) for i in range(3)]
        transaction(7, keys, b"committed-%d" % round_, True)
        transaction(8, keys, b"aborted-%d" % round_, False)
    log.roll(clock.now_ms)
    before = committed_view(log)
    stats, _ = clean(log, clock)
    after = committed_view(log)
    assert after == [(o, v) for o, v in before if (o, v) in after]
    # the last committed value of each key is there; no aborted record is left in the log at all
    assert {v for _, v in after} == {b"committed-%d" % r for r in range(25, 30)}
    assert all(not (r.value or b"").startswith(b"aborted") for r in read_everything(log))
    markers = [h for s in log.segments for h in s.iter_batches(0, s.size_bytes) if h.is_control]
    assert len(markers) == 60       # the first pass keeps every marker: their batches were in it
    # a second pass drops the markers whose records are gone (once delete.retention.ms passed):
    # left are the COMMIT markers of the five transactions that still hold a key's last value,
    # and producer 8's last ABORT: its epoch, which recovery rebuilds its state from (Kafka
    # keeps a producer's last batch, or with none in its state, its current epoch's markers)
    clock.now_ms += RETENTION_MS + 1
    clean(log, clock)
    markers = [h for s in log.segments for h in s.iter_batches(0, s.size_bytes) if h.is_control]
    assert [(h.producer_id, h.producer_epoch) for h in markers] == [(7, e) for e in range(26, 31)] + [(8, 30)]
    assert committed_view(log) == after
    # `eos dump-log` reads the cleaned segments: every batch valid (emptied ones included),
    # the same records and markers a reader sees
    capsys.readouterr()
    segment_files = sorted(os.path.join(log.directory, n) for n in os.listdir(log.directory) if n.endswith(".log"))
    assert eos_cli.main(["dump-log", "--print-data-log", *segment_files]) == 0
    dumped = capsys.readouterr().out
    assert "isvalid: true" in dumped and "isvalid: false" not in dumped and "invalid bytes" not in dumped
    dumped_offsets = [int(line.split()[2]) for line in dumped.splitlines() if line.startswith("| offset:")]
    assert dumped_offsets == [r.offset for r in read_everything(log)]     # (markers included)
    assert dumped.count("endTxnMarker") == len(markers)
    # the producers' sequences survive cleaning and a restart: the next batch is in sequence
    log.close()
    reopened = Log.open(str(tmp_path / "t-0"), compacted(**{"segment.bytes": "4096"}), now_ms=clock.now_ms)
    log = reopened
    transaction(7, [b"k0"], b"after", True)
    assert committed_view(reopened)[-1][1] == b"after"
    reopened.close()


@pytest.mark.parametrize("codec_name", ["gzip", "snappy", "lz4", "zstd"])
def test_compressed_batches_are_recompressed_with_their_codec(tmp_path, codec_name):
    clock = Clock()
    codec = compression.codec_from_name(codec_name)
    log = Log.open(str(tmp_path / "t-0"), compacted(), now_ms=clock.now_ms)
    last = write_keyed(log, clock, records=5_000, keys=50, codec=codec)
    clean(log, clock)
    headers = [h for s in log.segments for h in s.iter_batches(0, s.size_bytes)]
    assert headers and all(h.compression == codec for h in headers if h.records_count)
    assert {r.key: (r.offset, r.value) for r in read_everything(log)} == last
    log.close()


def test_a_compacted_topic_refuses_a_record_without_a_key_and_appends_nothing(tmp_path):
    log = Log.open(str(tmp_path / "t-0"), compacted(), now_ms=0)
    log.append_as_leader(encode_batch([b"a"], [b"k"]), 0)
    with pytest.raises(InvalidRecordError, match="has no key"):
        log.append_as_leader(encode_batch([b"b", b"c"], [b"k", None]), 0)
    assert log.log_end_offset == 1 and [r.value for r in read_everything(log)] == [b"a"]
    plain = Log.open(str(tmp_path / "u-0"), TopicConfig(), now_ms=0)
    plain.append_as_leader(encode_batch([b"b"]), 0)      # keys are optional on a delete topic
    assert plain.log_end_offset == 1
    log.close()
    plain.close()


def test_the_cleaner_checkpoint_is_kafkas_file_and_a_new_cleaner_resumes_from_it(tmp_path):
    clock = Clock()
    log = Log.open(str(tmp_path / "t-0"), compacted(), now_ms=clock.now_ms)
    write_keyed(log, clock, records=10_000, keys=100)
    cleaner = LogCleaner(str(tmp_path), lambda: [log], CleanerConfig(), now_ms_fn=clock)
    stats = cleaner.clean_once()
    assert stats is not None and stats.end_offset == 10_000
    lines = (tmp_path / CLEANER_CHECKPOINT).read_text().splitlines()
    assert lines == ["0", "1", "t 0 10000"]
    assert cleaner.clean_once() is None                  # nothing dirty is left
    again = LogCleaner(str(tmp_path), lambda: [log], CleanerConfig(), now_ms_fn=clock)
    assert again.first_dirty_offset("t", 0) == 10_000 and again.clean_once() is None
    log.close()


def test_min_and_max_compaction_lag(tmp_path):
    clock = Clock()
    log = Log.open(str(tmp_path / "t-0"), compacted(**{"min.compaction.lag.ms": "10000"}), now_ms=clock.now_ms)
    write_keyed(log, clock, records=5_000, keys=50)
    assert plan_cleaning(log, 0, clock.now_ms).dirty_bytes == 0      # too young to compact
    clock.now_ms += 10_001
    assert wants_cleaning(log, plan_cleaning(log, 0, clock.now_ms))
    log.close()
    lagging = Log.open(str(tmp_path / "u-0"), compacted(**{"min.cleanable.dirty.ratio": "0.99",
                                                           "max.compaction.lag.ms": "5000"}), now_ms=clock.now_ms)
    write_keyed(lagging, clock, records=5_000, keys=50)
    cleaned_once, _ = clean(lagging, clock)
    write_keyed(lagging, clock, records=100, keys=50)     # a little new dirt: far below the ratio
    plan = plan_cleaning(lagging, cleaned_once.end_offset, clock.now_ms)
    assert plan.dirty_ratio < 0.99 and not wants_cleaning(lagging, plan)
    clock.now_ms += 5_001                                # ... until it is older than max.compaction.lag.ms
    assert wants_cleaning(lagging, plan_cleaning(lagging, cleaned_once.end_offset, clock.now_ms))
    lagging.close()


# ---- kill -9 in the middle of a swap ----------------------------------------------------------

_CHILD = r"""
import os, signal, sys
from broker.storage import Log
from broker.storage.cleaner import Cleaner, CleanerConfig, plan_cleaning
from tests.unit.test_log_cleaner import Clock, compacted
directory, kill_at = sys.argv[1], sys.argv[2]
clock = Clock()
log = Log.open(directory, compacted(), now_ms=clock.now_ms)
passes = {"n": 0}
def step(name):
    if name == kill_at:
        passes["n"] += 1
        if passes["n"] == 2:     # the second segment group's swap: one is done, one is cut
            os.kill(os.getpid(), signal.SIGKILL)
Cleaner(CleanerConfig(), clock).clean(log, plan_cleaning(log, 0, clock.now_ms), step=step)
print("not killed", flush=True)
"""


@pytest.mark.parametrize("kill_at", ["cleaned", "swap", "deleted", "live"])
def test_kill_9_at_each_step_of_a_swap_leaves_a_whole_log_and_cleaning_resumes(tmp_path, kill_at):
    clock = Clock()
    directory = str(tmp_path / "t-0")
    log = Log.open(directory, compacted(), now_ms=clock.now_ms)
    last = write_keyed(log, clock)
    everything = [(r.offset, r.key, r.value) for r in read_everything(log)]
    log.close()
    child = subprocess.run([sys.executable, "-c", _CHILD, directory, kill_at], capture_output=True, text=True,
                           timeout=300, cwd=os.getcwd())
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    # the crash left .cleaned / .swap / .deleted files behind, in some combination
    leftovers = [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted"))]
    assert leftovers
    reopened = Log.open(directory, compacted(), now_ms=clock.now_ms)
    assert not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted"))]
    seen = [(r.offset, r.key, r.value) for r in read_everything(reopened)]
    # whole and readable: a subsequence of what was written, in order, ending with every key's last record
    assert set(seen) <= set(everything) and seen == sorted(seen)
    assert {key: (offset, value) for offset, key, value in seen} == last
    assert reopened.log_end_offset == RECORDS
    # cleaning resumes and finishes the job
    clean(reopened, clock)
    assert sorted((o, k, v) for k, (o, v) in last.items()) == [(r.offset, r.key, r.value)
                                                               for r in read_everything(reopened)]
    reopened.close()


def test_a_follower_copies_cleaned_batches_as_they_are(tmp_path):
    clock = Clock()
    leader = Log.open(str(tmp_path / "a" / "t-0"), compacted(), now_ms=clock.now_ms)
    last = write_keyed(leader, clock, records=5_000, keys=50)
    clean(leader, clock)
    follower = Log.open(str(tmp_path / "b" / "t-0"), compacted(), now_ms=clock.now_ms)
    position = 0
    while position < leader.log_end_offset:
        data = leader.read(position, 1 << 20, max_offset_exclusive=leader.log_end_offset)
        if not data.records:
            break
        follower.append_as_follower(data.records, clock.now_ms)
        position = follower.log_end_offset
    assert {r.key: (r.offset, r.value) for r in read_everything(follower)} == last
    leader.close()
    follower.close()


def test_coordinator_appends_to_a_compacted_internal_topic_need_keys_too(tmp_path):
    log = Log.open(str(tmp_path / "__consumer_offsets-0"), compacted(), now_ms=0)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(encode_batch([b"x"]), 0, origin=AppendOrigin.COORDINATOR)
    assert log.log_end_offset == 0
    # a transaction marker is a control batch (checked as a marker, its key is the marker type)
    log.append_as_leader(encode_batch([b"v"], [b"k"], producer_id=1, producer_epoch=0, base_sequence=-1,
                                      transactional=True), 0, origin=AppendOrigin.COORDINATOR)
    log.append_as_leader(encode_control_batch(committed=True, producer_id=1, producer_epoch=1, coordinator_epoch=0,
                                              timestamp_ms=0), 0, origin=AppendOrigin.COORDINATOR)
    assert log.log_end_offset == 2 and log.last_stable_offset == 2
    log.close()
