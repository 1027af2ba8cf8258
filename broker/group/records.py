"""Records of the `__consumer_offsets` topic: committed offsets and group metadata.

Theory of operation
-------------------
The group coordinator's durable state is this compacted log, one key/value per change,
in Kafka's layout (big-endian; strings are i16 length + UTF-8, -1 for null; bytes are i32
length + raw, -1 for null; arrays are an i32 count then the items). The first i16 of every
key says which kind of record it is, so a reader can tell them apart before decoding:

    OffsetCommitKey    (1): version i16 = 1, group string, topic string, partition i32
    OffsetCommitValue  v3 : version i16 = 3, offset i64, leader_epoch i32, metadata string,
                            commit_timestamp i64
    GroupMetadataKey   (2): version i16 = 2, group string
    GroupMetadataValue v3 : version i16 = 3, protocol_type string, generation i32,
                            protocol string?, leader string?, current_state_timestamp i64,
                            members [member_id string, group_instance_id string?,
                                     client_id string, client_host string,
                                     rebalance_timeout i32, session_timeout i32,
                                     subscription bytes, assignment bytes]

We write OffsetCommitValue v3 and GroupMetadataValue v3 (the last non-flexible versions)
and read every older non-flexible version (values v0-v3), as Kafka does when it loads an
old log. A null value is a tombstone: the offset, or the whole group, is gone. Bad bytes
raise CorruptRecordError naming what is wrong; nothing here changes any state.

Which partition of `__consumer_offsets` holds a group is Kafka's
abs(group_id.hashCode) % 50: `partition_for_group` reuses the transaction log's
implementation of that hash.
"""
from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Iterable, Union

from eos.errors import CorruptRecordError
from eos.types import TopicPartition
from txn_coordinator.txn_log import partition_for

OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_PARTITIONS = 50          # offsets.topic.num.partitions

OFFSET_COMMIT_KEY_VERSION = 1          # keys 0 and 1 are both offset commits (0: Kafka 0.8)
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
NO_LEADER_EPOCH = -1

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I16_PAIR = struct.Struct(">hh")
# OffsetCommitValue v3: version, offset, leader epoch, then the metadata string and the timestamp
_OFFSET_VALUE_HEAD = struct.Struct(">hqi")
_OFFSET_VALUE_NO_METADATA = struct.Struct(">hqihq")     # ... with an empty metadata string


def partition_for_group(group_id: str, partitions: int = OFFSETS_TOPIC_PARTITIONS) -> int:
    """The `__consumer_offsets` partition that holds `group_id` (Kafka's rule)."""
    return partition_for(group_id, partitions)


# ---- record types --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OffsetCommitKey:
    group_id: str
    topic: str
    partition: int

    @functools.cached_property      # (a replay asks a decoded key for it once per record)
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclasses.dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset (the OffsetCommitValue). `offset` is the next record to read."""

    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp_ms: int = -1


@dataclasses.dataclass(frozen=True)
class GroupMetadataKey:
    group_id: str


@dataclasses.dataclass(frozen=True)
class MemberMetadata:
    """One member as the GroupMetadataValue stores it (subscription = the chosen protocol's metadata)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclasses.dataclass(frozen=True)
class GroupMetadataValue:
    protocol_type: str
    generation_id: int
    protocol: str | None
    leader: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberMetadata, ...] = ()


RecordKey = Union[OffsetCommitKey, GroupMetadataKey]
RecordValue = Union[OffsetAndMetadata, GroupMetadataValue, None]


# ---- encoding ------------------------------------------------------------------------------

def _string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0x7FFF:
        raise ValueError(f"string of {len(raw)} bytes is longer than a Kafka string (32767)")
    return _I16.pack(len(raw)) + raw


def _nullable_string(text: str | None) -> bytes:
    return _I16.pack(-1) if text is None else _string(text)


def _bytes(raw: bytes) -> bytes:
    return _I32.pack(len(raw)) + bytes(raw)


def encode_key(key: RecordKey) -> bytes:
    if isinstance(key, OffsetCommitKey):
        return (_I16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(key.group_id) + _string(key.topic)
                + _I32.pack(key.partition))
    if isinstance(key, GroupMetadataKey):
        return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group_id)
    raise TypeError(f"not a __consumer_offsets key: {key!r}")


def encode_value(value: RecordValue) -> bytes | None:
    """Value bytes in the current version; None (a tombstone) stays None."""
    if value is None:
        return None
    if isinstance(value, OffsetAndMetadata):
        return _offset_value(value)
    if isinstance(value, GroupMetadataValue):
        parts = [_I16.pack(GROUP_METADATA_VALUE_VERSION), _string(value.protocol_type),
                 _I32.pack(value.generation_id), _nullable_string(value.protocol),
                 _nullable_string(value.leader), _I64.pack(value.current_state_timestamp_ms),
                 _I32.pack(len(value.members))]
        for m in value.members:
            parts += [_string(m.member_id), _nullable_string(m.group_instance_id), _string(m.client_id),
                      _string(m.client_host), _I32.pack(m.rebalance_timeout_ms), _I32.pack(m.session_timeout_ms),
                      _bytes(m.subscription), _bytes(m.assignment)]
        return b"".join(parts)
    raise TypeError(f"not a __consumer_offsets value: {value!r}")


