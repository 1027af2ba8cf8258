"""v2 records and batches: the published layout byte for byte, round trips, rebuilds, corruption."""
from __future__ import annotations

import struct
import time

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from eos.errors import CorruptRecordError, InvalidRecordError
from eos.records import codec as codec_module
from eos.records import compression
from eos.records import decode as decode_module
from eos.records.codec import (
    CREATE_TIME, LOG_APPEND_TIME, BatchBuilder, decode_control_record, decode_records, decode_records_part,
    encode_batch, encode_control_batch, iter_decoded)
from eos.records.decode import RUN_RECORDS_MIN, decode_runs
from eos.records.header import parse_header, verify_crc
from eos.records.varint import (
    decode_unsigned_varint, decode_varint, decode_varlong, encode_unsigned_varint, encode_varint,
    encode_varlong, size_of_varint)
from eos.types import Record

CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]
T0 = 1_700_000_000_000


def _decode(raw: bytes, topic: str = "t", partition: int = 0) -> list[Record]:
    header = parse_header(raw)
    verify_crc(raw, header)
    return decode_records(raw, header, topic, partition)


def _rewrap(raw: bytes, section: bytes, **fields) -> bytes:
    """`raw`'s header over a new records section, with batchLength and CRC made consistent
    (so only record-level checks can fail). `fields` override header fields by name."""
    names = ["base_offset", "batch_length", "partition_leader_epoch", "magic", "crc", "attributes",
             "last_offset_delta", "base_timestamp", "max_timestamp", "producer_id", "producer_epoch",
             "base_sequence", "records_count"]
    values = dict(zip(names, struct.unpack_from(">qiibIhiqqqhii", raw)))
    values.update(fields)
    tail = struct.pack(">hiqqqhii", *(values[n] for n in names[5:])) + section
    prefix = struct.pack(">qiib", values["base_offset"], 49 + len(section),
                         values["partition_leader_epoch"], values["magic"])
    return prefix + struct.pack(">I", crc32c(tail)) + tail


# --- varints (Kafka's ByteUtils semantics) ------------------------------------------------

VARINT_VECTORS = [
    (0, "00"), (-1, "01"), (1, "02"), (63, "7e"), (-64, "7f"), (64, "8001"), (-65, "8101"),
    (8191, "fe7f"), (-8192, "ff7f"), (8192, "808001"), (-8193, "818001"),
    (2**31 - 1, "feffffff0f"), (-(2**31), "ffffffff0f"),
]


@pytest.mark.parametrize("value, hex_bytes", VARINT_VECTORS)
def test_varint_vectors(value, hex_bytes):
    encoded = bytes.fromhex(hex_bytes)
    assert encode_varint(value) == encoded
    assert encode_varlong(value) == encoded
    assert decode_varint(encoded) == (value, len(encoded))
    assert decode_varlong(encoded) == (value, len(encoded))
    assert size_of_varint(value) == len(encoded)


def test_varlong_extremes():
    assert encode_varlong(2**63 - 1) == bytes.fromhex("feffffffffffffffff01")
    assert encode_varlong(-(2**63)) == bytes.fromhex("ffffffffffffffffff01")
    assert decode_varlong(bytes.fromhex("ffffffffffffffffff01")) == (-(2**63), 10)


@settings(max_examples=100, deadline=None)
@given(st.integers(-(2**31), 2**31 - 1), st.binary(max_size=3))
def test_varint_round_trip(value, trailing):
    encoded = encode_varint(value)
    assert decode_varint(encoded + trailing) == (value, len(encoded))
    assert len(encoded) == size_of_varint(value) <= 5


