"""The controller's decisions: a pure core, events in, effects out (Kafka's KafkaController).

Theory of operation
-------------------
`ControllerCore` is the one owner of the controller's model (Kafka's ControllerContext):
the live brokers (with their epochs), each topic's replica assignment (and the adding and
removing replicas of a reassignment), each partition's leadership `LeaderIsr` with the
version of its state znode, the brokers in controlled shutdown and the reassignments in
progress. It never does I/O and never reads a clock: the shell (`shell.py`) feeds it
events read from ZooKeeper and RPCs, and carries out the effects it returns.

Changing leadership is two-phase, like the storage's staged appends. A decision does not
assume its ZooKeeper write succeeds: the core answers `WriteStates` (each new state with the
znode version it expects), remembering why it wants each change. The shell writes
conditionally and calls `states_written(results)`; the core applies the successes to its
model and only then returns the broker requests for them: LeaderAndIsr to each live
replica of a changed partition, UpdateMetadata to every live broker. A write that failed
on its version (a leader changed the ISR meanwhile) makes the core ask for the state again
(`ReadStates`); `states_read` refreshes the model and decides again, at most
`DECISION_ATTEMPTS_MAX` times. Example:

    effects = core.brokers_changed({1: b1, 2: b2}, now_ms)   # broker 0 died
    # -> [WriteStates(updates={("t", 0): (LeaderIsr(leader=1, leader_epoch=5, isr=(1, 2), ...), 7)}), ...]
    effects = core.states_written({("t", 0): 8})
    # -> [SendLeaderAndIsr(1, ...), SendLeaderAndIsr(2, ...), SendUpdateMetadata((1, 2), ...)]

Topic deletion (Kafka's TopicDeletionManager): a topic with a replica on a broker that is
down stays marked for deletion (`deletions_waiting`, its /admin/delete_topics mark and its
znodes kept) until every such broker is back; then every replica gets StopReplica with
delete, and the topic's znodes (so its name) go only once every replica has answered that
it deleted its copy (`deletions_unconfirmed`, `stop_replica_answered`). A broker that dies
before it answers -- also one that is dead but not yet noticed, its ZooKeeper session still
open, whose StopReplica the channel drops when the session ends -- is sent it again when it
registers anew. Either shortcut left that broker's copy on its disk: back, it served the
old records again inside a new topic of the same name (the epochs of both start at 0), so
acknowledged records of the new one were lost and the replicas differed for good.

Every leader change and every ISR change the controller makes bumps the leader epoch (as
Kafka's controller does), and each state carries the controller's epoch. The election rules
are `election.py`; the legal partition and replica state transitions are tables in
`states.py`, checked here on every move.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from broker.controller import election
from broker.controller.states import PartitionState, PartitionStates, ReplicaState, ReplicaStates
from broker.metadata.types import BrokerInfo as LiveBroker
from broker.metadata.types import LeaderIsr
from eos.errors import EosError, ErrorCode

TP = tuple[str, int]
NO_LEADER = -1
DECISION_ATTEMPTS_MAX = 5


@dataclass(frozen=True)
class TopicModel:
    assignment: dict[int, tuple[int, ...]]
    adding: dict[int, tuple[int, ...]] = field(default_factory=dict)
    removing: dict[int, tuple[int, ...]] = field(default_factory=dict)
    unclean_leader_election_enable: bool = False


@dataclass(frozen=True)
class ControllerConfig:
    auto_leader_rebalance_enable: bool = True
    leader_imbalance_per_broker_percentage: int = 10
    unclean_leader_election_enable: bool = False      # the broker default; topics override


# ---- effects ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WriteStates:
    creates: dict[TP, LeaderIsr]
    updates: dict[TP, tuple[LeaderIsr, int]]         # (new value, expected znode version)


@dataclass(frozen=True)
class ReadStates:
    partitions: tuple[TP, ...]


@dataclass(frozen=True)
class PartitionRequestState:
    tp: TP
    leader_isr: LeaderIsr
    replicas: tuple[int, ...]
    adding: tuple[int, ...]
    removing: tuple[int, ...]
    is_new: bool
    zk_version: int
    throttle_bytes_per_s: int = 0
    unclean_election: bool = False


@dataclass(frozen=True)
class SendLeaderAndIsr:
    broker_id: int
    partitions: tuple[PartitionRequestState, ...]


@dataclass(frozen=True)
class SendUpdateMetadata:
    broker_ids: tuple[int, ...]
    partitions: tuple[PartitionRequestState, ...]
    live_brokers: tuple[LiveBroker, ...]
    offline_replicas: dict[TP, tuple[int, ...]]
    full: bool = False
    deleted_topics: tuple[str, ...] = ()


@dataclass(frozen=True)
class SendStopReplica:
    broker_id: int
    partitions: tuple[TP, ...]
    delete: bool


@dataclass(frozen=True)
class WriteAssignment:
    topic: str
    assignment: dict[int, tuple[int, ...]]
    adding: dict[int, tuple[int, ...]]
    removing: dict[int, tuple[int, ...]]


@dataclass(frozen=True)
class RemoveReassignmentRequest:
    partitions: tuple[TP, ...]


@dataclass(frozen=True)
class DeleteTopicZnodes:
    topic: str


@dataclass(frozen=True)
class _Reassignment:
    original: tuple[int, ...]
    target: tuple[int, ...]
    throttle_bytes_per_s: int = 0


class ControllerCore:
    """See the module doc."""

    def __init__(self, controller_id: int, controller_epoch: int, config: ControllerConfig):
        self.controller_id = controller_id
        self.epoch = controller_epoch
        self.config = config
        self.live: dict[int, LiveBroker] = {}
        self.topics: dict[str, TopicModel] = {}
        self.states: dict[TP, tuple[LeaderIsr, int]] = {}
        self.shutting_down: set[int] = set()
        # topic -> the brokers down that hold a replica of it: its deletion waits for them
        self.deletions_waiting: dict[str, tuple[int, ...]] = {}
        # topic -> broker -> its partitions whose StopReplica(delete) it has not confirmed yet
        self.deletions_unconfirmed: dict[str, dict[int, tuple[TP, ...]]] = {}
        self.reassignments: dict[TP, _Reassignment] = {}
        self.partition_states = PartitionStates()
        self.replica_states = ReplicaStates()
        self._pending: dict[TP, str] = {}          # why a state write is in flight
        self._attempts: dict[TP, int] = {}
        self._unclean: set[TP] = set()               # decided by an unclean election, not yet sent
        self.unclean_elections: list[tuple[TP, int]] = []   # (partition, leader): for logs and tests
        # written states that gave a partition a different leader (clean or unclean): Kafka's
        # LeaderElectionRateAndTimeMs counts these; the shell adds them up across terms
        self.leader_elections = 0
        self.errors: list[str] = []                 # decisions given up on (for logs and tests)

    # ---- model queries ------------------------------------------------------------------------

    def replicas_of(self, tp: TP) -> tuple[int, ...]:
        """The partition's current replica set (during a reassignment: original + adding)."""
        topic = self.topics.get(tp[0])
        return () if topic is None else topic.assignment.get(tp[1], ())

    def partitions(self) -> list[TP]:
        return sorted((t, p) for t, model in self.topics.items() for p in model.assignment)

    def leader_of(self, tp: TP) -> int:
        found = self.states.get(tp)
        return NO_LEADER if found is None else found[0].leader

    def partitions_led_by(self, broker_id: int) -> set[TP]:
        return {tp for tp, (state, _) in self.states.items() if state.leader == broker_id}

    def ongoing_reassignments(self) -> dict[TP, tuple[list[int], list[int], list[int]]]:
        result = {}
        for tp in self.reassignments:
            topic = self.topics[tp[0]]
            result[tp] = (list(topic.assignment.get(tp[1], ())), list(topic.adding.get(tp[1], ())),
                          list(topic.removing.get(tp[1], ())))
        return result

    def _unclean_enabled(self, topic: str) -> bool:
        model = self.topics.get(topic)
        return bool(model and model.unclean_leader_election_enable)

    def _eligible(self) -> set[int]:
        return set(self.live) - self.shutting_down

    # ---- events -------------------------------------------------------------------------------

    def initialize(self, *, live_brokers: Mapping[int, LiveBroker], topics: Mapping[str, TopicModel],
                   states: Mapping[TP, tuple[LeaderIsr, int] | None], reassignments: Mapping[TP, tuple[int, ...]],
                   now_ms: int) -> list:
        """This broker just became controller (Kafka's onControllerFailover)."""
        self.live = dict(live_brokers)
        self.topics = dict(topics)
        for tp, found in states.items():
            if found is not None:
                self.states[tp] = found
        effects: list = []
        for tp in self.partitions():
            self.partition_states.force(tp, PartitionState.NEW if tp not in self.states else (
                PartitionState.ONLINE if self.states[tp][0].leader in self.live else PartitionState.OFFLINE))
            for replica in self.replicas_of(tp):
                self.replica_states.force((tp, replica), ReplicaState.ONLINE if replica in self.live
                                          else ReplicaState.OFFLINE)
        # ongoing reassignments recorded in the topic znodes (adding/removing) resume
        for tp in self.partitions():
            topic = self.topics[tp[0]]
            adding = topic.adding.get(tp[1], ())
            removing = topic.removing.get(tp[1], ())
            if adding or removing:
                replicas = topic.assignment[tp[1]]
                original = tuple(r for r in replicas if r not in adding)
                target = tuple(r for r in replicas if r not in removing)
                self.reassignments[tp] = _Reassignment(original, target)
        effects.append(self._update_metadata(self.partitions(), to=sorted(self.live), full=True))
        unchanged = []
        for tp in self.partitions():
            decision = self._initial_decision(tp)
            if decision is None:
                unchanged.append(tp)
            else:
                self._pending[tp] = decision
        effects.extend(self._leader_and_isr(unchanged, to=None))
        effects.extend(self._plan(list(self._pending)))
        reassign_results, reassign_effects = self.reassign(
            {tp: target for tp, target in reassignments.items() if tp not in self.reassignments})
        effects.extend(reassign_effects)
        effects.extend(self._progress_reassignments())
        return effects

    def _initial_decision(self, tp: TP) -> str | None:
        found = self.states.get(tp)
        if found is None:
            return "new"
        state = found[0]
        if state.leader not in self.live:
            return "offline"
        if any(b not in self.live for b in state.isr):
            return "shrink"
        return None

    def brokers_changed(self, live: Mapping[int, LiveBroker], now_ms: int) -> list:
        """Brokers joined or left (a broker whose epoch changed restarted: left, then joined)."""
        old = self.live
        dead = {b for b in old if b not in live or live[b].epoch != old[b].epoch}
        joined = {b for b in live if b not in old or live[b].epoch != old[b].epoch}
        self.live = dict(live)
        self.shutting_down -= dead | joined
        effects: list = []
        if joined:
            # the new brokers learn the whole cluster, everyone learns the new broker list
            effects.append(self._update_metadata(self.partitions(), to=sorted(self.live), full=True))
        elif dead:
            # everyone learns the new broker list, also when no partition of theirs changes
            # (Kafka's onBrokerFailure): Metadata must stop naming a dead broker
            effects.append(self._update_metadata((), to=sorted(self.live)))
        for tp in self.partitions():
            state = self.states.get(tp)
            replicas = self.replicas_of(tp)
            for replica in replicas:
                if replica in dead:
                    self.replica_states.transition([(tp, replica)], ReplicaState.OFFLINE)
                if replica in joined:
                    self.replica_states.transition([(tp, replica)], ReplicaState.ONLINE)
            if state is None:
                self._pending[tp] = "new"
                continue
            leader_isr = state[0]
            if leader_isr.leader in dead or (leader_isr.leader == NO_LEADER and any(r in self.live for r in replicas)):
                self._pending[tp] = "offline"
            elif any(b in dead for b in leader_isr.isr):
                self._pending[tp] = "shrink"
        if joined:
            # Each joined broker learns its roles in the partitions it hosts -- also those
            # queued for an ISR shrink: a broker that restarted between two looks is both gone
            # and back in this event, so the shrink may have nothing to remove (it is live),
            # write nothing and tell it nothing, and it would never follow. A partition whose
            # leadership is being decided is told when the decision is written.
            hosted = [tp for tp in self.partitions() if self._pending.get(tp) in (None, "shrink")
                      and any(r in joined for r in self.replicas_of(tp))]
            effects.extend(self._leader_and_isr(hosted, to=joined))
        effects.extend(self._plan(list(self._pending)))
        for name, unconfirmed in sorted(self.deletions_unconfirmed.items()):
            # a broker back (or restarted) that never confirmed: its copy may still be on disk
            for broker in sorted(b for b in unconfirmed if b in joined):
                effects.append(SendStopReplica(broker, unconfirmed[broker], delete=True))
        ready = {name for name, down in self.deletions_waiting.items() if all(b in self.live for b in down)}
        if ready:
            effects.extend(self.delete_topics(ready))
        return effects

    def stop_replica_answered(self, broker_id: int, deleted: Iterable[TP]) -> list:
        """Broker `broker_id` answered a StopReplica(delete): `deleted` are the partitions it
        says it deleted. A topic whose every replica has confirmed loses its znodes (and its
        /admin/delete_topics mark): only then may its name be used again."""
        done = set(deleted)
        effects: list = []
        for name in sorted(self.deletions_unconfirmed):
            unconfirmed = self.deletions_unconfirmed[name]
            left = tuple(tp for tp in unconfirmed.get(broker_id, ()) if tp not in done)
            if left:
                unconfirmed[broker_id] = left
            else:
                unconfirmed.pop(broker_id, None)
            if not unconfirmed:
                del self.deletions_unconfirmed[name]
                effects.append(DeleteTopicZnodes(name))
        return effects

    def topics_changed(self, topics: Mapping[str, TopicModel]) -> list:
        """New topics or partitions (and config changes); deletions go through delete_topics."""
        effects: list = []
        for name, model in topics.items():
            if name in self.deletions_unconfirmed:
                continue        # deleted: its znodes only wait for the replicas' confirmations
            old = self.topics.get(name)
            self.topics[name] = model
            for partition in model.assignment:
                tp = (name, partition)
                if tp not in self.states:
                    self.partition_states.transition([tp], PartitionState.NEW)
                    for replica in model.assignment[partition]:
                        self.replica_states.transition([(tp, replica)], ReplicaState.NEW)
                    self._pending[tp] = "new"
                elif (old is not None and not old.unclean_leader_election_enable
                      and model.unclean_leader_election_enable and self.leader_of(tp) == NO_LEADER):
                    self._pending[tp] = "offline"
        effects.extend(self._plan(list(self._pending)))
        return effects

    def configs_changed(self, topics: Mapping[str, TopicModel]) -> list:
        """Topics whose configs changed (/config/changes): their models are taken in as by
        `topics_changed` (unclean.leader.election.enable turned on elects their offline
        partitions), and every broker is sent their partitions again: the UpdateMetadata
        carries the new configs to the brokers' registries and logs."""
        effects = self.topics_changed(topics)
        # (not the partitions it elects: their UpdateMetadata follows the state write, and
        # one sent now would carry the states from before it)
        tps = [tp for tp in self.partitions() if tp[0] in topics and tp in self.states and tp not in self._pending]
        if tps:
            effects.append(self._update_metadata(tps, to=sorted(self.live)))
        return effects

    def isr_changed(self, states: Mapping[TP, tuple[LeaderIsr, int]]) -> list:
        """Leaders wrote ISR changes: take them in, tell every broker, drive reassignments."""
        changed = []
        for tp, found in states.items():
            if tp[0] not in self.topics:
                continue
            current = self.states.get(tp)
            if current is None or found[1] > current[1] or found[0].leader_epoch >= current[0].leader_epoch:
                self.states[tp] = found
                changed.append(tp)
        effects: list = []
        if changed:
            effects.append(self._update_metadata(changed, to=sorted(self.live)))
        effects.extend(self._progress_reassignments())
        return effects

    def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> tuple[set[TP], list]:
        """Move `broker_id`'s leaderships away and take it out of the ISRs (Kafka's
        ControlledShutdown). Returns the partitions it will still lead and the effects."""
        registered = self.live.get(broker_id)
        if registered is None:
            raise _error(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker_id} is not registered")
        if broker_epoch >= 0 and registered.epoch != broker_epoch:
            raise _error(ErrorCode.STALE_BROKER_EPOCH,
                         f"broker {broker_id} asked with epoch {broker_epoch}, registered with {registered.epoch}")
        self.shutting_down.add(broker_id)
        effects: list = []
        stop_following = []
        for tp in self.partitions():
            found = self.states.get(tp)
            if found is None:
                continue
            state = found[0]
            if state.leader == broker_id:
                if len(self.replicas_of(tp)) > 1:
                    self._pending[tp] = "shutdown"
            elif broker_id in state.isr and state.leader != NO_LEADER:
                self._pending[tp] = "shrink"
                stop_following.append(tp)
        effects.extend(self._plan(list(self._pending)))
        if stop_following:
            effects.append(SendStopReplica(broker_id, tuple(stop_following), delete=False))
        return self.shutdown_remaining(broker_id), effects

    def shutdown_remaining(self, broker_id: int) -> set[TP]:
        """What a broker in controlled shutdown still leads among partitions with another
        replica (Kafka counts only those: a single replica's partition cannot move)."""
        return {tp for tp in self.partitions_led_by(broker_id) if len(self.replicas_of(tp)) > 1}

    def elect_leaders(self, election_type: str, tps: set[TP] | None) -> tuple[dict[TP, tuple[int, str]], list]:
        results: dict[TP, tuple[int, str]] = {}
        wanted = sorted(tps) if tps is not None else self.partitions()
        chosen = []
        for tp in wanted:
            if tp not in self.states or tp[0] not in self.topics or tp[1] not in self.topics[tp[0]].assignment:
                results[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp[0]}-{tp[1]} does not exist")
                continue
            state = self.states[tp][0]
            replicas = self.replicas_of(tp)
            if election_type == "preferred":
                if state.leader == replicas[0]:
                    results[tp] = (ErrorCode.ELECTION_NOT_NEEDED, f"broker {replicas[0]} already leads {tp[0]}-{tp[1]}")
                elif self._decide(tp, "preferred") is None:
                    results[tp] = (ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                                   f"the preferred replica {replicas[0]} of {tp[0]}-{tp[1]} is not alive and in "
                                   f"the ISR {list(state.isr)}")
                else:
                    chosen.append((tp, "preferred"))
            else:
                if state.leader in self.live:
                    results[tp] = (ErrorCode.ELECTION_NOT_NEEDED, f"{tp[0]}-{tp[1]} has a live leader {state.leader}")
                elif not self._unclean_enabled(tp[0]):
                    results[tp] = (ErrorCode.POLICY_VIOLATION,
                                   f"unclean.leader.election.enable is false for topic {tp[0]}: an unclean "
                                   f"election could lose acknowledged records")
                elif self._decide(tp, "unclean") is None:
                    results[tp] = (ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                                   f"no replica of {tp[0]}-{tp[1]} is alive")
                else:
                    chosen.append((tp, "unclean"))
        for tp, purpose in chosen:
            self._pending[tp] = purpose
            results[tp] = (ErrorCode.NONE, "")
        return results, self._plan([tp for tp, _ in chosen])

    def rebalance_tick(self, now_ms: int) -> list:
        if not self.config.auto_leader_rebalance_enable:
            return []
        assignments = {tp: self.replicas_of(tp) for tp in self.partitions()}
        leaders = {tp: self.leader_of(tp) for tp in self.partitions()}
        chosen = []
        for broker, tps in election.imbalanced_brokers(
                assignments, leaders, self._eligible(),
                self.config.leader_imbalance_per_broker_percentage).items():
            for tp in tps:
                if tp in self.reassignments or tp in self._pending:
                    continue
                if self._decide(tp, "preferred") is not None:
                    chosen.append(tp)
        for tp in chosen:
            self._pending[tp] = "preferred"
        return self._plan(chosen)

    def delete_topics(self, topics: set[str]) -> list:
        effects: list = []
        deleted = []
        for name in sorted(topics):
            if name in self.deletions_unconfirmed:
                continue       # deleted, waiting for its replicas to confirm (stop_replica_answered)
            model = self.topics.get(name)
            if model is None:
                self.deletions_waiting.pop(name, None)
                effects.append(DeleteTopicZnodes(name))    # a mark left for a topic already gone
                continue
            down = tuple(sorted({r for replicas in model.assignment.values() for r in replicas} - set(self.live)))
            if down:
                self.deletions_waiting[name] = down        # see the module doc; brokers_changed resumes it
                continue
            self.deletions_waiting.pop(name, None)
            del self.topics[name]
            by_broker: dict[int, list[TP]] = {}
            for partition, replicas in model.assignment.items():
                tp = (name, partition)
                self.states.pop(tp, None)
                self._pending.pop(tp, None)
                self.reassignments.pop(tp, None)
                self.partition_states.transition([tp], PartitionState.OFFLINE)
                self.partition_states.transition([tp], PartitionState.NON_EXISTENT)
                for replica in replicas:
                    self.replica_states.forget((tp, replica))
                    if replica in self.live:
                        by_broker.setdefault(replica, []).append(tp)
            for broker, tps in sorted(by_broker.items()):
                effects.append(SendStopReplica(broker, tuple(sorted(tps)), delete=True))
            if by_broker:
                self.deletions_unconfirmed[name] = {broker: tuple(sorted(tps)) for broker, tps in by_broker.items()}
            else:
                effects.append(DeleteTopicZnodes(name))    # no partition, no replica to wait for
            deleted.append(name)
        if deleted:
            effects.append(SendUpdateMetadata(tuple(sorted(self.live)), (), tuple(self.live.values()), {},
                                              deleted_topics=tuple(deleted)))
        return effects

    # ---- reassignment (KIP-455) ---------------------------------------------------------------------

    def reassign(self, plan: Mapping[TP, tuple[int, ...] | None], *,
                 throttle_bytes_per_s: int = 0) -> tuple[dict[TP, tuple[int, str]], list]:
        """Start (or, with None, cancel) reassignments; per partition (code, message).
        `throttle_bytes_per_s` bounds what the leader sends the new replicas while they
        catch up (kept by this controller only: a successor resumes without it)."""
        results: dict[TP, tuple[int, str]] = {}
        effects: list = []
        for tp, target in sorted(plan.items()):
            topic = self.topics.get(tp[0])
            if topic is None or tp[1] not in topic.assignment or tp not in self.states:
                results[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{tp[0]}-{tp[1]} does not exist")
                continue
            if target is None:
                ongoing = self.reassignments.get(tp)
                if ongoing is None:
                    results[tp] = (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS,
                                   f"no reassignment of {tp[0]}-{tp[1]} is in progress")
                    continue
                effects.extend(self._finish_reassignment(tp, ongoing.original, cancelled=True))
                results[tp] = (ErrorCode.NONE, "")
                continue
            target = tuple(target)
            problem = self._invalid_target(tp, target)
            if problem is not None:
                results[tp] = problem
                continue
            if tp in self.reassignments:
                results[tp] = (ErrorCode.REASSIGNMENT_IN_PROGRESS,
                               f"{tp[0]}-{tp[1]} is being reassigned already; cancel it first")
                continue
            original = topic.assignment[tp[1]]
            if original == target:
                results[tp] = (ErrorCode.NONE, "")
                effects.append(RemoveReassignmentRequest((tp,)))
                continue
            adding = tuple(r for r in target if r not in original)
            removing = tuple(r for r in original if r not in target)
            full = original + adding
            self.reassignments[tp] = _Reassignment(original, target, max(0, throttle_bytes_per_s))
            self._set_assignment(tp, full, adding, removing)
            effects.append(self._write_assignment(tp[0]))
            for replica in adding:
                self.replica_states.transition([(tp, replica)], ReplicaState.NEW)
            # a new leader epoch tells every replica, new ones included, the new replica set
            self._pending[tp] = "bump"
            effects.extend(self._plan([tp]))
            results[tp] = (ErrorCode.NONE, "")
        effects.extend(self._progress_reassignments())
        return results, effects

    def _invalid_target(self, tp: TP, target: tuple[int, ...]) -> tuple[int, str] | None:
        if not target:
            return (ErrorCode.INVALID_REPLICA_ASSIGNMENT, f"the target replicas of {tp[0]}-{tp[1]} are empty")
        if len(set(target)) != len(target):
            return (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"the target replicas of {tp[0]}-{tp[1]} name a broker twice: {list(target)}")
        unknown = sorted(b for b in target if b not in self.live)
        if unknown:
            return (ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"the target replicas of {tp[0]}-{tp[1]} name unknown or offline brokers {unknown}; live brokers "
                    f"are {sorted(self.live)}")
        return None

    def _progress_reassignments(self) -> list:
        """Reassignments whose new replicas all joined the ISR finish now."""
        effects: list = []
        for tp, ongoing in sorted(self.reassignments.items()):
            found = self.states.get(tp)
            if found is None or tp in self._pending:
                continue
            if all(r in found[0].isr for r in ongoing.target):
                effects.extend(self._finish_reassignment(tp, ongoing.target, cancelled=False))
        return effects

    def _finish_reassignment(self, tp: TP, final: tuple[int, ...], *, cancelled: bool) -> list:
        topic = self.topics[tp[0]]
        leaving = tuple(r for r in topic.assignment[tp[1]] if r not in final)
        self.reassignments.pop(tp, None)
        self._set_assignment(tp, final, (), ())
        effects: list = [self._write_assignment(tp[0])]
        self._pending[tp] = "reassign"
        effects.extend(self._plan([tp]))
        for replica in leaving:
            self.replica_states.transition([(tp, replica)], ReplicaState.OFFLINE)
            self.replica_states.forget((tp, replica))
            if replica in self.live:
                effects.append(SendStopReplica(replica, (tp,), delete=True))
        effects.append(RemoveReassignmentRequest((tp,)))
        return effects

    def _set_assignment(self, tp: TP, replicas, adding, removing) -> None:
        topic = self.topics[tp[0]]
        assignment = dict(topic.assignment)
        assignment[tp[1]] = tuple(replicas)
        adds = {p: r for p, r in topic.adding.items() if p != tp[1]}
        removes = {p: r for p, r in topic.removing.items() if p != tp[1]}
        if adding:
            adds[tp[1]] = tuple(adding)
        if removing:
            removes[tp[1]] = tuple(removing)
        self.topics[tp[0]] = dataclasses.replace(topic, assignment=assignment, adding=adds, removing=removes)

    def _write_assignment(self, topic: str) -> WriteAssignment:
        model = self.topics[topic]
        return WriteAssignment(topic, dict(model.assignment), dict(model.adding), dict(model.removing))

    # ---- deciding and writing states ------------------------------------------------------------------

    def _decide(self, tp: TP, purpose: str) -> LeaderIsr | None:
        """The new state for `tp` under `purpose`, or None when nothing may (or need) change."""
        replicas = self.replicas_of(tp)
        eligible = self._eligible()
        found = self.states.get(tp)
        if purpose == "new":
            live = tuple(r for r in replicas if r in eligible)
            if not live:
                return None
            return LeaderIsr(live[0], 0, live, self.epoch)
        if found is None:
            return None
        state = found[0]
        result = None
        if purpose == "offline":
            result = election.offline_partition_leader(replicas, state.isr, eligible,
                                                       unclean_enabled=self._unclean_enabled(tp[0]))
            if result is None:
                # no one may lead: the partition is offline, and its state says so
                if state.leader == NO_LEADER:
                    return None
                return LeaderIsr(NO_LEADER, state.leader_epoch + 1, state.isr, self.epoch)
        elif purpose == "unclean":
            result = election.offline_partition_leader(replicas, state.isr, eligible, unclean_enabled=True)
        elif purpose == "preferred":
            result = election.preferred_replica_leader(replicas, state.isr, eligible)
            if result is not None and result.leader == state.leader:
                return None
        elif purpose == "shutdown":
            result = election.controlled_shutdown_leader(replicas, state.isr, set(self.live), self.shutting_down)
        elif purpose == "shrink":
            isr = tuple(b for b in state.isr if b in self.live and b not in self.shutting_down)
            if state.leader in isr:
                pass
            elif state.leader in self.live:
                isr = (state.leader, *isr) if state.leader not in self.shutting_down else isr
            if isr == state.isr or not isr:
                return None
            return LeaderIsr(state.leader, state.leader_epoch + 1, isr, self.epoch)
        elif purpose == "bump":
            return LeaderIsr(state.leader, state.leader_epoch + 1, state.isr, self.epoch)
        elif purpose == "reassign":
            isr = tuple(b for b in state.isr if b in replicas)
            if state.leader in replicas and state.leader in eligible:
                return LeaderIsr(state.leader, state.leader_epoch + 1, isr or (state.leader,), self.epoch)
            result = election.reassign_partition_leader(replicas, isr, eligible)
            if result is None:
                return LeaderIsr(NO_LEADER, state.leader_epoch + 1, isr or state.isr, self.epoch)
        if result is None:
            return None
        if result.unclean:
            self._unclean.add(tp)
        else:
            self._unclean.discard(tp)
        return LeaderIsr(result.leader, state.leader_epoch + 1, result.isr, self.epoch)

    def _plan(self, tps: Iterable[TP]) -> list:
        creates: dict[TP, LeaderIsr] = {}
        updates: dict[TP, tuple[LeaderIsr, int]] = {}
        for tp in sorted(set(tps)):
            purpose = self._pending.get(tp)
            if purpose is None:
                continue
            decided = self._decide(tp, purpose)
            if decided is None:
                self._pending.pop(tp, None)
                continue
            found = self.states.get(tp)
            if found is None:
                creates[tp] = decided
            else:
                updates[tp] = (decided, found[1])
        if not creates and not updates:
            return []
        return [WriteStates(creates, updates)]

    def states_written(self, results: Mapping[TP, int | Exception]) -> list:
        """The shell wrote the states of the last WriteStates: apply the successes, re-read
        the conflicts."""
        done: list[TP] = []
        conflicts: list[TP] = []
        new_partitions: set[TP] = set()
        for tp, result in results.items():
            purpose = self._pending.get(tp)
            if purpose is None:
                continue
            if isinstance(result, Exception):
                conflicts.append(tp)
                continue
            decided = self._decide(tp, purpose)
            self._pending.pop(tp, None)
            self._attempts.pop(tp, None)
            if decided is None:
                continue
            previous = self.states.get(tp)
            if tp not in self.states:
                new_partitions.add(tp)
            elif decided.leader != NO_LEADER and decided.leader != previous[0].leader:
                self.leader_elections += 1
            self.states[tp] = (decided, result)
            target = PartitionState.ONLINE if decided.leader != NO_LEADER else PartitionState.OFFLINE
            self.partition_states.transition([tp], target)
            for replica in self.replicas_of(tp):
                if replica in self.live:
                    self.replica_states.transition([(tp, replica)], ReplicaState.ONLINE)
            done.append(tp)
        effects: list = []
        unclean = {tp for tp in done if tp in self._unclean}
        self._unclean -= set(results)
        for tp in sorted(unclean):
            self.unclean_elections.append((tp, self.states[tp][0].leader))
        if done:
            effects.extend(self._leader_and_isr(done, to=None, new=new_partitions, unclean=unclean))
            effects.append(self._update_metadata(done, to=sorted(self.live)))
        retry = []
        for tp in conflicts:
            attempts = self._attempts.get(tp, 0) + 1
            if attempts > DECISION_ATTEMPTS_MAX:
                self.errors.append(f"{tp[0]}-{tp[1]}: gave up after {attempts - 1} conflicting state writes")
                self._pending.pop(tp, None)
                self._attempts.pop(tp, None)
            else:
                self._attempts[tp] = attempts
                retry.append(tp)
        if retry:
            effects.append(ReadStates(tuple(retry)))
        effects.extend(self._progress_reassignments())
        return effects

    def states_read(self, found: Mapping[TP, tuple[LeaderIsr, int] | None]) -> list:
        for tp, value in found.items():
            if value is not None:
                self.states[tp] = value
        return self._plan([tp for tp in found if tp in self._pending])

    # ---- requests to brokers -----------------------------------------------------------------------

    def _request_state(self, tp: TP, *, is_new: bool = False, unclean: bool = False) -> PartitionRequestState:
        state, version = self.states[tp]
        topic = self.topics[tp[0]]
        ongoing = self.reassignments.get(tp)
        return PartitionRequestState(tp, state, self.replicas_of(tp), topic.adding.get(tp[1], ()),
                                     topic.removing.get(tp[1], ()), is_new, version,
                                     0 if ongoing is None else ongoing.throttle_bytes_per_s, unclean)

    def _leader_and_isr(self, tps: Iterable[TP], *, to, new: set[TP] = frozenset(),
                        unclean: set[TP] = frozenset()) -> list:
        by_broker: dict[int, list[PartitionRequestState]] = {}
        for tp in tps:
            if tp not in self.states:
                continue
            request_state = self._request_state(tp, is_new=tp in new, unclean=tp in unclean)
            for replica in self.replicas_of(tp):
                if replica in self.live and (to is None or replica in to):
                    by_broker.setdefault(replica, []).append(request_state)
        return [SendLeaderAndIsr(broker, tuple(states)) for broker, states in sorted(by_broker.items())]

    def _update_metadata(self, tps: Iterable[TP], *, to, full: bool = False) -> SendUpdateMetadata:
        states = tuple(self._request_state(tp) for tp in tps if tp in self.states)
        offline = {s.tp: tuple(r for r in s.replicas if r not in self.live) for s in states}
        return SendUpdateMetadata(tuple(to), states, tuple(self.live[b] for b in sorted(self.live)),
                                  {tp: r for tp, r in offline.items() if r}, full=full)


def _error(code: int, message: str) -> EosError:
    return EosError(message, code)
