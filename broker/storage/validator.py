"""Kafka's LogValidator: what an append checks and stamps before it takes the log's lock.

Theory of operation
-------------------
`broker.storage.log.Log` appends in three stages (prepare, write, apply; see its module
doc). This module is the pure part of prepare, and the stamping that follows it:

- `prepare_batches` checks that a request is one or more whole, valid v2 batches for the
  partition and its topic's config, and summarises them (`PreparedBatches`): sizes against
  max.message.bytes and segment.bytes, record counts against lastOffsetDelta, every CRC,
  a control batch only from a coordinator and only as a transaction marker, a key on every
  record of a compacted topic, every record of a client's batch whole (its length prefix;
  the compressed ones decompressed to see it), one batch per request for an idempotent or transactional
  producer, no v0/v1 message set from a client. A follower's append (`AppendOrigin.
  REPLICATION`) copies what its leader checked, so it is held only to the batches' own
  integrity. Any failure raises before anything is copied or written.
- `copy_and_stamp` copies the request and writes what does not depend on the log's state:
  the leader epoch, and under LogAppendTime the timestamp type and max timestamp (with new
  CRCs). It needs no lock: the per-byte work stays outside it.
- `assign_offsets` runs under the lock, once the log end is known: base offsets, which the
  CRC does not cover.

Nothing here reads or writes files or the log's state: the checks depend only on the
request, the topic's config and who is appending.
"""
from __future__ import annotations

import enum
import struct
from typing import NamedTuple, Sequence

from eos.config import TopicConfig
from eos.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidRequestError,
    MessageTooLargeError,
    RecordListTooLargeError,
)
from eos.records.codec import CONTROL_TYPE_COMMIT, decode_control_record
from eos.records.header import (
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    compute_crc,
    iter_headers,
    verify_crc,
    write_base_offset,
)
from eos.records.legacy import refuse_legacy_produce
from eos.records.raw import check_record_framing, first_keyless_record

_LEADER_EPOCH_STRUCT = struct.Struct(">i")   # partitionLeaderEpoch at byte 12, outside the CRC
_CRC_STRUCT = struct.Struct(">I")            # crc at byte 17
_ATTRIBUTES_STRUCT = struct.Struct(">h")     # attributes at byte 21
_TIMESTAMP_STRUCT = struct.Struct(">q")      # maxTimestamp at byte 35


class AppendOrigin(enum.Enum):
    """Who is appending. Clients may not write control batches and their idempotent batches
    follow every sequence rule. A coordinator may write transaction markers, and its
    transactional batches (the group coordinator's TxnOffsetCommit, base sequence -1) skip
    the sequence rules but keep the epoch rule and open the producer's transaction."""

    CLIENT = "client"
    COORDINATOR = "coordinator"
    # A follower copying its leader: batches as the leader wrote them, several producers'
    # batches and markers in one append, no sequence rules (the leader applied them).
    REPLICATION = "replication"


class PreparedBatches(NamedTuple):
    """The outcome of the pure part of prepare: the request is whole, valid batches."""

    headers: list[BatchHeader]
    size_bytes: int
    record_count: int
    max_timestamp_ms: int
    producer_header: BatchHeader | None
    marker: tuple[bool, int] | None = None   # a transaction marker: (committed, coordinator epoch)


