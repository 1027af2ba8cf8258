"""Old message formats (magic 0 and 1) in a log an old Kafka wrote: read, recovered, indexed,
served up-converted to v2, cleaned; producing them is refused as Kafka 4 refuses it.

The segments are written by tests/legacy_messages.py, an encoder written from the format
description (and checked against Apache Kafka's DumpLogSegments in
test_kafka_dump_log_segments_reads_the_test_encoders_segments_and_eos_indexes)."""
from __future__ import annotations

import subprocess
import struct
import zlib
from pathlib import Path

import pytest

from broker.storage import Log
from broker.storage.cleaner import Cleaner, CleanerConfig, plan_cleaning
from eos.config import TopicConfig
from eos.errors import CorruptRecordError, ErrorCode, InvalidRecordError
from eos.records import legacy
from eos.records.codec import CREATE_TIME, LOG_APPEND_TIME, encode_batch, iter_decoded
from eos.records.header import iter_headers, write_base_offset
from tests.legacy_messages import GZIP, LZ4, NONE, SNAPPY, Msg, entry, lz4_frame, message, plain_entries, \
    wrapper_entry

CODECS = [NONE, GZIP, SNAPPY, LZ4]
CONFIG = TopicConfig(index_interval_bytes=1)     # an index entry for (nearly) every entry


def msgs(n: int, tag: str, timestamp_ms: int = 1_000) -> list[Msg]:
    """n messages: keys tag-i (every third null), values of varied lengths (one null)."""
    return [Msg(None if i % 3 == 2 else f"{tag}-{i}".encode(), None if i == 1 else f"{tag}-v{i}".encode() * (i + 1),
                timestamp_ms + i) for i in range(n)]


def legacy_run(magic: int, codec: int, first_offset: int, items: list[Msg], **kw) -> bytes:
    """`items` at consecutive offsets from `first_offset`: plain messages, or one wrapper."""
    if codec == NONE:
        return plain_entries(magic, first_offset, items, **kw)
    return wrapper_entry(magic, codec, first_offset + len(items) - 1, items, **kw)


def expected(magic: int, first_offset: int, items: list[Msg], *, log_append_time_ms: int | None = None):
    """(offset, key, value, timestamp, timestamp type) a reader must get for `items`."""
    rows = []
    for i, m in enumerate(items):
        if magic == 0:
            timestamp, kind = -1, CREATE_TIME
        elif log_append_time_ms is not None:
            timestamp, kind = log_append_time_ms, LOG_APPEND_TIME
        else:
            timestamp, kind = m.timestamp_ms, CREATE_TIME
        rows.append((first_offset + i, m.key, m.value, timestamp, kind))
    return rows


def rows_of(v2_bytes: bytes) -> list[tuple]:
    return [(r.offset, r.key, r.value, r.timestamp, r.timestamp_type) for r in iter_decoded(v2_bytes, "t", 0)]


def v2_batch(first_offset: int, values: list[bytes], timestamp_ms: int = 5_000) -> bytes:
    buf = bytearray(encode_batch(values, keys=[b"k2-%d" % i for i in range(len(values))],
                                 timestamps_ms=[timestamp_ms + i for i in range(len(values))]))
    write_base_offset(buf, 0, first_offset)
    return bytes(buf)


def read_all(log: Log) -> bytes:
    parts, offset = [], log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 20)
        assert data.records, offset
        parts.append(data.records)
        offset = list(iter_headers(data.records))[-1].next_offset
    return b"".join(parts)


def write_segment(directory: Path, base_offset: int, data: bytes) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{base_offset:020d}.log"
    path.write_bytes(data)
    return path


# ---- the decoder and the up-conversion ----------------------------------------------------

@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", CODECS)
def test_entries_read_back_as_written_and_up_convert_to_v2(magic, codec):
    items = msgs(5, f"m{magic}c{codec}")
    data = legacy_run(magic, codec, 40, items)
    v2 = legacy.up_convert(data)
    assert rows_of(v2) == expected(magic, 40, items)
    headers = list(iter_headers(v2))      # v2 only, CRC-32C right (iter_decoded verified it)
    assert [h.magic for h in headers] == [2] * len(headers)
    assert all(h.producer_id == -1 and not h.is_transactional for h in headers)
    assert {h.compression for h in headers} == {codec}          # the wrapper's codec is kept
    # the header the storage layer walks with: stored size and position, offsets 40..44
    walked, position = [], 0
    while position < len(data):
        header = legacy.batch_header(legacy.read_entry(data, position))
        walked.append(header)
        position += header.size_bytes
    assert position == len(data)
    assert (walked[0].base_offset, walked[-1].last_offset) == (40, 44)
    assert {h.magic for h in walked} == {magic}