@settings(max_examples=100, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_round_trip(value):
    encoded = encode_varlong(value)
    assert decode_varlong(encoded) == (value, len(encoded))
    assert len(encoded) <= 10


def test_unsigned_varint():
    assert encode_unsigned_varint(300) == b"\xac\x02"
    assert decode_unsigned_varint(b"\xac\x02") == (300, 2)
    with pytest.raises(InvalidRecordError):
        encode_unsigned_varint(-1)


def test_varint_longer_than_5_bytes_is_corrupt():
    assert decode_varint(b"\xff\xff\xff\xff\x0f") == (-(2**31), 5)
    with pytest.raises(CorruptRecordError, match="too long"):
        decode_varint(b"\xff\xff\xff\xff\xff\x01")
    with pytest.raises(CorruptRecordError, match="too long"):
        decode_varint(b"\x80\x80\x80\x80\x80\x00")


def test_varint_fifth_byte_high_bits_are_dropped_as_java_does():
    # Java's `b << 28` in an int loses bits 32+; the value wraps instead of failing
    assert decode_varint(b"\xff\xff\xff\xff\x7f") == (-(2**31), 5)


def test_varlong_longer_than_10_bytes_is_corrupt():
    with pytest.raises(CorruptRecordError, match="too long"):
        decode_varlong(b"\xff" * 10 + b"\x01")


def test_truncated_varint_is_corrupt():
    with pytest.raises(CorruptRecordError, match="truncated"):
        decode_varint(b"\xff\xff")
    with pytest.raises(CorruptRecordError, match="truncated"):
        decode_varlong(b"")


def test_encoding_out_of_range_is_refused():
    with pytest.raises(InvalidRecordError):
        encode_varint(2**31)
    with pytest.raises(InvalidRecordError):
        encode_varlong(-(2**63) - 1)


# --- one batch by hand, from the published v2 layout --------------------------------------

def _hand_built_batch() -> bytes:
    """Two records, written byte by byte from Kafka's documented RecordBatch/Record layout.

    record 0: timestamp T0, key b"k0", value b"hello", one header ("trace", b"\\x01\\x02")
    record 1: timestamp T0 - 5 (negative delta), null key, empty value, no headers
    batch: baseOffset 100, partitionLeaderEpoch 5, producerId 1234, producerEpoch 3,
           baseSequence 10, CreateTime, no compression, not transactional.
    """
    record0 = bytes.fromhex(
        "2c"            # length 22 (zigzag 44)
        "00"            # attributes
        "00"            # timestampDelta 0
        "00"            # offsetDelta 0
        "04" "6b30"     # keyLength 2, "k0"
        "0a" "68656c6c6f"  # valueLength 5, "hello"
        "02"            # headerCount 1
        "0a" "7472616365"  # headerKeyLength 5, "trace"
        "04" "0102"     # headerValueLength 2, 01 02
    )
    record1 = bytes.fromhex(
        "0c"            # length 6
        "00"            # attributes
        "09"            # timestampDelta -5 (zigzag 9)
        "02"            # offsetDelta 1
        "01"            # keyLength -1: null key
        "00"            # valueLength 0: empty value
        "00"            # headerCount 0
    )
    records = record0 + record1
    assert len(record0) == 23 and len(record1) == 7
    crc_covered = bytes.fromhex(
        "0000"               # attributes: CreateTime, no codec, not transactional, not control
        "00000001"           # lastOffsetDelta 1
        "0000018bcfe56800"   # baseTimestamp 1_700_000_000_000
        "0000018bcfe56800"   # maxTimestamp (record 1 is earlier)
        "00000000000004d2"   # producerId 1234
        "0003"               # producerEpoch 3
        "0000000a"           # baseSequence 10
        "00000002"           # recordsCount 2
    ) + records
    return bytes.fromhex(
        "0000000000000064"   # baseOffset 100
        "0000004f"           # batchLength 79 = 49 header bytes after it + 30 record bytes
        "00000005"           # partitionLeaderEpoch 5
        "02"                 # magic 2
    ) + crc32c(crc_covered).to_bytes(4, "big") + crc_covered


def test_hand_built_batch_decodes():
    raw = _hand_built_batch()
    header = parse_header(raw)
    verify_crc(raw, header)
    assert (header.base_offset, header.records_count, header.last_offset_delta, header.producer_id,
            header.producer_epoch, header.base_sequence, header.partition_leader_epoch) == \
        (100, 2, 1, 1234, 3, 10, 5)
    assert decode_records(raw, header, "orders", 3) == [
        Record("orders", 3, 100, b"k0", b"hello", T0, [("trace", b"\x01\x02")], CREATE_TIME),
        Record("orders", 3, 101, None, b"", T0 - 5, [], CREATE_TIME),
    ]


def test_hand_built_batch_re_encodes_to_the_same_bytes():
    builder = BatchBuilder()
    assert builder.append(b"hello", b"k0", T0, [("trace", b"\x01\x02")]) == 0
    assert builder.append(b"", None, T0 - 5) == 1
    built = builder.build(producer_id=1234, producer_epoch=3, base_sequence=10,
                          partition_leader_epoch=5, base_offset=100)
    assert built == _hand_built_batch()
    assert builder.size_bytes == len(built)
    assert builder.max_timestamp_ms == T0


def test_hand_built_batch_re_encodes_through_the_bulk_path():
    builder = BatchBuilder()
    assert builder.append_many([b"hello", b""], [b"k0", None], [T0, T0 - 5],
                               [[("trace", b"\x01\x02")], None]) == 2
    assert builder.build(producer_id=1234, producer_epoch=3, base_sequence=10,
                         partition_leader_epoch=5, base_offset=100) == _hand_built_batch()


def test_transaction_marker_by_hand():
    raw = encode_control_batch(committed=True, producer_id=1234, producer_epoch=3, coordinator_epoch=7,
                               timestamp_ms=T0, base_offset=42)
    covered = bytes.fromhex(
        "0030"               # attributes: transactional (0x10) + control (0x20)
        "00000000" "0000018bcfe56800" "0000018bcfe56800" "00000000000004d2" "0003"
        "ffffffff"           # baseSequence -1: markers carry no sequence
        "00000001"
        "20"                 # record length 16
        "00" "00" "00"       # attributes, timestampDelta, offsetDelta
        "08" "00000001"      # key: version 0, type 1 (COMMIT)
        "0c" "000000000007"  # value: version 0, coordinator epoch 7
        "00")
    expected = bytes.fromhex("000000000000002a" "00000042" "ffffffff" "02") + \
        crc32c(covered).to_bytes(4, "big") + covered
    assert raw == expected
    assert len(raw) == 78  # the size of every Kafka transaction marker batch
    header = parse_header(raw)
    assert header.is_control and header.is_transactional
    assert decode_control_record(raw, header) == (1, 7)


# --- round trips --------------------------------------------------------------------------

# Lengths past the two-byte varint table, built from a length and a short pattern: drawing
# 8 KiB of random bytes per blob made examples exceed Hypothesis's buffer under load
# (FailedHealthCheck data_too_large) without testing anything more.
long_blobs = st.builds(lambda length, pattern: (pattern * (length // len(pattern) + 1))[:length],
                       st.integers(8200, 9000), st.binary(min_size=1, max_size=8))
blobs = st.one_of(st.none(), st.just(b""), st.binary(max_size=300), long_blobs)
headers_strategy = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=40))), max_size=4)
record_strategy = st.tuples(
    blobs, blobs,
    st.integers(-(2**40), 2**40),   # timestamp offset from a base: negative deltas included
    headers_strategy)


