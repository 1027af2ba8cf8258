"""Kafka's legacy message formats (magic 0 and 1): read them, and up-convert them to v2 batches.

Theory of operation
-------------------
Before Kafka 0.11 a log held message sets, not record batches. A log that an old Kafka
wrote, or that an upgraded Kafka kept, holds such entries, possibly followed by v2 batches
in the same segment. eos reads those logs and serves them as v2; it never writes a legacy
entry (Kafka 4 refuses to produce them too: see `LEGACY_PRODUCE_REFUSAL`).

One entry of a message set (big-endian), offsets in bytes from the entry's start:

     0  offset i64          the message's offset (of a wrapper: see below)
     8  messageSize i32     the bytes after this field
    12  crc u32             CRC-32 (zlib's, not CRC-32C) over magic .. end
    16  magic i8            0 or 1; a v2 batch has its magic at byte 16 too
    17  attributes i8       bits 0-2 codec (0 none, 1 gzip, 2 snappy, 3 lz4), bit 3 (v1)
                            timestamp type (0 CreateTime, 1 LogAppendTime)
    18  timestamp i64       v1 only
        keyLength i32, key  -1 and no bytes for a null key
        valueLength i32, value

The first 12 bytes frame an entry exactly as they frame a v2 batch (offset, then the
length of the rest), so a walk over a segment by length fields works on a mix of both, and
the byte at 16 tells which one starts there.

A compressed entry (a "wrapper") holds in its value a whole inner message set, compressed
with the wrapper's codec; the inner messages are uncompressed and of the wrapper's magic.
Under v1 the inner offsets are relative (0 .. n-1) and the wrapper's offset is the absolute
offset of the last inner message, so inner offset o is at wrapper offset - last inner + o.
Under v0 the inner offsets are absolute. LZ4 under v0 has Kafka's framing quirk
(KAFKA-3160): the frame's header checksum was computed over the magic number too, so it is
wrong by the LZ4 spec; Kafka's reader ignores it for v0, and so do we (we put the right
checksum in before handing the frame to liblz4). Under v1 the frame is a standard one.

`read_entry` reads one entry into a `LegacyEntry` (CRCs of the wrapper and of every inner
message verified; anything malformed is CorruptRecordError naming the byte), `batch_header`
describes it as the `BatchHeader` the storage layer walks with (file position and stored
size kept, so indexes and reads address the stored bytes, as Kafka's do), and
`to_v2_batch` writes the v2 batch a reader gets instead: the same offsets, keys and values;
v1 timestamps and timestamp type kept, v0 messages without timestamp (-1, NO_TIMESTAMP);
no producer id, not transactional; the wrapper's codec kept. `up_convert` does that for
every legacy entry of a run of stored entries and copies the v2 batches as they are.
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from crc32c import crc32c

from eos.errors import CorruptRecordError, InvalidRecordError
from eos.records import compression as _compression
from eos.records.header import (
    BATCH_LENGTH_LIMIT_BYTES, COMPRESSION_CODEC_MASK, HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2,
    NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP, TIMESTAMP_TYPE_MASK, BatchHeader)
from eos.records.varint import encode_varint, encode_varlong

MAGIC_V0 = 0
MAGIC_V1 = 1
LEGACY_MAGICS = (MAGIC_V0, MAGIC_V1)
MAGIC_AT = 16                 # the magic byte's offset in an entry (legacy or v2)
LEGACY_CRC_AT = 12
LEGACY_CRC_START = 16         # the CRC-32 covers magic .. end
# bytes of a message after its size field, with empty key and value: crc, magic,
# attributes, (v1: timestamp), key length, value length
MESSAGE_OVERHEAD_BYTES = {MAGIC_V0: 4 + 1 + 1 + 4 + 4, MAGIC_V1: 4 + 1 + 1 + 8 + 4 + 4}
LEGACY_CODECS = (_compression.NONE, _compression.GZIP, _compression.SNAPPY, _compression.LZ4)
_LEGACY_ATTRIBUTES_MASK = COMPRESSION_CODEC_MASK | TIMESTAMP_TYPE_MASK   # the bits v0/v1 define

# Kafka's answer to a produce of magic 0/1 (ProduceRequest.validateRecords, INVALID_RECORD)
LEGACY_PRODUCE_REFUSAL = "Produce requests are only allowed to contain record batches with magic version 2"

_ENTRY_HEAD = struct.Struct(">qiIbb")        # offset, size, crc, magic, attributes
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_V2_PREFIX = struct.Struct(">qiibI")         # baseOffset .. crc
_V2_TAIL = struct.Struct(">hiqqqhii")        # attributes .. recordsCount


class LegacyRecord(NamedTuple):
    offset: int               # absolute
    timestamp_ms: int         # NO_TIMESTAMP (-1) under v0
    key: bytes | None
    value: bytes | None


class LegacyEntry(NamedTuple):
    """One stored entry: a plain message (one record) or a wrapper (its inner messages)."""

    position: int             # where the entry starts in the buffer it was read from
    size_bytes: int           # stored size, offset and size fields included
    offset: int               # the entry's own offset field (a wrapper's: its last message's)
    magic: int
    attributes: int
    crc: int
    timestamp_type: int       # 0 CreateTime, 1 LogAppendTime (always 0 under v0)
    max_timestamp_ms: int     # NO_TIMESTAMP under v0
    records: list[LegacyRecord]


def is_legacy_at(buf, position: int) -> bool:
    """Whether the entry starting at `position` is a v0/v1 message (byte 16 is its magic)."""
    return len(buf) > position + MAGIC_AT and buf[position + MAGIC_AT] in LEGACY_MAGICS


def entry_size(buf, position: int) -> int:
    """The stored size of the v0/v1 entry at `position` (offset and size fields included),
    from its frame alone; CorruptRecordError when that cannot be a message's."""
    if len(buf) - position <= MAGIC_AT:
        raise CorruptRecordError(f"legacy message at byte {position}: {len(buf) - position} bytes, too few")
    magic = buf[position + MAGIC_AT]
    message_size = _I32.unpack_from(buf, position + 8)[0]
    if magic not in LEGACY_MAGICS or not MESSAGE_OVERHEAD_BYTES[magic] <= message_size <= BATCH_LENGTH_LIMIT_BYTES:
        raise CorruptRecordError(f"legacy message at byte {position}: magic {magic}, invalid message size "
                                 f"{message_size}")
    return LOG_OVERHEAD + message_size


