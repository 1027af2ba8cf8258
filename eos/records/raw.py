"""Records of a stored batch as raw byte ranges: what the log cleaner keeps or drops.

Theory of operation
-------------------
The broker never decodes records on its hot paths; two places must look inside a batch
without building `Record` objects: the log cleaner (which records to keep: it needs each
record's offset, key and whether the value is null) and the compacted-topic check on
append (every record has a key). `raw_records` walks the (decompressed) records
section and yields each record's byte range with those three facts; `rebuild_batch` writes
a batch holding only some of them, and `recompress_batch` the same records in another
codec (a topic whose compression.type is not the producer's).

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
from typing import NamedTuple

from crc32c import crc32c

from eos.errors import CorruptRecordError
from eos.records import compression as _compression
from eos.records.decode import _records_section
from eos.records.header import COMPRESSION_CODEC_MASK, CRC_START, HEADER_SIZE, LOG_OVERHEAD, BatchHeader
from eos.records.varint import ZIGZAG_DECODE_1, decode_varint, decode_varlong

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


def raw_records(data: bytes, start: int, end: int, header: BatchHeader) -> list[RawRecord]:
    """Every record of the section `data[start:end]` (as `records_section` returns it) of
    `header`'s batch; raises CorruptRecordError unless it holds exactly recordsCount whole
    records.

    Reads only what the cleaner needs -- each record's length, offset delta, key and the
    sign of its value length -- and skips timestamps, values and headers: the cleaner's
    cost is this loop, once per record."""
    count = header.records_count
    base_offset = header.base_offset
    records: list[RawRecord] = []
    append = records.append
    new_record = tuple.__new__
    zigzag1 = ZIGZAG_DECODE_1
    position = start
    try:
        for _ in range(count):
            record_start = position
            byte = data[position]
            if byte < 0x80:
                length = zigzag1[byte]
                position += 1
            else:
                length, position = decode_varint(data, position)
            record_end = position + length
            if length <= 0 or record_end > end:
                raise CorruptRecordError(f"batch at offset {base_offset}: record {len(records)} of {count} has "
                                         f"length {length}, past the end of the records section")
            # attributes (one byte), then timestampDelta (varlong, skipped)
            if data[position + 1] < 0x80:
                position += 2
            else:
                _, position = decode_varlong(data, position + 1)
            byte = data[position]
            if byte < 0x80:
                offset_delta = zigzag1[byte]
                position += 1
            else:
                offset_delta, position = decode_varint(data, position)
            byte = data[position]
            if byte < 0x80:
                key_length = zigzag1[byte]
                position += 1
            else:
                key_length, position = decode_varint(data, position)
            if key_length < 0:
                key = None
            else:
                key = data[position:position + key_length]
                position += key_length
            byte = data[position]
            value_length = zigzag1[byte] if byte < 0x80 else decode_varint(data, position)[0]
            if position >= record_end or key_length < -1 or value_length < -1:
                raise CorruptRecordError(f"batch at offset {base_offset}: record {len(records)} of {count} "
                                         f"does not fit its length {length}")
            append(new_record(RawRecord, (record_start, record_end, base_offset + offset_delta, key,
                                          value_length < 0)))
            position = record_end
    except IndexError:
        raise _ends_inside(f"batch at offset {base_offset}", len(records), count) from None
    _check_section_end(f"batch at offset {base_offset}", position, end, count)
    return records


def _ends_inside(where: str, index: int, count: int) -> CorruptRecordError:
    return CorruptRecordError(f"{where}: the records section ends inside record {index} of {count}")


def _check_section_end(where: str, position: int, end: int, count: int) -> None:
    """The walk over `count` records ended exactly at the section's end."""
    if position != end:
        raise CorruptRecordError(f"{where}: {end - position} byte(s) after its {count} record(s)")


def check_record_framing(buf, header: BatchHeader) -> None:
    """`header`'s batch in `buf` holds exactly recordsCount whole records in its records
    section (decompressed first: a codec that cannot read it fails here), each as long as its
    length prefix says; CorruptRecordError otherwise. Kafka's LogValidator parses every record
    of a client's batch and refuses one it cannot read; this reads each record's length
    prefix only -- one short step a record, on the append path -- so a batch whose body is
    not records (a wrong codec flag, garbage under a good CRC) never reaches the log, where
    it would stop every consumer of the partition. A record's inner fields are read by the
    consumers, not here."""
    data, start, end = _records_section(buf, header)
    count = header.records_count
    zigzag1 = ZIGZAG_DECODE_1
    position = start
    index = -1
    try:
        for index in range(count):
            byte = data[position]
            if byte < 0x80:
                length = zigzag1[byte]
                position += 1
            elif data[position + 1] < 0x80:          # records of 64 B to 8 KiB: two bytes
                raw = (byte & 0x7F) | (data[position + 1] << 7)
                length = (raw >> 1) ^ -(raw & 1)
                position += 2
            else:
                length, position = decode_varint(data, position)
            position += length
            if length <= 0 or position > end:
                raise CorruptRecordError(f"batch at byte {header.position}: record {index} of {count} has length "
                                         f"{length}, which the records section cannot hold")
    except IndexError:
        raise _ends_inside(f"batch at byte {header.position}", index, count) from None
    _check_section_end(f"batch at byte {header.position}", position, end, count)


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


def recompress_batch(buf, header: BatchHeader, codec: int) -> bytes:
    """The batch at `header` in `buf` with its records section in `codec` (Kafka's
    LogValidator when a topic's compression.type differs from the producer's codec). Every
    header field but the codec bits, the length and the CRC is kept, so offsets, sequences,
    timestamps and the transactional flag are those of the original; the records are copied
    byte for byte. The caller has checked that they tile the section (`check_record_framing`,
    which the append path runs on every client batch first), so they are not walked here."""
    data, start, end = _records_section(buf, header)
    section = bytes(data[start:end])
    if codec:
        section = _compression.compress(codec, section)
    out = bytearray(buf[header.position:header.position + HEADER_SIZE])
    out += section
    _I32.pack_into(out, _BATCH_LENGTH_AT, len(out) - LOG_OVERHEAD)
    _I16.pack_into(out, _ATTRIBUTES_AT, (header.attributes & ~COMPRESSION_CODEC_MASK) | codec)
    _U32.pack_into(out, _CRC_AT, crc32c(memoryview(out)[CRC_START:]))
    return bytes(out)


def recompress_batches(buf, headers, codec: int) -> bytes | None:
    """`buf`'s batches (parsed as `headers`, their records checked: see `recompress_batch`)
    with every data batch in `codec`, or None when all already are. Control batches
    (transaction markers) stay as written: Kafka never compresses them."""
    if all(h.is_control or h.compression == codec for h in headers):
        return None
    view = memoryview(buf)
    return b"".join(bytes(view[h.position:h.position + h.size_bytes]) if h.is_control or h.compression == codec
                    else recompress_batch(view, h, codec) for h in headers)


def first_keyless_record(buf, header: BatchHeader) -> int | None:
    """The offset of the first record without a key in the batch, or None."""
    data, start, end = _records_section(buf, header)
    for record in raw_records(data, start, end, header):
        if record[3] is None:
            return record[2]
    return None
