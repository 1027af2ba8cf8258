"""Table tests of the transactional producer's state machine (producer/transactions.py)."""
from __future__ import annotations

import pytest

from eos.errors import ErrorCode, EosError, ProducerFencedError, Reaction
from producer.transactions import (
    VALID_PREVIOUS_STATES,
    IllegalStateError,
    TransactionAbortedError,
    TransactionManager,
    TxnState,
    reaction_to,
)

S = TxnState
TP0, TP1, TP2 = ("t", 0), ("t", 1), ("u", 0)
ABORTABLE = EosError("a batch failed", ErrorCode.MESSAGE_TOO_LARGE)
FENCED = ProducerFencedError("fenced")


def in_state(state: TxnState, *, participant: bool = False) -> TransactionManager:
    txn = TransactionManager("tx", participant=participant)
    txn.state = state
    if state is S.ABORTABLE_ERROR:
        txn.last_error = ABORTABLE
    if state is S.FATAL_ERROR:
        txn.last_error = FENCED
    return txn


# ---- the transition table itself ----------------------------------------------------------------

@pytest.mark.parametrize("target", list(TxnState))
@pytest.mark.parametrize("source", list(TxnState))
def test_every_transition_is_allowed_or_refused_by_the_table(source, target):
    txn = in_state(source)
    if source in VALID_PREVIOUS_STATES[target]:
        txn._transition(target, FENCED if target is S.FATAL_ERROR else ABORTABLE)
        assert txn.state is target
    else:
        with pytest.raises(IllegalStateError, match=f"from {source.name} to {target.name}"):
            txn._transition(target)
        assert txn.state is source     # refused before anything changed


# ---- the application's calls, from every state ----------------------------------------------------

RAISES_ABORTABLE = TransactionAbortedError
RAISES_FENCED = ProducerFencedError
ILLEGAL = IllegalStateError

# (call, {state: expected state after, or the exception}); a state missing from a row is ILLEGAL.
CALLS = {
    "begin_init": {S.UNINITIALIZED: S.INITIALIZING, S.INITIALIZING: S.INITIALIZING,
                   S.ABORTABLE_ERROR: RAISES_ABORTABLE, S.FATAL_ERROR: RAISES_FENCED},
    "init_done": {S.INITIALIZING: S.READY},
    "begin_transaction": {S.READY: S.IN_TRANSACTION, S.ABORTABLE_ERROR: RAISES_ABORTABLE,
                          S.FATAL_ERROR: RAISES_FENCED},
    "check_send": {S.IN_TRANSACTION: S.IN_TRANSACTION, S.ABORTABLE_ERROR: RAISES_ABORTABLE,
                   S.FATAL_ERROR: RAISES_FENCED},
    "check_send_offsets": {S.IN_TRANSACTION: S.IN_TRANSACTION, S.ABORTABLE_ERROR: RAISES_ABORTABLE,
                           S.FATAL_ERROR: RAISES_FENCED},
    "begin_commit": {S.IN_TRANSACTION: S.COMMITTING, S.COMMITTING: S.COMMITTING,
                     S.ABORTABLE_ERROR: RAISES_ABORTABLE, S.FATAL_ERROR: RAISES_FENCED},
    "begin_abort": {S.IN_TRANSACTION: S.ABORTING, S.ABORTABLE_ERROR: S.ABORTING, S.ABORTING: S.ABORTING,
                    S.FATAL_ERROR: RAISES_FENCED},
    "end_done": {S.COMMITTING: S.READY, S.ABORTING: S.READY},
}


@pytest.mark.parametrize("state", list(TxnState))
@pytest.mark.parametrize("call", list(CALLS))
def test_calls_from_every_state(call, state):
    txn = in_state(state)
    expected = CALLS[call].get(state, ILLEGAL)
    if isinstance(expected, TxnState):
        getattr(txn, call)()
        assert txn.state is expected
    else:
        with pytest.raises(expected):
            getattr(txn, call)()
        assert txn.state is state


def test_resumed_calls_say_so():
    txn = in_state(S.UNINITIALIZED)
    assert txn.begin_init() is True and txn.begin_init() is False     # after a timeout: resume
    txn.init_done()
    txn.begin_transaction()
    assert txn.begin_commit() is True and txn.begin_commit() is False
    txn = in_state(S.IN_TRANSACTION)
    assert txn.begin_abort() is True and txn.begin_abort() is False


def test_an_abortable_transaction_reports_its_first_error_until_aborted():
    txn = in_state(S.IN_TRANSACTION)
    first = EosError("first", ErrorCode.MESSAGE_TOO_LARGE)
    txn.abortable_error(first)
    txn.abortable_error(EosError("second", ErrorCode.INVALID_RECORD))
    assert txn.state is S.ABORTABLE_ERROR and txn.last_error is first
    with pytest.raises(TransactionAbortedError, match="first") as raised:
        txn.begin_commit()
    assert raised.value.__cause__ is first
    txn.begin_abort()
    txn.end_done()
    assert txn.state is S.READY and txn.last_error is None


