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


def only(group):
    """The one marker entry of a decision without participants."""
    [entry] = group.entries
    return entry


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
    markers = only(settle(core, d))
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
    markers = only(settle(core, d))
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


def test_a_marker_group_is_current_only_while_its_transaction_awaits_it_at_its_epoch():
    """The marker thread asks before it sends and before it completes: a group queued
    before the id's partition moved away and back, or for a transaction already completed,
    is stale (completing twice killed the marker thread in a chaos run)."""
    core, ids = ongoing()
    epochs = {"app": 3}
    core.epoch_of = lambda tid: epochs[tid]
    group = settle(core, core.end_transaction("app", 1000, 0, True, 10, ids))
    assert group.coordinator_epoch == 3 and core.awaits_markers(group)
    epochs["app"] = 4                   # the partition went away and came back: a new load
    assert not core.awaits_markers(group)
    reloaded = core.unfinished_markers()[0]
    assert reloaded.coordinator_epoch == 4 and core.awaits_markers(reloaded)
    done = core.markers_written("app", 12)
    assert not core.awaits_markers(reloaded)       # the Complete* write is pending
    settle(core, done)
    assert not core.awaits_markers(reloaded)       # and now it is complete
    with pytest.raises(InvariantError, match="in state CompleteCommit"):
        core.markers_written("app", 13)


def test_a_write_in_flight_while_the_partition_reloads_is_no_longer_awaited():
    """The shell asks before it applies a written record: a reload (a new leader epoch of
    the id's partition) dropped the pending write, and the client is told to retry."""
    core, ids = ongoing()
    decision = core.end_transaction("app", 1000, 0, True, 10, ids)
    assert core.awaits_write(decision.write)
    core.unload(["app"])                         # the load that takes the partition again
    assert not core.awaits_write(decision.write)
    with pytest.raises(InvariantError, match="does not match the pending write"):
        core.write_completed(decision.write)


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
    markers = only(settle(core, d))
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
    [group] = reloaded.unfinished_markers()
    markers = only(group)
    assert markers.committed and group.coordinator_epoch == 1 and markers.partitions == {TP0, TP1}


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
    markers = only(settle(core, core.end_transaction("app", 1000, EPOCH_MAX - 1, True, 1, ids)))
    assert (markers.producer_id, markers.producer_epoch) == (1000, EPOCH_MAX)
    md = core.describe("app")
    assert (md.producer_id, md.producer_epoch) == (1001, 0)


def test_fenced_abort_markers_use_the_bumped_epoch_of_the_same_id():
    core, ids = ongoing()
    markers = only(settle(core, core.init_producer_id("app", TIMEOUT_MS, 1, ids)))
    assert (markers.producer_id, markers.producer_epoch) == (1000, 1)


# ---- participants (writers on many machines in one transaction) ----------------------------

TP2, TP3 = TopicPartition("out", 2), TopicPartition("out", 3)


def with_participants(*partition_sets, now_ms=0):
    """'app' (pid 1000, epoch 0) with one participant per partition set (pids 1001, 1002, ...)."""
    core, ids = started(now_ms=now_ms)
    pids = []
    for partitions in partition_sets:
        d = core.init_participant("app", 1000, 0, partitions, now_ms, ids)
        settle(core, d)
        pids.append(d.producer_id)
    return core, ids, pids


def entries_by_pid(group):
    return {(e.producer_id, e.producer_epoch): (e.committed, e.partitions) for e in group.entries}


def test_init_participant_hands_out_a_fresh_id_and_opens_the_transaction():
    core, ids = started()
    d = core.init_participant("app", 1000, 0, [TP0], 7, ids)
    assert (d.producer_id, d.producer_epoch) == (1001, 0)       # same id source as every producer
    assert d.write.state is S.ONGOING and d.write.start_time_ms == 7
    assert d.write.partitions == frozenset()                     # the owner's set is untouched
    assert core.describe("app").state is S.EMPTY                 # nothing durable before the log has it
    assert core.init_participant("app", 1000, 0, [], 7, ids).error is ErrorCode.CONCURRENT_TRANSACTIONS
    settle(core, d)
    second = core.init_participant("app", 1000, 0, [], 9, ids)
    assert second.producer_id == 1002 and second.write.start_time_ms == 7    # still the same transaction
    settle(core, second)
    assert [(p.producer_id, p.producer_epoch, p.partitions) for p in core.describe("app").participants] == [
        (1001, 0, {TP0}), (1002, 0, frozenset())]


@pytest.mark.parametrize("pid, epoch, error", [
    (999, 0, ErrorCode.INVALID_PRODUCER_ID_MAPPING),
    (1000, 1, ErrorCode.PRODUCER_FENCED),
    (1001, 0, ErrorCode.INVALID_PRODUCER_ID_MAPPING),        # a participant cannot make participants
])
def test_init_participant_only_for_the_owner(pid, epoch, error):
    core, ids, _ = with_participants([TP0])
    before = core.describe("app")
    d = core.init_participant("app", pid, epoch, [TP1], 1, ids)
    assert d.error is error and d.write is None and core.describe("app") == before and not core.pending


