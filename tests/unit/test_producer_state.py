"""The broker's idempotence rules (broker.storage.producer_state), driven directly: table
tests per rule, staging (prepare changes nothing), snapshots and recovery, expiration, and a
stateful test against a model."""
from __future__ import annotations

import dataclasses
import os

import pytest
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.storage.log import AppendOrigin
from broker.storage.producer_state import (
    RETAINED_BATCHES_MAX,
    SEQUENCE_MAX,
    CompletedTxn,
    DuplicateBatch,
    MarkerAppend,
    ProducerAppend,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    read_snapshot_file,
    snapshot_path,
)
from broker.storage.txn_index import AbortedTxn
from eos.errors import (
    EosError,
    ErrorCode,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTxnStateError,
    InvariantError,
    OutOfOrderSequenceError,
)
from eos.records.codec import CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT
from eos.records.header import CONTROL_FLAG, TRANSACTIONAL_FLAG, BatchHeader

PID = 1000
HOUR_MS = 3_600_000


def header(producer_id: int = PID, epoch: int = 0, base_sequence: int = 0, count: int = 1, *,
           base_offset: int = 0, timestamp_ms: int = 1_000, attributes: int = 0) -> BatchHeader:
    return BatchHeader(
        base_offset=base_offset, batch_length=49 + 10 * count, partition_leader_epoch=0, magic=2, crc=0,
        attributes=attributes, last_offset_delta=count - 1, base_timestamp=timestamp_ms,
        max_timestamp=timestamp_ms, producer_id=producer_id, producer_epoch=epoch,
        base_sequence=base_sequence, records_count=count, position=0)


def manager_with(tmp_path, batches, **kwargs) -> ProducerStateManager:
    """A manager whose log holds `batches` [(epoch, base_sequence, count), ...] of PID, back to
    back from offset 0, each appended through prepare/apply (so they pass the rules)."""
    manager = ProducerStateManager(str(tmp_path), **kwargs)
    offset = 0
    for epoch, base_sequence, count in batches:
        append_at(manager, header(PID, epoch, base_sequence, count, timestamp_ms=1_000 + offset), offset)
        offset += count
    return manager


def append_at(manager: ProducerStateManager, batch: BatchHeader, offset: int, now_ms: int = 0):
    outcome = manager.prepare_append(batch, now_ms)
    if not isinstance(outcome, ProducerAppend):
        raise AssertionError(f"expected an append, got {outcome}")
    manager.apply(outcome, offset, offset + batch.last_offset_delta)
    return outcome


APPEND = "append"
OOS = OutOfOrderSequenceError
EPOCH = InvalidProducerEpochError
INVALID = InvalidRecordError
BUG = InvariantError


def dup(first_offset: int, last_offset: int) -> tuple:
    return ("duplicate", first_offset, last_offset)


# Seven batches of 2 records in epoch 3: sequences 0-1, 2-3, ..., 12-13 at offsets 0-1 ... 12-13;
# the last five (sequences 4..13, offsets 4..13) are retained.
SEVEN = [(3, 2 * i, 2) for i in range(7)]
NEAR_WRAP = [(0, SEQUENCE_MAX - 3, 2), (0, SEQUENCE_MAX - 1, 2)]   # ends at 2**31 - 1
ACROSS_WRAP = [(0, SEQUENCE_MAX - 1, 3)]                            # 2**31-2, 2**31-1, 0

RULES = [
    # (rule, state batches of PID, incoming (epoch, base_sequence, count), expected outcome)
    ("unknown producer, sequence 0", [], (0, 0, 1), APPEND),
    ("unknown producer, any sequence (KIP-360)", [], (0, 42, 3), APPEND),
    ("unknown producer, any epoch", [], (7, 5, 1), APPEND),
    ("next in sequence", SEVEN, (3, 14, 1), APPEND),
    ("gap", SEVEN, (3, 15, 1), OOS),
    ("far gap", SEVEN, (3, 1_000, 1), OOS),
    ("duplicate of the last batch", SEVEN, (3, 12, 2), dup(12, 13)),
    ("duplicate of the oldest retained batch", SEVEN, (3, 4, 2), dup(4, 5)),
    ("duplicate of a middle retained batch", SEVEN, (3, 8, 2), dup(8, 9)),
    ("retry older than the retained batches", SEVEN, (3, 2, 2), OOS),
    ("retry of the very first batch", SEVEN, (3, 0, 2), OOS),
    ("overlap: same first sequence, longer", SEVEN, (3, 12, 3), OOS),
    ("overlap: same first sequence, shorter", SEVEN, (3, 12, 1), OOS),
    ("overlap: same last sequence, later first", SEVEN, (3, 13, 1), OOS),
    ("overlap: spans two retained batches", SEVEN, (3, 9, 2), OOS),
    ("older epoch", SEVEN, (2, 14, 1), EPOCH),
    ("older epoch with a retained batch's sequences", SEVEN, (2, 12, 2), EPOCH),
    ("epoch 0 after a bump", SEVEN, (0, 0, 1), EPOCH),
    ("new epoch starts at 0", SEVEN, (4, 0, 5), APPEND),
    ("new epoch not at 0", SEVEN, (4, 14, 1), OOS),
    ("new epoch with a retained batch's sequences is no duplicate", SEVEN, (4, 12, 2), OOS),
    ("epoch jump by more than one starts at 0", SEVEN, (9, 0, 1), APPEND),
    ("after 2**31-1 comes 0", NEAR_WRAP, (0, 0, 1), APPEND),
    ("after 2**31-1, 2**31 is no sequence: 1 is a gap", NEAR_WRAP, (0, 1, 1), OOS),
    ("duplicate of the batch ending at 2**31-1", NEAR_WRAP, (0, SEQUENCE_MAX - 1, 2), dup(2, 3)),
    ("batch across the wrap, then 1", ACROSS_WRAP, (0, 1, 1), APPEND),
    ("batch across the wrap, then 0 again", ACROSS_WRAP, (0, 0, 1), OOS),
    ("duplicate of a batch across the wrap", ACROSS_WRAP, (0, SEQUENCE_MAX - 1, 3), dup(0, 2)),
    ("negative base sequence", SEVEN, (3, -1, 1), INVALID),
    ("negative base sequence, unknown producer", [], (0, -1, 1), INVALID),
    ("negative epoch", [], (-1, 0, 1), INVALID),
]


@pytest.mark.parametrize("rule_name, state, incoming, expected", RULES, ids=[r[0] for r in RULES])
def test_rule_table(tmp_path, rule_name, state, incoming, expected):
    manager = manager_with(tmp_path, state)
    before = manager.active_producers()
    epoch, base_sequence, count = incoming
    batch = header(PID, epoch, base_sequence, count, timestamp_ms=99_000)
    if isinstance(expected, type):
        with pytest.raises(expected):
            manager.prepare_append(batch, now_ms=100_000)
    else:
        outcome = manager.prepare_append(batch, now_ms=100_000)
        if expected == APPEND:
            assert isinstance(outcome, ProducerAppend)
            assert (outcome.producer_epoch, outcome.first_sequence) == (epoch, base_sequence)
        else:
            assert isinstance(outcome, DuplicateBatch)
            assert ("duplicate", outcome.first_offset, outcome.last_offset) == expected
            # the original batch's timestamp, not the retry's
            assert outcome.timestamp_ms == 1_000 + outcome.first_offset
    assert manager.active_producers() == before