def _message_fields(buf, position: int, end: int, magic: int, where: str):
    """(attributes, timestamp, key, value) of the message whose crc field is at `position`
    and which ends at `end`; raises CorruptRecordError unless its fields fill it exactly."""
    at = position + 6                      # after crc, magic, attributes
    attributes = buf[position + 5]
    timestamp = NO_TIMESTAMP
    if magic == MAGIC_V1:
        timestamp = _I64.unpack_from(buf, at)[0]
        at += 8
    fields = []
    for what in ("key", "value"):
        if at + 4 > end:
            raise CorruptRecordError(f"{where}: the message ends inside its {what} length")
        length = _I32.unpack_from(buf, at)[0]
        at += 4
        if length < -1 or at + max(length, 0) > end:
            raise CorruptRecordError(f"{where}: {what} length {length} does not fit the message")
        fields.append(None if length == -1 else bytes(buf[at:at + length]))
        at += max(length, 0)
    if at != end:
        raise CorruptRecordError(f"{where}: {end - at} byte(s) after the message's value")
    return attributes, timestamp, fields[0], fields[1]


def _frame(buf, position: int, end: int, where: str) -> tuple[int, int, int, int, int]:
    """(offset, size_bytes, crc, magic, attributes) of the entry at `position`, its frame and
    its CRC-32 checked, the entry lying within `end`."""
    if end - position < LOG_OVERHEAD + MESSAGE_OVERHEAD_BYTES[MAGIC_V0]:
        raise CorruptRecordError(f"{where}: {end - position} bytes, too few for a message")
    offset, message_size, crc, magic, attributes = _ENTRY_HEAD.unpack_from(buf, position)
    if magic not in LEGACY_MAGICS:
        raise CorruptRecordError(f"{where}: magic {magic} is not a legacy message (0 or 1)")
    if message_size < MESSAGE_OVERHEAD_BYTES[magic] or message_size > BATCH_LENGTH_LIMIT_BYTES:
        raise CorruptRecordError(f"{where}: invalid v{magic} message size {message_size}")
    size_bytes = LOG_OVERHEAD + message_size
    if position + size_bytes > end:
        raise CorruptRecordError(f"{where}: truncated v{magic} message: declares {size_bytes} bytes, "
                                 f"{end - position} present")
    actual = zlib.crc32(memoryview(buf)[position + LEGACY_CRC_START:position + size_bytes])
    if actual != crc:
        raise CorruptRecordError(f"{where}: CRC mismatch in v{magic} message: stored {crc:#010x}, "
                                 f"computed {actual:#010x}")
    return offset, size_bytes, crc, magic, attributes


