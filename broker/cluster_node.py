"""A broker's membership in a ZooKeeper cluster: the pieces a cluster of one does without.

Theory of operation
-------------------
`ClusterNode` composes, for one broker, what cluster mode adds around the same storage,
services and coordinators a single broker runs (DESIGN.md §10):

- the ZooKeeper store (kazoo), its session and the broker's ephemeral registration;
- the `MetadataCache` that UpdateMetadata fills and Metadata answers from;
- the `ReplicaManager` and its `FetcherManager` (leaders, followers, ISR, HW);
- the `Controller` candidate (active on at most one broker);
- topic administration through ZooKeeper and producer ids from ZooKeeper blocks;
- the coordinators' loading: the transaction coordinator serves the transactional ids of
  the `__transaction_state` partitions this broker leads, the group coordinator the groups
  of the `__consumer_offsets` partitions it leads (Kafka's TransactionStateManager and
  GroupMetadataManager). A partition becoming led here is loaded on one background thread,
  in the order the leadership changes arrived, once the followers have confirmed its log
  (HW = log end); a partition led elsewhere now is unloaded at once. FindCoordinator answers
  with the leader of the key's partition; the internal topics are created (RF min(3, live
  brokers), min.insync.replicas min(2, RF)) on the first FindCoordinator that needs them.

Start order (`connect`, then `join` once the gRPC server serves): connect to ZooKeeper and
check the cluster id against the data dir (a data dir written by another cluster refuses to
start), then register /brokers/ids/<id> (the broker epoch is the znode's czxid) and start
the controller candidate, so the controller's first requests find the server up.

Stop order (`leave`): controlled shutdown first (ask the controller, up to
controlled.shutdown.max.retries times, to move this broker's leaderships away; Kafka's
order), then the controller candidate resigns, fetchers stop, the registration goes with
the ZooKeeper session. With ZooKeeper unreachable at that point the session is closed
first: the threads' reads then fail at once instead of waiting for ZooKeeper to return. A broker killed with -9 skips all of this: its session expires after
zookeeper.session.timeout.ms and the controller elects new leaders from the ISR.
"""
from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from typing import Callable

import grpc

from broker.group.records import OFFSETS_TOPIC, partition_for_group
from broker.metadata.cache import MetadataCache
from eos.client_config import PLAINTEXT_SECURITY, ChannelSecurity
from eos.errors import ErrorCode, InconsistentClusterIdError
from eos.net import open_channel
from eos.v1 import cluster_pb2, cluster_pb2_grpc

log = logging.getLogger("eos.broker.cluster")

CONTROLLED_SHUTDOWN_RPC_TIMEOUT_S = 30.0
TXN_STATE_TOPIC = "__transaction_state"
COORDINATOR_LOAD_WAIT_S = 30.0
INTERNAL_TOPIC_REPLICATION_FACTOR = 3     # offsets.topic / transaction.state.log .replication.factor
INTERNAL_TOPIC_MIN_ISR = 2                # transaction.state.log.min.isr
REPLICATED_APPEND_TIMEOUT_MS = 30_000     # a coordinator's append waits this long for the ISR


