"""Committed and transactional offsets of groups (broker.group.offsets): visibility on commit,
drop on abort, KIP-447 UNSTABLE_OFFSET_COMMIT, Kafka's log-order rule, replay from the log."""
from __future__ import annotations

import pytest

from broker.group.offsets import OffsetStore
from broker.group.records import OffsetAndMetadata as OM, decode_record, partition_for_group
from eos.errors import ErrorCode, InvariantError
from eos.types import TopicPartition as TP

T0, T1 = TP("in", 0), TP("in", 1)
PID, EPOCH = 4000, 2


class Log:
    """Plays the shell: one `__consumer_offsets` log (all partitions share the offset counter,
    which is enough for ordering) plus the markers."""

    def __init__(self, store: OffsetStore):
        self.store, self.next_offset, self.entries = store, 0, []

    def write(self, decision_or_write):
        write = getattr(decision_or_write, "write", decision_or_write)
        base = self.next_offset
        for key, value in zip(*write.records()):
            self.entries.append(("data", key, value, self.next_offset, write.producer_id))
            self.next_offset += 1
        self.store.write_completed(write, base)
        return base

    def marker(self, producer_id, committed, group="g"):
        partition = partition_for_group(group)
        self.entries.append(("marker", producer_id, committed, self.next_offset, partition))
        self.next_offset += 1
        self.store.complete_txn(producer_id, committed, partition)

    def replay_into(self, store):
        for entry in self.entries:
            if entry[0] == "data":
                _, key, value, offset, producer_id = entry
                k, v = decode_record(key, value)
                store.replay(k, v, offset, producer_id)
            else:
                _, producer_id, committed, _, partition = entry
                store.replay_marker(producer_id, committed, partition)


def offsets_of(store, group="g", **kw):
    return {(f.topic, f.partition): (f.offset, f.error) for f in store.fetch(group, [T0, T1], **kw)}


def test_plain_commit_is_visible_once_written():
    store = OffsetStore()
    d = store.commit("g", {T0: OM(10, metadata="m")}, now_ms=500)
    assert d.write and not d.partition_errors
    assert offsets_of(store)[("in", 0)] == (-1, ErrorCode.NONE)          # not yet in the log
    assert offsets_of(store, require_stable=True)[("in", 0)] == (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)
    Log(store).write(d)
    fetched = store.fetch("g", [T0])[0]
    assert (fetched.offset, fetched.metadata, fetched.error) == (10, "m", ErrorCode.NONE)
    assert store.committed("g")[T0].commit_timestamp_ms == 500             # filled in from now_ms


def test_transactional_offsets_are_invisible_until_the_commit_marker():
    store = OffsetStore()
    log = Log(store)
    log.write(store.commit("g", {T0: OM(5)}, 0))
    log.write(store.txn_commit("g", PID, EPOCH, {T0: OM(20), T1: OM(30)}, 0))
    assert offsets_of(store) == {("in", 0): (5, ErrorCode.NONE), ("in", 1): (-1, ErrorCode.NONE)}
    assert offsets_of(store, require_stable=True) == {("in", 0): (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT),
                                                      ("in", 1): (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)}
    assert store.pending_producers("g") == {PID} and store.has_pending(PID)
    log.marker(PID, committed=True)
    assert offsets_of(store, require_stable=True) == {("in", 0): (20, ErrorCode.NONE), ("in", 1): (30, ErrorCode.NONE)}
    assert not store.has_pending(PID)


def test_transactional_offsets_are_dropped_on_abort():
    store = OffsetStore()
    log = Log(store)
    log.write(store.commit("g", {T0: OM(5)}, 0))
    log.write(store.txn_commit("g", PID, EPOCH, {T0: OM(20)}, 0))
    log.marker(PID, committed=False)
    assert offsets_of(store, require_stable=True)[("in", 0)] == (5, ErrorCode.NONE)
    assert store.pending_producers("g") == set()


def test_a_plain_commit_written_after_the_transactional_one_wins():
    # Kafka compares the log offsets of the two records, not the order of the marker.
    store = OffsetStore()
    log = Log(store)
    log.write(store.txn_commit("g", PID, EPOCH, {T0: OM(20)}, 0))
    log.write(store.commit("g", {T0: OM(25)}, 0))
    log.marker(PID, committed=True)
    assert offsets_of(store)[("in", 0)] == (25, ErrorCode.NONE)


