"""ControllerCore driven by events, with ZooKeeper played by a dict: deterministic scenarios."""
from __future__ import annotations

import pytest

from broker.controller.core import (ControllerConfig, ControllerCore, DeleteTopicZnodes, LeaderIsr, LiveBroker,
                                    ReadStates, RemoveReassignmentRequest, SendLeaderAndIsr, SendStopReplica,
                                    SendUpdateMetadata, TopicModel, WriteAssignment, WriteStates)
from eos.errors import EosError, ErrorCode

T0 = ("t", 0)


def live(*ids, epoch=1):
    return {b: LiveBroker(b, "127.0.0.1", 9000 + b, None, epoch) for b in ids}


class FakeZk:
    """The state znodes: value and version; a test can make the next write of a partition conflict."""

    def __init__(self):
        self.states: dict = {}
        self.conflict_once: set = set()

    def run(self, core: ControllerCore, effects: list) -> list:
        """Carry out effects like the shell does; return every non-write effect seen."""
        seen = []
        pending = list(effects)
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, WriteStates):
                results = {}
                for tp, state in effect.creates.items():
                    self.states[tp] = (state, 0)
                    results[tp] = 0
                for tp, (state, version) in effect.updates.items():
                    if tp in self.conflict_once:
                        self.conflict_once.discard(tp)
                        current, current_version = self.states[tp]
                        self.states[tp] = (current, current_version + 1)   # a leader wrote meanwhile
                        results[tp] = EosError("bad version")
                        continue
                    assert self.states[tp][1] == version
                    self.states[tp] = (state, version + 1)
                    results[tp] = version + 1
                pending[:0] = core.states_written(results)
            elif isinstance(effect, ReadStates):
                seen.append(effect)
                pending[:0] = core.states_read({tp: self.states.get(tp) for tp in effect.partitions})
            else:
                seen.append(effect)
        return seen


def started(replicas=(0, 1, 2), brokers=(0, 1, 2), unclean=False, **config):
    core = ControllerCore(controller_id=0, controller_epoch=3, config=ControllerConfig(**config))
    zk = FakeZk()
    seen = zk.run(core, core.initialize(
        live_brokers=live(*brokers), topics={"t": TopicModel({0: tuple(replicas)}, unclean_leader_election_enable=unclean)},
        states={T0: None}, reassignments={}, now_ms=0))
    return core, zk, seen


def leader_and_isr_to(seen) -> dict:
    return {e.broker_id: e.partitions[0].leader_isr for e in seen if isinstance(e, SendLeaderAndIsr)}


def test_a_follower_that_restarted_between_two_looks_is_told_its_role():
    # Found in CI's chaos test: broker 1 (a follower in the ISR) was killed and registered again
    # before the controller looked, so one event saw it both gone and back. Its partition was
    # queued for an ISR shrink that had nothing to remove (broker 1 is live again), and so it
    # was told nothing: it never fetched, the leader dropped it from the ISR, and it never came
    # back.
    core, zk, _ = started()
    bounced = {**live(0, 2), **live(1, epoch=2)}
    seen = zk.run(core, core.brokers_changed(bounced, now_ms=5))
    assert leader_and_isr_to(seen).get(1) is not None, "the restarted follower was not told to follow"
    assert leader_and_isr_to(seen)[1].leader == 0


def test_initial_election_takes_the_first_replica_and_tells_everyone():
    core, zk, seen = started()
    assert zk.states[T0] == (LeaderIsr(0, 0, (0, 1, 2), 3), 0)
    sent = leader_and_isr_to(seen)
    assert set(sent) == {0, 1, 2} and all(s.leader == 0 for s in sent.values())
    assert any(isinstance(e, SendUpdateMetadata) and e.full for e in seen)


def test_dead_leader_is_replaced_from_the_isr_with_a_higher_epoch():
    core, zk, _ = started()
    seen = zk.run(core, core.brokers_changed(live(1, 2), now_ms=10))
    state, _ = zk.states[T0]
    assert (state.leader, state.leader_epoch, state.isr) == (1, 1, (1, 2))
    assert set(leader_and_isr_to(seen)) == {1, 2}
    # first every live broker learns the broker list (broker 0 gone), then the partition's state
    first = next(e for e in seen if isinstance(e, SendUpdateMetadata))
    assert (first.broker_ids, first.partitions, [b.broker_id for b in first.live_brokers]) == ((1, 2), (), [1, 2])
    update = next(e for e in seen if isinstance(e, SendUpdateMetadata) and e.partitions)
    assert update.offline_replicas == {T0: (0,)}