@pytest.mark.parametrize("state", [S.UNINITIALIZED, S.INITIALIZING, S.READY, S.ABORTING])
def test_abortable_errors_outside_a_live_transaction_change_nothing(state):
    txn = in_state(state)
    txn.abortable_error(ABORTABLE)      # e.g. the batches an abort fails on purpose
    assert txn.state is state


@pytest.mark.parametrize("state", list(TxnState))
def test_a_fatal_error_wins_from_every_state(state):
    txn = in_state(state)
    txn.fatal_error(FENCED)
    assert txn.state is S.FATAL_ERROR and txn.last_error is (FENCED if state is not S.FATAL_ERROR else txn.last_error)
    with pytest.raises(ProducerFencedError):
        txn.begin_abort()


def test_a_commit_in_progress_can_turn_abortable():
    txn = in_state(S.COMMITTING)
    txn.abortable_error(ABORTABLE)      # a batch failed during the commit's flush
    assert txn.state is S.ABORTABLE_ERROR
    assert txn.begin_abort() is True


# ---- participants ---------------------------------------------------------------------------------

PARTICIPANT_CALLS = {
    "begin_transaction": ILLEGAL, "begin_commit": ILLEGAL, "begin_abort": ILLEGAL,
    "check_send_offsets": ILLEGAL, "check_send": S.IN_TRANSACTION,
}


@pytest.mark.parametrize("call, expected", list(PARTICIPANT_CALLS.items()))
def test_a_participant_sends_but_never_begins_or_ends(call, expected):
    txn = TransactionManager("tx", participant=True)
    txn.begin_init()
    txn.init_done()
    assert txn.state is S.IN_TRANSACTION
    if isinstance(expected, TxnState):
        getattr(txn, call)()
        assert txn.state is expected
    else:
        with pytest.raises(expected, match="owner|participant"):
            getattr(txn, call)()
        assert txn.state is S.IN_TRANSACTION


# ---- partitions -------------------------------------------------------------------------------------

def test_new_partitions_wait_and_are_registered_in_one_request():
    txn = in_state(S.IN_TRANSACTION)
    assert not txn.end_txn_needed
    assert [txn.partition_ready(tp) for tp in (TP0, TP1, TP0)] == [False, False, False]
    assert txn.partitions_to_add() == [TP0, TP1]
    assert txn.end_txn_needed                       # the coordinator may know of it now
    assert not txn.partition_ready(TP2)             # a request is in flight: TP2 waits for the next
    assert txn.partitions_to_add() == []
    assert txn.add_partitions_done({TP0: (ErrorCode.NONE, ""), TP1: (ErrorCode.NONE, "")}) is None
    assert txn.partition_ready(TP0) and txn.partition_ready(TP1)
    assert txn.partitions_to_add() == [TP2]


def test_with_partitions_added_by_produce_every_partition_is_ready_and_none_is_queued():
    """transaction.version 2 (KIP-890 part 2): no AddPartitionsToTxn is ever asked for; the
    first batch sent starts the transaction, and an acknowledged one registers its partition."""
    txn = TransactionManager("tx", partitions_added_by_produce=True)
    txn.state = S.IN_TRANSACTION
    assert not txn.note_partition(TP0) and not txn.end_txn_needed
    assert txn.partition_ready(TP0) and txn.partition_ready(TP1)
    assert txn.partitions_to_add() == [] and txn.end_txn_needed
    assert txn.nothing_registered                   # sent, not yet acknowledged
    txn.partition_written(TP0)
    assert txn.partitions_in_txn == {TP0} and not txn.nothing_registered
    txn.begin_commit()
    txn.end_done()
    assert txn.partitions_in_txn == set() and not txn.end_txn_needed
    txn.partition_written(TP1)                      # a late acknowledgement outside a transaction
    assert txn.partitions_in_txn == set()


def test_a_participant_cannot_have_its_partitions_added_by_produce():
    with pytest.raises(ValueError, match="participant"):
        TransactionManager("tx", participant=True, partitions_added_by_produce=True)


def test_retriable_refusals_go_back_to_pending():
    txn = in_state(S.IN_TRANSACTION)
    txn.partition_ready(TP0)
    txn.partition_ready(TP1)
    txn.partitions_to_add()
    reaction = txn.add_partitions_done({TP0: (ErrorCode.NONE, ""),
                                        TP1: (ErrorCode.CONCURRENT_TRANSACTIONS, "completing")})
    assert reaction is Reaction.RETRY and txn.state is S.IN_TRANSACTION
    assert txn.partitions_to_add() == [TP1]
    txn.add_partitions_failed()                     # no answer at all: pending again
    assert txn.partitions_to_add() == [TP1]