def test_a_transactional_commit_written_after_a_plain_one_wins_at_its_marker():
    store = OffsetStore()
    log = Log(store)
    log.write(store.commit("g", {T0: OM(25)}, 0))
    log.write(store.txn_commit("g", PID, EPOCH, {T0: OM(30)}, 0))
    assert offsets_of(store)[("in", 0)] == (25, ErrorCode.NONE)
    log.marker(PID, committed=True)
    assert offsets_of(store)[("in", 0)] == (30, ErrorCode.NONE)


def test_markers_only_settle_the_producers_groups_on_that_partition():
    store = OffsetStore(offsets_partitions=50)
    log = Log(store)
    groups = ["g", "other-group"]
    assert partition_for_group(groups[0]) != partition_for_group(groups[1])
    for g in groups:
        log.write(store.txn_commit(g, PID, EPOCH, {T0: OM(7)}, 0))
    assert store.complete_txn(PID, True, partition_for_group("g")) == ["g"]
    assert store.pending_producers("other-group") == {PID}
    assert store.complete_txn(PID + 1, True) == []                          # another producer: nothing


def test_two_producers_pending_on_one_group_are_independent():
    store = OffsetStore()
    log = Log(store)
    log.write(store.txn_commit("g", PID, EPOCH, {T0: OM(1)}, 0))
    log.write(store.txn_commit("g", PID + 1, 0, {T1: OM(2)}, 0))
    log.marker(PID + 1, committed=False)
    assert offsets_of(store, require_stable=True)[("in", 0)] == (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)
    assert offsets_of(store, require_stable=True)[("in", 1)] == (-1, ErrorCode.NONE)


def test_failed_writes_change_nothing():
    store = OffsetStore()
    d = store.commit("g", {T0: OM(1)}, 0)
    store.write_failed(d.write)
    assert offsets_of(store, require_stable=True)[("in", 0)] == (-1, ErrorCode.NONE)
    t = store.txn_commit("g", PID, EPOCH, {T0: OM(2)}, 0)
    store.write_failed(t.write)
    assert store.pending_producers("g") == set() and store.groups() == set()
    with pytest.raises(InvariantError, match="not pending"):
        store.write_completed(t.write, 0)


def test_a_failed_transactional_write_keeps_what_the_producer_already_wrote():
    # A TxnOffsetCommit whose append fails (a stale request fenced by the log's epoch rule,
    # a retry that meets a broker stopping) must not take the producer's written offsets
    # with it: they are in the log and the marker will commit them.
    for stale_value in (OM(20), OM(30)):
        store = OffsetStore()
        log = Log(store)
        log.write(store.txn_commit("g", PID, EPOCH + 1, {T0: OM(30)}, 0))
        failed = store.txn_commit("g", PID, EPOCH, {T0: stale_value}, 0)
        assert offsets_of(store, require_stable=True)[("in", 0)] == (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)
        store.write_failed(failed.write)
        assert store.pending_producers("g") == {PID}
        log.marker(PID, committed=True)
        assert offsets_of(store, require_stable=True)[("in", 0)] == (30, ErrorCode.NONE)


def test_a_marker_before_the_write_is_acknowledged_is_a_bug():
    store = OffsetStore()
    store.txn_commit("g", PID, EPOCH, {T0: OM(2)}, 0)
    with pytest.raises(InvariantError, match="before its offset record"):
        store.complete_txn(PID, True)


def test_oversized_metadata_is_refused_per_partition_and_the_rest_written():
    store = OffsetStore(metadata_max_bytes=4)
    d = store.commit("g", {T0: OM(1, metadata="toolong"), T1: OM(2, metadata="ok")}, 0)
    assert d.partition_errors == {T0: ErrorCode.OFFSET_METADATA_TOO_LARGE}
    assert "offset.metadata.max.bytes 4" in d.messages[T0]
    assert [tp for tp, _ in d.write.entries] == [T1]
    only_bad = store.txn_commit("g", PID, EPOCH, {T0: OM(1, metadata="toolong")}, 0)
    assert only_bad.write is None and store.pending_producers("g") == set()
    with pytest.raises(ValueError, match="needs a producer id"):
        store.txn_commit("g", -1, 0, {T1: OM(1)}, 0)