def test_dead_follower_leaves_the_isr():
    core, zk, _ = started()
    zk.run(core, core.brokers_changed(live(0, 1), now_ms=10))
    state, _ = zk.states[T0]
    assert (state.leader, state.leader_epoch, state.isr) == (0, 1, (0, 1))


def test_no_live_isr_member_leaves_the_partition_offline_unless_unclean():
    for unclean, expected_leader in ((False, -1), (True, 2)):
        core, zk, _ = started(replicas=(0, 1, 2), unclean=unclean)
        zk.run(core, core.brokers_changed(live(0, 2), now_ms=1))      # 1 leaves the ISR
        zk.run(core, core.brokers_changed(live(0), now_ms=2))         # 2 too: ISR (0,)
        seen = zk.run(core, core.brokers_changed(live(2), now_ms=3))  # 0 dies, 2 comes back (not in the ISR)
        assert zk.states[T0][0].leader == expected_leader, unclean
        # the new leader is told it was elected uncleanly (it says so in its log)
        told = [s.unclean_election for e in seen if isinstance(e, SendLeaderAndIsr) for s in e.partitions]
        assert any(told) == unclean
        assert core.unclean_elections == ([(T0, 2)] if unclean else [])


def test_a_conflicting_write_is_read_again_and_retried():
    core, zk, _ = started()
    zk.conflict_once.add(T0)
    seen = zk.run(core, core.brokers_changed(live(1, 2), now_ms=10))
    assert any(isinstance(e, ReadStates) for e in seen)
    assert zk.states[T0][0].leader == 1


def test_controlled_shutdown_moves_leadership_and_answers_what_remains():
    core, zk, _ = started()
    remaining, effects = core.controlled_shutdown(0, 1)
    seen = zk.run(core, effects)
    assert zk.states[T0][0].leader == 1 and 0 not in zk.states[T0][0].isr
    assert core.shutdown_remaining(0) == set()
    with pytest.raises(EosError) as stale:
        core.controlled_shutdown(1, 99)
    assert stale.value.code == ErrorCode.STALE_BROKER_EPOCH
    assert not any(isinstance(e, SendStopReplica) and e.delete for e in seen)