@settings(max_examples=100, deadline=None)
@given(records=st.lists(record_strategy, min_size=1, max_size=30), codec=st.sampled_from(CODECS),
       bulk=st.booleans(), base_offset=st.integers(0, 2**62),
       producer=st.tuples(st.integers(-1, 2**63 - 1), st.integers(-1, 2**15 - 1),
                          st.integers(-1, 2**31 - 1)),
       transactional=st.booleans())
def test_batch_round_trip(records, codec, bulk, base_offset, producer, transactional):
    timestamps = [T0 + delta for _, _, delta, _ in records]
    builder = BatchBuilder(compression=codec)
    if bulk:
        builder.append_many([r[1] for r in records], [r[0] for r in records], timestamps,
                            [r[3] for r in records])
    else:
        for (key, value, _, headers), timestamp in zip(records, timestamps):
            builder.append(value, key, timestamp, headers)
    producer_id, producer_epoch, base_sequence = producer
    raw = builder.build(producer_id=producer_id, producer_epoch=producer_epoch,
                        base_sequence=base_sequence, transactional=transactional, base_offset=base_offset)
    if codec == compression.NONE:
        assert builder.size_bytes == len(raw)
    header = parse_header(raw)
    verify_crc(raw, header)
    assert header.compression == codec
    assert header.is_transactional == transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer
    assert header.base_timestamp == timestamps[0]
    assert header.max_timestamp == max(timestamps) == builder.max_timestamp_ms
    assert header.records_count == len(records) == header.last_offset_delta + 1
    decoded = decode_records(raw, header, "topic", 7)
    assert decoded == [
        Record("topic", 7, base_offset + i, key, value, timestamp, list(headers), CREATE_TIME)
        for i, ((key, value, _, headers), timestamp) in enumerate(zip(records, timestamps))]


@settings(max_examples=50, deadline=None)
@given(values=st.lists(st.one_of(st.none(), st.binary(max_size=200)), min_size=1, max_size=50),
       timestamp_ms=st.integers(0, 2**45), codec=st.sampled_from(CODECS),
       chunks=st.lists(st.integers(1, 20), min_size=1, max_size=4))
def test_bulk_fast_path_round_trip_in_several_calls(values, timestamp_ms, codec, chunks):
    """The uniform path (one timestamp, null keys): later calls have a nonzero time delta."""
    builder = BatchBuilder(compression=codec)
    position, call = 0, 0
    while position < len(values):
        size = chunks[call % len(chunks)]
        assert builder.append_many(values[position:position + size], None, timestamp_ms + call) == \
            len(values[position:position + size])
        position += size
        call += 1
    decoded = _decode(builder.build())
    assert [r.value for r in decoded] == values
    assert all(r.key is None and r.headers == [] for r in decoded)
    assert [r.offset for r in decoded] == list(range(len(values)))


@settings(max_examples=50, deadline=None)
@given(committed=st.booleans(), producer_id=st.integers(0, 2**63 - 1),
       producer_epoch=st.integers(0, 2**15 - 1), coordinator_epoch=st.integers(-(2**31), 2**31 - 1),
       timestamp_ms=st.integers(0, 2**50), base_offset=st.integers(0, 2**62))
def test_control_batch_round_trip(committed, producer_id, producer_epoch, coordinator_epoch,
                                  timestamp_ms, base_offset):
    raw = encode_control_batch(committed=committed, producer_id=producer_id,
                               producer_epoch=producer_epoch, coordinator_epoch=coordinator_epoch,
                               timestamp_ms=timestamp_ms, base_offset=base_offset)
    header = parse_header(raw)
    verify_crc(raw, header)
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_offset) == \
        (producer_id, producer_epoch, base_offset)
    assert decode_control_record(raw, header) == (1 if committed else 0, coordinator_epoch)
    assert list(iter_decoded(raw, "t", 0)) == []           # markers are skipped by default
    (marker,) = iter_decoded(raw, "t", 0, skip_control=False)
    assert marker.offset == base_offset and marker.timestamp == timestamp_ms