def read_entry(buf, position: int = 0, end: int | None = None) -> LegacyEntry:
    """The v0/v1 entry at `position` (ending within `end`, default the buffer's end), every
    CRC verified, a wrapper's inner messages decompressed and given absolute offsets."""
    end = len(buf) if end is None else end
    where = f"legacy message at byte {position}"
    offset, size_bytes, crc, magic, _ = _frame(buf, position, end, where)
    attributes, timestamp, key, value = _message_fields(buf, position + LEGACY_CRC_AT, position + size_bytes,
                                                        magic, where)
    codec = attributes & COMPRESSION_CODEC_MASK
    timestamp_type = (attributes & TIMESTAMP_TYPE_MASK) >> 3 if magic == MAGIC_V1 else 0
    if codec == _compression.NONE:
        records = [LegacyRecord(offset, timestamp, key, value)]
        return LegacyEntry(position, size_bytes, offset, magic, attributes, crc, timestamp_type, timestamp, records)
    if codec not in LEGACY_CODECS:
        raise CorruptRecordError(f"{where}: compression codec {codec} does not exist in message format v{magic}")
    if value is None:
        raise CorruptRecordError(f"{where}: a compressed message with a null value")
    inner = _decompress(codec, magic, value, where)
    records = _inner_records(inner, offset, magic, timestamp, timestamp_type, where)
    if magic == MAGIC_V1:
        max_timestamp = timestamp       # the wrapper carries the max (or the LogAppendTime)
    else:
        max_timestamp = NO_TIMESTAMP
    return LegacyEntry(position, size_bytes, offset, magic, attributes, crc, timestamp_type, max_timestamp,
                       records)


def _inner_records(inner: bytes, wrapper_offset: int, magic: int, wrapper_timestamp: int, timestamp_type: int,
                   where: str) -> list[LegacyRecord]:
    """The records of a wrapper's decompressed message set, with absolute offsets."""
    raw: list[LegacyRecord] = []
    position, end = 0, len(inner)
    while position < end:
        inner_where = f"{where}, inner message at byte {position}"
        offset, size_bytes, _, inner_magic, _ = _frame(inner, position, end, inner_where)
        if inner_magic != magic:
            raise CorruptRecordError(f"{inner_where}: magic {inner_magic} inside a v{magic} wrapper")
        attributes, timestamp, key, value = _message_fields(inner, position + LEGACY_CRC_AT, position + size_bytes,
                                                            magic, inner_where)
        if attributes & COMPRESSION_CODEC_MASK:
            raise CorruptRecordError(f"{inner_where}: a compressed message inside a compressed message")
        if timestamp_type == 1:
            timestamp = wrapper_timestamp   # LogAppendTime: every inner record shows the wrapper's time
        raw.append(LegacyRecord(offset, timestamp, key, value))
        position += size_bytes
    if not raw:
        raise CorruptRecordError(f"{where}: a compressed message with no inner messages")
    if magic == MAGIC_V1:
        base = wrapper_offset - raw[-1].offset
        raw = [record._replace(offset=base + record.offset) for record in raw]
    for earlier, later in zip(raw, raw[1:]):
        if later.offset <= earlier.offset:
            raise CorruptRecordError(f"{where}: inner offsets go from {earlier.offset} to {later.offset}")
    if raw[-1].offset > wrapper_offset:
        raise CorruptRecordError(f"{where}: an inner offset {raw[-1].offset} is past the wrapper's "
                                 f"{wrapper_offset}")
    return raw