def test_preferred_election_results():
    core, zk, _ = started()
    zk.run(core, core.brokers_changed(live(1, 2), now_ms=1))
    results, effects = core.elect_leaders("preferred", {T0})
    assert results[T0][0] == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE and effects == []
    zk.run(core, core.brokers_changed(live(0, 1, 2, epoch=2), now_ms=2))
    # back, but not in the ISR until it catches up: still refused
    assert core.elect_leaders("preferred", {T0})[0][T0][0] == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    state, version = zk.states[T0]
    caught_up = LeaderIsr(state.leader, state.leader_epoch, (1, 2, 0), state.controller_epoch)
    zk.states[T0] = (caught_up, version + 1)
    zk.run(core, core.isr_changed({T0: zk.states[T0]}))
    results, effects = core.elect_leaders("preferred", {T0})
    zk.run(core, effects)
    assert results[T0][0] == ErrorCode.NONE and zk.states[T0][0].leader == 0
    assert core.elect_leaders("preferred", {T0})[0][T0][0] == ErrorCode.ELECTION_NOT_NEEDED
    assert core.elect_leaders("preferred", {("t", 7)})[0][("t", 7)][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_reassignment_goes_through_kip_455s_steps():
    core, zk, _ = started(replicas=(0, 1), brokers=(0, 1, 2))
    results, effects = core.reassign({T0: (1, 2)})
    assert results[T0][0] == ErrorCode.NONE
    seen = zk.run(core, effects)
    writes = [e for e in seen if isinstance(e, WriteAssignment)]
    assert writes[0].assignment == {0: (0, 1, 2)} and writes[0].adding == {0: (2,)} and writes[0].removing == {0: (0,)}
    assert 2 in leader_and_isr_to(seen)                  # the new replica is told to start fetching
    assert core.ongoing_reassignments() == {T0: ([0, 1, 2], [2], [0])}
    # the new replica catches up: the leader (0) puts it in the ISR
    state, version = zk.states[T0]
    zk.states[T0] = (LeaderIsr(0, state.leader_epoch, (0, 1, 2), state.controller_epoch), version + 1)
    seen = zk.run(core, core.isr_changed({T0: zk.states[T0]}))
    final, _ = zk.states[T0]
    assert final.leader == 1 and final.isr == (1, 2)        # leader moved into the target, ISR trimmed
    assert [e.assignment for e in seen if isinstance(e, WriteAssignment)] == [{0: (1, 2)}]
    assert any(isinstance(e, SendStopReplica) and e.broker_id == 0 and e.delete for e in seen)
    assert any(isinstance(e, RemoveReassignmentRequest) for e in seen)
    assert core.ongoing_reassignments() == {}


def test_cancelled_reassignment_reverts_and_bad_targets_change_nothing():
    core, zk, _ = started(replicas=(0, 1), brokers=(0, 1, 2))
    zk.run(core, core.reassign({T0: (1, 2)})[1])
    results, effects = core.reassign({T0: None})
    seen = zk.run(core, effects)
    assert results[T0][0] == ErrorCode.NONE
    assert core.topics["t"].assignment == {0: (0, 1)} and core.ongoing_reassignments() == {}
    assert any(isinstance(e, SendStopReplica) and e.broker_id == 2 and e.delete for e in seen)
    before = (dict(core.topics), dict(zk.states))
    for target, code in (((1, 1), ErrorCode.INVALID_REPLICA_ASSIGNMENT), ((1, 9), ErrorCode.INVALID_REPLICA_ASSIGNMENT),
                         ((), ErrorCode.INVALID_REPLICA_ASSIGNMENT)):
        results, effects = core.reassign({T0: target})
        assert results[T0][0] == code and effects == []
    assert core.reassign({T0: None})[0][T0][0] == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS
    assert (dict(core.topics), dict(zk.states)) == before


def test_unclean_election_on_request_only_where_allowed():
    core, zk, _ = started(replicas=(0, 1))
    zk.run(core, core.brokers_changed(live(0, 2), now_ms=1))
    zk.run(core, core.brokers_changed(live(1, 2), now_ms=2))     # 0 (the only ISR member) dies, 1 returns
    assert zk.states[T0][0].leader == -1
    results, effects = core.elect_leaders("unclean", {T0})
    assert results[T0][0] == ErrorCode.POLICY_VIOLATION and effects == []


def test_a_config_change_tells_every_broker_and_turning_unclean_on_elects_after_the_write():
    core, zk, _ = started(replicas=(0, 1))
    seen = zk.run(core, core.configs_changed({"t": TopicModel({0: (0, 1)})}))    # e.g. retention.ms
    assert [(e.broker_ids, [s.tp for s in e.partitions]) for e in seen] == [((0, 1, 2), [T0])]
    zk.run(core, core.brokers_changed(live(0, 2), now_ms=1))
    zk.run(core, core.brokers_changed(live(1, 2), now_ms=2))     # offline: its only ISR member died
    assert zk.states[T0][0].leader == -1
    seen = zk.run(core, core.configs_changed({"t": TopicModel({0: (0, 1)}, unclean_leader_election_enable=True)}))
    assert zk.states[T0][0].leader == 1
    # every UpdateMetadata sent names the new leader: none carries the state from before the write
    told = [s.leader_isr.leader for e in seen if isinstance(e, SendUpdateMetadata) for s in e.partitions]
    assert told and set(told) == {1}


def test_auto_rebalance_moves_leadership_back_to_preferred_replicas():
    core, zk, _ = started()
    zk.run(core, core.brokers_changed(live(1, 2), now_ms=1))
    zk.run(core, core.brokers_changed(live(0, 1, 2, epoch=2), now_ms=2))
    state, version = zk.states[T0]
    zk.states[T0] = (LeaderIsr(state.leader, state.leader_epoch, (1, 2, 0), 3), version + 1)
    zk.run(core, core.isr_changed({T0: zk.states[T0]}))
    zk.run(core, core.rebalance_tick(now_ms=3))
    assert zk.states[T0][0].leader == 0
    core_off, zk_off, _ = started(auto_leader_rebalance_enable=False)
    assert core_off.rebalance_tick(now_ms=1) == []


def deleted_znodes(effects) -> list[str]:
    return [e.topic for e in effects if isinstance(e, DeleteTopicZnodes)]


def test_topic_deletion_stops_and_deletes_replicas_and_frees_the_name_once_each_confirmed():
    core, zk, _ = started()
    seen = zk.run(core, core.delete_topics({"t"}))
    assert sorted(e.broker_id for e in seen if isinstance(e, SendStopReplica) and e.delete) == [0, 1, 2]
    assert core.partitions() == []
    # the znodes (the name) stay until every replica says it deleted its copy
    assert deleted_znodes(seen) == [] and sorted(core.deletions_unconfirmed["t"]) == [0, 1, 2]
    assert zk.run(core, core.delete_topics({"t"})) == []         # the mark seen again: still waiting
    assert deleted_znodes(zk.run(core, core.stop_replica_answered(0, [T0]))) == []
    assert deleted_znodes(zk.run(core, core.stop_replica_answered(1, []))) == []    # it could not delete
    assert deleted_znodes(zk.run(core, core.stop_replica_answered(2, [T0]))) == []
    assert deleted_znodes(zk.run(core, core.stop_replica_answered(1, [T0]))) == ["t"]
    assert core.deletions_unconfirmed == {}


def test_a_topic_change_while_a_deletion_waits_for_confirmations_does_not_bring_the_topic_back():
    # (found by review) every topics event hands the core all topics that have znodes, the
    # deleted one too while its replicas have not all confirmed
    core, zk, _ = started()
    zk.run(core, core.delete_topics({"t"}))
    seen = zk.run(core, core.topics_changed({"t": TopicModel({0: (0, 1, 2)}), "u": TopicModel({0: (0, 1, 2)})}))
    assert [p for p in core.partitions() if p[0] == "t"] == []
    assert not any(isinstance(e, SendLeaderAndIsr) and any(s.tp[0] == "t" for s in e.partitions) for e in seen)
    for broker in (0, 1, 2):
        effects = zk.run(core, core.stop_replica_answered(broker, [T0]))
    assert deleted_znodes(effects) == ["t"] and "t" not in core.topics


def test_a_replica_that_dies_before_confirming_its_deletion_is_told_again_when_it_is_back():
    # Broker 2 was dead but still registered (its ZooKeeper session open): its StopReplica
    # never arrived. Freeing the name then let its stale copy come back inside a new topic.
    core, zk, _ = started()
    zk.run(core, core.delete_topics({"t"}))
    zk.run(core, core.stop_replica_answered(0, [T0]))
    zk.run(core, core.stop_replica_answered(1, [T0]))
    zk.run(core, core.brokers_changed(live(0, 1), now_ms=1))          # its session ends
    assert core.deletions_unconfirmed == {"t": {2: (T0,)}}
    seen = zk.run(core, core.brokers_changed(live(0, 1, 2), now_ms=2))   # it registers anew
    assert [(e.broker_id, e.partitions, e.delete) for e in seen if isinstance(e, SendStopReplica)] == [(2, (T0,), True)]
    assert deleted_znodes(seen) == []
    assert deleted_znodes(zk.run(core, core.stop_replica_answered(2, [T0]))) == ["t"]


def test_a_topic_with_a_replica_on_a_broker_that_is_down_is_deleted_only_once_it_is_back():
    # Deleted at once, the down broker kept its copy and served it again, back, inside a new
    # topic of the same name (Kafka's TopicDeletionManager waits, as here).
    core, zk, _ = started()
    zk.run(core, core.brokers_changed(live(0, 1), now_ms=1))          # broker 2 dies
    seen = zk.run(core, core.delete_topics({"t"}))
    assert seen == [] and core.deletions_waiting == {"t": (2,)}
    assert core.partitions() == [T0]                                  # still there, still served

    seen = zk.run(core, core.brokers_changed(live(0, 1, 2), now_ms=2))   # broker 2 is back
    stopped = sorted(e.broker_id for e in seen if isinstance(e, SendStopReplica) and e.delete)
    assert stopped == [0, 1, 2]
    # broker 2 first learns its roles in the partition it hosts, then is told to delete it
    to_two = [e for e in seen if getattr(e, "broker_id", None) == 2]
    assert isinstance(to_two[0], SendLeaderAndIsr) and isinstance(to_two[-1], SendStopReplica)
    assert core.partitions() == [] and core.deletions_waiting == {}
    for broker in (0, 1):
        zk.run(core, core.stop_replica_answered(broker, [T0]))
    assert deleted_znodes(zk.run(core, core.stop_replica_answered(2, [T0]))) == ["t"]