def test_fetch_all_partitions_and_unknown_groups():
    store = OffsetStore()
    log = Log(store)
    log.write(store.commit("g", {T1: OM(3), T0: OM(4)}, 0))
    assert [(f.partition, f.offset) for f in store.fetch("g")] == [(0, 4), (1, 3)]
    assert store.fetch("nobody") == []
    assert store.fetch("nobody", [T0])[0].offset == -1


def test_delete_group_writes_tombstones_and_removes_offsets_when_written():
    store = OffsetStore()
    log = Log(store)
    log.write(store.commit("g", {T0: OM(4), T1: OM(5)}, 0))
    write = store.delete_group("g")
    assert [value for _, value in write.entries] == [None, None]
    assert write.records()[1] == [None, None]
    assert store.committed("g")                                             # not until written
    log.write(write)
    assert store.committed("g") == {} and store.groups() == set()
    assert store.delete_group("g") is None


def test_replay_rebuilds_the_same_state_including_pending_and_order():
    store = OffsetStore()
    log = Log(store)
    log.write(store.commit("g", {T0: OM(1)}, 0))
    log.write(store.txn_commit("g", PID, EPOCH, {T0: OM(20), T1: OM(21)}, 0))
    log.write(store.commit("g", {T0: OM(25)}, 0))                           # after the txn record: wins
    log.marker(PID, committed=True)
    log.write(store.txn_commit("g", PID + 1, 0, {T1: OM(99)}, 0))           # still open
    log.write(store.commit("h", {T1: OM(7)}, 0))
    log.write(store.delete_group("h"))

    reloaded = OffsetStore()
    log.replay_into(reloaded)
    for s in (store, reloaded):
        assert offsets_of(s) == {("in", 0): (25, ErrorCode.NONE), ("in", 1): (21, ErrorCode.NONE)}
        assert offsets_of(s, require_stable=True)[("in", 1)] == (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)
        assert s.pending_producers("g") == {PID + 1}
        assert s.groups() == {"g"}
    reloaded.replay_marker(PID + 1, True, partition_for_group("g"))
    assert offsets_of(reloaded)[("in", 1)] == (99, ErrorCode.NONE)


def test_unload_partition_forgets_its_groups():
    store = OffsetStore()
    log = Log(store)
    log.write(store.commit("g", {T0: OM(1)}, 0))
    log.write(store.txn_commit("g", PID, EPOCH, {T1: OM(2)}, 0))
    store.unload_partition(partition_for_group("g") + 1)
    assert store.groups() == {"g"}
    store.unload_partition(partition_for_group("g"))
    assert store.groups() == set()


# ---- KIP-447: a zombie's transactional commit is fenced by the group ---------------------

def test_stale_generation_txn_offset_commit_is_refused_and_stores_nothing():
    from broker.group.state import GroupCoordinatorCore
    from consumer.assignors import Subscription, encode_subscription

    ids = iter(range(1, 100))
    core = GroupCoordinatorCore(initial_rebalance_delay_ms=0, member_id_factory=lambda c, i: f"{c}-{next(ids)}")
    store = OffsetStore()
    log = Log(store)
    md = [("range", encode_subscription(Subscription(("in",))))]

    def join(member_id, client, now):
        outcome = core.join("g", member_id, None, "consumer", md, 10_000, 30_000, now, client_id=client)
        return outcome.response.member_id if outcome.response else None

    a = join(join("", "a", 0), "a", 0)                    # generation 1: a alone
    for write in core.sync("g", 1, a, None, {a: b""}, 0).writes:
        core.write_completed(write.write_id, 0)
    b = join("", "b", 0)
    join(b, "b", 0)                                       # b joins: a rebalance
    core.join("g", a, None, "consumer", md, 10_000, 30_000, 0)   # a rejoins: generation 2

    def txn_commit(member_id, generation, offset):
        verdict = core.validate_offset_commit("g", generation, member_id, None, transactional=True)
        if verdict.ok:                                    # the shell stages only what passes
            log.write(store.txn_commit("g", PID, EPOCH, {T0: OM(offset)}, 0))
        return verdict.error

    assert txn_commit(a, 1, 50) is ErrorCode.ILLEGAL_GENERATION   # a's generation 1 is stale
    assert txn_commit("gone-member", 2, 50) is ErrorCode.UNKNOWN_MEMBER_ID
    assert store.pending_producers("g") == set()
    assert txn_commit(b, 2, 60) is ErrorCode.NONE                 # the current generation may commit
    log.marker(PID, committed=True)
    assert offsets_of(store)[("in", 0)] == (60, ErrorCode.NONE)