def test_init_participant_for_an_unknown_id():
    d = TxnCoordinatorCore().init_participant("nobody", 1, 0, [], 1, Ids())
    assert d.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING and d.write is None


def test_init_participant_while_the_previous_transaction_completes():
    core, ids, _ = with_participants([TP0])
    settle(core, core.end_transaction("app", 1000, 0, True, 1, ids))
    d = core.init_participant("app", 1000, 1, [], 2, ids)
    assert d.error is ErrorCode.CONCURRENT_TRANSACTIONS and d.write is None


def test_participants_per_transaction_are_bounded_and_the_error_names_the_bound():
    core, ids = started()
    core.participants_per_txn_max = 2
    for _ in range(2):
        settle(core, core.init_participant("app", 1000, 0, [], 1, ids))
    ids_before = ids()
    d = core.init_participant("app", 1000, 0, [], 1, ids)
    assert d.error is ErrorCode.INVALID_REQUEST and d.write is None
    assert "(2)" in d.message and "already has 2 participants" in d.message
    assert ids() == ids_before + 1                   # the refusal used up no producer id


def test_participant_partitions_are_tracked_per_participant():
    core, ids, [p1, p2] = with_participants([TP0], [])
    d = core.add_partitions("app", p2, 0, [TP1, TP0], 3)
    assert (d.producer_id, d.producer_epoch) == (p2, 0)
    settle(core, d)
    md = core.describe("app")
    assert md.participant(p1).partitions == {TP0} and md.participant(p2).partitions == {TP0, TP1}
    assert md.partitions == frozenset()
    again = core.add_partitions("app", p2, 0, [TP1], 4)
    assert again.ok and again.write is None and again.producer_id == p2


@pytest.mark.parametrize("epoch", [1, -1])
def test_participant_with_a_wrong_epoch_is_fenced(epoch):
    core, ids, [p1] = with_participants([TP0])
    d = core.add_partitions("app", p1, epoch, [TP1], 1)
    assert d.error is ErrorCode.PRODUCER_FENCED and d.partition_errors == {TP1: ErrorCode.PRODUCER_FENCED}


def test_participant_of_a_decided_or_finished_transaction_is_refused():
    core, ids, [p1] = with_participants([TP0])
    settle(core, core.end_transaction("app", 1000, 0, True, 1, ids, accepted_participants=[p1]))
    decided = core.add_partitions("app", p1, 0, [TP1], 2)
    assert decided.error is ErrorCode.INVALID_TXN_STATE and "PrepareCommit" in decided.message
    assert core.verify_partitions("app", p1, 0, [TP0]).partition_errors == {TP0: ErrorCode.INVALID_TXN_STATE}
    settle(core, core.markers_written("app", 3))
    assert core.describe("app").participants == ()
    # finished: the id is forgotten, also once the next transaction is open
    settle(core, core.init_participant("app", 1000, 1, [TP1], 4, ids))
    late = core.add_partitions("app", p1, 0, [TP1], 5)
    assert late.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING and late.write is None
    assert core.verify_partitions("app", p1, 0, [TP1]).partition_errors == {
        TP1: ErrorCode.INVALID_PRODUCER_ID_MAPPING}


def test_verify_partitions_for_a_participant():
    core, ids, [p1, p2] = with_participants([TP0], [TP1])
    settle(core, core.add_partitions("app", 1000, 0, [TP2], 1))
    d = core.verify_partitions("app", p1, 0, [TP0, TP1, TP2])
    assert d.write is None and not core.pending
    # registered for p1 only: another participant's or the owner's partitions do not count
    assert d.partition_errors == {TP0: ErrorCode.NONE, TP1: ErrorCode.INVALID_TXN_STATE,
                                  TP2: ErrorCode.INVALID_TXN_STATE}
    assert core.verify_partitions("app", p2, 1, [TP1]).partition_errors == {TP1: ErrorCode.PRODUCER_FENCED}
    assert core.verify_partitions("app", 1000, 0, [TP0]).partition_errors == {TP0: ErrorCode.INVALID_TXN_STATE}