# --- LZ4 under v0 (KAFKA-3160) -------------------------------------------------------------

_XXH_PRIME1, _XXH_PRIME2, _XXH_PRIME3, _XXH_PRIME4, _XXH_PRIME5 = (
    2654435761, 2246822519, 3266489917, 668265263, 374761393)
_MASK32 = 0xFFFFFFFF
_LZ4_FLG_CONTENT_SIZE = 0x08
_LZ4_FLG_DICT_ID = 0x01


def _rotl32(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK32


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 of `data`: the LZ4 frame's header checksum is byte 1 of it (for a few bytes
    only, so plain Python)."""
    length = len(data)
    position = 0
    if length >= 16:
        lanes = [(seed + _XXH_PRIME1 + _XXH_PRIME2) & _MASK32, (seed + _XXH_PRIME2) & _MASK32, seed & _MASK32,
                 (seed - _XXH_PRIME1) & _MASK32]
        while position <= length - 16:
            for i in range(4):
                word = int.from_bytes(data[position:position + 4], "little")
                lanes[i] = (_rotl32((lanes[i] + word * _XXH_PRIME2) & _MASK32, 13) * _XXH_PRIME1) & _MASK32
                position += 4
        digest = (_rotl32(lanes[0], 1) + _rotl32(lanes[1], 7) + _rotl32(lanes[2], 12) + _rotl32(lanes[3], 18))
    else:
        digest = seed + _XXH_PRIME5
    digest = (digest + length) & _MASK32
    while position + 4 <= length:
        word = int.from_bytes(data[position:position + 4], "little")
        digest = (_rotl32((digest + word * _XXH_PRIME3) & _MASK32, 17) * _XXH_PRIME4) & _MASK32
        position += 4
    while position < length:
        digest = (_rotl32((digest + data[position] * _XXH_PRIME5) & _MASK32, 11) * _XXH_PRIME1) & _MASK32
        position += 1
    digest ^= digest >> 15
    digest = (digest * _XXH_PRIME2) & _MASK32
    digest ^= digest >> 13
    digest = (digest * _XXH_PRIME3) & _MASK32
    digest ^= digest >> 16
    return digest


def lz4_header_checksum_position(frame: bytes) -> int:
    """Where the frame descriptor's header checksum byte is (after FLG, BD and the optional
    content size and dictionary id)."""
    flg = frame[4]
    return 6 + (8 if flg & _LZ4_FLG_CONTENT_SIZE else 0) + (4 if flg & _LZ4_FLG_DICT_ID else 0)


def _with_correct_lz4_header_checksum(frame: bytes) -> bytes:
    """A v0 LZ4 frame with its header checksum recomputed as the spec says (over the
    descriptor alone), whatever the writer put there: Kafka's reader ignores it for v0."""
    if len(frame) < 7 or frame[:4] != _compression.LZ4_FRAME_MAGIC:
        return frame            # not a frame: let the normal reader say what is wrong
    at = lz4_header_checksum_position(frame)
    if at >= len(frame):
        return frame
    checksum = (xxh32(frame[4:at]) >> 8) & 0xFF
    return frame[:at] + bytes((checksum,)) + frame[at + 1:]


def _decompress(codec: int, magic: int, value: bytes, where: str) -> bytes:
    if codec == _compression.LZ4 and magic == MAGIC_V0:
        value = _with_correct_lz4_header_checksum(value)
    try:
        return _compression.decompress(codec, value)
    except CorruptRecordError as exc:
        raise CorruptRecordError(f"{where}: {exc}") from None


# --- as the storage layer and readers see it -----------------------------------------------