def test_many_records_cross_every_varint_table_boundary():
    count = 10_000  # offset deltas past 8191 take three-byte varints
    values = [b"v%d" % i for i in range(count)]
    timestamps = [T0 + (i * 7 if i % 2 else -i) for i in range(count)]  # deltas beyond +-8192
    one_by_one = BatchBuilder()
    for value, timestamp in zip(values, timestamps):
        one_by_one.append(value, None, timestamp)
    bulk = BatchBuilder()
    bulk.append_many(values, None, timestamps)
    uniform = BatchBuilder()
    uniform.append_many(values[:5000], None, T0)
    uniform.append_many(values[5000:], None, T0 + 9000)
    assert one_by_one.build() == bulk.build()
    decoded = _decode(bulk.build())
    assert [(r.offset, r.value, r.timestamp) for r in decoded] == list(zip(range(count), values, timestamps))
    decoded = _decode(uniform.build())
    assert [r.value for r in decoded] == values
    assert decoded[4999].timestamp == T0 and decoded[5000].timestamp == T0 + 9000


def test_encode_batch_is_builder_shorthand():
    raw = encode_batch([b"a", b"b"], [b"1", None], T0, compression=compression.LZ4, producer_id=9,
                       base_offset=5)
    header = parse_header(raw)
    assert header.producer_id == 9 and header.compression == compression.LZ4
    assert [(r.offset, r.key, r.value) for r in _decode(raw)] == [(5, b"1", b"a"), (6, None, b"b")]