def prepare_batches(records, origin: AppendOrigin, config: TopicConfig, name: str, topic: str,
                    parsed: Sequence[BatchHeader] | None = None, *, built_here: bool = False) -> PreparedBatches:
    """Check that `records` is one or more whole, valid v2 batches for the partition
    `name` of `topic` under `config` (with `parsed`: that those headers tile it). Pure.
    `built_here`: the bytes are this broker's recompression of batches that passed these
    checks a moment ago (`Log.append_as_leader`): their CRCs were just computed and their
    records walked, so only the limits, which apply to the stored bytes, are checked again
    (verifying a fresh CRC, and decompressing the section to walk its records once more,
    cost about what the recompression itself did)."""
    try:
        view = memoryview(records)
    except TypeError:
        raise InvalidRecordError(f"records must be bytes-like, got {type(records).__name__}") from None
    if view.nbytes == 0:
        raise InvalidRecordError(f"{name}: the request holds no record batches")
    if origin is not AppendOrigin.REPLICATION:
        refuse_legacy_produce(view, name)   # v0/v1 message sets: INVALID_RECORD, as Kafka 4
    if parsed is not None:
        _check_tiling(parsed, view.nbytes, name)
    max_message_bytes = config.max_message_bytes
    headers: list[BatchHeader] = []
    size_bytes = 0
    record_count = 0
    max_timestamp_ms = -1
    producer_header = None
    marker = None
    replicating = origin is AppendOrigin.REPLICATION
    for header in iter_headers(view) if parsed is None else parsed:
        batch_bytes = header.size_bytes
        if batch_bytes > max_message_bytes:
            raise MessageTooLargeError(f"{_where(name, len(headers), header)} is {batch_bytes} bytes, "
                                       f"larger than max.message.bytes {max_message_bytes}")
        if batch_bytes > config.segment_bytes and not replicating:
            raise RecordListTooLargeError(f"{_where(name, len(headers), header)} is {batch_bytes} bytes, "
                                          f"larger than segment.bytes {config.segment_bytes}")
        if header.records_count != header.last_offset_delta + 1 and not replicating:
            # (a follower copies what its leader's cleaner left: fewer records, same offsets)
            raise InvalidRecordError(
                f"{_where(name, len(headers), header)}: recordsCount {header.records_count} does not match "
                f"lastOffsetDelta {header.last_offset_delta} (expected {header.last_offset_delta + 1} records)")
        if not built_here:
            verify_crc(view, header)
        if header.is_control:
            marker = _check_marker_batch(view, header, origin, _where(name, len(headers), header))
        elif built_here:
            pass               # its records were walked before it was rebuilt
        elif config.compact and not replicating:
            _check_keys(view, header, _where(name, len(headers), header), topic, config.cleanup_policy)
        elif origin is AppendOrigin.CLIENT:
            # (the key check above walks the records too; a follower's and a coordinator's
            # batches were checked, or written, by a broker)
            _check_framing(view, header, _where(name, len(headers), header))
        if header.producer_id != NO_PRODUCER_ID:
            if not header.is_control:
                producer_header = header
        elif header.is_transactional:
            raise InvalidRecordError(f"{_where(name, len(headers), header)} is transactional but has no producer id")
        headers.append(header)
        size_bytes += batch_bytes
        record_count += header.records_count
        if header.max_timestamp > max_timestamp_ms:
            max_timestamp_ms = header.max_timestamp
    if origin is AppendOrigin.REPLICATION:
        return PreparedBatches(headers, size_bytes, record_count, max_timestamp_ms, producer_header, marker)
    if producer_header is not None and len(headers) > 1:
        raise InvalidRecordError(
            f"{name}: {len(headers)} batches in one request, but an idempotent or transactional "
            f"producer may send only one batch per partition per request")
    if marker is not None and len(headers) > 1:
        raise InvalidRecordError(
            f"{name}: {len(headers)} batches in one request with a transaction marker; a marker "
            f"is appended alone")
    return PreparedBatches(headers, size_bytes, record_count, max_timestamp_ms, producer_header, marker)


def _where(name: str, index: int, header: BatchHeader) -> str:
    """A batch's place, for error messages (formatted only when needed: every append runs
    the checks)."""
    return f"{name}: batch {index} (byte {header.position})"


def _check_keys(view, header: BatchHeader, where: str, topic: str, cleanup_policy: str) -> None:
    """A compacted topic keeps the last record of each key, so every record needs one
    (Kafka's LogValidator refuses the batch as INVALID_RECORD)."""
    try:
        keyless = first_keyless_record(view, header)
    except CorruptRecordError as e:
        raise InvalidRecordError(f"{where}: {e}") from None
    if keyless is not None:
        raise InvalidRecordError(
            f"{where}: record at offset delta {keyless - header.base_offset} has no key; "
            f"{topic} is a compacted topic (cleanup.policy={cleanup_policy}) and every "
            f"record in it needs a key")


def _check_framing(view, header: BatchHeader, where: str) -> None:
    """Every record of a client's batch is whole (eos.records.raw.check_record_framing): a
    batch whose body cannot be read is refused here, CORRUPT_MESSAGE, rather than stored
    where it would stop every consumer of the partition."""
    try:
        check_record_framing(view, header)
    except CorruptRecordError as e:
        raise CorruptRecordError(f"{where}: {e}") from None


def _check_tiling(parsed: Sequence[BatchHeader], size_bytes: int, name: str) -> None:
    """Headers handed in by the caller describe `size_bytes` of batches back to back
    from byte 0 (the CRC check then ties each to its bytes)."""
    position = 0
    for index, header in enumerate(parsed):
        if not isinstance(header, BatchHeader) or header.position != position:
            raise InvalidRequestError(
                f"{name}: parsed header {index} does not describe the batch at byte {position} of "
                f"the request: {header!r}")
        position += header.size_bytes
    if position != size_bytes or not parsed:
        raise InvalidRequestError(f"{name}: the parsed headers cover {position} bytes of a "
                                  f"{size_bytes}-byte request")


