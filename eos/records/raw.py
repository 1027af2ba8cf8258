"""Records of a stored batch as raw byte ranges: what the log cleaner keeps or drops.

Theory of operation
-------------------
The broker never decodes records on its hot paths; two places must look inside a batch
without building `Record` objects: the log cleaner (which records to keep: it needs each
record's offset, key and whether the value is null) and the compacted-topic check on
append (every record has a key). `iter_raw_records` walks the (decompressed) records
section and yields each record's byte range with those three facts; `rebuild_batch` writes
a batch holding only some of them.

A rebuilt batch keeps everything the header says about the original — base offset,
lastOffsetDelta, base and max timestamps, producer id, epoch, base sequence, attributes,
partition leader epoch — and only the records count, the length and the CRC change. The
kept records are copied byte for byte: their offset and timestamp deltas stay relative to
the same base, so every record keeps its offset (Kafka's cleaner keeps offsets too), and
keeping lastOffsetDelta keeps the producer's last sequence (base sequence + delta), which
is what an idempotent producer's state is rebuilt from. A compressed batch is
recompressed with its own codec. A batch with no records left is written as Kafka writes
an empty retained batch: the header alone, records count 0, uncompressed.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

from crc32c import crc32c

from eos.errors import CorruptRecordError
from eos.records import compression as _compression
from eos.records.codec import _records_section, decode_records
from eos.records.header import COMPRESSION_CODEC_MASK, CRC_START, HEADER_SIZE, LOG_OVERHEAD, BatchHeader
from eos.records.varint import ZIGZAG_DECODE_1, decode_varint

_BATCH_LENGTH_AT = 8
_CRC_AT = 17
_ATTRIBUTES_AT = 21
_RECORDS_COUNT_AT = 57
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I16 = struct.Struct(">h")


class RawRecord(NamedTuple):
    """One record of a batch: its bytes are data[start:end] of the section it came from."""

    start: int
    end: int
    offset: int            # absolute: the batch's base offset + the record's offset delta
    key: bytes | None
    value_is_null: bool    # a tombstone on a compacted topic


def records_section(buf, header: BatchHeader) -> tuple[bytes, int, int]:
    """(data, start, end) of the batch's records, decompressed if needed."""
    return _records_section(buf, header)


def iter_raw_records(data, start: int, end: int, header: BatchHeader) -> Iterator[RawRecord]:
    """Every record of the section `data[start:end]` of `header`'s batch; raises
    CorruptRecordError unless it holds exactly recordsCount whole records.

    The fields come from `decode_records` (the optimised decoder every reader uses); the
    byte ranges from a walk over the records' length prefixes alone."""
    section = data[start:end] if (start or end != len(data)) else data
    if not isinstance(section, bytes):
        section = bytes(section)
    # the section is decompressed already: decode it as an uncompressed batch
    local = header._replace(position=0, attributes=header.attributes & ~COMPRESSION_CODEC_MASK,
                            batch_length=HEADER_SIZE - LOG_OVERHEAD + len(section))
    # (prefixed by a header's worth of zeros: the decoder reads records from HEADER_SIZE on)
    decoded = decode_records(bytes(HEADER_SIZE) + section, local, "", 0)
    position = 0
    for record in decoded:
        byte = section[position]
        if byte < 0x80:
            length = ZIGZAG_DECODE_1[byte]
            body = position + 1
        else:
            length, body = decode_varint(section, position)
        record_end = body + length
        yield RawRecord(start + position, start + record_end, record.offset, record.key, record.value is None)
        position = record_end


def rebuild_batch(batch: bytes, header: BatchHeader, data, kept: list[RawRecord]) -> bytes:
    """The batch `batch` (its bytes alone, header at 0) with only the records `kept`
    (taken from `data`, the section `records_section` returned for it), recompressed with
    the batch's codec; with none kept, the empty batch Kafka retains."""
    codec = header.attributes & COMPRESSION_CODEC_MASK
    attributes = header.attributes
    if kept:
        section = b"".join(data[r.start:r.end] for r in kept)
        if codec:
            section = _compression.compress(codec, section)
    else:
        section = b""
        attributes &= ~COMPRESSION_CODEC_MASK
    out = bytearray(batch[:HEADER_SIZE])
    out += section
    _I32.pack_into(out, _BATCH_LENGTH_AT, len(out) - LOG_OVERHEAD)
    _I16.pack_into(out, _ATTRIBUTES_AT, attributes)
    _I32.pack_into(out, _RECORDS_COUNT_AT, len(kept))
    _U32.pack_into(out, _CRC_AT, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def keys_and_offsets(buf, header: BatchHeader) -> list[tuple[bytes | None, int]]:
    """(key, offset) of every record of the batch `header` describes in `buf`."""
    return [(record.key, record.offset) for record in decode_records(buf, header, "", 0)]


def first_keyless_record(buf, header: BatchHeader) -> int | None:
    """The offset of the first record without a key in the batch, or None."""
    for key, offset in keys_and_offsets(buf, header):
        if key is None:
            return offset
    return None