def test_decode_in_a_buffer_of_several_batches_of_any_type():
    first = encode_batch([b"a", b"b"], timestamps_ms=T0, base_offset=0)
    second = encode_batch([b"c"], timestamps_ms=T0, base_offset=2, compression=compression.ZSTD)
    third = encode_batch([b"d", b"e"], timestamps_ms=T0, base_offset=3)
    joined = first + second + third
    for buf in (joined, bytearray(joined), memoryview(joined)):
        assert [(r.offset, r.value) for r in iter_decoded(buf, "t", 0)] == \
            [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")]
    # a middle batch decoded alone, in place
    header = parse_header(joined, len(first) + len(second))
    assert [r.value for r in decode_records(joined, header, "t", 0)] == [b"d", b"e"]


def test_log_append_time_gives_every_record_the_batch_max_timestamp():
    builder = BatchBuilder(timestamp_type=LOG_APPEND_TIME)
    builder.append_many([b"a", b"b", b"c"], None, [T0, T0 + 1, T0 - 3])
    raw = builder.build()
    assert parse_header(raw).timestamp_type == LOG_APPEND_TIME
    broker_time = T0 + 60_000
    stamped = _rewrap(raw, raw[61:], max_timestamp=broker_time)  # what a broker would do
    decoded = _decode(stamped)
    assert [r.timestamp for r in decoded] == [broker_time] * 3
    assert {r.timestamp_type for r in decoded} == {LOG_APPEND_TIME}


# --- the builder --------------------------------------------------------------------------

def test_rebuild_changes_only_producer_fields_and_crc():
    builder = BatchBuilder(compression=compression.NONE)
    builder.append_many([b"x" * 50] * 20, [b"k"] * 20, T0)
    first = builder.build(producer_id=1000, producer_epoch=0, base_sequence=0)
    second = builder.build(producer_id=1001, producer_epoch=1, base_sequence=40)
    assert len(first) == len(second)
    changed = {i for i, (a, b) in enumerate(zip(first, second)) if a != b}
    allowed = set(range(17, 21)) | set(range(43, 57))  # crc; producerId, producerEpoch, baseSequence
    assert changed and changed <= allowed
    assert changed & set(range(17, 21)), "the CRC must change with the producer fields"
    header = parse_header(second)
    verify_crc(second, header)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (1001, 1, 40)
    assert [r.value for r in decode_records(second, header, "t", 0)] == [b"x" * 50] * 20


def test_rebuild_reuses_the_compressed_section(monkeypatch):
    calls = []
    real = compression.compress
    monkeypatch.setattr(compression, "compress", lambda c, d, **kw: calls.append(c) or real(c, d, **kw))
    builder = BatchBuilder(compression=compression.ZSTD)
    builder.append_many([b"payload"] * 100, None, T0)
    first = builder.build(producer_id=1, producer_epoch=0, base_sequence=0)
    second = builder.build(producer_id=1, producer_epoch=1, base_sequence=0)
    assert calls == [compression.ZSTD]
    assert first[61:] == second[61:]
    builder.append(b"late", None, T0)      # appending invalidates the cached section
    third = builder.build()
    assert calls == [compression.ZSTD, compression.ZSTD]
    assert [r.value for r in _decode(third)][-1] == b"late"


def test_size_bytes_and_counts_track_appends_exactly():
    builder = BatchBuilder()
    assert (builder.record_count, builder.size_bytes, builder.max_timestamp_ms) == (0, 61, -1)
    builder.append(b"v", b"k", T0, [("h", None)])
    builder.append_many([b"a" * 300, None], None, T0 + 9)
    builder.append_many([b"b"], [b"key"], [T0 - 4], [[("x", b"y")]])
    builder.append(None, None, T0 + 20_000)
    assert builder.record_count == 5
    assert builder.max_timestamp_ms == T0 + 20_000
    assert builder.base_timestamp_ms == T0
    assert builder.size_bytes == len(builder.build())


def test_timestamp_none_means_now():
    before = int(time.time() * 1000)
    builder = BatchBuilder()
    builder.append(b"a")
    builder.append_many([b"b", b"c"])
    after = int(time.time() * 1000) + 1
    decoded = _decode(builder.build())
    assert all(before <= r.timestamp <= after for r in decoded)


def test_buffer_values_are_copied_at_append():
    value = bytearray(b"before")
    builder = BatchBuilder()
    builder.append(value, memoryview(b"key"), T0, [("h", bytearray(b"hv"))])
    builder.append_many([value], [bytearray(b"k2")], T0)
    value[:] = b"AFTER!"
    decoded = _decode(builder.build())
    assert [(r.key, r.value) for r in decoded] == [(b"key", b"before"), (b"k2", b"before")]
    assert decoded[0].headers == [("h", b"hv")]


def test_wide_item_buffers_are_encoded_by_their_bytes_not_their_items():
    wide = memoryview(b"\x01\x00\x00\x00\x02\x00\x00\x00").cast("I")   # len() == 2 items, 8 bytes
    builder = BatchBuilder()
    builder.append(wide, wide, T0)
    builder.append_many([wide], [wide], [T0])
    builder.append_many([wide], None, T0)
    assert [(r.key, r.value) for r in _decode(builder.build())] == \
        [(wide.tobytes(), wide.tobytes())] * 2 + [(None, wide.tobytes())]


def _snapshot(builder: BatchBuilder):
    return builder.record_count, builder.size_bytes, builder.max_timestamp_ms, builder.build()


@pytest.mark.parametrize("call, message", [
    (lambda b: b.append("text"), "value must be bytes"),
    (lambda b: b.append(b"v", "key"), "key must be bytes"),
    (lambda b: b.append(b"v", None, 1.5), "timestamp must be an int"),
    (lambda b: b.append(b"v", None, T0, [("h", "str")]), "header"),
    (lambda b: b.append(b"v", None, T0, [(b"bytes-key", b"v")]), "header"),
    (lambda b: b.append_many([b"ok", "text"]), "record 1: value must be bytes"),
    (lambda b: b.append_many([b"ok", 5]), "record 1: value must be bytes"),
    (lambda b: b.append_many([b"a", b"b"], [b"k", "k"]), "record 1: key must be bytes"),
    (lambda b: b.append_many([b"a", b"b"], [b"k"]), "1 keys for 2 values"),
    (lambda b: b.append_many([b"a"], None, [T0, T0]), "2 timestamps for 1 values"),
    (lambda b: b.append_many([b"a"], None, [1.5]), "timestamp must be an int"),
    (lambda b: b.append_many([b"a"], None, "soon"), "timestamps for 1 values"),
    (lambda b: b.append_many([b"a"], None, T0, [[("h", 5)]]), "header"),
])
def test_refused_records_leave_the_builder_unchanged(call, message):
    builder = BatchBuilder()
    builder.append_many([b"first", b"second"], [b"k", None], T0)
    before = _snapshot(builder)
    with pytest.raises(InvalidRecordError, match=message):
        call(builder)
    assert _snapshot(builder) == before


def test_building_an_empty_batch_is_refused():
    with pytest.raises(InvalidRecordError, match="no records"):
        BatchBuilder().build()
    assert BatchBuilder().append_many([]) == 0


def test_out_of_range_header_fields_are_refused():
    builder = BatchBuilder()
    builder.append(b"v", None, T0)
    with pytest.raises(InvalidRecordError, match="out of range"):
        builder.build(producer_epoch=2**15)
    with pytest.raises(InvalidRecordError):
        BatchBuilder(compression=6)
    with pytest.raises(InvalidRecordError):
        BatchBuilder(timestamp_type=2)


# --- corrupt input ------------------------------------------------------------------------

def _plain_batch(count: int = 3) -> bytes:
    return encode_batch([b"value-%d" % i for i in range(count)], [b"k"] * count, T0)


def test_truncated_record_is_corrupt():
    raw = _plain_batch()
    with pytest.raises(CorruptRecordError, match="record 2"):
        _decode(_rewrap(raw, raw[61:-1]))


def test_record_count_larger_than_records_is_corrupt():
    raw = _plain_batch()
    with pytest.raises(CorruptRecordError, match="recordsCount is 4 but the records section holds only 3"):
        _decode(_rewrap(raw, raw[61:], records_count=4))


def test_record_count_smaller_than_records_is_corrupt():
    raw = _plain_batch()
    with pytest.raises(CorruptRecordError, match="follow the 2 records"):
        _decode(_rewrap(raw, raw[61:], records_count=2))


def test_trailing_garbage_is_corrupt():
    raw = _plain_batch()
    with pytest.raises(CorruptRecordError, match="2 bytes follow"):
        _decode(_rewrap(raw, raw[61:] + b"\x00\x00"))


def test_count_mismatch_is_found_in_place_with_a_batch_after_it():
    raw = _plain_batch()
    lying = _rewrap(raw, raw[61:], records_count=4)
    buf = lying + _plain_batch()
    with pytest.raises(CorruptRecordError, match="recordsCount is 4"):
        decode_records(buf, parse_header(buf), "t", 0)


def _single_record_batch(record: bytes) -> bytes:
    return _rewrap(_plain_batch(1), record, records_count=1, last_offset_delta=0)


@pytest.mark.parametrize("record, message", [
    (b"\xff\xff\xff\xff\xff\x01", "too long"),                          # length varint, 6 bytes
    (b"\x0e\x00" + b"\xff" * 10 + b"\x01", "too long"),                 # timestampDelta, 11 bytes
    (b"\x0e\x00\x00\xff\xff\xff\xff\xff\x01\x01\x01\x00", "too long"),  # offsetDelta, 6 bytes
    (b"\x0c\x00\x00\x00\x03\x00\x00", "key length -2"),
    (b"\x0c\x00\x00\x00\x01\x05\x00", "value length -3"),
    (b"\x0e\x00\x00\x00\x01\x00\x00\x00", "declares 7 bytes but its fields take 6"),
    (b"\x0a\x00\x00\x00\x01\x00\x00", "declares 5 bytes but its fields take 6"),
    (b"\x00", "declares 0 bytes"),
    (b"\x13", "declares -10 bytes"),
    (b"\x14\x00\x00\x00\x01\x00\x02\x04\xc3\x28\x01", "not UTF-8"),    # header key b"\xc3\x28"
    (b"\x12\x00\x00\x00\x01\x00\x02\x03\x61\x61", "header key of length -2"),
    (b"\x0c\x00\x00\x00\x01\x00\x7e", "declares 63 headers"),
])
def test_malformed_records_are_corrupt(record, message):
    with pytest.raises(CorruptRecordError, match=message):
        _decode(_single_record_batch(record))


def test_a_well_formed_hand_record_decodes():
    """Control for the table above: the same shape, well formed, decodes."""
    (record,) = _decode(_single_record_batch(b"\x14\x00\x00\x00\x01\x00\x02\x04\x68\x69\x01"))
    assert record.headers == [("hi", None)] and record.key is None and record.value == b""


@pytest.mark.parametrize("codec", [compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD])
def test_bad_compressed_payload_is_corrupt(codec):
    raw = _plain_batch()
    bad = _rewrap(raw, b"this is not a compressed payload at all" * 2, attributes=codec)
    with pytest.raises(CorruptRecordError, match="decompress"):
        _decode(bad)


@pytest.mark.parametrize("codec", [compression.GZIP, compression.LZ4, compression.ZSTD])
def test_compressed_section_holding_too_few_records_is_corrupt(codec):
    raw = encode_batch([b"a", b"b", b"c"], timestamps_ms=T0, compression=codec)
    with pytest.raises(CorruptRecordError, match="recordsCount is 4"):
        _decode(_rewrap(raw, raw[61:], records_count=4))


@pytest.mark.parametrize("bits", [5, 6, 7])
def test_unknown_codec_bits_are_corrupt(bits):
    raw = _plain_batch()
    with pytest.raises(CorruptRecordError, match=f"unknown compression codec id {bits}"):
        _decode(_rewrap(raw, raw[61:], attributes=bits))


def test_crc_mismatch_is_found_by_iter_decoded():
    raw = bytearray(_plain_batch())
    raw[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC"):
        list(iter_decoded(bytes(raw), "t", 0))


def test_decode_control_record_refuses_data_batches_and_foreign_control_types():
    raw = _plain_batch(1)
    with pytest.raises(CorruptRecordError, match="not a control batch"):
        decode_control_record(raw, parse_header(raw))
    marker = encode_control_batch(committed=False, producer_id=1, producer_epoch=0, coordinator_epoch=0,
                                  timestamp_ms=T0)
    leader_change = marker[61:].replace(b"\x08\x00\x00\x00\x00", b"\x08\x00\x00\x00\x02")
    bad = _rewrap(marker, leader_change)
    with pytest.raises(CorruptRecordError, match="control type 2"):
        decode_control_record(bad, parse_header(bad))


def test_module_exports():
    for name in ("BatchBuilder", "encode_batch", "encode_control_batch", "decode_control_record",
                 "decode_records", "iter_decoded", "encode_varint", "decode_varint", "encode_varlong",
                 "decode_varlong"):
        assert hasattr(codec_module, name)


# --- bulk decoding of uniform runs (eos/records/decode.py) ------------------------------

def _decode_both(raw: bytes, monkeypatch) -> tuple[object, object]:
    """decode_records' outcome (records, or the error's type and message) with the bulk
    run decoder, then with the general loop alone."""
    def outcome():
        try:
            return decode_records(raw, parse_header(raw), "t", 3)
        except CorruptRecordError as e:
            return ("CorruptRecordError", str(e))

    bulk = outcome()
    with monkeypatch.context() as patch:
        patch.setattr(decode_module, "RUN_RECORDS_MIN", 1 << 62)   # the general loop takes every record
        general = outcome()
    return bulk, general


UNIFORM_SHAPES = [
    (count, value_bytes, spread_ms)
    for count in (8, 63, 64, 65, 500) for value_bytes in (0, 20, 100)
    for spread_ms in (0, 40, 300, 20_000)   # timestamp deltas up to 1, 2, then 3 varint bytes
] + [(8191, 20, 300), (8200, 20, 300), (9_520, 100, 30)]   # offset deltas of 3 varint bytes from 8192


@pytest.mark.parametrize("count,value_bytes,spread_ms", UNIFORM_SHAPES)
def test_uniform_runs_decode_as_the_general_loop_does(count, value_bytes, spread_ms, monkeypatch):
    values = [bytes([i % 251]) * value_bytes for i in range(count)]
    timestamps = [T0 + (i * spread_ms) // count for i in range(count)]
    raw = encode_batch(values, timestamps_ms=timestamps, base_offset=7_000)
    bulk, general = _decode_both(raw, monkeypatch)
    assert bulk == general
    assert [(r.offset, r.value, r.timestamp) for r in bulk] == \
        [(7_000 + i, v, t) for i, (v, t) in enumerate(zip(values, timestamps))]
    assert len({id(r.headers) for r in bulk}) == count   # a list of its own for each record
    assert {type(r) for r in bulk} == {Record}
    # and the bulk decoder took all but a short tail (runs break where a varint widens)
    header = parse_header(raw)
    taken: list[Record] = []
    decode_runs(raw, 61, len(raw), 0, count, "t", 3, header.base_offset, header.base_timestamp, 1, CREATE_TIME,
                taken)
    if spread_ms < 8192:
        # the runs break where a varint widens and leave at most one short one at the end
        assert len(taken) >= count - RUN_RECORDS_MIN
        assert taken == bulk[:len(taken)]


def test_uniform_runs_under_log_append_time_show_the_batch_time(monkeypatch):
    builder = BatchBuilder(timestamp_type=LOG_APPEND_TIME)
    builder.append_many([b"v" * 30] * 100, None, [T0 + i for i in range(100)])
    raw = builder.build()
    bulk, general = _decode_both(raw, monkeypatch)
    assert bulk == general and {r.timestamp for r in bulk} == {parse_header(raw).max_timestamp}


def test_a_record_of_another_shape_inside_a_run_decodes_as_the_general_loop_does(monkeypatch):
    values = [b"x" * 40] * 200
    for odd_one in ({"key": b"k"}, {"value": None}, {"headers": [("h", b"1")]}, {"value": b"y" * 41}):
        builder = BatchBuilder()
        for i, value in enumerate(values):
            if i == 70:
                builder.append(odd_one.get("value", value), odd_one.get("key"), T0, odd_one.get("headers"))
            else:
                builder.append(value, None, T0)
        bulk, general = _decode_both(builder.build(), monkeypatch)
        assert bulk == general and len(bulk) == 200, odd_one


@pytest.mark.parametrize("count,damaged_records", [
    (100, [0, 1, 2, 62, 63, 64, 65, 66, 98, 99]),   # the first, around the widening at 64, the last
    (8_200, [8_192]),                                # the first offset delta of three bytes
])
def test_a_damaged_uniform_batch_decodes_or_fails_as_the_general_loop_does(count, damaged_records, monkeypatch):
    # every byte of the sampled records, changed two ways (the continuation bit, the low
    # bit): the bulk decoder must accept exactly what the general loop accepts, and fail
    # with its message
    raw = encode_batch([bytes([i % 256]) * 6 for i in range(count)], timestamps_ms=[T0] * count)
    header = parse_header(raw)
    starts = [61]
    for _ in range(count):   # each record's start: its length varint says how long it is
        length, after_length = decode_varint(raw, starts[-1])
        starts.append(after_length + length)
    assert starts[-1] == len(raw) and header.records_count == count
    outcomes = set()
    for record in damaged_records:
        for position in range(starts[record], starts[record + 1]):
            for flip in (0x80, 0x01):
                damaged = bytearray(raw)
                damaged[position] ^= flip
                bulk, general = _decode_both(bytes(damaged), monkeypatch)
                assert bulk == general, (record, position, flip)
                outcomes.add(isinstance(bulk, tuple))
    assert outcomes == {True, False}   # some damage is still well-formed records, some is not


def test_bulk_decoding_leaves_the_garbage_collector_as_it_found_it():
    import gc

    raw = encode_batch([b"v" * 10] * 100, timestamps_ms=[T0] * 100)
    was_enabled = gc.isenabled()
    try:
        gc.enable()
        assert len(decode_records(raw, parse_header(raw), "t", 0)) == 100 and gc.isenabled()
        gc.disable()
        assert len(decode_records(raw, parse_header(raw), "t", 0)) == 100 and not gc.isenabled()
    finally:
        (gc.enable if was_enabled else gc.disable)()


def test_the_gc_pause_is_shared_by_nested_builders_and_survives_an_unmatched_exit():
    # Two threads inside bulk builds at once: the collector comes back only when the last
    # leaves, and an exit whose enter never counted (an interrupt inside enter) cannot
    # drive the count negative and leave the collector off for good.
    import gc

    from eos.records.decode import _GcPause

    was_enabled = gc.isenabled()
    pause = _GcPause()
    try:
        gc.enable()
        pause.enter()
        pause.enter()
        pause.exit()
        assert not gc.isenabled()
        pause.exit()
        assert gc.isenabled()
        pause.exit()                      # unmatched
        pause.enter()
        assert not gc.isenabled()
        pause.exit()
        assert gc.isenabled()
        gc.disable()                      # the application's own choice is kept
        pause.enter()
        pause.exit()
        assert not gc.isenabled()
    finally:
        (gc.enable if was_enabled else gc.disable)()


# --- a batch decoded in parts (decode_records_part: a consumer that sought into a batch) --

def _in_parts(raw: bytes, first_offset: int, max_records: int) -> tuple[list[Record], int]:
    """Every part from `first_offset` on, resumed until the batch is done; and the calls."""
    header = parse_header(raw)
    records: list[Record] = []
    resume, calls = None, 0
    while True:
        part, resume = decode_records_part(raw, header, "t", 3, first_offset=first_offset,
                                           max_records=max_records, resume=resume)
        records += part
        calls += 1
        if resume is None:
            return records, calls


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("keyed", [False, True], ids=["null-keys", "keyed"])
def test_a_batch_decoded_in_parts_gives_the_records_from_the_first_offset_on(codec, keyed):
    count = 300
    values = [b"value-%05d" % i for i in range(count)]          # one length: the bulk runs too
    keys = [b"k%d" % (i % 7) for i in range(count)] if keyed else None
    raw = encode_batch(values, keys, T0, compression=codec, base_offset=1_000)
    whole = decode_records(raw, parse_header(raw), "t", 3)
    for first_offset in (0, 1_000, 1_001, 1_150, 1_299, 1_300, 5_000):
        for max_records in (1, 7, 100, 10_000):
            records, calls = _in_parts(raw, first_offset, max_records)
            assert records == [r for r in whole if r.offset >= first_offset], (first_offset, max_records)
            assert calls == max(1, -(-len(records) // max_records))


def _hand_record(offset_delta: int, value: bytes) -> bytes:
    body = b"\x00" + encode_varlong(0) + encode_varint(offset_delta) + encode_varint(-1) \
        + encode_varint(len(value)) + value + encode_varint(0)
    return encode_varint(len(body)) + body


def test_parts_of_a_compacted_batch_start_at_the_first_offset_left_at_or_after_the_one_asked():
    deltas = [0, 2, 5, 9]                                    # compaction's gaps
    section = b"".join(_hand_record(delta, b"v%d" % delta) for delta in deltas)
    raw = _rewrap(_plain_batch(4), section, base_offset=100, last_offset_delta=9)
    for first_offset, expected in ((100, [100, 102, 105, 109]), (101, [102, 105, 109]), (103, [105, 109]),
                                   (109, [109]), (110, [])):
        for max_records in (1, 2, 4):
            records, _ = _in_parts(raw, first_offset, max_records)
            assert [r.offset for r in records] == expected
            assert [r.value for r in records] == [b"v%d" % (offset - 100) for offset in expected]


def test_a_part_finds_what_decode_records_finds_wrong():
    raw = _plain_batch()
    truncated = _rewrap(raw, raw[61:-1])
    for first_offset in (0, T0):                             # built, or walked over
        with pytest.raises(CorruptRecordError, match="record 2 declares 14 bytes, 13 remain"):
            _in_parts(truncated, first_offset, 1)
    with pytest.raises(CorruptRecordError, match="2 bytes follow the 3 records"):
        _in_parts(_rewrap(raw, raw[61:] + b"\x00\x00"), 0, 2)
    # the earlier parts came out before the damage was reached: the last part raises
    header = parse_header(_rewrap(raw, raw[61:] + b"\x00\x00"))
    first, resume = decode_records_part(_rewrap(raw, raw[61:] + b"\x00\x00"), header, "t", 3, first_offset=0,
                                        max_records=2)
    assert [r.value for r in first] == [b"value-0", b"value-1"] and resume is not None