def test_errors_name_expected_and_received(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    with pytest.raises(OutOfOrderSequenceError, match=r"expected sequence 14, got 20\.\.20"):
        manager.prepare_append(header(PID, 3, 20), 0)
    with pytest.raises(InvalidProducerEpochError, match=r"epoch 2, older than the current epoch 3"):
        manager.prepare_append(header(PID, 2, 14), 0)
    with pytest.raises(OutOfOrderSequenceError, match=r"from 3 to 4.*start at sequence 0, got 7"):
        manager.prepare_append(header(PID, 4, 7), 0)


def test_batches_without_producer_id_or_control_batches_are_refused_as_bugs(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    with pytest.raises(InvariantError):
        manager.prepare_append(header(-1, -1, -1), 0)
    with pytest.raises(InvariantError):
        manager.prepare_append(header(PID, 0, 0, attributes=CONTROL_FLAG), 0)


def test_prepare_changes_nothing_until_apply(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    before = manager.active_producers()
    files_before = sorted(os.listdir(tmp_path))
    for incoming in [header(PID, 3, 14), header(PID, 4, 0), header(PID + 1, 0, 0), header(PID, 3, 12, 2)]:
        manager.prepare_append(incoming, 0)
        manager.prepare_append(incoming, 0)   # twice: the second answer equals the first
    assert manager.active_producers() == before
    assert sorted(os.listdir(tmp_path)) == files_before
    outcome = manager.prepare_append(header(PID, 3, 14, 2), 0)
    manager.apply(outcome, 14, 15)
    entry = manager.last_entry(PID)
    assert entry.last_sequence == 15 and entry.last_offset == 15
    assert [b.first_sequence for b in entry.batches] == [6, 8, 10, 12, 14]


def test_apply_refuses_a_stale_append_or_offsets_that_do_not_fit(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    first = manager.prepare_append(header(PID, 3, 14), 0)
    also_first = manager.prepare_append(header(PID, 3, 14), 0)
    manager.apply(first, 14, 14)
    with pytest.raises(InvariantError, match="moved between prepare and apply"):
        manager.apply(also_first, 15, 15)
    nxt = manager.prepare_append(header(PID, 3, 15, 3), 0)
    with pytest.raises(InvariantError, match="last offset delta"):
        manager.apply(nxt, 15, 16)
    with pytest.raises(InvariantError, match="not after its last batch"):
        manager.apply(nxt, 10, 12)
    assert manager.last_entry(PID).last_sequence == 14


def test_new_epoch_forgets_the_old_epochs_batches(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    append_at(manager, header(PID, 4, 0, 2), 14)
    entry = manager.last_entry(PID)
    assert entry.producer_epoch == 4 and len(entry.batches) == 1
    with pytest.raises(InvalidProducerEpochError):
        manager.prepare_append(header(PID, 3, 12, 2), 0)


def test_producers_are_independent(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    append_at(manager, header(PID + 1, 0, 0, 3), 14)
    assert isinstance(manager.prepare_append(header(PID + 1, 0, 3), 0), ProducerAppend)
    assert isinstance(manager.prepare_append(header(PID, 3, 14), 0), ProducerAppend)
    assert manager.prepare_append(header(PID + 1, 0, 0, 3), 0) == DuplicateBatch(14, 16, 1_000)
    assert [e.producer_id for e in manager.active_producers()] == [PID, PID + 1]


def test_prepare_appends_checks_batches_of_one_buffer_in_turn(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    buffer = [header(PID, 3, 14, 2), header(-1, -1, -1), header(PID, 3, 16, 1), header(PID + 1, 0, 0)]
    appends = manager.prepare_appends(buffer, 0)
    assert appends[1] is None and [a.first_sequence for a in appends if a] == [14, 16, 0]
    offset = 14
    for batch, append in zip(buffer, appends):
        if append is not None:
            manager.apply(append, offset, offset + batch.last_offset_delta)
        offset += batch.last_offset_delta + 1
    assert manager.last_entry(PID).last_sequence == 16
    # the same batch twice in one buffer: the second is out of sequence, not a duplicate
    with pytest.raises(OutOfOrderSequenceError):
        manager.prepare_appends([header(PID, 3, 17), header(PID, 3, 17)], 0)
    # a retry of a retained batch answers for the whole buffer, as Kafka does
    assert manager.prepare_appends([header(PID, 3, 17), header(PID, 3, 16)], 0) == DuplicateBatch(17, 17, 1_000)


def test_missing_timestamp_takes_now(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    append_at(manager, header(PID, 0, 0, timestamp_ms=-1), 0, now_ms=5_000)
    assert manager.last_entry(PID).last_timestamp_ms == 5_000


# ---- transactions: rule table -------------------------------------------------------------------

def data(epoch: int, sequence: int, count: int = 1, *, txn: bool = True) -> tuple:
    return ("data", epoch, sequence, count, txn)


def coord(epoch: int, count: int = 1, *, txn: bool = True, sequence: int = -1) -> tuple:
    """An append by a coordinator (TxnOffsetCommit): the producer's id and epoch, no sequence."""
    return ("coord", epoch, sequence, count, txn)


def marker(epoch: int, coordinator_epoch: int = 0, *, commit: bool = True) -> tuple:
    return ("marker", epoch, coordinator_epoch, commit)


def prepare_step(manager: ProducerStateManager, step: tuple, now_ms: int = 50_000):
    if step[0] == "marker":
        _, epoch, coordinator_epoch, commit = step
        return manager.prepare_marker(PID, epoch, coordinator_epoch, commit, now_ms)
    kind, epoch, sequence, count, txn = step
    batch = header(PID, epoch, sequence, count, timestamp_ms=now_ms,
                   attributes=TRANSACTIONAL_FLAG if txn else 0)
    return manager.prepare_append(batch, now_ms, origin="coordinator" if kind == "coord" else "client")


def apply_step(manager: ProducerStateManager, prepared, offset: int) -> tuple[int, CompletedTxn | None]:
    """Apply at `offset`; return the next offset and what a marker completed."""
    if isinstance(prepared, MarkerAppend):
        return offset + 1, manager.apply_marker(prepared, offset)
    manager.apply(prepared, offset, offset + prepared.offset_delta)
    return offset + prepared.offset_delta + 1, None


def manager_after(tmp_path, steps) -> tuple[ProducerStateManager, int]:
    manager = ProducerStateManager(str(tmp_path))
    offset = 0
    for step in steps:
        offset, _ = apply_step(manager, prepare_step(manager, step), offset)
    return manager, offset


OPENS = "opens a transaction"
CONTINUES = "appends without opening"
COMPLETES = "marker completes the transaction"
NO_TXN = "marker completes nothing"
TXN_STATE = InvalidTxnStateError
BAD_REQUEST = InvalidRequestError
COORDINATOR_FENCED = "TRANSACTION_COORDINATOR_FENCED"
DUPLICATE = "duplicate"

TXN = [data(0, 0, 2)]                                # an open transaction at offsets 0-1
COMMITTED = [data(0, 0, 2), marker(1)]               # ... committed by a marker at offset 2 (epoch 1)
NEXT_COORDINATOR = [data(0, 0, 1), marker(1, coordinator_epoch=5), data(1, 0)]

TXN_RULES = [
    # (rule, steps before, incoming step, expected outcome)
    ("unknown producer: a transactional batch opens a transaction", [], data(0, 0, 2), OPENS),
    ("unknown producer: a transaction starts at sequence 0", [], data(0, 5), OOS),
    ("unknown producer: an idempotent batch still takes any sequence", [], data(0, 5, txn=False), CONTINUES),
    ("the next transactional batch continues the transaction", TXN, data(0, 2), CONTINUES),
    ("an idempotent batch while a transaction is open", TXN, data(0, 2, txn=False), TXN_STATE),
    ("an idempotent batch with a new epoch while a transaction is open", TXN, data(1, 0, txn=False), TXN_STATE),
    ("a transactional batch after idempotent ones opens a transaction", [data(0, 0, 2, txn=False)], data(0, 2),
     OPENS),
    ("a retry inside a transaction is a duplicate", TXN + [data(0, 2, 2)], data(0, 0, 2), DUPLICATE),
    ("a gap inside a transaction", TXN, data(0, 3), OOS),
    ("an older epoch inside a transaction", [data(1, 0, 2)], data(0, 2), EPOCH),
    ("a commit marker ends the transaction", TXN, marker(1), COMPLETES),
    ("an abort marker ends the transaction", TXN, marker(1, commit=False), COMPLETES),
    ("a marker with a much newer epoch", TXN, marker(7), COMPLETES),
    ("a marker for a producer unknown here completes nothing", [], marker(1), NO_TXN),
    ("a marker for a producer without a transaction here", [data(0, 0, txn=False)], marker(1), NO_TXN),
    ("a marker with the open transaction's own epoch (not bumped)", TXN, marker(0), EPOCH),
    ("a marker with an older epoch", [data(3, 0, 2)], marker(2), EPOCH),
    ("a retry of a written marker: same epoch, nothing open", COMMITTED, marker(1), NO_TXN),
    ("a retry of a marker after the next transaction began", COMMITTED + [data(1, 0)], marker(1), EPOCH),
    ("a marker older than the last marker", [data(0, 0, 2), marker(2)], marker(1), EPOCH),
    ("after a marker the next transaction starts at sequence 0", COMMITTED, data(1, 0), OPENS),
    ("after a marker the old sequences do not continue", COMMITTED, data(1, 2), OOS),
    ("after a marker a late write of the finished transaction is fenced", COMMITTED, data(0, 2), EPOCH),
    ("after a marker a retry of the finished transaction is fenced", COMMITTED, data(0, 0, 2), EPOCH),
    ("after a marker on a partition without data a late write is fenced", [marker(1)], data(0, 0), EPOCH),
    ("a coordinator epoch older than the last marker's", NEXT_COORDINATOR, marker(2, coordinator_epoch=4),
     COORDINATOR_FENCED),
    ("the same coordinator epoch as the last marker's", NEXT_COORDINATOR, marker(2, coordinator_epoch=5), COMPLETES),
    ("a newer coordinator epoch", NEXT_COORDINATOR, marker(2, coordinator_epoch=6), COMPLETES),
    ("the producer epoch is checked before the coordinator epoch", NEXT_COORDINATOR,
     marker(1, coordinator_epoch=4), EPOCH),
    ("a marker with a negative producer epoch", [], marker(-1), BAD_REQUEST),
    ("a marker with a negative coordinator epoch", [], marker(0, coordinator_epoch=-1), BAD_REQUEST),
    ("coordinator append without sequence opens a transaction", [], coord(0), OPENS),
    ("coordinator append continues the transaction", [coord(0)], coord(0, 3), CONTINUES),
    ("coordinator append ignores sequences", [data(0, 0, 3, txn=False)], coord(0, sequence=17), OPENS),
    ("coordinator append with an older epoch is fenced", COMMITTED, coord(0), EPOCH),
    ("coordinator append, non-transactional, while a transaction is open", [coord(0)], coord(0, txn=False),
     TXN_STATE),
    ("coordinator append with a sequence below -1", [], coord(0, sequence=-2), INVALID),
    ("client batch without a sequence", [], data(0, -1), INVALID),
]


@pytest.mark.parametrize("rule_name, steps, incoming, expected", TXN_RULES, ids=[r[0] for r in TXN_RULES])
def test_transaction_rule_table(tmp_path, rule_name, steps, incoming, expected):
    manager, offset = manager_after(tmp_path, steps)
    before = (manager.active_producers(), manager.open_transactions(), manager.first_unstable_offset())
    if isinstance(expected, type):
        with pytest.raises(expected):
            prepare_step(manager, incoming)
        assert (manager.active_producers(), manager.open_transactions(), manager.first_unstable_offset()) == before
        return
    if expected == COORDINATOR_FENCED:
        with pytest.raises(EosError) as caught:
            prepare_step(manager, incoming)
        assert caught.value.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
        assert "coordinator epoch 4" in str(caught.value)
        return
    prepared = prepare_step(manager, incoming)
    assert (manager.active_producers(), manager.open_transactions(), manager.first_unstable_offset()) == before
    if expected == DUPLICATE:
        assert isinstance(prepared, DuplicateBatch)
        return
    txn_first_offset = manager.last_entry(PID).current_txn_first_offset if manager.last_entry(PID) else -1
    next_offset, completed = apply_step(manager, prepared, offset)
    entry = manager.last_entry(PID)
    if expected in (OPENS, CONTINUES):
        assert prepared.starts_transaction == (expected == OPENS)
        if expected == OPENS:
            assert entry.current_txn_first_offset == offset
            assert manager.open_transactions() == [(PID, offset)]
        else:
            assert entry.current_txn_first_offset == txn_first_offset
    else:
        assert entry.producer_epoch == incoming[1] and entry.coordinator_epoch == incoming[2]
        assert entry.current_txn_first_offset == -1 and manager.open_transactions() == []
        if expected == COMPLETES:
            assert completed == CompletedTxn(PID, txn_first_offset, offset, not incoming[3], offset + 1)
        else:
            assert completed is None


def test_errors_name_the_transaction_problem(tmp_path):
    manager, _ = manager_after(tmp_path, TXN + [data(0, 2)])
    with pytest.raises(InvalidTxnStateError, match=r"transaction open in this partition since offset 0"):
        prepare_step(manager, data(0, 3, txn=False))
    with pytest.raises(InvalidProducerEpochError, match=r"COMMIT marker .* epoch 0, .* at epoch 0 with a "
                                                        r"transaction open since offset 0"):
        prepare_step(manager, marker(0))
    with pytest.raises(InvalidRequestError, match="must be non-negative"):
        manager.prepare_marker(-1, 0, 0, True, 0)


def test_a_bumped_marker_clears_the_retained_batches(tmp_path):
    manager, _ = manager_after(tmp_path, [data(0, 0, 2, txn=False), data(0, 2, 2, txn=False)])
    assert len(manager.last_entry(PID).batches) == 2
    # a same-epoch marker retry (nothing open) keeps them, as Kafka's maybeUpdateProducerEpoch does
    apply_step(manager, prepare_step(manager, marker(0)), 4)
    assert len(manager.last_entry(PID).batches) == 2 and manager.last_entry(PID).producer_epoch == 0
    apply_step(manager, prepare_step(manager, marker(1)), 5)
    entry = manager.last_entry(PID)
    assert entry.batches == () and entry.producer_epoch == 1 and entry.last_timestamp_ms == 50_000


# ---- transactions: first unstable offset, staging, restart, replay ----------------------------------

def txn_header(producer_id: int, epoch: int, sequence: int, count: int, offset: int, *,
               timestamp_ms: int = 1_000) -> BatchHeader:
    return header(producer_id, epoch, sequence, count, base_offset=offset, timestamp_ms=timestamp_ms,
                  attributes=TRANSACTIONAL_FLAG)


def marker_header(producer_id: int, epoch: int, offset: int, *, timestamp_ms: int = 1_000) -> BatchHeader:
    return header(producer_id, epoch, -1, 1, base_offset=offset, timestamp_ms=timestamp_ms,
                  attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG)


def append_txn(manager, producer_id, epoch, sequence, count, offset):
    manager.apply(manager.prepare_append(txn_header(producer_id, epoch, sequence, count, offset), 0),
                  offset, offset + count - 1)


def end_txn(manager, producer_id, epoch, offset, *, commit, coordinator_epoch=0, now_ms=1_000):
    return manager.apply_marker(manager.prepare_marker(producer_id, epoch, coordinator_epoch, commit, now_ms), offset)


def test_first_unstable_offset_and_the_last_stable_offset_of_completed_transactions(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    assert manager.first_unstable_offset() is None
    append_txn(manager, 1, 0, 0, 2, 0)                      # P1 opens at 0
    append_txn(manager, 2, 0, 0, 3, 2)                      # P2 opens at 2
    append_txn(manager, 1, 0, 2, 1, 5)
    assert manager.first_unstable_offset() == 0
    assert manager.open_transactions() == [(1, 0), (2, 2)]
    # P1 aborts at 6: the LSO recorded for it is P2's start, still open
    assert end_txn(manager, 1, 1, 6, commit=False) == CompletedTxn(1, 0, 6, True, 2)
    assert manager.open_transactions() == [(2, 2)]
    assert manager.first_unstable_offset() == 0, "unstable until the high watermark passes the marker"
    manager.on_high_watermark_updated(6)
    assert manager.first_unstable_offset() == 0
    manager.on_high_watermark_updated(7)
    assert manager.first_unstable_offset() == 2
    append_txn(manager, 3, 0, 0, 1, 7)                      # P3 opens at 7
    completed = end_txn(manager, 2, 1, 8, commit=True)      # P2 commits: P3 is the earliest open
    assert completed == CompletedTxn(2, 2, 8, False, 7)
    manager.on_high_watermark_updated(9)
    assert manager.first_unstable_offset() == 7
    assert end_txn(manager, 3, 1, 9, commit=False).to_aborted_txn() == AbortedTxn(3, 7, 9, 10)
    manager.on_high_watermark_updated(10)
    assert manager.first_unstable_offset() is None and manager.open_transactions() == []
    with pytest.raises(InvariantError, match="only aborted"):
        completed.to_aborted_txn()


def test_a_later_transaction_of_another_producer_is_not_the_first_unstable(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    append_txn(manager, 2, 0, 0, 1, 0)
    append_txn(manager, 1, 0, 0, 1, 1)
    end_txn(manager, 1, 1, 2, commit=True)                  # completes the later one
    manager.on_high_watermark_updated(3)
    assert manager.first_unstable_offset() == 0 and manager.open_transactions() == [(2, 0)]


def test_prepare_marker_changes_nothing_and_stale_markers_are_refused_as_bugs(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    append_txn(manager, 1, 0, 0, 2, 0)
    before = (manager.active_producers(), manager.open_transactions(), manager.first_unstable_offset())
    first = manager.prepare_marker(1, 1, 0, True, 5)
    also = manager.prepare_marker(1, 1, 0, False, 5)
    assert first.control_type == CONTROL_TYPE_COMMIT and also.control_type == CONTROL_TYPE_ABORT
    assert (manager.active_producers(), manager.open_transactions(), manager.first_unstable_offset()) == before
    with pytest.raises(InvariantError, match="not after its last batch"):
        manager.apply_marker(first, 1)
    manager.apply_marker(first, 2)
    with pytest.raises(InvariantError, match="moved between prepare_marker and apply_marker"):
        manager.apply_marker(also, 3)
    # a data batch prepared before the marker cannot be applied after it
    (tmp_path / "second").mkdir()
    manager2 = ProducerStateManager(str(tmp_path / "second"))
    append_txn(manager2, 1, 0, 0, 1, 0)
    late = manager2.prepare_append(txn_header(1, 0, 1, 1, 0), 0)
    end_txn(manager2, 1, 1, 1, commit=True)
    with pytest.raises(InvariantError, match="moved between prepare and apply"):
        manager2.apply(late, 2, 2)


def test_transactions_must_open_in_log_order(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    append_txn(manager, 1, 0, 0, 1, 10)
    with pytest.raises(InvariantError, match="out of log order"):
        append_txn(manager, 2, 0, 0, 1, 5)
    assert manager.open_transactions() == [(1, 10)] and manager.last_entry(2) is None


def test_origin_may_be_the_logs_enum(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    batch = header(PID, 0, -1, attributes=TRANSACTIONAL_FLAG)
    assert manager.prepare_append(batch, 0, origin=AppendOrigin.COORDINATOR).starts_transaction
    with pytest.raises(InvalidRecordError):
        manager.prepare_append(batch, 0, origin=AppendOrigin.CLIENT)
    with pytest.raises(InvariantError, match="unknown append origin"):
        manager.prepare_append(batch, 0, origin="replication")


def test_prepare_appends_carries_the_open_transaction_between_batches(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    with pytest.raises(InvalidTxnStateError):
        manager.prepare_appends([txn_header(PID, 0, 0, 2, 0), header(PID, 0, 2)], 0)
    appends = manager.prepare_appends([txn_header(PID, 0, 0, 2, 0), txn_header(PID, 0, 2, 1, 0)], 0)
    assert [a.starts_transaction for a in appends] == [True, False]
    manager.apply(appends[0], 0, 1)
    manager.apply(appends[1], 2, 2)
    assert manager.open_transactions() == [(PID, 0)] and manager.last_entry(PID).last_sequence == 2


def test_coordinator_appends_keep_no_sequences_and_survive_a_snapshot(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    for offset in (0, 1):
        manager.apply(manager.prepare_append(header(PID, 4, -1, attributes=TRANSACTIONAL_FLAG), 0,
                                             origin="coordinator"), offset, offset)
    entry = manager.last_entry(PID)
    assert entry.batches == () and entry.producer_epoch == 4 and entry.current_txn_first_offset == 0
    manager.take_snapshot(2)
    reloaded = ProducerStateManager(str(tmp_path))
    reloaded.load(0, 2)
    assert reloaded.last_entry(PID) == entry and reloaded.first_unstable_offset() == 0
    assert end_txn(reloaded, PID, 5, 2, commit=False) == CompletedTxn(PID, 0, 2, True, 3)


def test_open_transactions_survive_a_restart_with_the_same_lso(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    append_txn(manager, 1, 0, 0, 2, 0)
    append_txn(manager, 2, 3, 0, 1, 2)
    append_txn(manager, 3, 0, 0, 1, 3)
    end_txn(manager, 1, 1, 4, commit=True, coordinator_epoch=3)
    manager.on_high_watermark_updated(5)
    manager.take_snapshot(5)
    described = {d["producerId"]: d for d in read_snapshot_file(snapshot_path(str(tmp_path), 5))}
    assert (described[1]["coordinatorEpoch"], described[1]["currentTxnFirstOffset"]) == (3, -1)
    assert described[2]["currentTxnFirstOffset"] == 2 and described[3]["currentTxnFirstOffset"] == 3

    reloaded = ProducerStateManager(str(tmp_path))
    assert reloaded.load(0, 5) == 5
    assert reloaded.open_transactions() == manager.open_transactions() == [(2, 2), (3, 3)]
    assert reloaded.first_unstable_offset() == manager.first_unstable_offset() == 2
    with pytest.raises(EosError) as caught:
        reloaded.prepare_marker(1, 2, 2, True, 0)
    assert caught.value.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert end_txn(reloaded, 2, 4, 5, commit=False) == CompletedTxn(2, 2, 5, True, 3)
    with pytest.raises(InvalidProducerEpochError):
        reloaded.prepare_append(txn_header(2, 3, 1, 1, 0), 0)   # the aborted transaction's late write


def test_replay_rebuilds_transactions_and_the_completed_ones(tmp_path):
    """Live appends and markers, then a fresh manager replaying the same batches (from the
    log start, and from a snapshot in the middle) reaches the same state and reports the
    same completed transactions, with the same last stable offsets."""
    live = ProducerStateManager(str(tmp_path))
    log: list[tuple[BatchHeader, tuple[int, int] | None]] = []
    completed_live: list[CompletedTxn] = []

    def data_batch(pid, epoch, sequence, count, offset):
        append_txn(live, pid, epoch, sequence, count, offset)
        log.append((txn_header(pid, epoch, sequence, count, offset), None))

    def control(pid, epoch, offset, commit, coordinator_epoch):
        completed = end_txn(live, pid, epoch, offset, commit=commit, coordinator_epoch=coordinator_epoch)
        if completed is not None:
            completed_live.append(completed)
        log.append((marker_header(pid, epoch, offset),
                    (CONTROL_TYPE_COMMIT if commit else CONTROL_TYPE_ABORT, coordinator_epoch)))

    data_batch(1, 0, 0, 2, 0)
    data_batch(2, 0, 0, 1, 2)
    control(1, 1, 3, False, 0)          # aborted while 2 is open: lso 2
    data_batch(3, 7, 0, 2, 4)
    live.take_snapshot(6)
    control(5, 1, 6, True, 0)           # a marker for a producer with no data here
    control(2, 1, 7, True, 1)
    data_batch(1, 1, 0, 1, 8)
    control(3, 8, 9, False, 1)          # lso 8: producer 1's new transaction
    control(1, 2, 10, False, 1)         # nothing open after it: lso 11
    data_batch(2, 1, 0, 2, 11)
    assert [(c.producer_id, c.last_stable_offset) for c in completed_live] == [(1, 2), (2, 4), (3, 8), (1, 11)]

    for replay_from in (0, 6):
        replayed = ProducerStateManager(str(tmp_path))
        assert replayed.load(0, 13, snapshot_at_most=replay_from) == replay_from
        completed_replay = []
        for batch, control_marker in log:
            if batch.base_offset >= replay_from:
                completed = replayed.update_from_replay(batch, control_marker=control_marker)
                if completed is not None:
                    completed_replay.append(completed)
        assert completed_replay == [c for c in completed_live if c.last_offset >= replay_from]
        assert replayed.active_producers() == live.active_producers()
        assert replayed.open_transactions() == live.open_transactions() == [(2, 11)]
        replayed.on_high_watermark_updated(13)
        live.on_high_watermark_updated(13)
        assert replayed.first_unstable_offset() == live.first_unstable_offset() == 11


def test_replaying_a_control_batch_needs_its_marker(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    with pytest.raises(InvariantError, match="without its marker"):
        manager.update_from_replay(marker_header(PID, 1, 0))


def test_load_can_ignore_newer_snapshots_without_deleting_them(tmp_path):
    _write_two_snapshots(tmp_path)
    manager = ProducerStateManager(str(tmp_path))
    assert manager.load(0, 10, snapshot_at_most=7) == 6
    assert manager.snapshot_offsets() == [6, 8]
    assert manager.load(0, 10, snapshot_at_most=5) == 0 and manager.active_producers() == []
    assert manager.load(0, 10) == 8


def test_truncation_forgets_open_transactions_until_reload(tmp_path):
    manager = ProducerStateManager(str(tmp_path))
    append_txn(manager, 1, 0, 0, 1, 0)
    manager.take_snapshot(1)
    append_txn(manager, 2, 0, 0, 1, 1)
    manager.truncate_to(1)
    assert manager.open_transactions() == [] and manager.first_unstable_offset() is None
    with pytest.raises(InvariantError, match="load"):
        manager.prepare_marker(1, 1, 0, True, 0)
    assert manager.load(0, 1) == 1
    assert manager.open_transactions() == [(1, 0)] and manager.first_unstable_offset() == 0


def test_a_producer_expires_only_after_its_transaction_ends(tmp_path):
    manager = ProducerStateManager(str(tmp_path), producer_id_expiration_ms=HOUR_MS)
    append_txn(manager, 1, 0, 0, 1, 0)                      # timestamp 1_000
    assert manager.remove_expired(now_ms=10 * HOUR_MS) == []
    end_txn(manager, 1, 1, 1, commit=True, now_ms=9 * HOUR_MS)
    assert manager.remove_expired(now_ms=10 * HOUR_MS - 1) == [], "the marker's time restarts the clock"
    assert manager.remove_expired(now_ms=10 * HOUR_MS) == [1]


# ---- snapshots ------------------------------------------------------------------------------

def test_snapshot_round_trip_and_layout(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    append_at(manager, header(PID + 1, 2, SEQUENCE_MAX - 1, 4, timestamp_ms=7), 14)   # across the wrap
    manager.take_snapshot(18)
    path = snapshot_path(str(tmp_path), 18)
    assert os.path.basename(path) == "00000000000000000018.snapshot"
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000018.snapshot"]
    data = open(path, "rb").read()
    assert data[:2] == b"\x00\x01" and len(data) == 2 + 4 + 4 + 2 * 46
    # first entry, field by field: producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp,
    # coordinator_epoch, current_txn_first_offset
    assert data[10:10 + 46] == (PID.to_bytes(8, "big") + (3).to_bytes(2, "big") + (13).to_bytes(4, "big")
                                + (13).to_bytes(8, "big") + (1).to_bytes(4, "big") + (1_012).to_bytes(8, "big")
                                + (-1).to_bytes(4, "big", signed=True) + (-1).to_bytes(8, "big", signed=True))

    reloaded = ProducerStateManager(str(tmp_path))
    assert reloaded.load(0, 18) == 18
    entries = {e.producer_id: e for e in reloaded.active_producers()}
    assert entries[PID].producer_epoch == 3 and entries[PID].last_sequence == 13
    assert [(b.first_sequence, b.first_offset, b.last_offset) for b in entries[PID].batches] == [(12, 12, 13)]
    wrapped = entries[PID + 1].batches[0]
    assert (wrapped.first_sequence, wrapped.last_sequence, wrapped.first_offset, wrapped.last_offset) == (
        SEQUENCE_MAX - 1, 1, 14, 17)
    # after a restart only the last batch is known: its retry is a duplicate, older ones are out of order
    assert reloaded.prepare_append(header(PID, 3, 12, 2), 0) == DuplicateBatch(12, 13, 1_012)
    with pytest.raises(OutOfOrderSequenceError):
        reloaded.prepare_append(header(PID, 3, 10, 2), 0)
    assert isinstance(reloaded.prepare_append(header(PID + 1, 2, 2), 0), ProducerAppend)
    assert decode_snapshot(encode_snapshot(reloaded.active_producers())) == reloaded.active_producers()


def test_read_snapshot_file_describes_entries_for_dump_log(tmp_path):
    manager = manager_with(tmp_path, SEVEN)
    manager.take_snapshot(14)
    assert read_snapshot_file(snapshot_path(str(tmp_path), 14)) == [{
        "producerId": PID, "producerEpoch": 3, "coordinatorEpoch": -1, "currentTxnFirstOffset": -1,
        "lastTimestamp": 1_012, "firstSequence": 12, "lastSequence": 13, "lastOffset": 13, "offsetDelta": 1}]


def test_empty_snapshot_round_trip(tmp_path):
    ProducerStateManager(str(tmp_path)).take_snapshot(0)
    manager = ProducerStateManager(str(tmp_path))
    assert manager.load(0, 0) == 0 and manager.active_producers() == []
    assert manager.snapshot_offsets() == [0]


def _write_two_snapshots(tmp_path) -> ProducerStateManager:
    manager = manager_with(tmp_path, SEVEN[:3])          # sequences 0..5, offsets 0..5
    manager.take_snapshot(6)
    append_at(manager, header(PID, 3, 6, 2, timestamp_ms=5), 6)
    manager.take_snapshot(8)
    return manager


@pytest.mark.parametrize("damage", ["flip a byte", "flip a CRC byte", "truncate", "empty", "append a byte",
                                    "unknown version"])
def test_corrupt_snapshot_is_deleted_and_the_older_one_used(tmp_path, damage):
    _write_two_snapshots(tmp_path)
    path = snapshot_path(str(tmp_path), 8)
    data = bytearray(open(path, "rb").read())
    if damage == "flip a byte":
        data[20] ^= 0x01
    elif damage == "flip a CRC byte":
        data[3] ^= 0x80
    elif damage == "truncate":
        data = data[:-7]
    elif damage == "empty":
        data = bytearray()
    elif damage == "append a byte":
        data += b"\x00"
    else:
        data[1] = 2
    open(path, "wb").write(bytes(data))

    manager = ProducerStateManager(str(tmp_path))
    assert manager.load(0, 8) == 6
    assert not os.path.exists(path)
    assert manager.snapshot_offsets() == [6]
    assert manager.last_entry(PID).last_sequence == 5


def test_all_snapshots_corrupt_means_replay_from_log_start(tmp_path):
    _write_two_snapshots(tmp_path)
    for offset in (6, 8):
        open(snapshot_path(str(tmp_path), offset), "r+b").write(b"\xff\xff")
    manager = ProducerStateManager(str(tmp_path))
    assert manager.load(2, 8) == 2
    assert manager.active_producers() == [] and manager.snapshot_offsets() == []


def test_snapshot_beyond_log_end_is_deleted(tmp_path):
    _write_two_snapshots(tmp_path)
    manager = ProducerStateManager(str(tmp_path))
    assert manager.load(0, 7) == 6
    assert manager.snapshot_offsets() == [6]
    assert manager.last_entry(PID).last_sequence == 5


def test_snapshot_before_log_start_is_deleted_but_one_at_the_start_is_used(tmp_path):
    _write_two_snapshots(tmp_path)
    manager = ProducerStateManager(str(tmp_path))
    assert manager.load(8, 8) == 8
    assert manager.snapshot_offsets() == [8]
    # the producer's data may be gone by retention; its state stays until it expires (KIP-360)
    assert manager.last_entry(PID).last_sequence == 7
    assert manager.load(9, 12) == 9 and manager.snapshot_offsets() == []


def test_load_replaces_state_and_replay_rebuilds_it(tmp_path):
    source = _write_two_snapshots(tmp_path)
    append_at(source, header(PID, 3, 8, 3, timestamp_ms=6), 8)
    append_at(source, header(PID + 7, 1, 40, 2, timestamp_ms=6), 11)
    # a crash: the log holds offsets 0..12, the newest snapshot is at 8
    manager = ProducerStateManager(str(tmp_path))
    append_at(manager, header(PID + 99, 0, 0), 0)        # stale in-memory state is replaced
    replay_from = manager.load(0, 13)
    assert replay_from == 8
    manager.update_from_replay(header(PID, 3, 8, 3, base_offset=8, timestamp_ms=6))
    manager.update_from_replay(header(-1, -1, -1, 1, base_offset=11))          # not idempotent: ignored
    manager.update_from_replay(header(PID + 7, 1, 40, 2, base_offset=11, timestamp_ms=6))
    assert manager.last_entry(PID + 99) is None
    rebuilt = {e.producer_id: (e.producer_epoch, e.last_sequence, e.last_offset, e.last_timestamp_ms)
               for e in manager.active_producers()}
    original = {e.producer_id: (e.producer_epoch, e.last_sequence, e.last_offset, e.last_timestamp_ms)
                for e in source.active_producers()}
    assert rebuilt == original
    assert manager.prepare_append(header(PID, 3, 8, 3), 0) == DuplicateBatch(8, 10, 6)
    assert manager.prepare_append(header(PID, 3, 6, 2), 0) == DuplicateBatch(6, 7, 5)


def test_truncate_drops_later_snapshots_and_requires_a_reload(tmp_path):
    manager = _write_two_snapshots(tmp_path)
    manager.take_snapshot(10)
    manager.truncate_to(7)
    assert manager.snapshot_offsets() == [6]
    with pytest.raises(InvariantError, match="load"):
        manager.prepare_append(header(PID, 3, 6), 0)
    assert manager.load(0, 7) == 6
    manager.update_from_replay(header(PID, 3, 6, 1, base_offset=6))
    assert manager.last_entry(PID).last_sequence == 6


def test_delete_snapshots_before(tmp_path):
    manager = _write_two_snapshots(tmp_path)
    manager.take_snapshot(10)
    manager.delete_snapshots_before(8)
    assert manager.snapshot_offsets() == [8, 10]


def test_stray_files_are_left_alone_and_temp_snapshots_removed(tmp_path):
    manager = _write_two_snapshots(tmp_path)
    (tmp_path / "00000000000000000000.log").write_bytes(b"")
    (tmp_path / "notes.snapshot").write_bytes(b"x")
    (tmp_path / "00000000000000000009.snapshot.tmp").write_bytes(b"half")
    assert manager.load(0, 10) == 8
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000000.log", "00000000000000000006.snapshot",
                                            "00000000000000000008.snapshot", "notes.snapshot"]


# ---- expiration -------------------------------------------------------------------------------

def test_idle_producers_expire(tmp_path):
    manager = ProducerStateManager(str(tmp_path), producer_id_expiration_ms=HOUR_MS)
    append_at(manager, header(1, 0, 0, timestamp_ms=10_000), 0)
    append_at(manager, header(2, 0, 0, timestamp_ms=10_000 + HOUR_MS), 1)
    assert manager.remove_expired(now_ms=10_000 + HOUR_MS - 1) == []
    assert manager.remove_expired(now_ms=10_000 + HOUR_MS) == [1]
    assert [e.producer_id for e in manager.active_producers()] == [2]
    # an expired producer is unknown again: any sequence is accepted (KIP-360)
    assert isinstance(manager.prepare_append(header(1, 0, 17), 0), ProducerAppend)
    assert manager.remove_expired(now_ms=10_000 + 2 * HOUR_MS) == [2]


def test_expired_producers_are_not_loaded_from_a_snapshot(tmp_path):
    manager = ProducerStateManager(str(tmp_path), producer_id_expiration_ms=HOUR_MS)
    append_at(manager, header(1, 0, 0, timestamp_ms=0), 0)
    append_at(manager, header(2, 0, 0, timestamp_ms=HOUR_MS), 1)
    manager.take_snapshot(2)
    assert manager.load(0, 2, now_ms=HOUR_MS + 1) == 2
    assert [e.producer_id for e in manager.active_producers()] == [2]
    assert manager.load(0, 2) == 2 and len(manager.active_producers()) == 2


def test_open_transaction_never_expires(tmp_path):
    # issue 4 will set current_txn_first_offset; a snapshot can already carry it
    manager = ProducerStateManager(str(tmp_path), producer_id_expiration_ms=HOUR_MS)
    append_at(manager, header(1, 0, 0, timestamp_ms=0, attributes=TRANSACTIONAL_FLAG), 0)
    entry = manager.last_entry(1)
    data = encode_snapshot([type(entry)(entry.producer_id, entry.producer_epoch, entry.batches,
                                        entry.last_timestamp_ms, 5, 0)])
    open(snapshot_path(str(tmp_path), 1), "wb").write(data)
    manager.load(0, 1)
    assert manager.last_entry(1).current_txn_first_offset == 0
    assert manager.remove_expired(now_ms=10 * HOUR_MS) == []


# ---- stateful: sends, retries, fencing, transactions, markers, restarts against a model -----------

PRODUCERS = (11, 12, 13)
START_SEQUENCE = {11: 0, 12: 0, 13: SEQUENCE_MAX - 6}   # producer 13 crosses the wrap soon


@dataclasses.dataclass
class ModelProducer:
    epoch: int
    batches: list            # [(first_seq, last_seq, off0, off1, ts)], at most RETAINED_BATCHES_MAX
    txn_first_offset: int = -1
    coordinator_epoch: int = -1
    last_timestamp_ms: int = -1


class Model:
    """Kafka's rules written as plainly as possible, over the model's own log."""

    def __init__(self):
        self.producers: dict[int, ModelProducer] = {}
        self.unreplicated: list[tuple] = []      # completed (pid, first, last, aborted, lso), marker >= hw

    def decide_data(self, pid, epoch, first, last, transactional, origin):
        p = self.producers.get(pid)
        client = origin == "client"
        if p is None:
            return ("out_of_order",) if client and transactional and first != 0 else ("append",)
        if epoch < p.epoch:
            return ("fenced",)
        if client and epoch == p.epoch:
            for b in p.batches:
                if (b[0], b[1]) == (first, last):
                    return ("duplicate", b[2], b[3], b[4])
            if first != ((p.batches[-1][1] + 1) % 2**31 if p.batches else 0):
                return ("out_of_order",)
        if client and epoch > p.epoch and first != 0:
            return ("out_of_order",)
        if p.txn_first_offset >= 0 and not transactional:
            return ("txn_state",)
        return ("append",)

    def record_data(self, pid, epoch, first, last, off0, off1, ts, transactional):
        p = self.producers.get(pid)
        if p is None:
            p = self.producers[pid] = ModelProducer(epoch, [])
        batches = p.batches if p.epoch == epoch else []
        if first != -1:
            batches = (batches + [(first, last, off0, off1, ts)])[-RETAINED_BATCHES_MAX:]
        p.epoch, p.batches, p.last_timestamp_ms = epoch, batches, ts
        if transactional and p.txn_first_offset < 0:
            p.txn_first_offset = off0

    def decide_marker(self, pid, epoch, coordinator_epoch):
        p = self.producers.get(pid)
        if p is not None:
            if epoch < p.epoch or (epoch == p.epoch and p.txn_first_offset >= 0):
                return ("fenced",)
            if coordinator_epoch < p.coordinator_epoch:
                return ("coordinator_fenced",)
        return ("marker",)

    def record_marker(self, pid, epoch, coordinator_epoch, offset, committed, ts):
        p = self.producers.get(pid)
        if p is None:
            p = self.producers[pid] = ModelProducer(epoch, [])
        completed = None
        if p.txn_first_offset >= 0:
            others = [q.txn_first_offset for qid, q in self.producers.items()
                      if qid != pid and q.txn_first_offset >= 0]
            completed = CompletedTxn(pid, p.txn_first_offset, offset, not committed,
                                     min(others) if others else offset + 1)
            self.unreplicated.append(completed)
        if p.epoch != epoch:
            p.batches = []
        p.epoch, p.coordinator_epoch, p.txn_first_offset = epoch, coordinator_epoch, -1
        p.last_timestamp_ms = ts
        return completed

    def high_watermark(self, hw):
        self.unreplicated = [c for c in self.unreplicated if c.last_offset >= hw]

    def first_unstable_offset(self):
        firsts = [p.txn_first_offset for p in self.producers.values() if p.txn_first_offset >= 0]
        firsts += [c.first_offset for c in self.unreplicated]
        return min(firsts) if firsts else None

    def snapshot(self):
        """Kafka's snapshot keeps one timestamp per producer: the last batch comes back with
        the producer's last timestamp (a later marker's or coordinator append's)."""
        return {pid: ModelProducer(p.epoch, [b[:4] + (p.last_timestamp_ms,) for b in p.batches[-1:]],
                                   p.txn_first_offset, p.coordinator_epoch, p.last_timestamp_ms)
                for pid, p in self.producers.items()}


def outcome_of(manager, batch, now_ms, origin="client"):
    try:
        result = manager.prepare_append(batch, now_ms, origin=origin)
    except OutOfOrderSequenceError:
        return ("out_of_order",), None
    except InvalidProducerEpochError:
        return ("fenced",), None
    except InvalidTxnStateError:
        return ("txn_state",), None
    if isinstance(result, DuplicateBatch):
        return ("duplicate", result.first_offset, result.last_offset, result.timestamp_ms), None
    return ("append",), result


def marker_outcome_of(manager, pid, epoch, coordinator_epoch, committed, now_ms):
    try:
        return ("marker",), manager.prepare_marker(pid, epoch, coordinator_epoch, committed, now_ms)
    except InvalidProducerEpochError:
        return ("fenced",), None
    except EosError as e:
        assert e.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED, e
        return ("coordinator_fenced",), None


@settings(max_examples=80, stateful_step_count=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
class ProducerStateMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        import tempfile
        self._dir = tempfile.TemporaryDirectory()
        self.manager = ProducerStateManager(self._dir.name)
        self.model = Model()
        # ("data", pid, epoch, first, last, off0, off1, ts, transactional)
        # ("marker", pid, epoch, coordinator_epoch, offset, committed, ts)
        self.log: list[tuple] = []
        self.completed_at: dict[int, CompletedTxn | None] = {}   # marker offset -> what it completed, live
        self.clock_ms = 1_000
        self.high_watermark = 0
        self.coordinator_epoch = 0
        self.epoch = {pid: 0 for pid in PRODUCERS}               # the client's idea of its epoch
        self.next_seq = dict(START_SEQUENCE)
        self.sent: dict[int, list[BatchHeader]] = {pid: [] for pid in PRODUCERS}   # this epoch, accepted
        self.snapshot_state: tuple[int, dict] | None = None   # (offset, model snapshot)

    def teardown(self):
        self._dir.cleanup()

    @property
    def end_offset(self) -> int:
        if not self.log:
            return 0
        last = self.log[-1]
        return (last[6] if last[0] == "data" else last[4]) + 1

    def _state(self):
        return (self.manager.active_producers(), self.manager.open_transactions(),
                self.manager.first_unstable_offset())

    def send(self, batch: BatchHeader, origin: str = "client") -> tuple:
        self.clock_ms += 1
        expected = self.model.decide_data(batch.producer_id, batch.producer_epoch, batch.base_sequence,
                                          batch.last_sequence, batch.is_transactional, origin)
        before = self._state()
        got, append = outcome_of(self.manager, batch, self.clock_ms, origin)
        assert self._state() == before, "prepare_append changed the state"
        assert got == expected, f"{batch}: manager {got}, model {expected}"
        if append is not None:
            off0 = self.end_offset
            off1 = off0 + batch.last_offset_delta
            self.manager.apply(append, off0, off1)
            entry = ("data", batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.last_sequence,
                     off0, off1, batch.max_timestamp, batch.is_transactional)
            self.log.append(entry)
            self.model.record_data(*entry[1:])
        return got

    def send_marker(self, pid: int, epoch: int, coordinator_epoch: int, committed: bool) -> tuple:
        self.clock_ms += 1
        expected = self.model.decide_marker(pid, epoch, coordinator_epoch)
        before = self._state()
        got, append = marker_outcome_of(self.manager, pid, epoch, coordinator_epoch, committed, self.clock_ms)
        assert self._state() == before, "prepare_marker changed the state"
        assert got == expected, f"marker {pid} e{epoch} c{coordinator_epoch}: manager {got}, model {expected}"
        if append is not None:
            offset = self.end_offset
            completed = self.manager.apply_marker(append, offset)
            assert completed == self.model.record_marker(pid, epoch, coordinator_epoch, offset, committed,
                                                         self.clock_ms)
            self.completed_at[offset] = completed
            self.log.append(("marker", pid, epoch, coordinator_epoch, offset, committed, self.clock_ms))
        return got

    def fresh(self, pid: int, count: int, base_sequence: int | None = None, epoch: int | None = None,
              transactional: bool = False):
        return header(pid, self.epoch[pid] if epoch is None else epoch,
                      self.next_seq[pid] if base_sequence is None else base_sequence, count,
                      timestamp_ms=self.clock_ms + 1, attributes=TRANSACTIONAL_FLAG if transactional else 0)

    @rule(pid=st.sampled_from(PRODUCERS), count=st.integers(1, 4), transactional=st.booleans())
    def send_next(self, pid, count, transactional):
        batch = self.fresh(pid, count, transactional=transactional)
        if self.send(batch) == ("append",):
            self.next_seq[pid] = (batch.last_sequence + 1) % 2**31
            self.sent[pid].append(batch)

    @precondition(lambda self: any(self.sent.values()))
    @rule(data=st.data(), back=st.integers(1, RETAINED_BATCHES_MAX + 2))
    def retry(self, data, back):
        pid = data.draw(st.sampled_from([p for p in PRODUCERS if self.sent[p]]))
        history = self.sent[pid]
        original = history[-min(back, len(history))]
        result = self.send(original)
        if min(back, len(history)) <= RETAINED_BATCHES_MAX and self.snapshot_state is None:
            assert result[0] == "duplicate"   # no restart yet: all five retries are recognised

    @precondition(lambda self: any(self.sent.values()))
    @rule(data=st.data(), skip=st.integers(1, 3))
    def gap(self, data, skip):
        pid = data.draw(st.sampled_from([p for p in PRODUCERS if self.sent[p]]))
        assert self.send(self.fresh(pid, 1, (self.next_seq[pid] + skip) % 2**31)) == ("out_of_order",)

    @precondition(lambda self: any(self.sent.values()))
    @rule(data=st.data(), shift=st.sampled_from([(1, 0), (0, 1), (0, -1), (-1, 0)]))
    def overlap(self, data, shift):
        pid = data.draw(st.sampled_from([p for p in PRODUCERS if self.sent[p]]))
        original = data.draw(st.sampled_from(self.sent[pid][-RETAINED_BATCHES_MAX:]))
        count = original.records_count + shift[1] - shift[0]
        assume(count >= 1)
        base = (original.base_sequence + shift[0]) % 2**31
        self.send(header(pid, original.producer_epoch, base, count, timestamp_ms=self.clock_ms,
                         attributes=original.attributes))

    @precondition(lambda self: any(self.epoch[p] > 0 for p in PRODUCERS))
    @rule(data=st.data(), transactional=st.booleans())
    def stale_epoch(self, data, transactional):
        pid = data.draw(st.sampled_from([p for p in PRODUCERS if self.epoch[p] > 0]))
        known = self.manager.last_entry(pid) is not None
        result = self.send(self.fresh(pid, 1, epoch=self.epoch[pid] - 1, transactional=transactional))
        if known and self.manager.last_entry(pid).producer_epoch == self.epoch[pid]:
            assert result == ("fenced",)

    @rule(pid=st.sampled_from(PRODUCERS), bad_start=st.booleans(), count=st.integers(1, 4),
          transactional=st.booleans())
    def bump_epoch(self, pid, bad_start, count, transactional):
        """The idempotent client's own bump (KIP-360)."""
        self.epoch[pid] += 1
        if bad_start and self.manager.last_entry(pid) is not None:
            assert self.send(self.fresh(pid, 1, base_sequence=5)) == ("out_of_order",)
        self.next_seq[pid] = 0
        self.sent[pid] = []
        self.send_next(pid, count, transactional)

    @rule(pid=st.sampled_from(PRODUCERS), committed=st.booleans(), coordinator_delta=st.sampled_from([0, 0, -1, 1]))
    def end_transaction(self, pid, committed, coordinator_delta):
        """The coordinator's marker with the bumped epoch (KIP-890), from the current
        coordinator, a deposed one (-1) or a new one (+1, a failover)."""
        coordinator_epoch = max(0, self.coordinator_epoch + coordinator_delta)
        if self.send_marker(pid, self.epoch[pid] + 1, coordinator_epoch, committed) == ("marker",):
            self.coordinator_epoch = max(self.coordinator_epoch, coordinator_epoch)
            self.epoch[pid] += 1
            self.next_seq[pid] = 0
            self.sent[pid] = []

    @rule(pid=st.sampled_from(PRODUCERS), back=st.integers(0, 2), committed=st.booleans())
    def stale_marker(self, pid, back, committed):
        """A retried or late marker: the current epoch (a retry, fine if nothing is open) or older."""
        self.send_marker(pid, max(0, self.epoch[pid] - back), self.coordinator_epoch, committed)

    @rule(pid=st.sampled_from(PRODUCERS), stale=st.booleans(), transactional=st.booleans(),
          count=st.integers(1, 3))
    def coordinator_append(self, pid, stale, transactional, count):
        """The group coordinator writing a TxnOffsetCommit for the producer (no sequence)."""
        batch = self.fresh(pid, count, base_sequence=-1, epoch=max(0, self.epoch[pid] - stale),
                           transactional=transactional)
        self.send(batch, origin="coordinator")

    @rule()
    def advance_high_watermark(self):
        self.high_watermark = self.end_offset
        self.manager.on_high_watermark_updated(self.high_watermark)
        self.model.high_watermark(self.high_watermark)

    @rule()
    def snapshot(self):
        self.manager.take_snapshot(self.end_offset)
        self.snapshot_state = (self.end_offset, self.model.snapshot())

    @rule()
    def restart(self):
        """A new manager over the same directory: newest snapshot, then replay of the log,
        then the high watermark at the log end (one node)."""
        self.manager = ProducerStateManager(self._dir.name)
        replay_from = self.manager.load(0, self.end_offset)
        expected_from, state = self.snapshot_state if self.snapshot_state else (0, {})
        assert replay_from == expected_from
        self.model.producers = {pid: ModelProducer(p.epoch, list(p.batches), p.txn_first_offset,
                                                   p.coordinator_epoch, p.last_timestamp_ms)
                                for pid, p in state.items()}
        self.model.unreplicated = []
        for entry in self.log:
            if entry[0] == "data":
                _, pid, epoch, first, last, off0, off1, ts, transactional = entry
                if off0 >= replay_from:
                    batch = header(pid, epoch, first, off1 - off0 + 1, base_offset=off0, timestamp_ms=ts,
                                   attributes=TRANSACTIONAL_FLAG if transactional else 0)
                    assert self.manager.update_from_replay(batch) is None
                    self.model.record_data(pid, epoch, first, last, off0, off1, ts, transactional)
            else:
                _, pid, epoch, coordinator_epoch, offset, committed, ts = entry
                if offset >= replay_from:
                    control = header(pid, epoch, -1, 1, base_offset=offset, timestamp_ms=ts,
                                     attributes=TRANSACTIONAL_FLAG | CONTROL_FLAG)
                    completed = self.manager.update_from_replay(control, control_marker=(
                        CONTROL_TYPE_COMMIT if committed else CONTROL_TYPE_ABORT, coordinator_epoch))
                    # the transaction index rebuilt from the log equals the one written live
                    assert completed == self.completed_at[offset]
                    self.model.record_marker(pid, epoch, coordinator_epoch, offset, committed, ts)
        self.advance_high_watermark()

    @invariant()
    def state_matches_the_model(self):
        for pid in PRODUCERS:
            entry = self.manager.last_entry(pid)
            model = self.model.producers.get(pid)
            if model is None:
                assert entry is None
                continue
            assert (entry.producer_epoch, entry.current_txn_first_offset, entry.coordinator_epoch,
                    entry.last_timestamp_ms) == (model.epoch, model.txn_first_offset, model.coordinator_epoch,
                                                 model.last_timestamp_ms)
            assert [(b.first_sequence, b.last_sequence, b.first_offset, b.last_offset, b.max_timestamp_ms)
                    for b in entry.batches] == model.batches

    @invariant()
    def first_unstable_offset_matches_the_model(self):
        assert self.manager.first_unstable_offset() == self.model.first_unstable_offset()
        assert self.manager.open_transactions() == sorted(
            ((pid, p.txn_first_offset) for pid, p in self.model.producers.items() if p.txn_first_offset >= 0),
            key=lambda t: t[1])

    @invariant()
    def log_is_exactly_once_in_order(self):
        last: dict[tuple[int, int], int] = {}
        epochs: dict[int, int] = {}
        coordinator_first: set[tuple[int, int]] = set()
        for entry in self.log:
            pid, epoch = entry[1], entry[2]
            assert epoch >= epochs.get(pid, epoch), "an older epoch was appended after a newer one"
            epochs[pid] = epoch
            if entry[0] == "data" and entry[3] == -1 and (pid, epoch) not in last:
                coordinator_first.add((pid, epoch))
            if entry[0] != "data" or entry[3] == -1:
                continue                       # markers and coordinator appends carry no sequence
            first, last_seq = entry[3], entry[4]
            key = (pid, epoch)
            if key in last:
                assert first == (last[key] + 1) % 2**31, f"gap or duplicate in {key}: {last[key]} then {first}"
            elif key in coordinator_first:
                # the epoch was opened by a coordinator append (no sequence): the producer is
                # known with nothing retained, and such a producer starts at 0
                assert first == 0
            else:
                assert first == (START_SEQUENCE[pid] if epoch == 0 else 0)
            last[key] = last_seq


TestProducerStateMachine = ProducerStateMachine.TestCase
