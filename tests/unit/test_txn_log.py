"""__transaction_state records round-trip and refuse corrupt bytes."""
import pytest
from hypothesis import given, settings, strategies as st

from eos.errors import CorruptRecordError
from eos.types import TopicPartition
from txn_coordinator import txn_log
from txn_coordinator.state import TxnMetadata, TxnState

metadata = st.builds(
    TxnMetadata,
    transactional_id=st.text(min_size=1, max_size=40),
    producer_id=st.integers(0, 2**63 - 1),
    producer_epoch=st.integers(0, 32767),
    last_producer_id=st.integers(-1, 2**63 - 1),
    last_producer_epoch=st.integers(-1, 32767),
    timeout_ms=st.integers(1, 900_000),
    state=st.sampled_from(list(TxnState)),
    partitions=st.frozensets(st.builds(TopicPartition, st.text(min_size=1, max_size=20), st.integers(0, 1000)),
                             max_size=10),
    start_time_ms=st.integers(-1, 2**62),
    last_update_ms=st.integers(0, 2**62),
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