def test_v1_log_append_time_wrapper_gives_every_record_the_wrapper_time():
    items = msgs(3, "lat")
    v2 = legacy.up_convert(wrapper_entry(1, GZIP, 9, items, log_append_time_ms=123_456))
    assert rows_of(v2) == expected(1, 7, items, log_append_time_ms=123_456)


def test_v0_wrapper_with_absolute_inner_offsets_with_gaps_keeps_them():
    items = msgs(3, "gap")
    v2 = legacy.up_convert(wrapper_entry(0, SNAPPY, 20, items, inner_offsets=[11, 15, 20]))
    assert [r[0] for r in rows_of(v2)] == [11, 15, 20]
    [header] = iter_headers(v2)
    assert (header.base_offset, header.last_offset, header.records_count) == (11, 20, 3)


def test_v0_lz4_takes_kafkas_broken_header_checksum_and_v1_lz4_does_not():
    items = msgs(2, "lz4")
    # v0: the checksum Kafka's old writer put there (KAFKA-3160), read as Kafka reads it
    assert rows_of(legacy.up_convert(wrapper_entry(0, LZ4, 1, items))) == expected(0, 0, items)
    # v1 with that same broken checksum: Kafka's reader checks it under v1, so do we
    inner = b"".join(entry(i, message(1, m.key, m.value, timestamp_ms=m.timestamp_ms)) for i, m in enumerate(items))
    broken = entry(1, message(1, None, lz4_frame(inner, broken_header_checksum=True), timestamp_ms=1_001,
                              attributes=LZ4))
    with pytest.raises(CorruptRecordError):
        legacy.up_convert(broken)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes((data[at] ^ 0x40,)) + data[at + 1:]


@pytest.mark.parametrize("magic", [0, 1])
def test_a_wrong_crc_is_a_clear_error(magic):
    data = plain_entries(magic, 0, msgs(2, "crc"))
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        legacy.up_convert(_flip(data, len(data) - 1))            # last value byte of the second message
    wrapped = wrapper_entry(magic, GZIP, 2, msgs(3, "crc"))
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        legacy.up_convert(_flip(wrapped, 16 + 2))                # the wrapper's attributes/timestamp
    # an inner message with a wrong CRC, inside a wrapper whose own CRC is right
    inner = entry(0, message(magic, b"k", b"v", timestamp_ms=5))
    inner = inner[:12] + struct.pack(">I", (struct.unpack_from(">I", inner, 12)[0] + 1) & 0xFFFFFFFF) + inner[16:]
    outer = entry(0, message(magic, None, zlib.compress(inner, 6, wbits=31), timestamp_ms=5, attributes=GZIP))
    with pytest.raises(CorruptRecordError, match="inner message at byte 0: CRC mismatch"):
        legacy.up_convert(outer)


def test_malformed_entries_are_refused():
    good = plain_entries(1, 0, msgs(1, "bad"))
    with pytest.raises(CorruptRecordError, match="truncated|declares"):
        legacy.read_entry(good[:-1])
    # zstd (4) has no legacy form; a compressed message inside a compressed one
    with pytest.raises(CorruptRecordError, match="codec 4"):
        legacy.read_entry(entry(0, message(1, None, b"x", timestamp_ms=1, attributes=4)))
    nested = wrapper_entry(1, GZIP, 0, [Msg(None, b"v", 1)])
    outer = entry(0, message(1, None, zlib.compress(nested, 6, wbits=31), timestamp_ms=1, attributes=GZIP))
    with pytest.raises(CorruptRecordError, match="compressed message inside"):
        legacy.read_entry(outer)


def test_v2_only_input_is_returned_as_is():
    batch = v2_batch(0, [b"a", b"b"])
    assert legacy.up_convert(batch) is batch


# ---- a log an old Kafka wrote ---------------------------------------------------------------

