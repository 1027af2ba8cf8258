"""The partition log: staged appends, reads, rolls, lookups by offset and time, retention, flush."""
from __future__ import annotations

import os
import struct
import threading

import pytest

from broker.storage import AppendOrigin, Log
from broker.storage.segment import RECENT_BATCHES_MAX
from eos.config import TopicConfig
from eos.errors import (
    CorruptRecordError,
    InvalidRecordError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    RecordListTooLargeError,
)
from eos.records.codec import decode_records, encode_control_batch
from eos.records.header import TIMESTAMP_TYPE_MASK, compute_crc, iter_headers, verify_crc
from tests.storage_batches import batch_of_size, make_batch


def open_log(tmp_path, now_ms: int = 0, name: str = "t-0", **config) -> Log:
    return Log.open(str(tmp_path / name), TopicConfig(**config), now_ms=now_ms)


def whole_batches(data: bytes):
    """Parse `data` as back-to-back batches, checking every CRC (raises if anything is torn)."""
    headers = list(iter_headers(data))
    for header in headers:
        verify_crc(data, header)
    return headers


def dir_state(path) -> dict[str, bytes]:
    state = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            state[name] = f.read()
    return state


def resign(buf: bytearray) -> bytearray:
    """Recompute the CRC of the first batch in `buf` after a header edit."""
    size = struct.unpack_from(">i", buf, 8)[0] + 12
    struct.pack_into(">I", buf, 17, compute_crc(buf, 0, size))
    return buf


# ---- appending and reading ------------------------------------------------------------------

def test_append_assigns_contiguous_offsets_and_reads_back_the_same_batches(tmp_path):
    log = open_log(tmp_path)
    first = log.append_as_leader(make_batch(3, timestamp_ms=100), now_ms=1)
    second = log.append_as_leader(make_batch(2, timestamp_ms=[300, 200]) + make_batch(1, timestamp_ms=50), now_ms=2)
    assert (first.first_offset, first.last_offset, first.record_count, first.batch_count) == (0, 2, 3, 1)
    assert (second.first_offset, second.last_offset, second.record_count, second.batch_count) == (3, 5, 3, 2)
    assert second.max_timestamp_ms == 300 and second.log_append_time_ms == -1 and not second.duplicate
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (0, 6, 6)

    data = log.read(0, 1 << 20)
    headers = whole_batches(data.records)
    assert [(h.base_offset, h.last_offset) for h in headers] == [(0, 2), (3, 4), (5, 5)]
    assert (data.first_offset, data.high_watermark, data.log_start_offset) == (0, 6, 0)
    records = [r for h in headers for r in decode_records(data.records, h, "t", 0)]
    assert [r.offset for r in records] == list(range(6))
    assert [r.timestamp for r in records] == [100, 100, 100, 300, 200, 50]


