"""Table tests of the transaction state machine (txn_coordinator.state), legal and illegal."""
from __future__ import annotations

import dataclasses
import itertools

import pytest

from eos.errors import ErrorCode, InvariantError
from eos.types import TopicPartition
from txn_coordinator.state import (EPOCH_MAX, VALID_PREVIOUS_STATES, TxnCoordinatorCore, TxnMetadata,
                                   TxnState, _transition)

S = TxnState
TP0, TP1 = TopicPartition("out", 0), TopicPartition("out", 1)
TIMEOUT_MS = 60_000


class Ids:
    def __init__(self, start: int = 1000):
        self._next = itertools.count(start)

    def __call__(self) -> int:
        return next(self._next)


def settle(core: TxnCoordinatorCore, decision):
    """Play the shell: the log accepts the proposed write."""
    assert decision.write is not None, decision
    return core.write_completed(decision.write)


def started(core=None, ids=None, now_ms=0):
    """A core with 'app' initialised (pid 1000, epoch 0)."""
    core = core or TxnCoordinatorCore()
    ids = ids or Ids()
    settle(core, core.init_producer_id("app", TIMEOUT_MS, now_ms, ids))
    return core, ids


def ongoing(now_ms=0):
    core, ids = started(now_ms=now_ms)
    settle(core, core.add_partitions("app", 1000, 0, [TP0, TP1], now_ms))
    return core, ids


def test_transition_table_is_exactly_kafkas():
    legal = {(prev, new) for new, prevs in VALID_PREVIOUS_STATES.items() for prev in prevs}
    base = TxnMetadata("t", 1, 0, -1, -1, 1000, S.EMPTY, frozenset(), -1, 0)
    for prev, new in itertools.product(S, S):
        md = dataclasses.replace(base, state=prev)
        if (prev, new) in legal:
            assert _transition(md, state=new).state is new
        else:
            with pytest.raises(InvariantError, match="illegal transaction transition"):
                _transition(md, state=new)
    assert (S.ONGOING, S.COMPLETE_COMMIT) not in legal  # a commit is always decided first
    assert (S.PREPARE_COMMIT, S.PREPARE_ABORT) not in legal  # a decision is final


def test_init_new_id_gets_epoch_zero_after_the_write():
    core, ids = TxnCoordinatorCore(), Ids()
    d = core.init_producer_id("app", TIMEOUT_MS, 5, ids)
    assert (d.producer_id, d.producer_epoch, d.write.state) == (1000, 0, S.EMPTY)
    assert core.describe("app") is None          # nothing durable until the log has it
    again = core.init_producer_id("app", TIMEOUT_MS, 5, ids)
    assert again.error is ErrorCode.CONCURRENT_TRANSACTIONS
    assert settle(core, d) is None
    assert core.describe("app").producer_epoch == 0


@pytest.mark.parametrize("timeout_ms", [0, -1, 900_001])
def test_init_refuses_bad_timeouts(timeout_ms):
    d = TxnCoordinatorCore().init_producer_id("app", timeout_ms, 0, Ids())
    assert d.error is ErrorCode.INVALID_TRANSACTION_TIMEOUT and d.write is None


def test_reinit_when_idle_bumps_the_epoch():
    core, ids = started()
    d = core.init_producer_id("app", TIMEOUT_MS, 1, ids)
    assert (d.producer_id, d.producer_epoch) == (1000, 1)
    settle(core, d)
    md = core.describe("app")
    assert (md.last_producer_id, md.last_producer_epoch) == (1000, 0)


def test_reinit_while_ongoing_fences_and_aborts_the_old_instance():
    core, ids = ongoing()
    d = core.init_producer_id("app", TIMEOUT_MS, 1, ids)
    assert d.error is ErrorCode.CONCURRENT_TRANSACTIONS
    assert d.write.state is S.PREPARE_ABORT and d.write.producer_epoch == 1
    markers = settle(core, d)
    assert not markers.committed and markers.producer_epoch == 1 and markers.partitions == {TP0, TP1}
    # the zombie (epoch 0) can do nothing any more
    assert core.add_partitions("app", 1000, 0, [TP0], 2).error is ErrorCode.PRODUCER_FENCED
    settle(core, core.markers_written("app", 3))
    assert core.end_transaction("app", 1000, 0, False, 4, ids).error is ErrorCode.PRODUCER_FENCED
    retry = core.init_producer_id("app", TIMEOUT_MS, 5, ids)
    assert retry.ok and retry.producer_epoch == 2