def old_kafka_partition(directory: Path) -> list[tuple]:
    """Three segments: v0 (plain, then gzip/snappy/lz4 wrappers), v1 (the same), and v1
    then v2 in one segment (an upgraded Kafka). Returns what a reader must get."""
    rows, data, offset = [], b"", 0
    for codec in CODECS:
        items = msgs(3, f"v0c{codec}")
        data += legacy_run(0, codec, offset, items)
        rows += expected(0, offset, items)
        offset += 3
    write_segment(directory, 0, data)
    base, data = offset, b""
    for codec in CODECS:
        items = msgs(4, f"v1c{codec}", timestamp_ms=2_000 + 10 * codec)
        data += legacy_run(1, codec, offset, items)
        rows += expected(1, offset, items)
        offset += 4
    items = msgs(2, "v1lat")
    data += legacy_run(1, SNAPPY, offset, items, log_append_time_ms=3_333)
    rows += expected(1, offset, items, log_append_time_ms=3_333)
    offset += 2
    write_segment(directory, base, data)
    base, data = offset, b""
    items = msgs(3, "mixed", timestamp_ms=4_000)
    data += legacy_run(1, NONE, offset, items) + legacy_run(1, LZ4, offset + 3, items)
    rows += expected(1, offset, items) + expected(1, offset + 3, items)
    offset += 6
    for _ in range(2):
        values = [b"v2-%d" % offset, b"v2-%d" % (offset + 1)]
        data += v2_batch(offset, values)
        rows += [(offset + i, b"k2-%d" % i, v, 5_000 + i, CREATE_TIME) for i, v in enumerate(values)]
        offset += 2
    write_segment(directory, base, data)
    return rows


@pytest.mark.parametrize("clean", [False, True])
def test_an_old_kafka_log_opens_and_reads_back_as_v2(tmp_path, clean):
    directory = tmp_path / "old-0"
    rows = old_kafka_partition(directory)
    log = Log.open(str(directory), CONFIG, clean_shutdown=clean, now_ms=0)
    try:
        assert (log.log_start_offset, log.log_end_offset) == (0, rows[-1][0] + 1)
        everything = read_all(log)
        assert {h.magic for h in iter_headers(everything)} == {2}
        assert rows_of(everything) == rows
        # a byte budget bounds the converted batches too (the first one always comes whole)
        for max_bytes in (1, 100, 300, 700):
            part = log.read(0, max_bytes).records
            assert len(part) <= max_bytes or len(list(iter_headers(part))) == 1
            assert rows_of(part) == rows[:len(rows_of(part))] and rows_of(part)
        # a fetch from inside a wrapper starts with the wrapper's batch, as Kafka's does
        inside = log.read(4, 1 << 20)
        assert inside.first_offset == 3 and rows_of(inside.records)[0][0] == 3
        # each offset-index entry points at the start of the stored entry holding its offset
        for segment in log.segments:
            stored = Path(segment.log_path).read_bytes()
            for offset, position in segment.offset_index.entries():
                assert stored[position + legacy.MAGIC_AT] in (0, 1, 2)
                assert next(segment.iter_batches(position, segment.size_bytes)).last_offset == offset
            assert segment.offset_index.entries(), segment
        # ListOffsets by time over v1 entries
        assert log.offset_for_timestamp(2_012) == (rows[12 + 4 + 2][0], 2_012)
        # appending goes on after the old data, in v2
        info = log.append_as_leader(encode_batch([b"new"]), now_ms=0)
        assert info.first_offset == rows[-1][0] + 1
    finally:
        log.close()


def test_recovery_cuts_at_a_corrupt_legacy_entry(tmp_path):
    directory = tmp_path / "torn-0"
    good = plain_entries(1, 0, msgs(3, "ok")) + wrapper_entry(1, GZIP, 5, msgs(3, "ok2"))
    bad = wrapper_entry(1, SNAPPY, 8, msgs(3, "bad"))
    path = write_segment(directory, 0, good + _flip(bad, len(bad) - 3) + plain_entries(1, 9, msgs(1, "after")))
    log = Log.open(str(directory), CONFIG, clean_shutdown=False, now_ms=0)
    try:
        assert log.log_end_offset == 6
        assert path.stat().st_size == len(good)
        assert [r[0] for r in rows_of(read_all(log))] == list(range(6))
    finally:
        log.close()
    # a torn last entry (a crash mid-write) is cut the same way
    directory = tmp_path / "torn-1"
    path = write_segment(directory, 0, good + bad[:-7])
    log = Log.open(str(directory), CONFIG, clean_shutdown=False, now_ms=0)
    try:
        assert (log.log_end_offset, path.stat().st_size) == (6, len(good))
    finally:
        log.close()