def batch_header(entry: LegacyEntry) -> BatchHeader:
    """The entry as a `BatchHeader`: magic 0/1, its stored size and position, offsets from
    its first record to its own offset (the last), no producer, leader epoch -1."""
    base_offset = entry.records[0].offset
    return BatchHeader(base_offset, entry.size_bytes - LOG_OVERHEAD, -1, entry.magic, entry.crc,
                       entry.attributes & _LEGACY_ATTRIBUTES_MASK, entry.offset - base_offset,
                       entry.records[0].timestamp_ms, entry.max_timestamp_ms, NO_PRODUCER_ID, NO_PRODUCER_EPOCH,
                       NO_SEQUENCE, len(entry.records), entry.position)


def to_v2_batch(entry: LegacyEntry) -> bytes:
    """The v2 batch a reader gets for `entry` (see the module doc for what is kept)."""
    records = entry.records
    base_offset = records[0].offset
    base_timestamp = records[0].timestamp_ms
    pieces = []
    for record in records:
        body = [b"\x00", encode_varlong(record.timestamp_ms - base_timestamp),
                encode_varint(record.offset - base_offset)]
        for blob in (record.key, record.value):
            if blob is None:
                body.append(b"\x01")          # varint -1
            else:
                body.append(encode_varint(len(blob)))
                body.append(blob)
        body.append(b"\x00")                  # no headers
        body = b"".join(body)
        pieces.append(encode_varint(len(body)))
        pieces.append(body)
    section = b"".join(pieces)
    codec = entry.attributes & COMPRESSION_CODEC_MASK
    if codec:
        section = _compression.compress(codec, section)
    attributes = codec | (TIMESTAMP_TYPE_MASK if entry.timestamp_type else 0)
    tail = _V2_TAIL.pack(attributes, entry.offset - base_offset, base_timestamp, entry.max_timestamp_ms,
                         NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_SEQUENCE, len(records))
    crc = crc32c(tail + section)
    prefix = _V2_PREFIX.pack(base_offset, HEADER_SIZE - LOG_OVERHEAD + len(section), -1, MAGIC_V2, crc)
    return prefix + tail + section


def up_convert(buf, size_limit_bytes: int | None = None) -> bytes:
    """The whole entries of `buf` with every v0/v1 entry replaced by its v2 batch; v2
    batches copied as they are. Returns `buf` itself (as bytes) when it holds no legacy
    entry. With `size_limit_bytes`, stops before the entry that would take the output past
    it (the first entry is always there): a v2 batch is larger than the v0/v1 message it
    replaces, so what fitted a reader's byte budget as stored may not fit it converted.
    Raises CorruptRecordError at an entry that is not whole or not valid."""
    data = buf if buf.__class__ is bytes else bytes(buf)
    end = len(data)
    position = 0
    pieces: list[bytes] = []
    output_bytes = 0
    converted = False
    unpack_length = _I32.unpack_from
    while position < end:
        if end - position < LOG_OVERHEAD + 5:
            raise CorruptRecordError(f"a partial entry at byte {position}: {end - position} bytes")
        size_bytes = unpack_length(data, position + 8)[0] + LOG_OVERHEAD
        if size_bytes <= LOG_OVERHEAD or position + size_bytes > end:
            raise CorruptRecordError(f"an entry at byte {position} declares {size_bytes} bytes, "
                                     f"{end - position} present")
        if data[position + MAGIC_AT] in LEGACY_MAGICS:
            piece = to_v2_batch(read_entry(data, position, position + size_bytes))
            converted = True
        else:
            piece = data[position:position + size_bytes]
        if size_limit_bytes is not None and pieces and output_bytes + len(piece) > size_limit_bytes:
            break
        pieces.append(piece)
        output_bytes += len(piece)
        position += size_bytes
    if not converted and position == end:
        return data
    return b"".join(pieces)


def refuse_legacy_produce(buf, where: str) -> None:
    """InvalidRecordError, as Kafka 4 answers (INVALID_RECORD), when the first entry of a
    produce's records is a v0/v1 message set. (Kafka checks the first batch's magic: a
    produce request carries one batch per partition.)"""
    if is_legacy_at(buf, 0):
        raise InvalidRecordError(f"{where}: {LEGACY_PRODUCE_REFUSAL}; the records are a message set of "
                                 f"format v{buf[MAGIC_AT]}, which Kafka 4 no longer accepts")
