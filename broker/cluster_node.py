"""A broker's membership in a ZooKeeper cluster: the pieces a cluster of one does without.

Theory of operation
-------------------
`ClusterNode` composes, for one broker, what cluster mode adds around the same storage,
services and coordinators a single broker runs (DESIGN.md §10):

- the ZooKeeper store (kazoo), its session and the broker's ephemeral registration;
- the `MetadataCache` that UpdateMetadata fills and Metadata answers from;
- the `ReplicaManager` and its `FetcherManager` (leaders, followers, ISR, HW);
- the `Controller` candidate (active on at most one broker);
- topic administration through ZooKeeper and producer ids from ZooKeeper blocks.

Start order (`connect`, then `join` once the gRPC server serves): connect to ZooKeeper and
check the cluster id against the data dir (a data dir written by another cluster refuses to
start), then register /brokers/ids/<id> (the broker epoch is the znode's czxid) and start
the controller candidate, so the controller's first requests find the server up.

Stop order (`leave`): controlled shutdown first (ask the controller, up to
controlled.shutdown.max.retries times, to move this broker's leaderships away; Kafka's
order), then the controller candidate resigns, fetchers stop, the registration goes with
the ZooKeeper session. A broker killed with -9 skips all of this: its session expires after
zookeeper.session.timeout.ms and the controller elects new leaders from the ISR.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import grpc

from broker.metadata.cache import MetadataCache
from eos.errors import ErrorCode, InconsistentClusterIdError
from eos.net import open_channel
from eos.v1 import cluster_pb2, cluster_pb2_grpc

log = logging.getLogger("eos.broker.cluster")

CONTROLLED_SHUTDOWN_RPC_TIMEOUT_S = 30.0


class ClusterNode:
    def __init__(self, broker_id: int, config, *, host: str, now_ms_fn: Callable[[], int]):
        self.broker_id = broker_id
        self.config = config
        self.host = host
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
            notify=notify, now_ms_fn=self._now_ms, replica_lag_time_max_ms=config.replica_lag_time_max_ms)
        self.replicas.fetchers = FetcherManager(
            self.broker_id, log_manager, address_of=self._address_of, on_appended=notify,
            broker_epoch_fn=lambda: self.broker_epoch)
        self.topic_admin = ClusterTopicAdmin(
            self.store, self.metadata, default_num_partitions=config.num_partitions,
            default_replication_factor=config.default_replication_factor, default_config=config.topic_defaults,
            rng=random.Random())
        self.controller = Controller(
            self.broker_id, self.store,
            config=ControllerConfig(
                auto_leader_rebalance_enable=config.auto_leader_rebalance_enable,
                leader_imbalance_per_broker_percentage=config.leader_imbalance_per_broker_percentage,
                unclean_leader_election_enable=config.topic_defaults.unclean_leader_election_enable),
            now_ms_fn=self._now_ms,
            rebalance_interval_ms=config.leader_imbalance_check_interval_seconds * 1000)

    def join(self, port: int) -> None:
        """Register in ZooKeeper and start the roles; the gRPC server already serves."""
        from broker.metadata.zk_store import BrokerRegistration

        self._port = port
        self.replicas.start()
        self.broker_epoch = self.store.register_broker(
            BrokerRegistration(self.broker_id, self.host, port, self.config.broker_rack or None))
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
        return self._registry.learn(topic, count, overrides).config

    def sync_registry(self) -> None:
        """After UpdateMetadata: the local registry learns every topic's partition count."""
        snapshot = self.metadata.snapshot
        for topic, partitions in snapshot.topics().items():
            self._registry.learn(topic, len(partitions), snapshot.topic_configs.get(topic, {}))

    def _address_of(self, broker_id: int) -> str | None:
        endpoint = self.metadata.broker(broker_id)
        if endpoint is None:
            registration = self.store.live_brokers().get(broker_id)
            if registration is None:
                return None
            return f"{registration.host}:{registration.port}"
        return f"{endpoint.host}:{endpoint.port}"

    def _write_isr(self, topic: str, partition: int, leader: int, leader_epoch: int, isr: tuple[int, ...],
                   controller_epoch: int, zk_version: int) -> int:
        from broker.metadata.zk_store import LeaderIsr

        results = self.store.update_partition_states(
            {(topic, partition): (LeaderIsr(leader, leader_epoch, tuple(isr), controller_epoch), zk_version)},
            epoch_zk_version=None)
        result = results[(topic, partition)]
        if isinstance(result, Exception):
            raise result
        self.store.write_isr_change_notification([(topic, partition)])
        return result

    # ---- stop --------------------------------------------------------------------------------------

    def controlled_shutdown(self) -> bool:
        """Ask the controller to move this broker's leaderships away; True when none is left."""
        if not self.config.controlled_shutdown_enable or self.store is None or self.broker_epoch < 0:
            return False
        attempts = self.config.controlled_shutdown_max_retries + 1
        for attempt in range(1, attempts + 1):
            controller_id = self.store.controller_id()
            address = None if controller_id is None else self._address_of(controller_id)
            if address is not None:
                channel = open_channel(address)
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

    def leave(self) -> None:
        if self.controller is not None:
            self.controller.stop()
        if self.replicas is not None:
            self.replicas.stop()
        if self.store is not None:
            try:
                self.store.close()
            except Exception as exc:
                log.info("closing the ZooKeeper session: %s", exc)