def _offset_value(value: OffsetAndMetadata) -> bytes:
    if not value.metadata:       # the usual case: one pack, no string to encode
        return _OFFSET_VALUE_NO_METADATA.pack(OFFSET_COMMIT_VALUE_VERSION, value.offset, value.leader_epoch, 0,
                                              value.commit_timestamp_ms)
    return (_OFFSET_VALUE_HEAD.pack(OFFSET_COMMIT_VALUE_VERSION, value.offset, value.leader_epoch)
            + _string(value.metadata) + _I64.pack(value.commit_timestamp_ms))


def offset_commit_record(group_id: str, tp: TopicPartition, value: OffsetAndMetadata | None) -> tuple[bytes, bytes | None]:
    """(key, value) bytes of one offset commit (value None: a tombstone deleting it)."""
    return encode_key(OffsetCommitKey(group_id, tp.topic, tp.partition)), encode_value(value)


def offset_commit_records(group_id: str, entries: Iterable[tuple[TopicPartition, OffsetAndMetadata | None]]
                          ) -> tuple[list[bytes], list[bytes | None]]:
    """(keys, values) of many offset commits of one group, the same bytes as
    `offset_commit_record` gives one by one: the group's and each topic's part of the key is
    encoded once, not once per partition (a commit of 500 partitions names one group and a
    few topics; encoding them 500 times was most of the broker's work on such a commit)."""
    group_head = _I16.pack(OFFSET_COMMIT_KEY_VERSION) + _string(group_id)
    key_heads: dict[str, bytes] = {}
    keys: list[bytes] = []
    values: list[bytes | None] = []
    for tp, value in entries:
        key_head = key_heads.get(tp.topic)
        if key_head is None:
            key_head = key_heads[tp.topic] = group_head + _string(tp.topic)
        keys.append(key_head + _I32.pack(tp.partition))
        values.append(None if value is None else _offset_value(value))
    return keys, values


def group_metadata_record(group_id: str, value: GroupMetadataValue | None) -> tuple[bytes, bytes | None]:
    """(key, value) bytes of a group's metadata (value None: a tombstone deleting the group)."""
    return encode_key(GroupMetadataKey(group_id)), encode_value(value)


# ---- decoding ------------------------------------------------------------------------------