def test_add_partitions_starts_a_transaction_once():
    core, ids = started()
    d = core.add_partitions("app", 1000, 0, [TP0], 7)
    assert d.write.state is S.ONGOING and d.write.start_time_ms == 7
    settle(core, d)
    again = core.add_partitions("app", 1000, 0, [TP0], 9)
    assert again.ok and again.write is None      # already registered: nothing to write
    more = core.add_partitions("app", 1000, 0, [TP1], 9)
    assert more.write.partitions == {TP0, TP1} and more.write.start_time_ms == 7


@pytest.mark.parametrize("pid, epoch, error", [
    (999, 0, ErrorCode.INVALID_PRODUCER_ID_MAPPING),
    (1000, 1, ErrorCode.PRODUCER_FENCED),
    (1000, -1, ErrorCode.PRODUCER_FENCED),
])
def test_add_partitions_checks_the_producer(pid, epoch, error):
    core, _ = started()
    d = core.add_partitions("app", pid, epoch, [TP0], 1)
    assert d.error is error and d.write is None and d.partition_errors == {TP0: error}


def test_add_partitions_for_unknown_id():
    d = TxnCoordinatorCore().add_partitions("nobody", 1, 0, [TP0], 1)
    assert d.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING


@pytest.mark.parametrize("commit", [True, False])
def test_end_transaction_decides_bumps_epoch_then_completes(commit):
    core, ids = ongoing()
    d = core.end_transaction("app", 1000, 0, commit, 10, ids)
    assert d.write.state is (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT)
    assert (d.producer_id, d.producer_epoch) == (1000, 1)   # KIP-890: bumped at every end
    markers = settle(core, d)
    assert markers.committed is commit and markers.producer_epoch == 1
    assert markers.partitions == {TP0, TP1}
    # nothing else may happen to the id until the markers are written
    assert core.add_partitions("app", 1000, 1, [TP0], 11).error is ErrorCode.CONCURRENT_TRANSACTIONS
    done = core.markers_written("app", 12)
    assert done.write.state is (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert settle(core, done) is None
    md = core.describe("app")
    assert md.partitions == frozenset() and md.start_time_ms == -1
    # the next transaction starts with the new epoch
    assert core.add_partitions("app", 1000, 1, [TP0], 13).write.state is S.ONGOING


def test_end_transaction_retry_with_the_old_epoch():
    core, ids = ongoing()
    settle(core, core.end_transaction("app", 1000, 0, True, 10, ids))
    assert core.end_transaction("app", 1000, 0, True, 11, ids).error is ErrorCode.CONCURRENT_TRANSACTIONS
    settle(core, core.markers_written("app", 12))
    retry = core.end_transaction("app", 1000, 0, True, 13, ids)
    assert retry.ok and retry.write is None and retry.producer_epoch == 1
    wrong = core.end_transaction("app", 1000, 0, False, 13, ids)
    assert wrong.error is ErrorCode.PRODUCER_FENCED


@pytest.mark.parametrize("commit, error", [(True, ErrorCode.INVALID_TXN_STATE), (False, ErrorCode.NONE)])
def test_end_transaction_with_nothing_open(commit, error):
    core, ids = started()
    d = core.end_transaction("app", 1000, 0, commit, 1, ids)
    assert d.error is error and d.write is None


def test_epoch_exhaustion_rotates_the_producer_id():
    core, ids = ongoing()
    md = core.describe("app")
    core.durable["app"] = dataclasses.replace(md, producer_epoch=EPOCH_MAX - 1)
    d = core.end_transaction("app", 1000, EPOCH_MAX - 1, True, 1, ids)
    assert (d.producer_id, d.producer_epoch) == (1001, 0)
    assert (d.write.last_producer_id, d.write.last_producer_epoch) == (1000, EPOCH_MAX - 1)


def test_timeout_aborts_and_fences():
    core, ids = ongoing(now_ms=100)
    assert core.expire(100 + TIMEOUT_MS, ids) == []             # not past the timeout yet
    [d] = core.expire(101 + TIMEOUT_MS, ids)
    assert d.write.state is S.PREPARE_ABORT and d.write.producer_epoch == 1
    markers = settle(core, d)
    assert not markers.committed
    assert core.end_transaction("app", 1000, 0, True, 200_000, ids).error is ErrorCode.PRODUCER_FENCED


def test_idle_ids_expire_to_a_tombstone():
    core, ids = started(now_ms=0)
    core.transactional_id_expiration_ms = 1000
    [d] = core.expire(1001, ids)
    assert d.write.state is S.DEAD
    settle(core, d)
    assert core.describe("app") is None


def test_write_failure_leaves_durable_state_alone():
    core, ids = ongoing()
    before = core.describe("app")
    d = core.end_transaction("app", 1000, 0, True, 10, ids)
    core.write_failed(d.write)
    assert core.describe("app") == before and not core.pending
    assert core.end_transaction("app", 1000, 0, True, 11, ids).write.state is S.PREPARE_COMMIT


def test_reload_finds_decided_transactions_to_finish():
    core, ids = ongoing()
    d = core.end_transaction("app", 1000, 0, True, 10, ids)
    settle(core, d)
    reloaded = TxnCoordinatorCore(coordinator_epoch=1)
    for md in [core.describe("app")]:
        reloaded.replay(md, md.transactional_id)
    [markers] = reloaded.unfinished_markers()
    assert markers.committed and markers.coordinator_epoch == 1 and markers.partitions == {TP0, TP1}


def test_list_filters():
    core, ids = ongoing(now_ms=0)
    settle(core, core.init_producer_id("idle", TIMEOUT_MS, 0, ids))
    assert [m.transactional_id for m in core.list(states=[S.ONGOING])] == ["app"]
    assert [m.transactional_id for m in core.list(producer_ids=[1001])] == ["idle"]
    assert [m.transactional_id for m in core.list(running_longer_than_ms=50, now_ms=100)] == ["app"]
    assert core.list(running_longer_than_ms=500, now_ms=100) == []


def test_verify_partitions_answers_without_writing():
    core, ids = ongoing()
    TP9 = TopicPartition("out", 9)
    d = core.verify_partitions("app", 1000, 0, [TP0, TP9])
    assert d.write is None and not core.pending
    assert d.partition_errors == {TP0: ErrorCode.NONE, TP9: ErrorCode.INVALID_TXN_STATE}
    assert "out-9" in d.message
    fenced = core.verify_partitions("app", 1000, 1, [TP0])
    assert fenced.partition_errors == {TP0: ErrorCode.PRODUCER_FENCED}
    settle(core, core.end_transaction("app", 1000, 0, True, 10, ids))
    late = core.verify_partitions("app", 1000, 1, [TP0])     # the transaction is decided
    assert late.partition_errors == {TP0: ErrorCode.INVALID_TXN_STATE}


def test_markers_after_rotation_use_the_old_id_with_the_last_epoch():
    core, ids = ongoing()
    core.durable["app"] = dataclasses.replace(core.describe("app"), producer_epoch=EPOCH_MAX - 1)
    markers = settle(core, core.end_transaction("app", 1000, EPOCH_MAX - 1, True, 1, ids))
    assert (markers.producer_id, markers.producer_epoch) == (1000, EPOCH_MAX)
    md = core.describe("app")
    assert (md.producer_id, md.producer_epoch) == (1001, 0)


def test_fenced_abort_markers_use_the_bumped_epoch_of_the_same_id():
    core, ids = ongoing()
    markers = settle(core, core.init_producer_id("app", TIMEOUT_MS, 1, ids))
    assert (markers.producer_id, markers.producer_epoch) == (1000, 1)
