"""The fixed 61-byte header of a Kafka v2 record batch, and the checks the broker makes.

Theory of operation
-------------------
A record batch (message format v2, magic 2) is a 61-byte header followed by the records,
which may be compressed as one block. The broker never looks past the header except to
verify the CRC: it reads the header, checks the length, magic and CRC-32C, writes the base
offset (bytes 0-8, outside the CRC) and stores the batch as it came. This module is the one
place that knows the header layout; record-level encoding lives in `eos.records.codec`.

Layout (big-endian), offsets in bytes:

    0  baseOffset i64        27 baseTimestamp i64
    8  batchLength i32       35 maxTimestamp i64
   12  partitionLeaderEpoch  43 producerId i64
   16  magic i8              51 producerEpoch i16
   17  crc u32               53 baseSequence i32
   21  attributes i16        57 recordsCount i32
   23  lastOffsetDelta i32   61 records...

batchLength counts the bytes after itself, so a batch occupies batchLength + 12 bytes. The
CRC-32C covers attributes through the end of the batch.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from crc32c import crc32c

from eos.errors import CorruptRecordError

HEADER_STRUCT = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER_STRUCT.size  # 61
if HEADER_SIZE != 61:  # the layout above is the contract; a typo in the format breaks it
    raise ImportError(f"v2 batch header must be 61 bytes, struct gives {HEADER_SIZE}")
LOG_OVERHEAD = 12             # baseOffset + batchLength: the bytes batchLength does not count
CRC_START = 21                # the CRC covers attributes .. end
MAGIC_V2 = 2

BASE_OFFSET_STRUCT = struct.Struct(">q")
BATCH_LENGTH_STRUCT = struct.Struct(">i")
PARTITION_LEADER_EPOCH_OFFSET = 12

# attributes
COMPRESSION_CODEC_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08    # 0 CreateTime, 1 LogAppendTime
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

# A batch whose declared length is beyond this is refused before anything is read; the
# broker's max.message.bytes check comes after, with its own error.
BATCH_LENGTH_LIMIT_BYTES = 1 << 30


class BatchHeader(NamedTuple):
    """One batch's header, plus where it sits in the buffer it was read from."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int
    position: int  # byte position of the batch in the buffer it was parsed from

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_CODEC_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def timestamp_type(self) -> int:
        return (self.attributes & TIMESTAMP_TYPE_MASK) >> 3

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping after 2**31 - 1 as Kafka's does."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


_OFFSET_AND_LENGTH = struct.Struct(">qi")
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_AT = 23


def offsets_spanned(buf, first_offset: int) -> int:
    """How many offsets the whole batches in `buf` take from `first_offset` to the end of
    the last one (what a fetch returned, control records and gaps included): a walk over
    the batch lengths, no header parsed. 0 for an empty or torn buffer."""
    position, end, last_batch = 0, len(buf), -1
    while position + HEADER_SIZE <= end:
        _, length = _OFFSET_AND_LENGTH.unpack_from(buf, position)
        if length < HEADER_SIZE - LOG_OVERHEAD or position + LOG_OVERHEAD + length > end:
            break
        last_batch = position
        position += LOG_OVERHEAD + length
    if last_batch < 0:
        return 0
    base_offset, _ = _OFFSET_AND_LENGTH.unpack_from(buf, last_batch)
    last_delta, = _LAST_OFFSET_DELTA.unpack_from(buf, last_batch + _LAST_OFFSET_DELTA_AT)
    return max(0, base_offset + last_delta + 1 - first_offset)


def parse_header(buf, position: int = 0) -> BatchHeader:
    """Read the header at `position`; raise CorruptRecordError when it cannot be a batch.

    Checks only what the header alone can tell: that 61 bytes are there, the magic, and
    that the declared length is sane and present in `buf`. The CRC is `verify_crc`'s job.
    """
    available = len(buf) - position
    if available < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch at byte {position}: {available} bytes, a header needs {HEADER_SIZE}")
    fields = HEADER_STRUCT.unpack_from(buf, position)
    batch_length = fields[1]
    magic = fields[3]
    if magic != MAGIC_V2:
        raise CorruptRecordError(f"unsupported magic {magic} at byte {position}: only v2 (2) is accepted")
    if batch_length < HEADER_SIZE - LOG_OVERHEAD or batch_length > BATCH_LENGTH_LIMIT_BYTES:
        raise CorruptRecordError(f"invalid batch length {batch_length} at byte {position}")
    if batch_length + LOG_OVERHEAD > available:
        raise CorruptRecordError(
            f"truncated batch at byte {position}: declares {batch_length + LOG_OVERHEAD} bytes, "
            f"{available} present")
    records_count = fields[12]
    last_offset_delta = fields[6]
    if records_count < 0 or last_offset_delta < 0:
        raise CorruptRecordError(
            f"invalid batch at byte {position}: recordsCount {records_count}, "
            f"lastOffsetDelta {last_offset_delta}")
    return BatchHeader(*fields, position)


def compute_crc(buf, position: int, size_bytes: int) -> int:
    """CRC-32C of one batch's covered range (attributes .. end)."""
    view = memoryview(buf)[position + CRC_START: position + size_bytes]
    return crc32c(view)


def verify_crc(buf, header: BatchHeader) -> None:
    actual = compute_crc(buf, header.position, header.size_bytes)
    if actual != header.crc:
        raise CorruptRecordError(
            f"CRC mismatch in batch at byte {header.position}: stored {header.crc:#010x}, "
            f"computed {actual:#010x}")


def iter_headers(buf, position: int = 0, end: int | None = None):
    """Yield the header of each whole batch in buf[position:end], back to back.

    Raises CorruptRecordError at the first thing that is not a whole batch; callers that
    recover a torn file catch it and cut the log at the last good position.
    """
    end = len(buf) if end is None else end
    view = memoryview(buf)[:end]
    while position < end:
        header = parse_header(view, position)
        yield header
        position += header.size_bytes


def write_base_offset(buf: bytearray, position: int, base_offset: int) -> None:
    """Stamp the offset the log assigns; the CRC does not cover these 8 bytes."""
    BASE_OFFSET_STRUCT.pack_into(buf, position, base_offset)
