"""Table tests of the idempotent producer's bookkeeping (producer/idempotence.py)."""
from __future__ import annotations

import pytest

from eos.errors import ErrorCode, InvariantError
from producer.idempotence import (
    SEQUENCE_MAX,
    UNACKED_BATCHES_MAX,
    Decision,
    IdempotenceState,
    increment_sequence,
)

TP = ("t", 0)
OTHER = ("t", 1)
PID, EPOCH = 1000, 0


def fresh() -> IdempotenceState:
    state = IdempotenceState()
    state.set_producer_id(PID, EPOCH)
    return state


def send(state, tp, count):
    seq = state.assign(tp, count)
    state.on_sent(tp, seq)
    return seq


def test_no_sequences_before_init_producer_id():
    state = IdempotenceState()
    assert not state.ready_to_send
    assert not state.can_assign(TP)
    with pytest.raises(InvariantError):
        state.assign(TP, 1)


def test_sequences_count_records_per_partition():
    state = fresh()
    assert state.assign(TP, 10) == 0
    assert state.assign(TP, 5) == 10
    assert state.assign(OTHER, 3) == 0
    assert state.next_sequence(TP) == 15
    assert state.next_sequence(OTHER) == 3


@pytest.mark.parametrize("sequence,count,expected", [
    (0, 1, 1),
    (SEQUENCE_MAX - 1, 1, SEQUENCE_MAX),
    (SEQUENCE_MAX, 1, 0),
    (SEQUENCE_MAX - 2, 5, 2),
])
def test_sequences_wrap_after_2_pow_31_minus_1(sequence, count, expected):
    assert increment_sequence(sequence, count) == expected


def test_the_first_batch_of_a_partition_goes_alone():
    state = fresh()
    assert state.can_assign(TP)
    seq = send(state, TP, 3)
    assert not state.can_assign(TP)          # the broker would accept any first sequence
    assert state.can_assign(OTHER)
    state.on_acked(TP, seq, PID, EPOCH)
    assert state.can_assign(TP)
    send(state, TP, 1)
    assert state.can_assign(TP)              # now the broker checks every sequence
    state.set_producer_id(PID, EPOCH + 1)
    send(state, TP, 1)
    assert not state.can_assign(TP)          # a new epoch starts afresh


def test_a_transactional_producer_sends_its_first_batches_together():
    state = IdempotenceState(first_batch_alone=False)
    state.set_producer_id(PID, EPOCH)
    for _ in range(UNACKED_BATCHES_MAX):
        assert state.can_assign(TP)
        send(state, TP, 1)
    assert not state.can_assign(TP)          # the window still bounds them


def test_at_most_five_unacked_batches_per_partition():
    state = fresh()
    state.on_acked(TP, state.assign(TP, 1), PID, EPOCH)
    for _ in range(UNACKED_BATCHES_MAX):
        assert state.can_assign(TP)
        send(state, TP, 1)
    assert not state.can_assign(TP)
    assert state.can_assign(OTHER)
    with pytest.raises(InvariantError):
        state.assign(TP, 1)
    state.on_acked(TP, 1, PID, EPOCH)
    assert state.can_assign(TP)


def test_the_window_counts_acknowledged_batches_behind_an_unacknowledged_one():
    # the answer to the oldest batch is lost while the younger ones are acknowledged: the
    # broker remembers only its last 5 batches, so no 6th may follow until the oldest is through
    state = fresh()
    state.on_acked(TP, state.assign(TP, 1), PID, EPOCH)
    seqs = [send(state, TP, 1) for _ in range(UNACKED_BATCHES_MAX)]
    for seq in seqs[1:]:
        state.on_acked(TP, seq, PID, EPOCH)
    assert state.unacked_count(TP) == 1
    assert state.window_count(TP) == UNACKED_BATCHES_MAX
    assert not state.can_assign(TP)
    state.on_acked(TP, seqs[0], PID, EPOCH)      # the retry was recognised as a duplicate
    assert state.window_count(TP) == 0 and state.can_assign(TP)


def test_ack_of_a_stale_epoch_changes_nothing():
    state = fresh()
    seq = send(state, TP, 1)
    state.on_acked(TP, seq, PID, EPOCH + 7)
    assert state.unacked_count(TP) == 1


def test_duplicate_sequence_counts_as_delivered():
    state = fresh()
    seq = send(state, TP, 1)
    assert state.on_error(TP, seq, PID, EPOCH, ErrorCode.DUPLICATE_SEQUENCE_NUMBER) is Decision.ACCEPT
    assert state.unacked_count(TP) == 0