@pytest.mark.parametrize("code, reaction, state, error", [
    (ErrorCode.PRODUCER_FENCED, Reaction.FATAL, S.FATAL_ERROR, ProducerFencedError),
    (ErrorCode.INVALID_PRODUCER_EPOCH, Reaction.FATAL, S.FATAL_ERROR, ProducerFencedError),
    (ErrorCode.INVALID_TXN_STATE, Reaction.FATAL, S.FATAL_ERROR, EosError),
    (ErrorCode.TRANSACTION_ABORTABLE, Reaction.ABORT, S.ABORTABLE_ERROR, EosError),
])
def test_add_partitions_refusals(code, reaction, state, error):
    txn = in_state(S.IN_TRANSACTION)
    txn.partition_ready(TP0)
    txn.partitions_to_add()
    assert txn.add_partitions_done({TP0: (code, "no")}) is reaction
    assert txn.state is state and isinstance(txn.last_error, error)
    assert not txn.partition_ready(TP0)


def test_no_registration_leaves_the_open_transaction_state():
    txn = in_state(S.ABORTING)
    txn.partition_ready(TP0)
    assert txn.partitions_to_add() == []            # aborting: nothing more is registered


def test_a_new_transaction_starts_with_nothing_registered():
    txn = in_state(S.IN_TRANSACTION)
    txn.partition_ready(TP0)
    txn.partitions_to_add()
    txn.add_partitions_done({TP0: (ErrorCode.NONE, "")})
    txn.offsets_confirmed()
    assert not txn.nothing_registered
    txn.begin_commit()
    txn.end_done()
    txn.begin_transaction()
    assert txn.nothing_registered and not txn.end_txn_needed and not txn.partition_ready(TP0)


@pytest.mark.parametrize("code, leader, expected", [
    (ErrorCode.PRODUCER_FENCED, False, Reaction.FATAL),
    (ErrorCode.INVALID_PRODUCER_EPOCH, True, Reaction.FATAL),
    (ErrorCode.INVALID_TXN_STATE, True, Reaction.ABORT),      # KIP-890: unregistered partition
    (ErrorCode.INVALID_TXN_STATE, False, Reaction.FATAL),     # the coordinator's own refusal
    (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, True, Reaction.ABORT),
    (ErrorCode.TRANSACTION_ABORTABLE, False, Reaction.ABORT),
    (ErrorCode.CONCURRENT_TRANSACTIONS, False, Reaction.RETRY),
    (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, False, Reaction.RETRY),
    (ErrorCode.NOT_LEADER_OR_FOLLOWER, True, Reaction.RETRY),
])
def test_reactions(code, leader, expected):
    assert reaction_to(code, from_partition_leader=leader) is expected


def test_an_empty_transactional_id_is_refused():
    with pytest.raises(ValueError, match="transactional.id"):
        TransactionManager("")


# ---- participants: fencing and partitions registered at initialisation ----------------------------

@pytest.mark.parametrize("code", [ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
                                  ErrorCode.INVALID_TXN_STATE, ErrorCode.INVALID_PRODUCER_ID_MAPPING])
def test_a_participant_whose_transaction_no_longer_takes_its_writes_is_fenced(code):
    txn = in_state(S.IN_TRANSACTION, participant=True)
    assert txn.fences(code)
    txn.partition_ready(TP0)
    txn.partitions_to_add()
    assert txn.add_partitions_done({TP0: (code, "the transaction is over")}) is Reaction.FATAL
    assert txn.state is S.FATAL_ERROR
    error = txn.last_error
    assert isinstance(error, ProducerFencedError) and error.code is ErrorCode.PRODUCER_FENCED
    assert code.name in str(error) and "the transaction is over" in str(error)
    with pytest.raises(ProducerFencedError):
        txn.check_send()


def test_an_owner_is_not_fenced_by_a_forgotten_producer_id():
    owner = in_state(S.IN_TRANSACTION)
    assert owner.fences(ErrorCode.PRODUCER_FENCED)
    assert not owner.fences(ErrorCode.INVALID_PRODUCER_ID_MAPPING)
    owner.error(ErrorCode.INVALID_PRODUCER_ID_MAPPING, "no")
    assert owner.last_error.code is ErrorCode.INVALID_PRODUCER_ID_MAPPING   # its own code, not fenced


def test_partitions_registered_by_init_participant_are_ready_at_once():
    txn = TransactionManager("tx", participant=True)
    txn.begin_init()
    txn.init_done()
    txn.participant_partitions_registered([TP0, TP1])
    assert txn.partition_ready(TP0) and txn.partition_ready(TP1)
    assert txn.partitions_to_add() == []
    assert not txn.partition_ready(TP2) and txn.partitions_to_add() == [TP2]
    assert txn.end_txn_needed


@pytest.mark.parametrize("participant, state", [(False, S.READY), (True, S.INITIALIZING)])
def test_partitions_registered_at_initialisation_only_for_an_initialised_participant(participant, state):
    txn = in_state(state, participant=participant)
    with pytest.raises(IllegalStateError, match="participant"):
        txn.participant_partitions_registered([TP0])
    assert txn.state is state and not txn.partitions_in_txn
