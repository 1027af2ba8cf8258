"""The __consumer_offsets record codec (broker.group.records): Kafka's layouts, round trips,
corrupt bytes refused with CorruptRecordError."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.group import records as R
from eos.errors import CorruptRecordError
from eos.types import TopicPartition
from txn_coordinator.txn_log import partition_for


def s16(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def test_offset_commit_key_and_value_match_kafkas_layout_byte_for_byte():
    key, value = R.offset_commit_record("g", TopicPartition("orders", 7),
                                        R.OffsetAndMetadata(42, 3, "meta", 1_700_000_000_000))
    assert key == struct.pack(">h", 1) + s16("g") + s16("orders") + struct.pack(">i", 7)
    assert value == (struct.pack(">hqi", 3, 42, 3) + s16("meta") + struct.pack(">q", 1_700_000_000_000))
    assert R.decode_record(key, value) == (R.OffsetCommitKey("g", "orders", 7),
                                           R.OffsetAndMetadata(42, 3, "meta", 1_700_000_000_000))


def test_many_offset_commits_encode_as_each_would_alone():
    entries = [(TopicPartition("orders", 7), R.OffsetAndMetadata(42, 3, "meta", 1_700_000_000_000)),
               (TopicPartition("orders", 8), R.OffsetAndMetadata(43)),
               (TopicPartition("payments", 0), R.OffsetAndMetadata(5, -1, "", 9)),
               (TopicPartition("orders", 9), None)]
    keys, values = R.offset_commit_records("g", entries)
    assert list(zip(keys, values)) == [R.offset_commit_record("g", tp, value) for tp, value in entries]
    # the empty metadata string is Kafka's i16 length 0, not a missing field
    assert values[2] == struct.pack(">hqi", 3, 5, -1) + s16("") + struct.pack(">q", 9)
    assert values[3] is None
    with pytest.raises(ValueError, match="longer than a Kafka string"):
        R.offset_commit_records("g" * 40_000, entries)


def test_group_metadata_value_matches_kafkas_v3_layout():
    member = R.MemberMetadata("m-1", None, "client", "/127.0.0.1", 300_000, 45_000, b"sub", b"asg")
    value = R.GroupMetadataValue("consumer", 5, "range", "m-1", 123, (member,))
    key, raw = R.group_metadata_record("g", value)
    assert key == struct.pack(">h", 2) + s16("g")
    expected = (struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 5) + s16("range") + s16("m-1")
                + struct.pack(">q", 123) + struct.pack(">i", 1)
                + s16("m-1") + struct.pack(">h", -1) + s16("client") + s16("/127.0.0.1")
                + struct.pack(">ii", 300_000, 45_000) + struct.pack(">i", 3) + b"sub" + struct.pack(">i", 3) + b"asg")
    assert raw == expected
    assert R.decode_record(key, raw) == (R.GroupMetadataKey("g"), value)


def test_empty_group_has_null_protocol_and_leader():
    value = R.GroupMetadataValue("consumer", 6, None, None, 9, ())
    raw = R.encode_value(value)
    assert raw == struct.pack(">h", 3) + s16("consumer") + struct.pack(">ihhqi", 6, -1, -1, 9, 0)
    assert R.decode_group_value(raw) == value


def test_tombstones_decode_to_none():
    key, value = R.offset_commit_record("g", TopicPartition("t", 0), None)
    assert value is None and R.decode_record(key, None) == (R.OffsetCommitKey("g", "t", 0), None)
    key, value = R.group_metadata_record("g", None)
    assert value is None and R.decode_record(key, None) == (R.GroupMetadataKey("g"), None)


def test_older_value_versions_are_read():
    v0 = struct.pack(">hq", 0, 10) + s16("m") + struct.pack(">q", 5)
    v1 = struct.pack(">hq", 1, 11) + s16("") + struct.pack(">qq", 6, 99)   # with expire_timestamp
    assert R.decode_offset_value(v0) == R.OffsetAndMetadata(10, -1, "m", 5)
    assert R.decode_offset_value(v1) == R.OffsetAndMetadata(11, -1, "", 6)
    group_v0 = (struct.pack(">h", 0) + s16("consumer") + struct.pack(">i", 1) + s16("range") + s16("a")
                + struct.pack(">i", 1) + s16("a") + s16("c") + s16("h") + struct.pack(">i", 10_000)
                + struct.pack(">i", 0) + struct.pack(">i", 0))
    decoded = R.decode_group_value(group_v0)
    assert decoded.current_state_timestamp_ms == -1
    assert decoded.members[0] == R.MemberMetadata("a", None, "c", "h", 10_000, 10_000, b"", b"")
    assert R.decode_key(struct.pack(">h", 0) + s16("g") + s16("t") + struct.pack(">i", 1)) == R.OffsetCommitKey("g", "t", 1)


def test_partition_for_group_is_the_transaction_logs_hash():
    assert R.partition_for_group("my-group") == partition_for("my-group", 50)
    assert 0 <= R.partition_for_group("x", 7) < 7


GOOD_KEY = R.encode_key(R.OffsetCommitKey("g", "t", 0))
GOOD_VALUE = R.encode_value(R.OffsetAndMetadata(1, 0, "m", 2))
GOOD_GROUP = R.encode_value(R.GroupMetadataValue("consumer", 1, "range", "a", 0, (
    R.MemberMetadata("a", "i", "c", "h", 1, 2, b"s", b"a"),)))


@pytest.mark.parametrize("key, problem", [
    (b"", "truncated"),
    (b"\x00", "truncated"),
    (struct.pack(">h", 9) + s16("g"), "key version 9"),
    (struct.pack(">h", 1) + s16("g") + s16("t"), "truncated"),
    (struct.pack(">h", 2) + struct.pack(">h", 50) + b"g", "runs past the end"),
    (struct.pack(">h", 2) + struct.pack(">h", -7), "negative"),
    (struct.pack(">h", 2) + struct.pack(">h", -1), "null where a string"),
    (struct.pack(">h", 2) + struct.pack(">h", 2) + b"\xff\xfe", "not UTF-8"),
    (GOOD_KEY + b"\x00", "trailing"),
])
def test_corrupt_keys_are_refused(key, problem):
    with pytest.raises(CorruptRecordError, match=problem):
        R.decode_key(key)


@pytest.mark.parametrize("value, problem", [
    (GOOD_VALUE[:-1], "truncated"),
    (GOOD_VALUE + b"\x00", "trailing"),
    (struct.pack(">h", 4) + GOOD_VALUE[2:], "version 4"),
    (struct.pack(">h", -1) + GOOD_VALUE[2:], "version -1"),
])
def test_corrupt_offset_values_are_refused(value, problem):
    with pytest.raises(CorruptRecordError, match=problem):
        R.decode_record(GOOD_KEY, value)


def test_corrupt_group_values_are_refused():
    with pytest.raises(CorruptRecordError, match="truncated"):
        R.decode_group_value(GOOD_GROUP[:-2])
    with pytest.raises(CorruptRecordError, match="trailing"):
        R.decode_group_value(GOOD_GROUP + b"x")
    # A member count the buffer cannot hold is refused before any loop runs.
    head = struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 1) + struct.pack(">hh", -1, -1) + struct.pack(">q", 0)
    with pytest.raises(CorruptRecordError, match="array count 2000000000"):
        R.decode_group_value(head + struct.pack(">i", 2_000_000_000))
    with pytest.raises(CorruptRecordError, match="array count -1"):
        R.decode_group_value(head + struct.pack(">i", -1))
    # Negative bytes length inside a member.
    member = s16("a") + struct.pack(">h", -1) + s16("c") + s16("h") + struct.pack(">ii", 1, 2) + struct.pack(">i", -5)
    with pytest.raises(CorruptRecordError, match="negative"):
        R.decode_group_value(head + struct.pack(">i", 1) + member + b"\x00" * 8)


def test_encode_refuses_what_it_cannot_write():
    with pytest.raises(TypeError):
        R.encode_value("not a value")
    with pytest.raises(ValueError, match="longer than a Kafka string"):
        R.encode_key(R.GroupMetadataKey("g" * 40_000))


text = st.text(max_size=20)
opt_text = st.none() | text
i32 = st.integers(-2**31, 2**31 - 1)
i64 = st.integers(-2**63, 2**63 - 1)
members = st.builds(R.MemberMetadata, text, opt_text, text, text, i32, i32, st.binary(max_size=30), st.binary(max_size=30))


@settings(max_examples=60, deadline=None)
@given(group=text, topic=text, partition=i32, value=st.none() | st.builds(R.OffsetAndMetadata, i64, i32, text, i64))
def test_offset_commit_round_trip(group, topic, partition, value):
    key, raw = R.offset_commit_record(group, TopicPartition(topic, partition), value)
    assert R.decode_record(key, raw) == (R.OffsetCommitKey(group, topic, partition), value)


@settings(max_examples=60, deadline=None)
@given(group=text, value=st.none() | st.builds(R.GroupMetadataValue, text, i32, opt_text, opt_text, i64,
                                               st.lists(members, max_size=4).map(tuple)))
def test_group_metadata_round_trip(group, value):
    key, raw = R.group_metadata_record(group, value)
    assert R.decode_record(key, raw) == (R.GroupMetadataKey(group), value)


@settings(max_examples=100, deadline=None)
@given(data=st.binary(max_size=80))
def test_random_bytes_never_escape_as_other_errors(data):
    for decode in (R.decode_key, R.decode_offset_value, R.decode_group_value):
        try:
            decode(data)
        except CorruptRecordError:
            pass