class _Reader:
    """Reads Kafka's primitive types, checking every length against the buffer."""

    def __init__(self, buf: bytes, what: str):
        self.buf, self.pos, self.what = bytes(buf), 0, what

    def _fail(self, problem: str) -> CorruptRecordError:
        return CorruptRecordError(f"{self.what}: {problem} at byte {self.pos} of {len(self.buf)}")

    def take(self, s: struct.Struct) -> int:
        if self.pos + s.size > len(self.buf):
            raise self._fail(f"truncated ({s.size} more bytes needed)")
        (value,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return value

    def i16(self) -> int:
        return self.take(_I16)

    def i32(self) -> int:
        return self.take(_I32)

    def i64(self) -> int:
        return self.take(_I64)

    def _raw(self, length: int) -> bytes:
        if self.pos + length > len(self.buf):
            raise self._fail(f"length {length} runs past the end")
        raw = self.buf[self.pos:self.pos + length]
        self.pos += length
        return raw

    def nullable_string(self) -> str | None:
        length = self.i16()
        if length == -1:
            return None
        if length < 0:
            raise self._fail(f"string length {length} is negative")
        try:
            return self._raw(length).decode()
        except UnicodeDecodeError:
            raise self._fail("string is not UTF-8") from None

    def string(self) -> str:
        text = self.nullable_string()
        if text is None:
            raise self._fail("null where a string is required")
        return text

    def nullable_bytes(self) -> bytes | None:
        length = self.i32()
        if length == -1:
            return None
        if length < 0:
            raise self._fail(f"bytes length {length} is negative")
        return self._raw(length)

    def bytes_(self) -> bytes:
        raw = self.nullable_bytes()
        if raw is None:
            raise self._fail("null where bytes are required")
        return raw

    def count(self, min_item_bytes: int) -> int:
        n = self.i32()
        # Each item takes at least min_item_bytes, so a count the buffer cannot hold is corrupt
        # (and must not make us allocate or loop for billions of items).
        if n < 0 or n * min_item_bytes > len(self.buf) - self.pos:
            raise self._fail(f"array count {n} does not fit in the record")
        return n

    def done(self) -> None:
        if self.pos != len(self.buf):
            raise self._fail(f"{len(self.buf) - self.pos} unexpected trailing bytes")


def _offset_key_fast(key) -> OffsetCommitKey | None:
    """The usual key, an offset commit's, read with three unpacks instead of the reader's
    dozen calls (a broker's start replays every offset commit in the log); None for anything
    else -- another version, a length that does not add up -- which `decode_key`'s reader then
    reads or refuses with its precise message."""
    try:
        version, group_length = _I16_PAIR.unpack_from(key, 0)
        if version not in (0, OFFSET_COMMIT_KEY_VERSION) or group_length < 0:
            return None
        topic_at = 4 + group_length
        (topic_length,) = _I16.unpack_from(key, topic_at)
        partition_at = topic_at + 2 + topic_length
        if topic_length < 0 or partition_at + 4 != len(key):
            return None
        (partition,) = _I32.unpack_from(key, partition_at)
        return OffsetCommitKey(str(key[4:topic_at], "utf-8"), str(key[topic_at + 2:partition_at], "utf-8"), partition)
    except (struct.error, UnicodeDecodeError):
        return None


def decode_key(key: bytes) -> RecordKey:
    if key is None:
        raise CorruptRecordError("__consumer_offsets record without a key")
    fast = _offset_key_fast(key)
    if fast is not None:
        return fast
    reader = _Reader(key, "__consumer_offsets key")
    version = reader.i16()
    if version in (0, OFFSET_COMMIT_KEY_VERSION):
        decoded: RecordKey = OffsetCommitKey(reader.string(), reader.string(), reader.i32())
    elif version == GROUP_METADATA_KEY_VERSION:
        decoded = GroupMetadataKey(reader.string())
    else:
        raise CorruptRecordError(f"__consumer_offsets key version {version} is not 0, 1 or 2")
    reader.done()
    return decoded


def decode_offset_value(value: bytes | None) -> OffsetAndMetadata | None:
    if value is None:
        return None
    if len(value) == _OFFSET_VALUE_NO_METADATA.size:
        # the usual value (v3, empty metadata) in one unpack; anything else takes the reader
        version, offset, leader_epoch, metadata_length, commit_timestamp_ms = _OFFSET_VALUE_NO_METADATA.unpack(value)
        if version == OFFSET_COMMIT_VALUE_VERSION and metadata_length == 0:
            return OffsetAndMetadata(offset, leader_epoch, "", commit_timestamp_ms)
    reader = _Reader(value, "offset commit value")
    version = reader.i16()
    if not 0 <= version <= OFFSET_COMMIT_VALUE_VERSION:
        raise CorruptRecordError(f"offset commit value version {version} is not 0..{OFFSET_COMMIT_VALUE_VERSION}")
    offset = reader.i64()
    leader_epoch = reader.i32() if version >= 3 else NO_LEADER_EPOCH
    metadata = reader.string()
    commit_timestamp_ms = reader.i64()
    if version == 1:
        reader.i64()  # expire_timestamp: only v1 has it; retention is the broker's setting now
    reader.done()
    return OffsetAndMetadata(offset, leader_epoch, metadata, commit_timestamp_ms)


def decode_group_value(value: bytes | None) -> GroupMetadataValue | None:
    if value is None:
        return None
    reader = _Reader(value, "group metadata value")
    version = reader.i16()
    if not 0 <= version <= GROUP_METADATA_VALUE_VERSION:
        raise CorruptRecordError(f"group metadata value version {version} is not 0..{GROUP_METADATA_VALUE_VERSION}")
    protocol_type = reader.string()
    generation_id = reader.i32()
    protocol = reader.nullable_string()
    leader = reader.nullable_string()
    current_state_timestamp_ms = reader.i64() if version >= 2 else -1
    members = []
    # The smallest member (v0): three empty strings, one timeout, two empty byte arrays.
    for _ in range(reader.count(min_item_bytes=3 * 2 + 4 + 2 * 4)):
        member_id = reader.string()
        group_instance_id = reader.nullable_string() if version >= 3 else None
        client_id = reader.string()
        client_host = reader.string()
        rebalance_timeout_ms = reader.i32() if version >= 1 else -1
        session_timeout_ms = reader.i32()
        if version == 0:
            rebalance_timeout_ms = session_timeout_ms  # v0 had one timeout for both
        members.append(MemberMetadata(member_id, group_instance_id, client_id, client_host, rebalance_timeout_ms,
                                      session_timeout_ms, reader.bytes_(), reader.bytes_()))
    reader.done()
    return GroupMetadataValue(protocol_type, generation_id, protocol, leader, current_state_timestamp_ms,
                              tuple(members))


def decode_record(key: bytes, value: bytes | None,
                  decoded_keys: dict[bytes, RecordKey] | None = None) -> tuple[RecordKey, RecordValue]:
    """Decode one `__consumer_offsets` record: (OffsetCommitKey, OffsetAndMetadata | None) or
    (GroupMetadataKey, GroupMetadataValue | None). `decoded_keys`, when given, remembers each
    key decoded: a replay meets the same key once per commit of its partition."""
    decoded_key = None if decoded_keys is None or key is None else decoded_keys.get(key)
    if decoded_key is None:
        decoded_key = decode_key(key)
        if decoded_keys is not None:
            decoded_keys[key] = decoded_key
    if isinstance(decoded_key, OffsetCommitKey):
        return decoded_key, decode_offset_value(value)
    return decoded_key, decode_group_value(value)
