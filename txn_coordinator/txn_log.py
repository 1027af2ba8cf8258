"""Records of the `__transaction_state` topic: one key/value per change of a transactional.id.

Theory of operation
-------------------
The coordinator's durable state is this log: replaying it from the start rebuilds every
`TxnMetadata` (the last record of an id wins; a null value is a tombstone). The layout
follows Kafka's TransactionLogKey/TransactionLogValue v0 field order, big-endian:

    key:   version i16 (0), transactional_id string (i16 length + UTF-8)
    value: version i16 (2), producer_id i64, producer_epoch i16, timeout_ms i32, state i8,
           partitions, last_update_ms i64, start_time_ms i64, last_producer_id i64,
           last_producer_epoch i16,
           participants: count i32, then each: producer_id i64, producer_epoch i16,
                         accepted i8 (0/1), partitions
    partitions: [topic string, [partition i32]] with i32 counts

Value version 1 is eos's own: Kafka's v0 fields, then the previous producer id and epoch
that KIP-890 keeps in tagged fields. Version 2 appends the participants of the open or
deciding transaction (eos's extension for writers on many machines). Version 2 is always
written; version 1 records (from before participants) are still read, with no
participants. Decoding checks every length against the buffer and raises
CorruptRecordError naming what is wrong.
"""
from __future__ import annotations

import functools
import struct
from collections import defaultdict

from eos.errors import CorruptRecordError
from eos.types import TopicPartition
from txn_coordinator.state import Participant, TxnMetadata, TxnState

KEY_VERSION = 0
VALUE_VERSION = 2
READABLE_VALUE_VERSIONS = (1, 2)
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqhib")       # version, producer_id, epoch, timeout_ms, state
_VALUE_TAIL = struct.Struct(">qqqh")        # last_update_ms, start_time_ms, last pid, last epoch
_PARTICIPANT_HEAD = struct.Struct(">qhb")   # producer_id, producer_epoch, accepted


def _string(text: str) -> bytes:
    raw = text.encode()
    return _I16.pack(len(raw)) + raw


class _Reader:
    def __init__(self, buf: bytes, what: str):
        self.buf, self.pos, self.what = buf, 0, what

    def take(self, s: struct.Struct) -> tuple:
        if self.pos + s.size > len(self.buf):
            raise CorruptRecordError(f"{self.what} truncated at byte {self.pos}")
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values

    def string(self) -> str:
        (length,) = self.take(_I16)
        if length < 0 or self.pos + length > len(self.buf):
            raise CorruptRecordError(f"{self.what}: string length {length} at byte {self.pos} is invalid")
        raw = self.buf[self.pos:self.pos + length]
        self.pos += length
        return bytes(raw).decode()

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise CorruptRecordError(f"{self.what}: {len(self.buf) - self.pos} unexpected trailing bytes")


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(transactional_id)


def decode_key(key: bytes) -> str:
    reader = _Reader(key, "transaction log key")
    (version,) = reader.take(_I16)
    if version != KEY_VERSION:
        raise CorruptRecordError(f"transaction log key version {version} is not {KEY_VERSION}")
    transactional_id = reader.string()
    reader.done()
    return transactional_id


def _encode_partitions(partitions, parts: list[bytes]) -> None:
    by_topic: dict[str, list[int]] = defaultdict(list)
    for tp in partitions:
        by_topic[tp.topic].append(tp.partition)
    parts.append(_I32.pack(len(by_topic)))
    for topic in sorted(by_topic):
        numbers = sorted(by_topic[topic])
        parts.append(_string(topic))
        parts.append(struct.pack(f">i{len(numbers)}i", len(numbers), *numbers))


def _decode_partitions(reader: _Reader, limit: int) -> frozenset[TopicPartition]:
    (topic_count,) = reader.take(_I32)
    if topic_count < 0 or topic_count > limit:
        raise CorruptRecordError(f"{reader.what}: topic count {topic_count} is invalid")
    partitions = set()
    for _ in range(topic_count):
        topic = reader.string()
        (count,) = reader.take(_I32)
        if count < 0 or count > limit:
            raise CorruptRecordError(f"{reader.what}: partition count {count} is invalid")
        for partition in reader.take(struct.Struct(f">{count}i")):
            partitions.add(TopicPartition(topic, partition))
    return frozenset(partitions)


def encode_value(md: TxnMetadata) -> bytes:
    parts = [_VALUE_HEAD.pack(VALUE_VERSION, md.producer_id, md.producer_epoch, md.timeout_ms, md.state.log_id)]
    _encode_partitions(md.partitions, parts)
    parts.append(_VALUE_TAIL.pack(md.last_update_ms, md.start_time_ms, md.last_producer_id, md.last_producer_epoch))
    parts.append(_I32.pack(len(md.participants)))
    for p in md.participants:
        parts.append(_PARTICIPANT_HEAD.pack(p.producer_id, p.producer_epoch, 1 if p.accepted else 0))
        _encode_partitions(p.partitions, parts)
    return b"".join(parts)


def decode_value(transactional_id: str, value: bytes | None) -> TxnMetadata | None:
    if value is None:
        return None
    reader = _Reader(value, f"transaction log value of {transactional_id!r}")
    version, producer_id, epoch, timeout_ms, state_id = reader.take(_VALUE_HEAD)
    if version not in READABLE_VALUE_VERSIONS:
        raise CorruptRecordError(f"transaction log value version {version} is not one of "
                                 f"{', '.join(map(str, READABLE_VALUE_VERSIONS))}")
    try:
        state = TxnState.from_log_id(state_id)
    except ValueError as e:
        raise CorruptRecordError(str(e)) from None
    partitions = _decode_partitions(reader, len(value))
    last_update_ms, start_time_ms, last_pid, last_epoch = reader.take(_VALUE_TAIL)
    participants: list[Participant] = []
    if version >= 2:
        (count,) = reader.take(_I32)
        # each participant takes at least 15 bytes: a count past that cannot be real
        if count < 0 or count > len(value) // _PARTICIPANT_HEAD.size:
            raise CorruptRecordError(f"{reader.what}: participant count {count} is invalid")
        for _ in range(count):
            pid, p_epoch, accepted = reader.take(_PARTICIPANT_HEAD)
            if accepted not in (0, 1):
                raise CorruptRecordError(f"{reader.what}: participant {pid} accepted flag {accepted} is not 0 or 1")
            participants.append(Participant(pid, p_epoch, _decode_partitions(reader, len(value)), accepted == 1))
    reader.done()
    return TxnMetadata(transactional_id, producer_id, epoch, last_pid, last_epoch, timeout_ms, state,
                       partitions, start_time_ms, last_update_ms, tuple(participants))


def partition_for(key: str, partition_count: int = 50) -> int:
    """Kafka's choice of partition for a transactional.id (or group id): Utils.abs(key.hashCode())
    % partition_count, where Utils.abs maps Integer.MIN_VALUE to 0."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partition_count


@functools.lru_cache(maxsize=16384)
def java_string_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as a signed 32-bit int. Cached: the
    coordinators ask it for the same few ids on every request (a loop over the characters
    in Python costs microseconds), and the cache is bounded."""
    raw = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(raw), 2):
        h = (31 * h + (raw[i] << 8 | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h