def test_read_returns_the_batch_holding_the_offset_and_respects_limits(tmp_path):
    log = open_log(tmp_path)
    batch = make_batch(4, value_bytes=20)
    for _ in range(5):
        log.append_as_leader(batch, now_ms=0)
    size = len(batch)
    # mid-batch fetch offset: the whole batch that holds it
    data = log.read(6, 1 << 20)
    assert data.first_offset == 4 and len(whole_batches(data.records)) == 4
    # max_bytes cuts at whole batches
    assert len(whole_batches(log.read(0, 2 * size + size // 2).records)) == 2
    # below one batch: one whole batch anyway, or nothing without min_one_batch
    assert len(log.read(0, 10).records) == size
    assert log.read(0, 10, min_one_batch=False).records == b""
    # never reaching max_offset_exclusive (a batch straddling it is left out)
    assert [h.last_offset for h in whole_batches(log.read(0, 1 << 20, max_offset_exclusive=8).records)] == [3, 7]
    assert [h.last_offset for h in whole_batches(log.read(0, 1 << 20, max_offset_exclusive=10).records)] == [3, 7]
    assert log.read(8, 1 << 20, max_offset_exclusive=10).records == b""
    # the end of the log is an empty answer; past it or before the start is out of range
    end = log.read(20, 1 << 20)
    assert (end.records, end.first_offset, end.high_watermark) == (b"", 20, 20)
    with pytest.raises(OffsetOutOfRangeError, match=r"21 is outside .*\[0, 20\]"):
        log.read(21, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)


def test_read_stops_at_the_snapshot_high_watermark_unless_given_a_bound(tmp_path):
    log = open_log(tmp_path)
    for _ in range(5):
        log.append_as_leader(make_batch(4, value_bytes=20), now_ms=0)
    # One node never holds the high watermark back, so publish a snapshot that does (as
    # replication would): the default bound is what consumers may see, not the log end.
    log._view = log._view._replace(high_watermark=10)
    held_back = log.read(0, 1 << 20)
    assert [h.last_offset for h in whole_batches(held_back.records)] == [3, 7]
    assert held_back.high_watermark == 10
    assert log.read(8, 1 << 20).records == b""
    # an explicit bound may pass the high watermark, never the log end
    assert [h.last_offset for h in whole_batches(log.read(8, 1 << 20, max_offset_exclusive=99).records)] == \
        [11, 15, 19]


def test_log_append_time_stamps_the_batch_and_keeps_the_crc_valid(tmp_path):
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    info = log.append_as_leader(make_batch(2, timestamp_ms=5), now_ms=777)
    assert info.log_append_time_ms == 777 and info.max_timestamp_ms == 777
    (header,) = whole_batches(log.read(0, 1 << 20).records)
    assert header.attributes & TIMESTAMP_TYPE_MASK and header.max_timestamp == 777
    assert log.offset_for_timestamp(700) == (0, 777)


def test_the_copy_and_the_log_append_time_crc_are_done_before_the_partition_lock(tmp_path, monkeypatch):
    import broker.storage.validator as validator_module

    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    lock_held_at_crc = []
    real_crc = validator_module.compute_crc

    def watched_crc(buf, position, size):
        lock_held_at_crc.append(log._lock.locked())
        return real_crc(buf, position, size)

    monkeypatch.setattr(validator_module, "compute_crc", watched_crc)
    log.append_as_leader(make_batch(3) + make_batch(2), now_ms=777)
    log.append_txn_marker(7, 0, 0, False, now_ms=778)
    assert lock_held_at_crc == [False, False, False]
    assert [h.base_offset for h in whole_batches(log.read(0, 1 << 20).records)] == [0, 3, 5]


def test_headers_parsed_by_the_caller_append_the_same_as_a_parse_here(tmp_path):
    request = make_batch(3, tag=1) + make_batch(2, tag=2)
    parsed = open_log(tmp_path, name="parsed-0")
    own = open_log(tmp_path, name="own-0")
    for log in (parsed, own):
        log.append_as_leader(make_batch(1), now_ms=0)
    assert parsed.append_as_leader(request, now_ms=5, headers=list(iter_headers(request))) == \
        own.append_as_leader(request, now_ms=5)
    assert parsed.read(0, 1 << 20).records == own.read(0, 1 << 20).records


def test_parsed_headers_that_do_not_describe_the_request_are_refused_and_change_nothing(tmp_path):
    from eos.errors import InvalidRequestError

    log = open_log(tmp_path)
    log.append_as_leader(make_batch(1), now_ms=0)
    before = dir_state(log.directory)
    request = make_batch(3) + make_batch(2)
    headers = list(iter_headers(request))
    with pytest.raises(InvalidRequestError, match="cover"):
        log.append_as_leader(request, now_ms=0, headers=headers[:1])          # the second batch is missing
    with pytest.raises(InvalidRequestError, match="does not describe the batch at byte"):
        log.append_as_leader(request, now_ms=0, headers=headers[::-1])        # out of order
    with pytest.raises(InvalidRequestError, match="cover"):
        log.append_as_leader(request, now_ms=0, headers=[])
    other = make_batch(3, tag=9) + make_batch(2, tag=9)                      # same layout, other bytes
    with pytest.raises(CorruptRecordError, match="CRC"):
        log.append_as_leader(request, now_ms=0, headers=list(iter_headers(other)))
    assert dir_state(log.directory) == before and log.log_end_offset == 1


# ---- bad input: a clear error, nothing changed ------------------------------------------------

def _bad_crc():
    buf = bytearray(make_batch(2))
    buf[-1] ^= 0xFF
    return bytes(buf)


def _bad_magic():
    buf = bytearray(make_batch(2))
    buf[16] = 3             # no such format
    return bytes(buf)


def _legacy_magic():
    buf = bytearray(make_batch(2))
    buf[16] = 1             # a v1 message set: Kafka 4 refuses to produce it
    return bytes(buf)


def _count_mismatch():
    buf = bytearray(make_batch(2))
    struct.pack_into(">i", buf, 57, 3)  # recordsCount 3, lastOffsetDelta 1
    return bytes(resign(buf))


def _length_too_long():
    buf = bytearray(make_batch(2))
    struct.pack_into(">i", buf, 8, struct.unpack_from(">i", buf, 8)[0] + 4)
    return bytes(buf)


def _length_too_short():
    buf = bytearray(make_batch(2))
    struct.pack_into(">i", buf, 8, struct.unpack_from(">i", buf, 8)[0] - 4)
    return bytes(buf)


def _negative_length():
    buf = bytearray(make_batch(2))
    struct.pack_into(">i", buf, 8, -1)
    return bytes(buf)


BAD_INPUTS = [
    ("wrong CRC", _bad_crc, CorruptRecordError, "CRC mismatch"),
    ("bad magic", _bad_magic, CorruptRecordError, "magic 3"),
    ("legacy magic", _legacy_magic, InvalidRecordError, "magic version 2"),
    ("record count vs offsets", _count_mismatch, InvalidRecordError, "recordsCount 3 does not match"),
    ("length beyond the buffer", _length_too_long, CorruptRecordError, "truncated batch"),
    ("length short of the batch", _length_too_short, CorruptRecordError, "CRC mismatch|truncated"),
    ("negative length", _negative_length, CorruptRecordError, "invalid batch length -1"),
    ("trailing partial batch", lambda: make_batch(1) + make_batch(1)[:30], CorruptRecordError, "truncated batch"),
    ("no batches", lambda: b"", InvalidRecordError, "no record batches"),
    ("too large", lambda: make_batch(1, value_bytes=600), MessageTooLargeError, r"\d+ bytes, larger than max.message.bytes 500"),
    ("control batch from a client",
     lambda: encode_control_batch(committed=True, producer_id=1, producer_epoch=0, coordinator_epoch=0, timestamp_ms=1),
     InvalidRecordError, "control batch"),
    ("two idempotent batches",
     lambda: make_batch(1, producer_id=1, producer_epoch=0, base_sequence=0)
     + make_batch(1, producer_id=1, producer_epoch=0, base_sequence=1),
     InvalidRecordError, "only one batch"),
    ("transactional without producer id", lambda: make_batch(1, transactional=True), InvalidRecordError,
     "no producer id"),
    ("out of sequence", lambda: make_batch(1, producer_id=7, producer_epoch=0, base_sequence=5),
     Exception, "sequence"),
]


@pytest.mark.parametrize("label, build, error, message", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_a_failing_prepare_changes_nothing(tmp_path, label, build, error, message):
    log = open_log(tmp_path, max_message_bytes=500, segment_bytes=1000, index_interval_bytes=50)
    for i in range(6):
        log.append_as_leader(make_batch(2, value_bytes=30, timestamp_ms=10 + i), now_ms=0)
    log.append_as_leader(make_batch(1, producer_id=7, producer_epoch=0, base_sequence=0), now_ms=0)
    before_files = dir_state(log.directory)
    before = (log.log_start_offset, log.log_end_offset, log.high_watermark, log.size_bytes, len(log.segments),
              log.recovery_point, log.read(0, 1 << 20).records)
    with pytest.raises(error, match=message):
        log.append_as_leader(build(), now_ms=10_000_000_000)
    after = (log.log_start_offset, log.log_end_offset, log.high_watermark, log.size_bytes, len(log.segments),
             log.recovery_point, log.read(0, 1 << 20).records)
    assert after == before
    assert dir_state(log.directory) == before_files
    # and the log still takes good input at the next offset
    assert log.append_as_leader(make_batch(1), now_ms=0).first_offset == before[1]


def test_a_batch_larger_than_a_segment_is_refused_and_changes_nothing(tmp_path):
    log = open_log(tmp_path, max_message_bytes=5000, segment_bytes=1000)
    log.append_as_leader(make_batch(2), now_ms=0)
    before = (log.log_end_offset, log.size_bytes, dir_state(log.directory))
    with pytest.raises(RecordListTooLargeError, match=r"\d+ bytes, larger than segment.bytes 1000"):
        log.append_as_leader(make_batch(4, value_bytes=400), now_ms=0)
    assert (log.log_end_offset, log.size_bytes, dir_state(log.directory)) == before


def test_a_plain_request_larger_than_a_segment_is_spread_over_segments(tmp_path):
    """A plain producer sends a partition's queued batches in one request; together they may
    exceed segment.bytes though each fits: every segment still stays within segment.bytes."""
    log = open_log(tmp_path, max_message_bytes=5000, segment_bytes=1000)
    log.append_as_leader(make_batch(1), now_ms=0)
    batches = [make_batch(3, value_bytes=100, tag=n) for n in range(7)]
    info = log.append_as_leader(b"".join(batches), now_ms=0)
    assert (info.first_offset, info.last_offset) == (1, 21)
    assert log.log_end_offset == 22
    assert len(log.segments) >= 3
    assert all(segment.size_bytes <= 1000 for segment in log.segments)
    written = batch_bytes_from(log, 1)
    # the part of each batch its CRC covers (from the attributes on) is the producer's
    assert [batch[21:] for batch in written] == [batch[21:] for batch in batches]
    log.close()
    reopened = open_log(tmp_path, max_message_bytes=5000, segment_bytes=1000)
    assert reopened.log_end_offset == 22 and batch_bytes_from(reopened, 1) == written


def batch_bytes_from(log: Log, offset: int) -> list[bytes]:
    """Every batch from `offset` to the log end, each as its bytes (reads cross segments)."""
    batches = []
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20).records
        for header in whole_batches(data):
            batches.append(bytes(data[header.position:header.position + header.size_bytes]))
            offset = header.next_offset
    return batches


def test_a_coordinator_may_write_control_batches(tmp_path):
    log = open_log(tmp_path)
    marker = encode_control_batch(committed=True, producer_id=1, producer_epoch=0, coordinator_epoch=0,
                                  timestamp_ms=1)
    info = log.append_as_leader(marker, now_ms=0, origin=AppendOrigin.COORDINATOR)
    (header,) = whole_batches(log.read(0, 1 << 20).records)
    assert (info.first_offset, header.is_control, header.is_transactional) == (0, True, True)


def test_records_must_be_bytes_like(tmp_path):
    with pytest.raises(InvalidRecordError, match="bytes-like"):
        open_log(tmp_path).append_as_leader("text", now_ms=0)


# ---- rolling ---------------------------------------------------------------------------------

def test_roll_on_segment_bytes(tmp_path):
    batch = batch_of_size(100)
    log = open_log(tmp_path, segment_bytes=3 * len(batch) + 10)
    for _ in range(10):
        log.append_as_leader(batch, now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    assert all(s.size_bytes <= 3 * len(batch) + 10 for s in log.segments)
    assert sorted(n for n in os.listdir(log.directory) if n.endswith(".log")) == \
        [f"{b:020d}.log" for b in (0, 3, 6, 9)]


def test_roll_on_segment_ms_counts_from_the_first_batch_timestamp(tmp_path):
    log = open_log(tmp_path, segment_ms=1000)
    log.append_as_leader(make_batch(1, timestamp_ms=10_000), now_ms=0)
    log.append_as_leader(make_batch(1, timestamp_ms=11_000), now_ms=0)   # waited 1000: not more than segment.ms
    assert len(log.segments) == 1
    log.append_as_leader(make_batch(1, timestamp_ms=11_001), now_ms=0)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_on_segment_ms_from_creation_when_the_first_batch_has_no_timestamp(tmp_path):
    log = open_log(tmp_path, segment_ms=1000, now_ms=5_000)
    log.append_as_leader(make_batch(1, timestamp_ms=-1), now_ms=5_000)
    log.append_as_leader(make_batch(1, timestamp_ms=-1), now_ms=6_000)
    assert len(log.segments) == 1
    log.append_as_leader(make_batch(1, timestamp_ms=-1), now_ms=6_001)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_roll_when_the_offset_index_is_full(tmp_path):
    log = open_log(tmp_path, index_interval_bytes=0, segment_index_bytes=24)  # 3 offset entries, 2 time entries
    for _ in range(12):
        log.append_as_leader(make_batch(1, timestamp_ms=1_000), now_ms=0)   # one timestamp: one time entry
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    assert [s.offset_index.entry_count for s in log.segments] == [3, 3, 3]


def test_roll_when_the_time_index_is_full(tmp_path):
    log = open_log(tmp_path, index_interval_bytes=0, segment_index_bytes=24)
    for i in range(6):
        log.append_as_leader(make_batch(1, timestamp_ms=1_000 + i), now_ms=0)
    # batches 1 and 2 fill the 2-entry time index (batch 0 is never indexed); batch 3 rolls
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert log.segments[0].time_index.entries() == [(1_001, 1), (1_002, 2)]
    assert log.segments[0].offset_index.entry_count == 2   # not full: the time index decided


def test_lookups_across_segments_find_every_offset(tmp_path):
    log = open_log(tmp_path, segment_bytes=2_000, index_interval_bytes=150)
    sizes = []
    for i in range(60):
        info = log.append_as_leader(make_batch(1 + i % 4, value_bytes=15, timestamp_ms=i), now_ms=0)
        sizes.append((info.first_offset, info.last_offset))
    assert len(log.segments) > 3
    assert all(s.offset_index.entry_count > 0 for s in log.segments[:-1])
    for first, last in sizes:
        for offset in range(first, last + 1):
            data = log.read(offset, 1)
            (header,) = whole_batches(data.records)
            assert (header.base_offset, header.last_offset) == (first, last)
    # the index narrows the scan: the entry it gives is at or before the batch, never after
    for segment in log.segments:
        for offset, position in segment.offset_index.entries():
            batch = segment.find_batch(offset, segment.size_bytes)
            assert (batch.last_offset, batch.position) == (offset, position)


def test_offset_for_timestamp(tmp_path):
    log = open_log(tmp_path, segment_bytes=1_500, index_interval_bytes=100)
    # batch i holds records with timestamps 100i, 100i+10, 100i+20; one late batch goes back in time
    for i in range(30):
        log.append_as_leader(make_batch(3, timestamp_ms=[100 * i, 100 * i + 10, 100 * i + 20]), now_ms=0)
    log.append_as_leader(make_batch(2, timestamp_ms=[5, 3_500]), now_ms=0)   # offsets 90, 91
    assert len(log.segments) > 2
    assert log.offset_for_timestamp(0) == (0, 0)
    assert log.offset_for_timestamp(1_010) == (31, 1_010)
    assert log.offset_for_timestamp(1_011) == (32, 1_020)
    assert log.offset_for_timestamp(1_021) == (33, 1_100)
    assert log.offset_for_timestamp(2_920) == (89, 2_920)
    assert log.offset_for_timestamp(2_921) == (91, 3_500)
    assert log.offset_for_timestamp(3_501) is None
    assert log.offset_for_timestamp(1_000, max_offset_exclusive=30) is None
    for ts in range(0, 2_921, 7):  # against a scan of every record
        expected = next((i * 3 + j, 100 * i + 10 * j) for i in range(30) for j in range(3) if 100 * i + 10 * j >= ts)
        assert log.offset_for_timestamp(ts) == expected


# ---- retention -------------------------------------------------------------------------------

def _segmented_log(tmp_path, **config):
    batch = batch_of_size(200)
    log = open_log(tmp_path, segment_bytes=2 * len(batch), **config)
    for i in range(8):
        log.append_as_leader(make_batch(1, value_bytes=len(batch) - 70, timestamp_ms=1_000 * (i + 1)), now_ms=0)
    return log


def test_retention_by_time_deletes_old_segments_but_never_the_active_one(tmp_path):
    log = _segmented_log(tmp_path, retention_ms=10_000, file_delete_delay_ms=500)
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6]
    assert [s.largest_timestamp_ms for s in log.segments] == [2_000, 4_000, 6_000, 8_000]
    assert log.delete_old_segments(now_ms=12_000) == 0        # 12000 - 2000 is not more than 10000
    assert log.delete_old_segments(now_ms=14_500) == 2
    assert [s.base_offset for s in log.segments] == [4, 6]
    assert log.log_start_offset == 4
    with pytest.raises(OffsetOutOfRangeError, match=r"\[4, 8\]"):
        log.read(3, 100)
    assert whole_batches(log.read(4, 1 << 20).records)[0].base_offset == 4
    # files are renamed first and removed after file.delete.delay.ms
    names = os.listdir(log.directory)
    assert f"{0:020d}.log.deleted" in names and f"{0:020d}.log" not in names
    log.delete_old_segments(now_ms=15_000)
    assert not any(n.endswith(".deleted") for n in os.listdir(log.directory))
    assert log.delete_old_segments(now_ms=10**12) == 1         # everything is old: the active one stays
    assert [s.base_offset for s in log.segments] == [6]
    assert log.log_start_offset == 6 and log.log_end_offset == 8


def test_retention_by_size(tmp_path):
    log = _segmented_log(tmp_path, retention_bytes=-1)
    segment_bytes = log.segments[0].size_bytes
    log.update_config(TopicConfig(segment_bytes=10**6, retention_bytes=2 * segment_bytes + 1))
    # 4 segments; deleting the oldest while what remains stays >= retention.bytes
    assert log.delete_old_segments(now_ms=0) == 1
    assert [s.base_offset for s in log.segments] == [2, 4, 6]
    assert log.log_start_offset == 2
    log.update_config(TopicConfig(segment_bytes=10**6, retention_bytes=0))
    assert log.delete_old_segments(now_ms=0) == 2
    assert [s.base_offset for s in log.segments] == [6] and log.log_start_offset == 6


def test_delete_records_before_moves_the_start_and_drops_whole_segments(tmp_path):
    log = _segmented_log(tmp_path)
    assert log.delete_records_before(3, now_ms=0) == 3
    assert [s.base_offset for s in log.segments] == [2, 4, 6]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(2, 100)
    assert log.read(3, 1 << 20).first_offset == 3
    with pytest.raises(OffsetOutOfRangeError, match="high watermark"):
        log.delete_records_before(9, now_ms=0)


# ---- flush -----------------------------------------------------------------------------------

def test_flush_policy(tmp_path):
    log = open_log(tmp_path, flush_messages=5)
    log.append_as_leader(make_batch(3), now_ms=0)
    assert log.recovery_point == 0
    log.append_as_leader(make_batch(2), now_ms=0)
    assert log.recovery_point == 5

    timed = open_log(tmp_path, name="t-1", flush_ms=1_000)
    timed.append_as_leader(make_batch(3), now_ms=0)
    assert not timed.maybe_flush(now_ms=999) and timed.recovery_point == 0
    assert timed.maybe_flush(now_ms=1_000) and timed.recovery_point == 3


def test_by_default_only_rolled_segments_are_flushed(tmp_path):
    batch = batch_of_size(200)
    log = open_log(tmp_path, segment_bytes=2 * len(batch))
    for _ in range(5):
        log.append_as_leader(batch, now_ms=0)
    assert log.recovery_point == 0
    assert not log.maybe_flush(now_ms=10**9)
    assert log.recovery_point == log.active_segment.base_offset == 4
    log.flush()
    assert log.recovery_point == 5


# ---- concurrency -----------------------------------------------------------------------------

def test_finding_a_batch_agrees_with_a_scan_from_the_start_at_every_snapshot(tmp_path):
    log = open_log(tmp_path, index_interval_bytes=300)
    snapshots = []   # (end position, log end offset) as a reader's view saw them after each append
    # single batches, and requests of several batches, one of more than RECENT_BATCHES_MAX:
    # enough for the remembered positions to be restarted and trimmed several times
    shapes = [1] * 150 + [3, RECENT_BATCHES_MAX + 5, 1, 2, 40] + [1] * 200
    for i, batches in enumerate(shapes):
        request = b"".join(make_batch(1 + (i + j) % 3, value_bytes=20) for j in range(batches))
        log.append_as_leader(request, now_ms=0)
        snapshots.append((log.active_segment.size_bytes, log.log_end_offset))
    segment = log.active_segment
    assert len(segment.offset_index.entries()) > 10
    for end_position, end_offset in snapshots[::7] + snapshots[-RECENT_BATCHES_MAX:]:
        scanned = list(segment.iter_batches(0, end_position))
        for offset in range(max(0, end_offset - 3 * RECENT_BATCHES_MAX), end_offset + 3):
            expected = next((h for h in scanned if h.last_offset >= offset), None)
            assert segment.find_batch(offset, end_position) == expected, (offset, end_position)


def test_a_read_at_the_tail_does_not_scan_headers(tmp_path, monkeypatch):
    log = open_log(tmp_path, index_interval_bytes=4096)
    for _ in range(100):
        log.append_as_leader(make_batch(1, value_bytes=100), now_ms=0)
    tail_offset = log.log_end_offset
    log.append_as_leader(make_batch(2, value_bytes=100), now_ms=0)

    def no_scan(*args):
        raise AssertionError("scanned headers for a batch appended moments ago")

    monkeypatch.setattr(log.active_segment, "iter_batches", no_scan)
    data = log.read(tail_offset + 1, 1 << 20)
    assert [(h.base_offset, h.last_offset) for h in whole_batches(data.records)] == [(100, 101)]
    # an older batch is still found, from the sparse index and a scan
    monkeypatch.undo()
    assert log.read(3, 1 << 20).first_offset == 3


def test_reads_concurrent_with_appends_see_only_whole_batches(tmp_path):
    log = open_log(tmp_path, segment_bytes=20_000, index_interval_bytes=500)
    total_batches = 600
    failures: list[BaseException] = []
    done = threading.Event()

    def writer():
        try:
            for i in range(total_batches):
                log.append_as_leader(make_batch(1 + i % 5, value_bytes=1 + (i * 37) % 300, timestamp_ms=i), now_ms=0)
        except BaseException as e:  # surfaced by the assertion below
            failures.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    try:
        while not done.is_set() or reads < 50:
            end = log.log_end_offset
            for fetch_offset in {0, end // 2, max(0, end - 1), end}:
                data = log.read(fetch_offset, 700 + reads % 3000)
                headers = whole_batches(data.records)
                if fetch_offset < end:
                    assert headers and headers[0].base_offset <= fetch_offset <= headers[0].last_offset
                for earlier, later in zip(headers, headers[1:]):
                    assert later.base_offset == earlier.next_offset
                assert all(h.next_offset <= data.high_watermark for h in headers)
            reads += 1
    finally:
        thread.join(timeout=60)
    assert not thread.is_alive() and not failures
    assert len(log.segments) > 3
    data = log.read(0, 1 << 30)
    assert sum(h.records_count for h in whole_batches(data.records)) <= log.log_end_offset