def test_the_cleaner_cleans_a_legacy_log(tmp_path):
    directory = tmp_path / "compact-0"
    same_keys = [Msg(b"k%d" % (i % 2), b"value-%d" % i, 1_000 + i) for i in range(4)]
    write_segment(directory, 0, legacy_run(0, NONE, 0, same_keys) + legacy_run(1, GZIP, 4, same_keys))
    write_segment(directory, 8, v2_batch(8, [b"tail"]))
    config = TopicConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.0, min_compaction_lag_ms=0)
    log = Log.open(str(directory), config, clean_shutdown=False, now_ms=10_000)
    try:
        plan = plan_cleaning(log, 0, now_ms=10_000)
        Cleaner(CleanerConfig(), now_ms_fn=lambda: 10_000).clean(log, plan)
        kept = rows_of(read_all(log))
        assert [(r[0], r[1], r[2]) for r in kept if r[0] < 8] == [(6, b"k0", b"value-2"), (7, b"k1", b"value-3")]
        assert kept[-1][2] == b"tail"
        assert {h.magic for h in iter_headers(Path(log.segments[0].log_path).read_bytes())} == {2}
    finally:
        log.close()


# ---- producing v0/v1 stays refused ----------------------------------------------------------

@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", [NONE, GZIP])
def test_producing_a_legacy_message_set_is_refused_and_changes_nothing(tmp_path, magic, codec):
    log = Log.open(str(tmp_path / "p-0"), TopicConfig(), now_ms=0)
    try:
        log.append_as_leader(encode_batch([b"first"]), now_ms=0)
        before = Path(log.segments[0].log_path).read_bytes()
        with pytest.raises(InvalidRecordError, match="magic version 2") as refused:
            log.append_as_leader(legacy_run(magic, codec, 0, msgs(2, "p")), now_ms=0)
        assert refused.value.code == ErrorCode.INVALID_RECORD
        assert log.log_end_offset == 1
        assert Path(log.segments[0].log_path).read_bytes() == before
    finally:
        log.close()


# ---- cross-check with Apache Kafka ----------------------------------------------------------

def test_kafka_dump_log_segments_reads_the_test_encoders_segments_and_eos_indexes(tmp_path):
    """Kafka's own DumpLogSegments reads the hand-built v0/v1 segments (so the test encoder
    writes what Kafka reads) and finds the offset indexes eos rebuilt for them consistent."""
    from bench.kafka import resolve_pinned_kafka
    classpath = resolve_pinned_kafka().classpath      # the broker's jars and kafka-tools, pinned
    directory = tmp_path / "old-0"
    rows = old_kafka_partition(directory)
    Log.open(str(directory), CONFIG, clean_shutdown=False, now_ms=0).close()
    files = sorted(str(p) for p in directory.iterdir() if p.suffix in (".log", ".index"))
    done = subprocess.run(["java", "-Xmx256m", "-cp", classpath, "org.apache.kafka.tools.DumpLogSegments",
                           "--deep-iteration", "--print-data-log", "--files", ",".join(files)],
                          capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    problems = [line for line in out.splitlines()
                if any(word in line.lower() for word in ("exception", "mismatch", "isvalid: false", "corrupt"))]
    assert not problems, out
    # every record, with Kafka's view of its offset, magic and timestamp
    dumped = [line for line in out.splitlines() if line.startswith("| offset: ")]
    assert [int(line.split()[2]) for line in dumped] == [r[0] for r in rows]
    for line, (offset, key, value, timestamp, kind) in zip(dumped, rows):
        if timestamp == -1:
            assert "NoTimestampType: -1" in line or "CreateTime: -1" in line, line
        else:
            assert f"{'LogAppendTime' if kind else 'CreateTime'}: {timestamp}" in line, line
        assert (f"payload: {value.decode()}" in line) if value is not None else "payload" not in line, line
    magics = {int(line.split("magic: ")[1].split()[0]) for line in out.splitlines() if " magic: " in line}
    assert magics == {0, 1, 2}