class ClusterNode:
    def __init__(self, broker_id: int, config, *, host: str, now_ms_fn: Callable[[], int],
                 security: ChannelSecurity = PLAINTEXT_SECURITY):
        self.broker_id = broker_id
        self.config = config
        self.host = host
        # How this broker's channels to the others are secured (the inter-broker listener's
        # protocol): replica fetches, the controller's requests, coordinator calls.
        self.security = security
        self._now_ms = now_ms_fn
        self.metadata = MetadataCache()
        self.store = None
        self.replicas = None
        self.controller = None
        self.topic_admin = None
        self.producer_ids = None
        self.broker_epoch = -1
        self._port: int | None = None
        self._registry = None
        self._log_manager = None
        self._notify = None
        self._lock = threading.Lock()
        # The topic defaults in force (dynamic broker configs included: `topic_defaults_changed`),
        # under a lock of their own so that the controller is built with the latest and told
        # of every later one.
        self._topic_defaults = config.topic_defaults
        self._topic_defaults_lock = threading.Lock()
        self.txn_coordinator = None          # set by the server: the partitioned TransactionCoordinator
        self.group_coordinator = None        # set by the server: the partitioned GroupCoordinator
        self._loads: queue.Queue = queue.Queue()
        # Channels to other brokers' transaction coordinators, kept: with KIP-890 part 2 a
        # transaction's first write to each partition asks the coordinator to add it.
        self._coordinator_channels: dict[str, grpc.Channel] = {}
        self._loader: threading.Thread | None = None
        self._stopping = threading.Event()

    # ---- start ------------------------------------------------------------------------------

    def connect(self, proposed_cluster_id: str, data_dir_cluster_id: str | None) -> str:
        """Connect to ZooKeeper; return the cluster id (ZooKeeper's, created from
        `proposed_cluster_id` on the first broker). A data dir of another cluster refuses."""
        from broker.metadata.zk_store import ZkStore
        from broker.cluster_admin import ZkProducerIdManager

        self.store = ZkStore(self.config.zookeeper_connect,
                             session_timeout_ms=self.config.zookeeper_session_timeout_ms)
        self.store.start()
        self.store.ensure_paths()
        # Kafka's rule: ZooKeeper's id wins (a fresh one if it has none), and a data dir that
        # already belongs to a cluster must belong to that one.
        cluster_id = self.store.get_or_create_cluster_id(proposed_cluster_id)
        if data_dir_cluster_id is not None and data_dir_cluster_id != cluster_id:
            self.store.close()
            raise InconsistentClusterIdError(
                f"the data dir belongs to cluster {data_dir_cluster_id}, but ZooKeeper at "
                f"{self.config.zookeeper_connect} holds cluster {cluster_id}: refusing to start (Kafka's "
                f"InconsistentClusterIdException)")
        self.producer_ids = ZkProducerIdManager(self.store.client, self.broker_id)
        return cluster_id

    def build(self, *, registry, log_manager, notify: Callable[[tuple[str, int]], None]) -> None:
        """Make the replica manager, fetchers, topic admin and controller (nothing runs yet)."""
        import random

        from broker.cluster_admin import ClusterTopicAdmin
        from broker.controller.core import ControllerConfig
        from broker.controller.shell import Controller
        from broker.replica.fetcher import FetcherManager
        from broker.replica.manager import ReplicaManager

        self._registry = registry
        self._log_manager = log_manager
        self._notify = notify
        config = self.config
        self.replicas = ReplicaManager(
            self.broker_id, log_manager, ensure_topic=self._ensure_topic, isr_writer=self._write_isr,
            notify=notify, now_ms_fn=self._now_ms, replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            is_live_broker=lambda broker_id: self.metadata.broker(broker_id) is not None)
        self.replicas.on_role_change = self._role_changed
        self.replicas.fetchers = FetcherManager(
            self.broker_id, log_manager, address_of=self._address_of, on_appended=notify,
            broker_epoch_fn=lambda: self.broker_epoch, security=self.security,
            socket_address_of=self._socket_address_of)
        self.topic_admin = ClusterTopicAdmin(
            self.store, self.metadata, default_num_partitions=config.num_partitions,
            default_replication_factor=config.default_replication_factor, default_config=lambda: registry.default_config,
            rng=random.Random())
        with self._topic_defaults_lock:
            self.controller = Controller(
                self.broker_id, self.store,
                config=ControllerConfig(
                    auto_leader_rebalance_enable=config.auto_leader_rebalance_enable,
                    leader_imbalance_per_broker_percentage=config.leader_imbalance_per_broker_percentage,
                    unclean_leader_election_enable=self._topic_defaults.unclean_leader_election_enable),
                now_ms_fn=self._now_ms,
                rebalance_interval_ms=config.leader_imbalance_check_interval_seconds * 1000, security=self.security)

    def topic_defaults_changed(self, defaults) -> None:
        """The dynamic broker configs changed the topic defaults (broker/dynamic_config.py):
        the controller candidate takes unclean.leader.election.enable, as Kafka's controller
        takes its own broker's value."""
        with self._topic_defaults_lock:     # (posting is a queue put: in order, under the lock)
            self._topic_defaults = defaults
            if self.controller is not None:
                self.controller.unclean_default_changed(defaults.unclean_leader_election_enable)

    def join(self, port: int, endpoints: tuple = (), socket_port: int = 0) -> None:
        """Register in ZooKeeper and start the roles; the gRPC server already serves.
        `port` is the inter-broker listener's; `endpoints` (ListenerEndpoint) every
        listener's advertised address, which Metadata hands to the clients of each;
        `socket_port` the socket.transport.port (0: none), handed to PLAINTEXT clients."""
        from broker.metadata.zk_store import BrokerRegistration

        self._port = port
        self.replicas.start()
        self._loader = threading.Thread(target=self._load_loop, name="eos-coordinator-load", daemon=True)
        self._loader.start()
        self.broker_epoch = self.store.register_broker(
            BrokerRegistration(self.broker_id, self.host, port, self.config.broker_rack or None,
                               endpoints=tuple(endpoints), socket_port=socket_port))
        self.store.add_session_listener(self._session_changed)
        self.controller.start()
        log.info("broker %d registered in ZooKeeper (broker epoch %d)", self.broker_id, self.broker_epoch)

    def _session_changed(self, state: str) -> None:
        if state == "connected":
            try:
                registered = self.store.live_brokers().get(self.broker_id)
                if registered is not None:
                    self.broker_epoch = registered.epoch
            except Exception as exc:
                log.info("reading this broker's registration after a new session failed: %s", exc)
        if self.controller is not None:
            self.controller.session_changed(state)

    # ---- hooks for the replica manager -------------------------------------------------------------

    def _ensure_topic(self, topic: str, partition: int, configs: dict):
        """The local registry knows `topic` with at least `partition` + 1 partitions;
        returns its TopicConfig (for opening the replica's log)."""
        known = self.metadata.snapshot.partition_count(topic)
        current = self._registry.get(topic)
        count = max(known, partition + 1, 0 if current is None else current.partition_count)
        overrides = configs if configs else ({} if current is None else dict(current.config_overrides))
        return self._learn(topic, count, overrides).config

    def sync_registry(self) -> None:
        """After UpdateMetadata: the local registry learns every topic's partition count and
        config overrides."""
        snapshot = self.metadata.snapshot
        for topic, partitions in snapshot.topics().items():
            self._learn(topic, len(partitions), snapshot.topic_configs.get(topic, {}))

    def _learn(self, topic: str, partition_count: int, overrides):
        """The registry learns the topic; a config that changed (an alteration the controller
        passed on, or one made while this broker was down) reaches its open logs at once."""
        before = self._registry.get(topic)
        info = self._registry.learn(topic, partition_count, overrides)
        if before is not None and before.config != info.config:
            self._registry.push_config(topic, functools.partial(self._log_manager.update_config, topic))
            log.info("topic %s: config overrides now %s", topic, dict(info.config_overrides))
        return info

    def _address_of(self, broker_id: int) -> str | None:
        endpoint = self.metadata.broker(broker_id)
        if endpoint is None:
            registration = self.store.live_brokers().get(broker_id)
            if registration is None:
                return None
            return f"{registration.host}:{registration.port}"
        return f"{endpoint.host}:{endpoint.port}"

    def _socket_address_of(self, broker_id: int) -> tuple[str, int] | None:
        """Where a broker serves socket.transport.port: its PLAINTEXT listener's host, when
        it has the port and this broker's inter-broker listener is PLAINTEXT (the socket is
        plain TCP, and the broker's own calls over TLS stay on TLS)."""
        if self.security.is_tls:
            return None
        endpoint = self.metadata.broker(broker_id)
        if endpoint is None or not endpoint.socket_port:
            return None
        plaintext = next((e for e in endpoint.endpoints if e.security_protocol == "PLAINTEXT"), None)
        return (plaintext.host if plaintext is not None else endpoint.host), endpoint.socket_port

    def _write_isr(self, topic: str, partition: int, leader: int, leader_epoch: int, isr: tuple[int, ...],
                   controller_epoch: int, zk_version: int) -> int:
        from broker.metadata.zk_store import LeaderIsr, StateVersionConflict

        tp = (topic, partition)
        results = self.store.update_partition_states(
            {tp: (LeaderIsr(leader, leader_epoch, tuple(isr), controller_epoch), zk_version)}, epoch_zk_version=None)
        result = results[tp]
        if isinstance(result, StateVersionConflict):
            # The znode moved without this leadership ending (a new controller rewrites the
            # states it finds, stamped with its epoch): only the version this leader cached
            # is stale. Kafka's ZooKeeper-mode leader skipped the write and could stay stuck
            # so (KAFKA-2729); read the state and write once more at its version while the
            # leader and its epoch are still ours. A changed leadership still refuses.
            current = self.store.partition_state(topic, partition)
            if current is not None and current[0].leader == leader and current[0].leader_epoch == leader_epoch:
                log.info("%s-%d: partition state version %d is now %d at the same leader epoch %d; "
                         "writing the ISR change at the new version", topic, partition, zk_version, current[1],
                         leader_epoch)
                results = self.store.update_partition_states(
                    {tp: (LeaderIsr(leader, leader_epoch, tuple(isr), max(controller_epoch, current[0].controller_epoch)),
                          current[1])}, epoch_zk_version=None)
                result = results[tp]
        if isinstance(result, Exception):
            raise result
        self.store.write_isr_change_notification([(topic, partition)])
        return result

    # ---- the coordinators follow leadership (Kafka's TransactionStateManager) -----------------

    def _role_changed(self, tp: tuple[str, int], is_leader: bool, leader_epoch: int) -> None:
        if tp[0] in (TXN_STATE_TOPIC, OFFSETS_TOPIC):
            self._loads.put((tp, is_leader, leader_epoch))   # in order, off the request thread

    def _load_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                tp, is_leader, leader_epoch = self._loads.get(timeout=0.5)
            except queue.Empty:
                continue
            coordinator = self.txn_coordinator if tp[0] == TXN_STATE_TOPIC else self.group_coordinator
            if coordinator is None:
                continue
            try:
                if not is_leader:
                    coordinator.unload_partition(tp[1])
                    continue
                self._wait_committed(tp)
                current = self.replicas.leader_epoch_of(tp)
                if current != leader_epoch:
                    log.info("%s-%d: not loading epoch %d, leadership is now %s", tp[0], tp[1], leader_epoch, current)
                    continue     # leadership moved on meanwhile; a later event says where
                if tp[0] == TXN_STATE_TOPIC:
                    coordinator.load_partition(tp[1], leader_epoch)
                else:
                    coordinator.load_partition(tp[1], leader_epoch, self._log_manager.get_log(*tp))
            except Exception:
                log.exception("loading %s-%d for its coordinator failed; retrying", tp[0], tp[1])
                if not self._stopping.wait(1.0):
                    self._loads.put((tp, is_leader, leader_epoch))

    def _wait_committed(self, tp: tuple[str, int]) -> None:
        """A new leader's high watermark reaches its log end once the followers confirm it;
        a coordinator replays up to the HW, so it waits (bounded) for that first."""
        deadline = time.monotonic() + COORDINATOR_LOAD_WAIT_S
        while time.monotonic() < deadline and not self._stopping.is_set():
            partition_log = self._log_manager.get_log(*tp)
            if partition_log is None or partition_log.high_watermark >= partition_log.log_end_offset:
                return
            time.sleep(0.05)

    def find_coordinator(self, key_type: int, keys: list[str], listener_name: str | None = None):
        """FindCoordinator on a cluster: the coordinator of a transactional id (of a group) is
        the leader of its `__transaction_state` (`__consumer_offsets`) partition, named by
        its address on `listener_name` (the listener the asking client came in on; None:
        the inter-broker one)."""
        from broker.group.coordinator import CoordinatorAddress, CoordinatorType
        from txn_coordinator import txn_log

        answers = []
        for key in keys:
            if key_type not in (CoordinatorType.GROUP, CoordinatorType.TRANSACTION) or not key:
                answers.append(CoordinatorAddress(key, -1, "", -1, ErrorCode.INVALID_REQUEST,
                                                  f"bad coordinator key type {key_type} or empty key"))
                continue
            if key_type == CoordinatorType.GROUP:
                topic, partitions = OFFSETS_TOPIC, self.config.offsets_topic_num_partitions
                partition = partition_for_group(key, partitions)
            else:
                topic, partitions = TXN_STATE_TOPIC, self.config.transaction_state_log_num_partitions
                partition = txn_log.partition_for(key, partitions)
            info = self.metadata.partition(topic, partition)
            if info is None:
                self._ensure_internal_topic(topic, partitions)
            leader = None if info is None or info.leader < 0 else self.metadata.broker(info.leader)
            address = None if leader is None else leader.endpoint(listener_name)
            if leader is None:
                answers.append(CoordinatorAddress(key, -1, "", -1, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                  f"{topic}-{partition} has no leader yet"))
            elif address is None:
                answers.append(CoordinatorAddress(key, -1, "", -1, ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                                  f"the leader of {topic}-{partition}, broker {leader.broker_id}, "
                                                  f"has no {listener_name} listener"))
            else:
                answers.append(CoordinatorAddress(key, leader.broker_id, *address))
        return answers

    def _ensure_internal_topic(self, topic: str, partitions: int) -> None:
        from broker.group.coordinator import offsets_topic_config
        from eos.v1 import broker_pb2

        if topic in self.store.topics():
            return
        factor = min(INTERNAL_TOPIC_REPLICATION_FACTOR, len(self.store.live_brokers()))
        configs = {"min.insync.replicas": str(min(INTERNAL_TOPIC_MIN_ISR, factor))}
        if topic == OFFSETS_TOPIC:
            configs.update(offsets_topic_config(self.config.offsets_topic_segment_bytes))
        self.topic_admin.create_topics(broker_pb2.CreateTopicsRequest(topics=[broker_pb2.NewTopic(
            name=topic, num_partitions=partitions, replication_factor=factor, configs=configs)], timeout_ms=1))

    def append_offsets(self, partition: int, batch: bytes, now_ms: int):
        """The group coordinator's append to `__consumer_offsets`-`partition`, as its leader
        (refused if this broker does not lead it or the ISR is below min.insync.replicas).
        Returns (first offset, wait): wait() blocks until the in-sync replicas have it."""
        from broker.storage.log import AppendOrigin

        with self.replicas.leader_append(OFFSETS_TOPIC, partition) as leader_epoch:
            partition_log = self._log_manager.get_log(OFFSETS_TOPIC, partition)
            min_isr = self._registry.get(OFFSETS_TOPIC).config.min_insync_replicas
            self.replicas.check_min_isr(OFFSETS_TOPIC, partition, min_isr)
            append = partition_log.append_as_leader(batch, now_ms, origin=AppendOrigin.COORDINATOR,
                                                    leader_epoch=leader_epoch)
            self.replicas.on_leader_append(OFFSETS_TOPIC, partition, partition_log)
        self._notify((OFFSETS_TOPIC, partition))      # followers' long polls
        end_offset = append.last_offset + 1
        return append.first_offset, lambda: self.replicas.wait_for_high_watermark(
            OFFSETS_TOPIC, partition, end_offset, REPLICATED_APPEND_TIMEOUT_MS, min_isr)

    def verify_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, partitions, *,
                   add: bool = False) -> dict:
        """KIP-890 part 1 across brokers: ask the id's coordinator, wherever it is; with
        `add` (part 2), have it add the partitions to the open transaction."""
        from broker.group.coordinator import CoordinatorType
        from eos.v1 import common_pb2, txn_pb2, txn_pb2_grpc

        coordinator = self.txn_coordinator
        if coordinator is not None and coordinator.owns(transactional_id):
            ask = coordinator.add_partitions if add else coordinator.verify_partitions
            decision = ask(transactional_id, producer_id, producer_epoch, partitions)
            return {tp: (int(decision.partition_errors.get(tp, decision.error)), decision.message)
                    for tp in partitions}
        [found] = self.find_coordinator(CoordinatorType.TRANSACTION, [transactional_id])
        if found.error != ErrorCode.NONE:
            return {tp: (int(found.error), found.message) for tp in partitions}
        address = f"{found.host}:{found.port}"
        with self._lock:
            channel = self._coordinator_channels.get(address)
            if channel is None:
                channel = self._coordinator_channels[address] = open_channel(address, self.security)
        try:
            response = txn_pb2_grpc.TxnCoordinatorStub(channel).AddPartitionsToTxn(
                txn_pb2.AddPartitionsToTxnRequest(
                    transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
                    verify_only=not add, partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)
                                                  for tp in partitions]), timeout=10)
        except grpc.RpcError as exc:
            with self._lock:
                if self._coordinator_channels.get(address) is channel:
                    del self._coordinator_channels[address]
            channel.close()
            return {tp: (int(ErrorCode.COORDINATOR_NOT_AVAILABLE), f"coordinator {found.node_id}: {exc.code()}")
                    for tp in partitions}
        if response.error_code != ErrorCode.NONE:
            return {tp: (int(response.error_code), response.error_message) for tp in partitions}
        answers = {(r.topic, r.partition): (int(r.error_code), r.error_message) for r in response.partitions}
        return {tp: answers.get((tp.topic, tp.partition), (int(ErrorCode.NONE), "")) for tp in partitions}

    # ---- stop --------------------------------------------------------------------------------------

    def controlled_shutdown(self) -> bool:
        """Ask the controller to move this broker's leaderships away; True when none is left."""
        if not self.config.controlled_shutdown_enable or self.store is None or self.broker_epoch < 0:
            return False
        self.replicas.in_controlled_shutdown = True
        attempts = self.config.controlled_shutdown_max_retries + 1
        for attempt in range(1, attempts + 1):
            controller_id = self._controller_for_shutdown(attempt)
            address = None if controller_id is None else self._address_of(controller_id)
            if address is not None:
                channel = open_channel(address, self.security)
                try:
                    response = cluster_pb2_grpc.ClusterStub(channel).ControlledShutdown(
                        cluster_pb2.ControlledShutdownRequest(broker_id=self.broker_id,
                                                              broker_epoch=self.broker_epoch),
                        timeout=CONTROLLED_SHUTDOWN_RPC_TIMEOUT_S)
                    if response.error_code == ErrorCode.NONE and not response.remaining_partitions:
                        log.info("controlled shutdown: controller %d moved every leadership away", controller_id)
                        return True
                    log.info("controlled shutdown attempt %d: %s, %d partitions still led here", attempt,
                             ErrorCode(response.error_code).name, len(response.remaining_partitions))
                except grpc.RpcError as exc:
                    log.info("controlled shutdown attempt %d: controller %s unreachable: %s", attempt,
                             controller_id, exc.code())
                finally:
                    channel.close()
            if attempt < attempts:
                time.sleep(self.config.controlled_shutdown_retry_backoff_ms / 1000.0)
        log.warning("controlled shutdown did not finish; stopping anyway (leaders move after the session ends)")
        return False

    def _controller_for_shutdown(self, attempt: int) -> int | None:
        """The controller's id for a controlled-shutdown attempt, None when ZooKeeper cannot
        say: with ZooKeeper gone, kazoo would queue the read until it came back (the broker
        hung on SIGTERM) or fail it with ConnectionLoss (the stop ended in a traceback).
        The attempt is then skipped; after the last one the broker stops without it, as
        Kafka does after controlled.shutdown.max.retries."""
        if not self.store.client.connected:
            log.info("controlled shutdown attempt %d: ZooKeeper is not connected", attempt)
            return None
        try:
            return self.store.controller_id()
        except Exception as exc:     # kazoo's ConnectionLoss, SessionExpiredError, ...
            log.info("controlled shutdown attempt %d: ZooKeeper did not answer: %r", attempt, exc)
            return None

    def leave(self) -> None:
        self._stopping.set()
        with self._lock:
            channels, self._coordinator_channels = list(self._coordinator_channels.values()), {}
        for channel in channels:
            channel.close()
        if self.store is not None and not self.store.client.connected:
            # ZooKeeper is gone: kazoo holds every read until it is back, so the controller's
            # and the ISR thread's reads in progress would hold this stop for their joins'
            # whole timeouts (35 s). Closed first, the session fails them at once; without
            # ZooKeeper there is no /controller to give up nor registration to remove anyway.
            self._close_store()
        if self.controller is not None:
            self.controller.stop()
        if self.replicas is not None:
            self.replicas.stop()
        self._close_store()

    def _close_store(self) -> None:
        if self.store is not None:
            try:
                self.store.close()
            except Exception as exc:
                log.info("closing the ZooKeeper session: %s", exc)