def _check_marker_batch(view, header: BatchHeader, origin: AppendOrigin, where: str) -> tuple[bool, int]:
    """A control batch is accepted only from a coordinator, only as a transaction
    marker of a producer: returns (committed, coordinator epoch)."""
    if origin is AppendOrigin.CLIENT:
        raise InvalidRecordError(f"{where} is a control batch; clients may not write control batches")
    if header.producer_id == NO_PRODUCER_ID or header.producer_epoch < 0 or not header.is_transactional:
        raise InvalidRecordError(
            f"{where} is a control batch but not a transaction marker of a producer (producer id "
            f"{header.producer_id}, epoch {header.producer_epoch}, transactional {header.is_transactional})")
    try:
        marker_type, coordinator_epoch = decode_control_record(view, header)
    except CorruptRecordError as e:
        raise InvalidRecordError(f"{where}: {e}") from None
    if coordinator_epoch < 0:
        raise InvalidRecordError(f"{where}: a marker's coordinator epoch is {coordinator_epoch}")
    return marker_type == CONTROL_TYPE_COMMIT, coordinator_epoch


def copy_and_stamp(records, headers: list[BatchHeader], leader_epoch: int,
                    log_append_time_ms: int | None) -> tuple[bytearray, list[int] | None, int]:
    """Copy the request and write what the log assigns that does not depend on its state:
    the leader epoch and, under LogAppendTime, the timestamp type and max timestamp (whose
    CRC is recomputed). Returns (the copy, the new CRCs under LogAppendTime else None, the
    max timestamp); no lock needed. `assign_offsets` brings the headers up to date."""
    buf = bytearray(records)
    max_timestamp_ms = -1
    if log_append_time_ms is None:
        for header in headers:
            _LEADER_EPOCH_STRUCT.pack_into(buf, header.position + 12, leader_epoch)
            if header.max_timestamp > max_timestamp_ms:
                max_timestamp_ms = header.max_timestamp
        return buf, None, max_timestamp_ms
    crcs = []
    for header in headers:
        position = header.position
        _LEADER_EPOCH_STRUCT.pack_into(buf, position + 12, leader_epoch)
        _ATTRIBUTES_STRUCT.pack_into(buf, position + 21, header.attributes | TIMESTAMP_TYPE_MASK)
        _TIMESTAMP_STRUCT.pack_into(buf, position + 35, log_append_time_ms)
        crc = compute_crc(buf, position, header.size_bytes)
        _CRC_STRUCT.pack_into(buf, position + 17, crc)
        crcs.append(crc)
    return buf, crcs, log_append_time_ms


def assign_offsets(buf: bytearray, headers: list[BatchHeader], first_offset: int, leader_epoch: int,
                    log_append_time_ms: int | None, crcs: list[int] | None) -> list[BatchHeader]:
    """Stamp base offsets contiguous from `first_offset` (under the log's lock: they depend
    on the log end; the CRC does not cover them). Returns the headers of `buf` as
    `copy_and_stamp` left it, with these offsets."""
    assigned: list[BatchHeader] = []
    next_offset = first_offset
    for index, header in enumerate(headers):
        write_base_offset(buf, header.position, next_offset)
        # BatchHeader's fields in order (namedtuple._replace costs several microseconds on
        # the produce path; building the tuple directly does not)
        (_, batch_length, _, magic, crc, attributes, last_offset_delta, base_timestamp, max_timestamp,
         producer_id, producer_epoch, base_sequence, records_count, position) = header
        if crcs is not None:
            attributes |= TIMESTAMP_TYPE_MASK
            max_timestamp = log_append_time_ms
            crc = crcs[index]
        assigned.append(_new_header(BatchHeader, (
            next_offset, batch_length, leader_epoch, magic, crc, attributes, last_offset_delta, base_timestamp,
            max_timestamp, producer_id, producer_epoch, base_sequence, records_count, position)))
        next_offset += last_offset_delta + 1
    return assigned


_new_header = tuple.__new__   # BatchHeader from its fields, with no per-field call


__all__ = ["AppendOrigin", "PreparedBatches", "assign_offsets", "copy_and_stamp", "prepare_batches"]
