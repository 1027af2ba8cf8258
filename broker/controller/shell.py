"""The controller's shell: ZooKeeper watches and gRPC requests around the pure ControllerCore.

Theory of operation
-------------------
Every broker runs a `Controller`; at most one is active. Election is Kafka's: whoever
creates the ephemeral /controller znode wins, bumps /controller_epoch by compare-and-set,
and becomes active with that epoch; the others watch /controller and try again when it
goes away. The epoch's znode version fences every controller write to ZooKeeper (a write
from a controller whose epoch was superseded fails the check and the controller resigns),
and the epoch itself travels in every request to the brokers, which refuse a lower one. A
controller that was paused past its ZooKeeper session therefore changes nothing when it
wakes up: its writes fail the version check, its requests carry a stale epoch.

One event thread owns the core (Kafka's single ControllerEventManager thread): ZooKeeper
watches (kazoo's thread), RPC handlers (ControlledShutdown, ElectLeaders, reassignments)
and the rebalance timer only put events on its queue; the thread takes them one at a time,
reads what it needs from ZooKeeper, calls the core and carries out the effects the core
returns: conditional state writes (whose results go back into the core), requests to the
brokers through `ControllerChannels`, assignment writes, topic deletion. The core decides;
this shell never does.

Watched besides Kafka's usual znodes: each topic's assignment znode (a broker's
CreatePartitions adds partitions there; the topic is read again) and /config/changes (a
broker altered a topic's configs; the topics named since the last notification handled are
read again and told to every broker, `ControllerCore.configs_changed`).
"""
from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable

from eos.errors import EosError, ErrorCode, NotControllerError
from eos.v1 import cluster_pb2

log = logging.getLogger("eos.controller")

EVENT_QUEUE_MAX = 10_000
LEADER_IMBALANCE_CHECK_INTERVAL_MS = 300_000   # leader.imbalance.check.interval.seconds = 300
CALL_TIMEOUT_S = 30.0
# Events a ZooKeeper watch raises; each handler reads the znode again and sets the next watch.
# Events retried (without their payload) when they fail; stop_replica_answered's retry is a
# delete_topics pass, which deletes the znodes of a deletion whose last confirmation came in
# but whose znodes could not be deleted then.
# (unclean_default is not a watch's, but its handler reads every topic again the same way.)
_WATCHED_EVENTS = frozenset({"brokers_changed", "topics_changed", "isr_change", "delete_topics",
                             "preferred_znode", "reassign_znode", "stop_replica_answered",
                             "assignment_changed", "config_changes", "unclean_default"})
ASSIGNMENT_WRITE_ATTEMPTS = 5   # a reassignment's write that keeps meeting partitions being added
ELECT_RETRY_S = 0.5          # after an election that failed (ZooKeeper unreachable, session expired)
STATE_WRITE_ROUNDS_MAX = 10


@dataclass
class _Event:
    kind: str
    payload: object = None
    future: concurrent.futures.Future | None = None


