"""Test helper: Kafka's legacy message sets (magic 0 and 1), written by hand from the format
description, independently of eos.records.legacy (the reader under test).

An entry is offset i64, messageSize i32, then the message: crc u32 (zlib CRC-32 over the
rest), magic i8, attributes i8 (codec in bits 0-2, v1 timestamp type in bit 3), timestamp
i64 (v1 only), key (i32 length, -1 = null), value (i32 length, -1 = null). A compressed
"wrapper" holds the inner message set, compressed, as its value: v1 inner offsets are
relative (0..n-1) with the wrapper at the absolute offset of the last; v0 inner offsets are
absolute. LZ4 under v0 carries Kafka's broken frame header checksum (KAFKA-3160), computed
over the frame magic as well as the descriptor.
"""
from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

import lz4.frame
import snappy

NONE, GZIP, SNAPPY, LZ4 = 0, 1, 2, 3
LOG_APPEND_TIME_FLAG = 0x08


class Msg(NamedTuple):
    key: bytes | None
    value: bytes | None
    timestamp_ms: int = -1        # ignored under v0


def _bytes_field(blob: bytes | None) -> bytes:
    return struct.pack(">i", -1) if blob is None else struct.pack(">i", len(blob)) + blob


def message(magic: int, key: bytes | None, value: bytes | None, *, timestamp_ms: int = -1,
            attributes: int = 0) -> bytes:
    """One message, from its crc field to the end of its value."""
    body = struct.pack(">bb", magic, attributes)
    if magic == 1:
        body += struct.pack(">q", timestamp_ms)
    body += _bytes_field(key) + _bytes_field(value)
    return struct.pack(">I", zlib.crc32(body)) + body


def entry(offset: int, msg: bytes) -> bytes:
    return struct.pack(">qi", offset, len(msg)) + msg


def plain_entries(magic: int, first_offset: int, msgs: list[Msg], *, log_append_time: bool = False) -> bytes:
    """Uncompressed messages at consecutive offsets from `first_offset`."""
    attributes = LOG_APPEND_TIME_FLAG if log_append_time and magic == 1 else 0
    return b"".join(entry(first_offset + i, message(magic, m.key, m.value, timestamp_ms=m.timestamp_ms,
                                                    attributes=attributes))
                    for i, m in enumerate(msgs))


def _xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32 for inputs under 16 bytes (the LZ4 frame descriptor, with or without magic)."""
    p1, p2, p3, p4, p5, mask = 2654435761, 2246822519, 3266489917, 668265263, 374761393, 0xFFFFFFFF
    rotl = lambda v, r: ((v << r) | (v >> (32 - r))) & mask   # noqa: E731
    assert len(data) < 16
    h = (seed + p5 + len(data)) & mask
    i = 0
    while i + 4 <= len(data):
        h = (rotl((h + int.from_bytes(data[i:i + 4], "little") * p3) & mask, 17) * p4) & mask
        i += 4
    while i < len(data):
        h = (rotl((h + data[i] * p5) & mask, 11) * p1) & mask
        i += 1
    h ^= h >> 15
    h = (h * p2) & mask
    h ^= h >> 13
    h = (h * p3) & mask
    h ^= h >> 16
    return h


def lz4_frame(data: bytes, *, broken_header_checksum: bool) -> bytes:
    """An LZ4 frame as Kafka's KafkaLZ4BlockOutputStream writes it (independent 64 KiB
    blocks, no checksums, no content size); with `broken_header_checksum`, the header
    checksum byte of Kafka's v0 writer (xxh32 over magic + FLG + BD)."""
    frame = lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
                               content_checksum=False, block_checksum=False, store_size=False)
    assert frame[6] == (_xxh32(frame[4:6]) >> 8) & 0xFF, "the standard checksum: our xxh32 agrees with liblz4"
    if broken_header_checksum:
        frame = frame[:6] + bytes(((_xxh32(frame[0:6]) >> 8) & 0xFF,)) + frame[7:]
    return frame


def _compress(codec: int, data: bytes, magic: int) -> bytes:
    if codec == GZIP:
        return zlib.compress(data, 6, wbits=31)
    if codec == SNAPPY:     # xerial snappy-java framing, one block
        block = snappy.compress(data)
        return b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1) + struct.pack(">i", len(block)) + block
    if codec == LZ4:
        return lz4_frame(data, broken_header_checksum=magic == 0)
    raise ValueError(codec)


def wrapper_entry(magic: int, codec: int, last_offset: int, msgs: list[Msg], *,
                  log_append_time_ms: int | None = None, inner_offsets: list[int] | None = None) -> bytes:
    """A compressed wrapper of `msgs` whose own offset is `last_offset` (its last message's).
    Inner offsets: v1 relative 0..n-1, v0 absolute (last_offset - n + 1 ..), unless given.
    v1 wrapper timestamp: the max inner timestamp, or `log_append_time_ms` with the
    LogAppendTime attribute."""
    count = len(msgs)
    if inner_offsets is None:
        inner_offsets = list(range(count)) if magic == 1 else list(range(last_offset - count + 1, last_offset + 1))
    inner = b"".join(entry(o, message(magic, m.key, m.value, timestamp_ms=m.timestamp_ms))
                     for o, m in zip(inner_offsets, msgs))
    attributes = codec
    timestamp = -1
    if magic == 1:
        if log_append_time_ms is not None:
            attributes |= LOG_APPEND_TIME_FLAG
            timestamp = log_append_time_ms
        else:
            timestamp = max(m.timestamp_ms for m in msgs)
    return entry(last_offset, message(magic, None, _compress(codec, inner, magic), timestamp_ms=timestamp,
                                      attributes=attributes))
