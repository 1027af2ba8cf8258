"""__transaction_state records round-trip and refuse corrupt bytes; version 1 still reads."""
import struct

import pytest
from hypothesis import given, settings, strategies as st

from eos.errors import CorruptRecordError
from eos.types import TopicPartition
from txn_coordinator import txn_log
from txn_coordinator.state import Participant, TxnMetadata, TxnState

topic_partitions = st.frozensets(st.builds(TopicPartition, st.text(min_size=1, max_size=20), st.integers(0, 1000)),
                                 max_size=10)
participants = st.lists(st.builds(Participant, producer_id=st.integers(0, 2**63 - 1),
                                  producer_epoch=st.integers(0, 32767), partitions=topic_partitions,
                                  accepted=st.booleans()), max_size=5).map(tuple)
metadata = st.builds(
    TxnMetadata,
    transactional_id=st.text(min_size=1, max_size=40),
    producer_id=st.integers(0, 2**63 - 1),
    producer_epoch=st.integers(0, 32767),
    last_producer_id=st.integers(-1, 2**63 - 1),
    last_producer_epoch=st.integers(-1, 32767),
    timeout_ms=st.integers(1, 900_000),
    state=st.sampled_from(list(TxnState)),
    partitions=topic_partitions,
    start_time_ms=st.integers(-1, 2**62),
    last_update_ms=st.integers(0, 2**62),
    participants=participants,
)


@settings(max_examples=80)
@given(metadata)
def test_round_trip(md):
    key = txn_log.encode_key(md.transactional_id)
    assert txn_log.decode_key(key) == md.transactional_id
    assert txn_log.decode_value(md.transactional_id, txn_log.encode_value(md)) == md


def test_tombstone():
    assert txn_log.decode_value("x", None) is None


def test_corrupt_values_are_refused():
    md = TxnMetadata("t", 1, 0, -1, -1, 1000, TxnState.ONGOING, frozenset({TopicPartition("a", 1)}), 5, 6)
    good = txn_log.encode_value(md)
    for cut in (1, 10, len(good) - 1):
        with pytest.raises(CorruptRecordError):
            txn_log.decode_value("t", good[:cut])
    with pytest.raises(CorruptRecordError, match="trailing"):
        txn_log.decode_value("t", good + b"\x00")
    bad_state = bytearray(good)
    bad_state[16] = 42
    with pytest.raises(CorruptRecordError, match="state"):
        txn_log.decode_value("t", bytes(bad_state))
    with pytest.raises(CorruptRecordError, match="version"):
        txn_log.decode_key(b"\x00\x07\x00\x01t")


@pytest.mark.parametrize("text, expected", [
    ("", 0), ("a", 97), ("hello", 99162322), ("transactional-id-0", None),
])
def test_java_string_hash(text, expected):
    h = txn_log.java_string_hash(text)
    if expected is not None:
        assert h == expected
    assert -(1 << 31) <= h < (1 << 31)
    assert 0 <= txn_log.partition_for(text) < 50


def version_1_value(md: TxnMetadata) -> bytes:
    """A value in the version 1 layout, packed by hand from the layout (not by encode_value)."""
    out = struct.pack(">hqhib", 1, md.producer_id, md.producer_epoch, md.timeout_ms, md.state.log_id)
    topics = sorted({tp.topic for tp in md.partitions})
    out += struct.pack(">i", len(topics))
    for topic in topics:
        numbers = sorted(tp.partition for tp in md.partitions if tp.topic == topic)
        out += struct.pack(">h", len(topic.encode())) + topic.encode()
        out += struct.pack(f">i{len(numbers)}i", len(numbers), *numbers)
    return out + struct.pack(">qqqh", md.last_update_ms, md.start_time_ms, md.last_producer_id,
                             md.last_producer_epoch)


def test_version_1_values_still_read_with_no_participants():
    md = TxnMetadata("t", 7, 3, 7, 2, 60_000, TxnState.PREPARE_COMMIT,
                     frozenset({TopicPartition("a", 1), TopicPartition("a", 0), TopicPartition("b", 4)}), 5, 6)
    assert txn_log.decode_value("t", version_1_value(md)) == md
    assert md.participants == ()


def test_version_2_is_written_and_keeps_participants_in_order():
    tp = TopicPartition("out", 0)
    md = TxnMetadata("t", 1, 0, -1, -1, 1000, TxnState.PREPARE_COMMIT, frozenset(), 5, 6,
                     (Participant(9, 0, frozenset({tp}), True), Participant(3, 0, frozenset(), False)))
    value = txn_log.encode_value(md)
    assert struct.unpack_from(">h", value)[0] == 2
    assert txn_log.decode_value("t", value).participants == md.participants


def test_corrupt_participants_are_refused():
    md = TxnMetadata("t", 1, 0, -1, -1, 1000, TxnState.ONGOING, frozenset(), 5, 6,
                     (Participant(9, 0, frozenset({TopicPartition("out", 0)})),))
    good = txn_log.encode_value(md)
    count_at = len(txn_log.encode_value(TxnMetadata("t", 1, 0, -1, -1, 1000, TxnState.ONGOING, frozenset(), 5, 6))) - 4
    too_many = bytearray(good)
    too_many[count_at:count_at + 4] = struct.pack(">i", 1 << 30)
    with pytest.raises(CorruptRecordError, match="participant count"):
        txn_log.decode_value("t", bytes(too_many))
    bad_flag = bytearray(good)
    bad_flag[count_at + 4 + 10] = 7
    with pytest.raises(CorruptRecordError, match="accepted flag 7"):
        txn_log.decode_value("t", bytes(bad_flag))
    with pytest.raises(CorruptRecordError, match="version 3"):
        txn_log.decode_value("t", struct.pack(">h", 3) + good[2:])