class Controller:
    """This broker's controller role; see the module doc.

    `store` is the ZooKeeper metadata store (`broker.metadata.zk_store.ZkStore`);
    `config` the core's `ControllerConfig`; `topic_configs(topic)` reads a topic's overrides
    (for LeaderAndIsr and the unclean flag)."""

    def __init__(self, broker_id: int, store, *, config, now_ms_fn: Callable[[], int],
                 rebalance_interval_ms: int = LEADER_IMBALANCE_CHECK_INTERVAL_MS, security=None):
        from broker.controller.channels import ControllerChannels

        self.broker_id = broker_id
        self._store = store
        self._config = config
        # The broker's unclean.leader.election.enable, which topics without their own follow:
        # the static one, then as the dynamic broker configs change it (`unclean_default_changed`;
        # the event thread's from then on).
        self._unclean_default = config.unclean_leader_election_enable
        self._now_ms = now_ms_fn
        self._rebalance_interval_ms = rebalance_interval_ms
        self._events: queue.Queue[_Event] = queue.Queue(maxsize=EVENT_QUEUE_MAX)
        self._channels = ControllerChannels(self._on_broker_response, security)
        self._core = None
        self._epoch = 0
        self._epoch_zk_version = -1
        self._topic_configs: dict[str, dict[str, str]] = {}
        self._topic_versions: dict[str, int] = {}
        self._config_changes_seen = -1    # the highest /config/changes notification handled
        self._stopping = threading.Event()
        self._calls_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._next_rebalance_ms = 0
        # For the broker's metrics (read from other threads; only the controller thread writes):
        # elections over every term this broker was controller, and the partitions without a
        # leader as the last event left them (0 while not the controller, as in Kafka).
        self.leader_elections_total = 0
        self.unclean_leader_elections_total = 0
        self.offline_partitions = 0

    # ---- lifecycle ---------------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self._core is not None

    @property
    def epoch(self) -> int:
        return self._epoch

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="eos-controller", daemon=True)
        self._thread.start()
        self._put("elect")

    def stop(self) -> None:
        self._stopping.set()
        self._put("stop")
        if self._thread is not None:
            self._thread.join(CALL_TIMEOUT_S)
        self._channels.close()

    def session_changed(self, state: str) -> None:
        """ZooKeeper session events (from the store's listener): after a new session the
        ephemeral /controller of the old one is gone, so resign and run for election again."""
        if state == "connected":
            self._put("elect")
        elif state == "lost":
            self._put("resign")

    def _put(self, kind: str, payload=None, future=None) -> None:
        try:
            self._events.put_nowait(_Event(kind, payload, future))
        except queue.Full:
            log.error("controller event queue full; dropping %s", kind)
            if future is not None:
                future.set_exception(EosError("the controller is overloaded", ErrorCode.REQUEST_TIMED_OUT))

    def _call(self, kind: str, payload):
        """Run an RPC's work on the event thread and wait for its answer."""
        if not self.is_active:
            raise NotControllerError(f"broker {self.broker_id} is not the controller")
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._calls_lock:
            # Under the lock the event thread's last act (`_fail_waiting_calls`) takes: a call is
            # either queued before it and failed there, or sees the stop here. Neither waits
            # CALL_TIMEOUT_S for a thread that is gone (a broker's controlled shutdown did, twice).
            if self._stopping.is_set():
                raise NotControllerError(f"broker {self.broker_id} is stopping its controller")
            self._put(kind, payload, future)
        return future.result(CALL_TIMEOUT_S)

    def _fail_waiting_calls(self) -> None:
        with self._calls_lock:
            while True:
                try:
                    event = self._events.get_nowait()
                except queue.Empty:
                    return
                if event.future is not None and not event.future.done():
                    event.future.set_exception(NotControllerError(
                        f"broker {self.broker_id} stopped its controller before answering"))

    # ---- RPC entry points (any thread) ---------------------------------------------------------

    def controlled_shutdown(self, broker_id: int, broker_epoch: int) -> set[tuple[str, int]]:
        return self._call("controlled_shutdown", (broker_id, broker_epoch))

    def elect_leaders(self, election_type: str, tps) -> dict[tuple[str, int], tuple[int, str]]:
        return self._call("elect_leaders", (election_type, tps))

    def reassign(self, plan, *, throttle_bytes_per_s: int = 0) -> dict[tuple[str, int], tuple[int, str]]:
        return self._call("reassign", (plan, throttle_bytes_per_s))

    def ongoing_reassignments(self) -> dict:
        return self._call("list_reassignments", None)

    def unclean_default_changed(self, enabled: bool) -> None:
        """The broker's unclean.leader.election.enable changed (a dynamic broker config)."""
        self._put("unclean_default", enabled)

    # ---- the event thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            timeout_s = 0.5
            try:
                event = self._events.get(timeout=timeout_s)
            except queue.Empty:
                event = _Event("tick")
            if event.kind == "stop":
                break
            try:
                result = self._handle(event)
                if event.future is not None:
                    event.future.set_result(result)
            except Exception as exc:
                if event.future is not None:
                    event.future.set_exception(exc)
                if _is_controller_moved(exc):
                    # Another controller took over: resign -- giving up /controller should
                    # it still be ours, else nobody would ever be elected -- and run again.
                    log.warning("controller %d fenced (%s); resigning", self.broker_id, exc)
                    self._resign(delete_znode=True)
                    self._put("elect")
                elif event.kind == "elect":
                    # (e.g. the session expired meanwhile) an election must not be lost
                    log.warning("controller election failed (%s); trying again", exc)
                    self._stopping.wait(ELECT_RETRY_S)
                    self._put("elect")
                elif event.kind in _WATCHED_EVENTS and self._core is not None:
                    # A watch fires once, and the read that failed (a ZooKeeper connection lost
                    # mid-read, say) was also the one that set it again: dropping the event
                    # would leave that change, and every later one, unseen (ISRs unhealed,
                    # topics not created) until something else moved. Read it again.
                    log.warning("controller event %s failed (%s); trying again", event.kind, exc)
                    self._stopping.wait(ELECT_RETRY_S)
                    self._put(event.kind)
                elif event.future is None:
                    log.exception("controller event %s failed", event.kind)
        self._fail_waiting_calls()
        self._resign(delete_znode=True)

    def _handle(self, event: _Event):
        kind = event.kind
        if kind == "elect":
            return self._elect()
        if kind == "resign":
            return self._resign()
        if kind == "unclean_default":
            return self._on_unclean_default(event.payload)    # kept while not active too
        if not self.is_active:
            if event.future is not None:
                raise NotControllerError(f"broker {self.broker_id} is no longer the controller")
            return None
        handler = getattr(self, "_on_" + kind)
        return handler(event.payload)

    # ---- election ---------------------------------------------------------------------------------

    def _elect(self) -> None:
        current = self._store.controller_id(watch=lambda *_: self._put("elect"))
        if current == self.broker_id and not self.is_active:
            # our /controller outlived our term (a resignation that could not delete it):
            # give it up, which wakes every broker's watch, this one's included
            log.info("broker %d holds /controller but is not active; giving it up", self.broker_id)
            self._store.resign_controller(self.broker_id)
            return
        if current is not None:
            if current != self.broker_id and self.is_active:
                log.info("broker %d is the controller now; %d resigns", current, self.broker_id)
                self._resign()
            return
        won = self._store.try_become_controller(self.broker_id)
        if won is None:
            self._store.controller_id(watch=lambda *_: self._put("elect"))
            return
        self._epoch, self._epoch_zk_version = won
        log.info("broker %d is the controller at epoch %d", self.broker_id, self._epoch)
        try:
            self._on_become_controller()
        except Exception:
            log.exception("taking over as controller failed; resigning")
            self._resign(delete_znode=True)
            raise

    def _resign(self, delete_znode: bool = False) -> None:
        was_active = self._core is not None
        self._core = None
        self.offline_partitions = 0
        self._channels.set_brokers({})
        if was_active:
            log.info("broker %d resigned as controller (epoch %d)", self.broker_id, self._epoch)
        if delete_znode:
            try:
                self._store.resign_controller(self.broker_id)
            except Exception as exc:
                log.info("could not delete /controller: %s", exc)

    def _on_become_controller(self) -> None:
        from broker.controller.core import ControllerCore

        store = self._store
        live = self._read_live_brokers()
        # The config changes announced so far are in the configs read below; later ones are
        # `_on_config_changes`'.
        self._config_changes_seen = store.last_config_change(watch=self._config_changes_watch)
        topics = self._read_topics(store.topics(watch=lambda *_: self._put("topics_changed")))
        tps = [(t, p) for t, model in topics.items() for p in model.assignment]
        states = store.partition_states(tps)
        reassignments = store.reassignment_request(watch=lambda *_: self._put("reassign_znode")) or {}
        store.isr_change_notifications(watch=lambda *_: self._put("isr_change"))
        store.topics_to_delete(watch=lambda *_: self._put("delete_topics"))
        store.preferred_election_request(watch=lambda *_: self._put("preferred_znode"))
        self._core = ControllerCore(self.broker_id, self._epoch, self._config)
        self._channels.set_brokers({b: f"{r.host}:{r.port}" for b, r in live.items()})
        self._execute(self._core.initialize(
            live_brokers=live, topics=topics, states=states, reassignments=reassignments, now_ms=self._now_ms()))
        # What was pending while no controller was active.
        self._on_isr_change(None)
        self._on_delete_topics(None)
        self._on_preferred_znode(None)
        self._next_rebalance_ms = self._now_ms() + self._rebalance_interval_ms

    # ---- reading ZooKeeper ---------------------------------------------------------------------------

    def _read_live_brokers(self) -> dict:
        """Broker id -> its registration (a BrokerInfo, the core's LiveBroker), endpoints and all."""
        return self._store.live_brokers(watch=lambda *_: self._put("brokers_changed"))

    def _read_topics(self, names) -> dict:
        from broker.controller.core import TopicModel

        models = {}
        for name in names:
            # the watch sees partitions added to the topic (CreatePartitions); kazoo keeps a
            # watcher once per znode however often it is set (a set of callables)
            found = self._store.topic_assignment(name, watch=self._assignment_changed)
            if found is None:
                continue
            assignment, version = found
            config = self._store.topic_config(name)
            self._topic_configs[name] = config
            self._topic_versions[name] = version
            models[name] = TopicModel(
                assignment=dict(assignment.partitions), adding=dict(assignment.adding),
                removing=dict(assignment.removing), unclean_leader_election_enable=_is_true(
                    config.get("unclean.leader.election.enable"), self._unclean_default))
        return models

    def _assignment_changed(self, event) -> None:
        """(kazoo's thread) A topic's assignment znode changed: read that topic again. (An
        event without a path is the connection's state changing: every watcher gets one,
        among them the watch on /brokers/topics' children, whose event reads every topic
        again and sets these watches anew.)"""
        if event.path is not None:
            self._put("assignment_changed", event.path.rsplit("/", 1)[-1])

    def _config_changes_watch(self, _event) -> None:
        """(kazoo's thread) One watcher object, so a re-election does not add another."""
        self._put("config_changes")

    # ---- events -------------------------------------------------------------------------------------

    def _on_tick(self, _payload) -> None:
        now_ms = self._now_ms()
        if now_ms >= self._next_rebalance_ms:
            self._next_rebalance_ms = now_ms + self._rebalance_interval_ms
            self._execute(self._core.rebalance_tick(now_ms))

    def _on_brokers_changed(self, _payload) -> None:
        live = self._read_live_brokers()
        self._channels.set_brokers({b: f"{r.host}:{r.port}" for b, r in live.items()})
        self._execute(self._core.brokers_changed(live, self._now_ms()))

    def _on_topics_changed(self, _payload) -> None:
        names = self._store.topics(watch=lambda *_: self._put("topics_changed"))
        topics = self._read_topics(names)
        self._execute(self._core.topics_changed(topics))

    def _on_assignment_changed(self, topic: str | None) -> None:
        """New partitions of a topic (or the controller's own reassignment write, read back):
        the core brings new partitions online as it does a new topic's. (A retried event
        carries no topic: every topic is read again.)"""
        if topic is None:
            self._on_topics_changed(None)
        else:
            self._execute(self._core.topics_changed(self._read_topics([topic])))

    def _on_config_changes(self, _payload) -> None:
        """Topic configs altered (broker/cluster_admin.py): read those topics again and tell
        the brokers (`ControllerCore.configs_changed`)."""
        seen, names = self._store.topic_config_changes(self._config_changes_seen, watch=self._config_changes_watch)
        if names:
            self._execute(self._core.configs_changed(self._read_topics(sorted(names))))
        self._config_changes_seen = seen     # only now: a failed event is retried from the same place

    def _on_unclean_default(self, enabled: bool | None) -> None:
        """unclean.leader.election.enable of this broker changed (None: a retry of this event).
        The active controller reads every topic again: those without a value of their own follow
        the new default, and when it turned on their partitions without a leader get one from
        outside the ISR (`ControllerCore.topics_changed`; Kafka's
        enableDefaultUncleanLeaderElection). A candidate only keeps it for when it is elected."""
        if enabled is not None:
            if enabled == self._unclean_default:
                return
            self._unclean_default = enabled
            log.info("unclean.leader.election.enable is now %s for topics without their own", str(enabled).lower())
        if self._core is not None:
            self._execute(self._core.topics_changed(self._read_topics(sorted(self._core.topics))))

    def _on_isr_change(self, _payload) -> None:
        names = self._store.isr_change_notifications(watch=lambda *_: self._put("isr_change"))
        if not names:
            return
        # Deleted only once applied: a read cut short (ZooKeeper lost mid-way) is retried from
        # the same notifications, where deleting them first lost those partitions' ISR changes
        # for good (the brokers' metadata kept a shrunk ISR that had healed).
        changed = self._store.read_isr_changes(names)
        states = {tp: found for tp, found in self._store.partition_states(list(changed)).items() if found is not None}
        self._execute(self._core.isr_changed(states))
        self._store.delete_isr_changes(names, epoch_zk_version=self._epoch_zk_version)

    def _on_delete_topics(self, _payload) -> None:
        names = self._store.topics_to_delete(watch=lambda *_: self._put("delete_topics"))
        if names:
            self._execute(self._core.delete_topics(set(names)))
        for name, down in sorted(self._core.deletions_waiting.items()):
            log.warning("the deletion of topic %s waits for broker(s) %s, down, which hold a replica of it",
                        name, ", ".join(map(str, down)))
        for name, unconfirmed in sorted(self._core.deletions_unconfirmed.items()):
            log.info("the deletion of topic %s waits for broker(s) %s to confirm they deleted their replicas",
                     name, ", ".join(map(str, sorted(unconfirmed))))

    def _on_preferred_znode(self, _payload) -> None:
        tps = self._store.preferred_election_request(watch=lambda *_: self._put("preferred_znode"))
        if tps is None:
            return
        results, effects = self._core.elect_leaders("preferred", set(tps) or None)
        self._execute(effects)
        self._store.delete_preferred_election_request(epoch_zk_version=self._epoch_zk_version)

    def _on_reassign_znode(self, _payload) -> None:
        plan = self._store.reassignment_request(watch=lambda *_: self._put("reassign_znode")) or {}
        if plan:
            results, effects = self._core.reassign(dict(plan))
            self._execute(effects)

    def _on_controlled_shutdown(self, payload) -> set:
        broker_id, broker_epoch = payload
        _, effects = self._core.controlled_shutdown(broker_id, broker_epoch)
        self._execute(effects)
        return self._core.shutdown_remaining(broker_id)   # after the writes went through

    def _on_elect_leaders(self, payload) -> dict:
        election_type, tps = payload
        results, effects = self._core.elect_leaders(election_type, tps)
        self._execute(effects)
        return results

    def _on_reassign(self, payload) -> dict:
        plan, throttle_bytes_per_s = payload
        results, effects = self._core.reassign(plan, throttle_bytes_per_s=throttle_bytes_per_s)
        self._execute(effects)
        return results

    def _on_list_reassignments(self, _payload) -> dict:
        return self._core.ongoing_reassignments()

    # ---- effects ------------------------------------------------------------------------------------

    def _execute(self, effects) -> None:
        """Carry out the core's effects in order; write results go back into the core,
        whose answers are carried out in turn (bounded)."""
        from broker.controller import core as c

        try:
            self._execute_effects(list(effects or ()))
        finally:
            if self._core is not None:
                self.offline_partitions = sum(1 for state, _ in self._core.states.values()
                                              if state.leader == c.NO_LEADER)

    def _execute_effects(self, pending: list) -> None:
        from broker.controller import core as c

        rounds = 0
        while pending:
            effect = pending.pop(0)
            if isinstance(effect, c.WriteStates):
                rounds += 1
                if rounds > STATE_WRITE_ROUNDS_MAX * 10:
                    log.error("too many state write rounds; giving up this event")
                    return
                results = {}
                if effect.creates:
                    results.update(self._store.create_partition_states(
                        dict(effect.creates), epoch_zk_version=self._epoch_zk_version))
                if effect.updates:
                    results.update(self._store.update_partition_states(
                        dict(effect.updates), epoch_zk_version=self._epoch_zk_version))
                for result in results.values():
                    if _is_controller_moved(result):
                        raise result
                seen_unclean = len(self._core.unclean_elections)
                seen_elections = self._core.leader_elections
                pending[:0] = list(self._core.states_written(results) or ())
                self.leader_elections_total += self._core.leader_elections - seen_elections
                self.unclean_leader_elections_total += len(self._core.unclean_elections) - seen_unclean
                for (topic, partition), leader in self._core.unclean_elections[seen_unclean:]:
                    log.warning("%s-%d: UNCLEAN leader election: broker %d leads without being in sync; "
                                "acknowledged records may be lost (unclean.leader.election.enable)",
                                topic, partition, leader)
            elif isinstance(effect, c.ReadStates):
                found = self._store.partition_states(list(effect.partitions))
                pending[:0] = list(self._core.states_read(found) or ())
            elif isinstance(effect, c.SendLeaderAndIsr):
                self._channels.send(effect.broker_id, "LeaderAndIsr", self._leader_and_isr_request(effect))
            elif isinstance(effect, c.SendUpdateMetadata):
                request = self._update_metadata_request(effect)
                for broker_id in effect.broker_ids:
                    self._channels.send(broker_id, "UpdateMetadata", request)
            elif isinstance(effect, c.SendStopReplica):
                request = cluster_pb2.StopReplicaRequest(controller_id=self.broker_id, controller_epoch=self._epoch,
                                                         delete_partitions=effect.delete)
                for topic, partition in effect.partitions:
                    request.partitions.add(topic=topic, partition=partition)
                self._channels.send(effect.broker_id, "StopReplica", request)
            elif isinstance(effect, c.WriteAssignment):
                self._write_assignment(effect)
            elif isinstance(effect, c.RemoveReassignmentRequest):
                current = self._store.reassignment_request() or {}
                left = {tp: r for tp, r in current.items() if tp not in set(effect.partitions)}
                self._store.set_reassignment_request(left or None, epoch_zk_version=self._epoch_zk_version)
            elif isinstance(effect, c.DeleteTopicZnodes):
                self._store.delete_topic(effect.topic, epoch_zk_version=self._epoch_zk_version)
                self._topic_configs.pop(effect.topic, None)
                self._topic_versions.pop(effect.topic, None)
            else:
                raise EosError(f"the controller shell does not know the effect {type(effect).__name__}")

    def _write_assignment(self, effect) -> None:
        """A reassignment step's assignment, written under the version last read. A broker
        may have added partitions since (CreatePartitions writes the znode too; its watch
        event is still queued): then the znode is read again and written with those partitions
        kept -- they are new ids, never ones the reassignment moves -- and the watch event
        that follows brings them online."""
        from kazoo.exceptions import BadVersionError

        from broker.metadata.zk_store import TopicAssignment

        wanted = TopicAssignment(dict(effect.assignment), dict(effect.adding), dict(effect.removing))
        for attempt in range(ASSIGNMENT_WRITE_ATTEMPTS):
            try:
                self._topic_versions[effect.topic] = self._store.set_topic_assignment(
                    effect.topic, wanted, expected_version=self._topic_versions.get(effect.topic, -1),
                    epoch_zk_version=self._epoch_zk_version)
                return
            except BadVersionError:
                found = self._store.topic_assignment(effect.topic, watch=self._assignment_changed)
                if found is None or attempt == ASSIGNMENT_WRITE_ATTEMPTS - 1:
                    raise
                current, self._topic_versions[effect.topic] = found
                added = {p: r for p, r in current.partitions.items() if p not in wanted.partitions}
                wanted = TopicAssignment({**wanted.partitions, **added}, wanted.adding, wanted.removing)

    def _partition_state_proto(self, state) -> cluster_pb2.PartitionLeaderState:
        topic, partition = state.tp
        li = state.leader_isr
        return cluster_pb2.PartitionLeaderState(
            topic=topic, partition=partition, controller_epoch=li.controller_epoch, leader=li.leader,
            leader_epoch=li.leader_epoch, isr=li.isr, zk_version=getattr(state, "zk_version", 0),
            replicas=state.replicas, adding_replicas=state.adding, removing_replicas=state.removing,
            is_new=state.is_new, topic_configs=self._topic_configs.get(topic, {}),
            reassignment_throttle_bytes_per_s=state.throttle_bytes_per_s, unclean_election=state.unclean_election)

    def _leader_and_isr_request(self, effect) -> cluster_pb2.LeaderAndIsrRequest:
        return cluster_pb2.LeaderAndIsrRequest(
            controller_id=self.broker_id, controller_epoch=self._epoch,
            partitions=[self._partition_state_proto(s) for s in effect.partitions])

    def _update_metadata_request(self, effect) -> cluster_pb2.UpdateMetadataRequest:
        request = cluster_pb2.UpdateMetadataRequest(
            controller_id=self.broker_id, controller_epoch=self._epoch,
            full=getattr(effect, "full", False), deleted_topics=list(getattr(effect, "deleted_topics", ())),
            live_brokers=[cluster_pb2.ClusterBroker(
                broker_id=b.broker_id, host=b.host, port=b.port, rack=b.rack or "", broker_epoch=b.epoch,
                endpoints=[cluster_pb2.ListenerEndpoint(listener_name=e.name, security_protocol=e.security_protocol,
                                                        host=e.host, port=e.port) for e in b.endpoints],
                socket_port=b.socket_port)
                for b in effect.live_brokers])
        offline = effect.offline_replicas or {}
        for state in effect.partitions:
            proto = self._partition_state_proto(state)
            proto.offline_replicas.extend(offline.get(state.tp, ()))
            request.partitions.append(proto)
        return request

    def _on_broker_response(self, broker_id: int, rpc_name: str, response, request) -> None:
        """(a sender thread) Errors are logged; a StopReplica that deleted partitions goes to
        the core as an event (a topic's deletion ends when every replica confirmed it)."""
        code = getattr(response, "error_code", 0)
        if code:
            log.warning("%s to broker %d answered %s: %s", rpc_name, broker_id, ErrorCode(code).name,
                        response.error_message)
        elif rpc_name == "StopReplica" and request.delete_partitions:
            deleted = [(p.topic, p.partition) for p in response.partitions if p.error_code == ErrorCode.NONE]
            refused = [p for p in response.partitions if p.error_code != ErrorCode.NONE]
            for p in refused:
                log.warning("broker %d could not delete %s-%d: %s", broker_id, p.topic, p.partition, p.error_message)
            self._put("stop_replica_answered", (broker_id, deleted))

    def _on_stop_replica_answered(self, payload) -> None:
        if payload is None:
            # the retry of a failed event carries no payload: the core has taken the answer in,
            # and what failed was deleting the topic's znodes; a mark left behind for a topic
            # the core no longer has is deleted by the delete_topics pass
            self._on_delete_topics(None)
            return
        broker_id, deleted = payload
        self._execute(self._core.stop_replica_answered(broker_id, deleted))


def _is_true(raw: str | None, default: bool) -> bool:
    if raw is None:
        return default
    return raw.strip().lower() == "true"


def _is_controller_moved(exc) -> bool:
    """Another controller took over (or this one is no longer active). A partition state
    whose version moved under a write (StateVersionConflict: a leader's own ISR change
    raced it) is not that: the core re-reads it and decides again, as Kafka's controller
    retries such partitions."""
    from broker.metadata.zk_store import StateVersionConflict
    return (isinstance(exc, EosError) and exc.code == ErrorCode.NOT_CONTROLLER
            and not isinstance(exc, StateVersionConflict))