def test_commit_marks_the_owner_and_accepted_participants_commit_and_the_rest_abort():
    core, ids, [p1, p2, p3] = with_participants([TP0, TP1], [TP1], [])
    settle(core, core.add_partitions("app", 1000, 0, [TP3], 1))
    d = core.end_transaction("app", 1000, 0, True, 2, ids, accepted_participants=[p1, p3])
    assert d.write.state is S.PREPARE_COMMIT
    assert [(p.producer_id, p.accepted) for p in d.write.participants] == [(p1, True), (p2, False), (p3, True)]
    group = settle(core, d)
    assert entries_by_pid(group) == {
        (1000, 1): (True, {TP3}),            # the owner's marker carries its bumped epoch (KIP-890)
        (p1, 1): (True, {TP0, TP1}),         # participants' markers carry epoch + 1
        (p2, 1): (False, {TP1}),
    }                                        # p3 registered nothing: no marker
    assert group.entries[0].producer_id == 1000 and group.partition_count == 4
    settle(core, core.markers_written("app", 3))
    md = core.describe("app")
    assert md.state is S.COMPLETE_COMMIT and md.participants == () and md.partitions == frozenset()


def test_accepting_an_unknown_participant_writes_nothing():
    core, ids, [p1] = with_participants([TP0])
    before = core.describe("app")
    d = core.end_transaction("app", 1000, 0, True, 2, ids, accepted_participants=[p1, 4242])
    assert d.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING and d.write is None and "4242" in d.message
    assert core.describe("app") == before and not core.pending
    owner_as_participant = core.end_transaction("app", 1000, 0, True, 2, ids, accepted_participants=[1000])
    assert owner_as_participant.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING


def test_an_abort_accepts_no_participants():
    core, ids, [p1] = with_participants([TP0])
    d = core.end_transaction("app", 1000, 0, False, 2, ids, accepted_participants=[p1])
    assert d.error is ErrorCode.INVALID_REQUEST and d.write is None


def abort_everyone_cases():
    def end_abort(core, ids):
        return core.end_transaction("app", 1000, 0, False, 10, ids)

    def timeout(core, ids):
        [d] = core.expire(TIMEOUT_MS + 1, ids)
        return d

    def fence(core, ids):
        return core.init_producer_id("app", TIMEOUT_MS, 10, ids)

    return [end_abort, timeout, fence]


@pytest.mark.parametrize("how", abort_everyone_cases(), ids=lambda f: f.__name__)
def test_abort_timeout_and_fencing_abort_every_participant(how):
    core, ids, [p1, p2] = with_participants([TP0], [TP1])
    settle(core, core.add_partitions("app", 1000, 0, [TP2], 0))
    d = how(core, ids)
    assert d.write.state is S.PREPARE_ABORT
    group = settle(core, d)
    assert {pid: (committed, parts) for (pid, _), (committed, parts) in entries_by_pid(group).items()} == {
        1000: (False, {TP2}), p1: (False, {TP0}), p2: (False, {TP1})}
    assert group.entry_for(p1).producer_epoch == 1 and group.entry_for(p2).producer_epoch == 1
    settle(core, core.markers_written("app", 20))
    assert core.describe("app").participants == ()


def test_a_reload_re_sends_the_same_marker_group():
    core, ids, [p1, p2] = with_participants([TP0], [TP1])
    group = settle(core, core.end_transaction("app", 1000, 0, True, 2, ids, accepted_participants=[p2]))
    reloaded = TxnCoordinatorCore()
    reloaded.replay(core.describe("app"), "app")
    assert reloaded.unfinished_markers() == [group]


def test_end_transaction_retry_after_a_commit_with_participants():
    core, ids, [p1] = with_participants([TP0])
    settle(core, core.end_transaction("app", 1000, 0, True, 2, ids, accepted_participants=[p1]))
    settle(core, core.markers_written("app", 3))
    retry = core.end_transaction("app", 1000, 0, True, 4, ids, accepted_participants=[p1])
    assert retry.ok and retry.write is None and retry.producer_epoch == 1


def test_rotation_with_participants_keeps_their_own_markers():
    core, ids, [p1] = with_participants([TP0])
    settle(core, core.add_partitions("app", 1000, 0, [TP1], 1))
    core.durable["app"] = dataclasses.replace(core.describe("app"), producer_epoch=EPOCH_MAX - 1)
    group = settle(core, core.end_transaction("app", 1000, EPOCH_MAX - 1, True, 1, ids, accepted_participants=[p1]))
    assert entries_by_pid(group) == {(1000, EPOCH_MAX): (True, {TP1}), (p1, 1): (True, {TP0})}


def test_list_and_describe_find_participants():
    core, ids, [p1] = with_participants([TP0])
    assert [m.transactional_id for m in core.list(producer_ids=[p1])] == ["app"]
    assert core.list(producer_ids=[p1 + 100]) == []


def test_participants_outside_an_open_or_deciding_transaction_are_an_invariant_error():
    core, ids, [p1] = with_participants([TP0])
    md = dataclasses.replace(core.describe("app"), state=S.PREPARE_COMMIT)
    with pytest.raises(InvariantError, match="participants in state CompleteCommit"):
        _transition(md, state=S.COMPLETE_COMMIT)