# (code, is the batch the oldest unacked, was it sent behind an older one) -> decision
ERROR_TABLE = [
    (ErrorCode.NOT_LEADER_OR_FOLLOWER, True, False, Decision.RETRY),
    (ErrorCode.REQUEST_TIMED_OUT, False, True, Decision.RETRY),
    (ErrorCode.NETWORK_EXCEPTION, True, False, Decision.RETRY),
    (ErrorCode.CORRUPT_MESSAGE, True, False, Decision.RETRY),
    (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, False, True, Decision.RETRY),
    # the older batch was acknowledged before this answer came back (gRPC reordering)
    (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, True, True, Decision.RETRY),
    (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, True, False, Decision.FAIL_AND_BUMP),
    (ErrorCode.UNKNOWN_PRODUCER_ID, True, False, Decision.FAIL_AND_BUMP),
    (ErrorCode.MESSAGE_TOO_LARGE, True, False, Decision.FAIL_AND_BUMP),
    (ErrorCode.INVALID_RECORD, False, True, Decision.FAIL_AND_BUMP),
    (ErrorCode.INVALID_PRODUCER_EPOCH, True, False, Decision.FAIL),
]


@pytest.mark.parametrize("code,oldest,behind,expected", ERROR_TABLE)
def test_error_decisions(code, oldest, behind, expected):
    state = fresh()
    if oldest and behind:
        older = send(state, TP, 2)
        seq = send(state, TP, 3)
        state.on_acked(TP, older, PID, EPOCH)   # acknowledged before the younger's answer
    elif oldest:
        seq = send(state, TP, 3)
    else:
        send(state, TP, 2)
        seq = send(state, TP, 3)
    before = state.unacked_count(TP)
    decision = state.on_error(TP, seq, PID, EPOCH, code)
    assert decision is expected
    assert state.bump_required is (expected is Decision.FAIL_AND_BUMP)
    if expected is Decision.RETRY:
        assert state.unacked_count(TP) == before          # keeps its sequence
    else:
        assert state.unacked_count(TP) == before - 1
    assert state.ready_to_send is (expected is not Decision.FAIL_AND_BUMP)


def test_after_a_failed_batch_the_younger_ones_are_rebuilt_not_failed():
    state = fresh()
    first = send(state, TP, 1)
    second = send(state, TP, 1)
    third = send(state, TP, 1)
    assert state.on_error(TP, first, PID, EPOCH, ErrorCode.MESSAGE_TOO_LARGE) is Decision.FAIL_AND_BUMP
    assert state.on_error(TP, second, PID, EPOCH, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER) is Decision.REBUILD
    assert state.on_error(TP, third, PID, EPOCH, ErrorCode.NOT_LEADER_OR_FOLLOWER) is Decision.REBUILD
    assert state.unacked_count(TP) == 0
    # ... but an error about the content itself still fails the batch
    state2 = fresh()
    a = send(state2, TP, 1)
    b = send(state2, TP, 1)
    state2.on_error(TP, a, PID, EPOCH, ErrorCode.UNKNOWN_PRODUCER_ID)
    assert state2.on_error(TP, b, PID, EPOCH, ErrorCode.INVALID_RECORD) is Decision.FAIL_AND_BUMP


def test_bump_resets_every_partition_to_sequence_zero():
    state = fresh()
    send(state, TP, 4)
    send(state, OTHER, 9)
    seq = send(state, TP, 1)
    state.on_error(TP, seq, PID, EPOCH, ErrorCode.UNKNOWN_PRODUCER_ID)
    assert not state.ready_to_send and not state.can_assign(OTHER)
    state.set_producer_id(PID + 1, 0)          # the coordinator may hand a new id
    assert state.ready_to_send
    assert state.assign(TP, 1) == 0
    assert state.assign(OTHER, 1) == 0
    assert state.unacked_count(TP) == 1


@pytest.mark.parametrize("code,expected", [
    (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, Decision.REBUILD),
    (ErrorCode.INVALID_PRODUCER_EPOCH, Decision.REBUILD),
    (ErrorCode.UNKNOWN_PRODUCER_ID, Decision.REBUILD),
    (ErrorCode.NOT_LEADER_OR_FOLLOWER, Decision.REBUILD),
    (ErrorCode.MESSAGE_TOO_LARGE, Decision.FAIL),
])
def test_answers_for_batches_of_an_older_epoch(code, expected):
    state = fresh()
    seq = send(state, TP, 1)
    state.set_producer_id(PID, EPOCH + 1)
    assert state.on_error(TP, seq, PID, EPOCH, code) is expected
    assert state.ready_to_send                 # a stale answer never asks for another bump


def test_giving_up_on_a_sent_batch_requires_a_bump():
    state = fresh()
    seq = send(state, TP, 1)
    assert state.on_given_up(TP, seq, PID, EPOCH) is Decision.FAIL_AND_BUMP
    assert state.bump_required
    assert state.on_given_up(TP, seq, PID, EPOCH - 1) is Decision.FAIL


def test_invalid_answers_raise_invariant_errors():
    state = fresh()
    with pytest.raises(InvariantError):
        state.on_sent(TP, 0)
    with pytest.raises(InvariantError):
        state.on_error(TP, 0, PID, EPOCH, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
    with pytest.raises(InvariantError):
        state.set_producer_id(-1, 0)
    with pytest.raises(InvariantError):
        state.assign(TP, 0)
