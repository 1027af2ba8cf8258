"""The broker process: storage, services and housekeeping wired together, started, stopped.

Theory of operation
-------------------
`BrokerServer` owns the life of one broker node and nothing else: it validates the broker
config (no I/O), then `start()` takes the data dir (an exclusive lock, `meta.properties`
with the cluster id), binds the gRPC ports and serves the health service (NOT_SERVING; every
other call UNAVAILABLE, broker/listener_servers.LateServices) and, with `metrics.port`, the
Prometheus endpoint (broker/metrics.py), so that a long recovery is visible; then loads the
topic registry and the logs, sweeps the logs against the registry, loads the group
coordinator (`__consumer_offsets`, written in-process through the same LogManager and
TopicRegistry), adds the Broker, TxnCoordinator and GroupCoordinator services and opens
them, then loads the transaction coordinator (after which health says SERVING; on a
cluster, once the broker has joined), and starts the housekeeping thread (retention,
segment roll by time, flush.ms), which wakes every log.retention.check.interval.ms on an
Event so that stop never waits for it to sleep out. Two hooks join the pieces: the Broker
service asks the transaction coordinator whether a transactional write's partition is in
the producer's transaction (KIP-890), and tells the group coordinator about markers written
to `__consumer_offsets`.

`stop()` is the reverse, in an order that keeps acknowledged data safe: health turns
NOT_SERVING, stop the coordinators (parked group requests are answered at once), refuse new
RPCs, wake long polls, end produce streams once their request in flight is answered, wait
(bounded) for requests in flight, stop housekeeping, then close the logs
(LogManager.shutdown flushes and writes the clean-shutdown state), and let go of the lock.
`run_broker()` is the blocking entry of `eos broker start` and `python -m broker`: it
prints one line "eos broker listening on HOST:PORT (data dir DIR)" once the port is bound
and serving, and stops cleanly on SIGTERM or SIGINT.

Broker config uses Kafka's broker names (`broker/config.py`); the data dirs' own files
(meta.properties, the lock, the log dirs used) are `broker/data_dir.py`'s.

The gRPC worker pool is sized from the bounds of the calls that hold a worker for long
(long polls, parked group requests, produce streams) plus `num.io.threads` workers left for
short calls, and `queued.max.requests` more calls may wait for one; see rpc_pool_limits.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Mapping

import grpc
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection

from broker.group.coordinator import GroupCoordinator
from broker.group.service import GroupCoordinatorServicer
from broker.config import GRPC_MESSAGE_BYTES_MAX, BrokerConfig, describe_settings
from broker.data_dir import (META_PROPERTIES, DataDirLock, load_or_create_meta_properties, new_cluster_id,
                             read_data_dir_cluster_id, read_known_log_dirs, write_known_log_dirs)
from broker.in_process import InProcessBrokerStub
from broker.listener_servers import LateServices, ServerGroup, group_listeners
from broker.socket_server import SocketRpcServer
from broker.authorizer import ACL_FILE_NAME, Authorizer, FileAclStore
from broker.purgatory import FetchPurgatory
from broker.metadata.types import ListenerEndpoint, format_host_port
from broker.security import (PLAINTEXT, SASL_SSL, SSL, CallIdentityInterceptor, Listener, ReloadingServerCertificates,
                             advertised_host, check_plaintext_binds, inter_broker_security, listener_name_of_call,
                             parse_advertised, transport_of)
from broker.client_quotas import QUOTA_FILE_NAME, ClientQuotas, RequestTimeQuotaInterceptor
from broker.scram_users import SCRAM_FILE_NAME, SESSION_LIFETIME_MS_DEFAULT, ScramUsers, SessionTokens, ZkScramUsers
from broker.security_service import SecurityServicer
from broker.reads import FETCH_MAX_WAIT_CAP_MS
from broker.service import BrokerServicer, NodeAddress
from broker.topics import TopicRegistry
from broker.traffic import TopicTraffic
from eos.allocator import BROKER_THRESHOLD_BYTES, keep_large_buffers_in_the_heap
from eos.errors import EosError, ErrorCode, InvalidConfigError, StorageError
from eos.types import TopicPartition
from eos.v1 import (broker_pb2, broker_pb2_grpc, cluster_pb2, cluster_pb2_grpc, group_pb2, group_pb2_grpc, security_pb2,
                    security_pb2_grpc, txn_pb2, txn_pb2_grpc)
from txn_coordinator.producer_ids import PRODUCER_IDS_FILE_NAME, ProducerIdManager
from txn_coordinator.coordinator import BrokerLink, RoutingBrokerLink, TransactionCoordinator
from txn_coordinator.service import TxnCoordinatorServicer

log = logging.getLogger("eos.broker")

# Four kinds of call hold a gRPC worker for a while: long-poll fetches (up to 30 s), parked
# JoinGroup/SyncGroup (a rebalance), produce streams (their whole life) and transactional
# requests waiting for their id's previous transaction to complete (up to 100 ms). Each kind
# is bounded on its own, and the pool holds all four bounds plus workers that only they can
# never take, so short calls (unary Produce, admin, coordinator RPCs) always find a worker.
FETCH_WAITERS_MAX = 32
GROUP_PARKED_REQUESTS_MAX = 32
PRODUCE_STREAMS_MAX = 32
TXN_PARKED_REQUESTS_MAX = 16
# (and num.io.threads more, broker/config.py: see rpc_pool_limits)
STOP_GRACE_S = 10.0
HOUSEKEEPING_JOIN_TIMEOUT_S = 60.0
# What the health service reports on: the whole broker ("", gRPC's convention) and each
# service (Cluster only on a ZooKeeper cluster, the one place it is served).
HEALTH_SERVICE_NAMES = ("",) + tuple(module.DESCRIPTOR.services_by_name[name].full_name for module, name in (
    (broker_pb2, "Broker"), (txn_pb2, "TxnCoordinator"), (group_pb2, "GroupCoordinator"), (security_pb2, "Security")))
CLUSTER_SERVICE_NAME = cluster_pb2.DESCRIPTOR.services_by_name["Cluster"].full_name


def rpc_pool_limits(config: BrokerConfig) -> tuple[int, int]:
    """(gRPC worker threads, gRPC maximum_concurrent_rpcs) for `config`. The pool holds the
    bound of each kind of call that keeps a worker for long (long polls, parked group and
    transactional requests, produce streams) plus num.io.threads workers that only short
    calls can take. Up to queued.max.requests more calls wait for a worker, as Kafka's
    request queue holds them; beyond that gRPC answers RESOURCE_EXHAUSTED ("Concurrent RPC
    limit exceeded"), which clients retry after their backoff, where Kafka's network
    threads would stop reading the socket."""
    workers = (FETCH_WAITERS_MAX + GROUP_PARKED_REQUESTS_MAX + PRODUCE_STREAMS_MAX + TXN_PARKED_REQUESTS_MAX
               + config.num_io_threads)
    return workers, workers + config.queued_max_requests


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- the server -------------------------------------------------------------------------------

class BrokerServer:
    """One broker node. `start()` returns once the port is bound and serving.

    `port=0` binds a free port; read the bound one from `.port` / `.address` after start.
    Usable as a context manager (start on enter, stop on exit).
    """

    def __init__(self, data_dir: str | os.PathLike, host: str = "127.0.0.1", port: int = 9092,
                 node_id: int = 0, config: Mapping[str, str] | None = None, *,
                 now_ms_fn: Callable[[], int] = _wall_clock_ms):
        if not 0 <= port <= 65535:
            raise InvalidConfigError(f"port {port} is outside 0..65535")
        if node_id < 0:
            raise InvalidConfigError(f"node.id must be >= 0, got {node_id}")
        self.config = BrokerConfig.from_dict(config)
        self.data_dir = Path(data_dir).resolve()
        # The data dir first, then every other directory of log.dirs (see BrokerConfig).
        self.log_dirs = [self.data_dir] + [d for d in dict.fromkeys(Path(p).resolve() for p in self.config.log_dirs)
                                           if d != self.data_dir]
        # what DescribeConfigs of this broker answers (static: computed once)
        self._settings = describe_settings(self.config, {str(k): str(v) for k, v in (config or {}).items()},
                                           [str(d) for d in self.log_dirs])
        if self.config.zookeeper_connect and len(self.log_dirs) > 1:
            raise InvalidConfigError(
                "log.dirs with several directories is not supported on a ZooKeeper cluster yet: a failed "
                "directory is not reported to the controller (Kafka's LogDirEventNotification), so a replica "
                "it held could be created again, empty, on another directory")
        # Listeners: Kafka's `listeners`, or one PLAINTEXT listener on host:port (`--port N`).
        self.listeners: tuple[Listener, ...] = self.config.listeners or (Listener(PLAINTEXT, PLAINTEXT, host, port),)
        check_plaintext_binds(self.listeners, self.config.allow_plaintext_remote)   # before any bind
        self._advertised = parse_advertised(self.config.advertised_listeners, self.listeners)
        inter_broker_name = self.config.inter_broker_listener_name or self.listeners[0].name
        self.inter_broker_listener = next(l for l in self.listeners if l.name == inter_broker_name)
        # host/port/address are the inter-broker listener's: what a cluster registers and
        # what in-process links name.
        self.host = self._advertised.get(inter_broker_name, (advertised_host(self.inter_broker_listener.host), 0))[0]
        self.node_id = node_id
        self.port: int | None = None
        self.socket_port: int | None = None             # socket.transport.port once bound
        self.socket_listener: str | None = None         # the PLAINTEXT listener it serves
        self.bound_ports: dict[str, int] = {}           # listener name -> the port it bound
        self.listener_nodes: dict[str, NodeAddress] = {}  # listener name -> advertised address
        self._certificates: ReloadingServerCertificates | None = None
        # SASL/SCRAM: the users' credentials (read from the data dir when a client
        # authenticates) and the session tokens the Security service issues.
        self._scram_users = ScramUsers(self.data_dir)
        self._sessions = SessionTokens(self.config.connections_max_reauth_ms or SESSION_LIFETIME_MS_DEFAULT)
        self._quotas = ClientQuotas(self.data_dir, window_num=self.config.quota_window_num,
                                    window_size_ms=self.config.quota_window_size_seconds * 1000)
        # Kafka's request_percentage: a pass-through unless some entity has one.
        self._request_quota = RequestTimeQuotaInterceptor(self._quotas, super_users=self.config.super_users)
        # One gRPC server per group of listeners that gRPC can tell apart (one per transport),
        # each with an identity interceptor that knows its own listeners.
        self._listener_groups = group_listeners(self.listeners)
        self._interceptors = [CallIdentityInterceptor(group, self.config.ssl_principal_mapping_rules,
                                                      sessions=self._sessions) for group in self._listener_groups]
        self.cluster_id: str | None = None
        self._now_ms = now_ms_fn
        # Operations: metrics only when metrics.port is set (the request interceptor with
        # them); the health service always, NOT_SERVING until the logs and coordinators load.
        from broker.metrics import BrokerMetrics
        self._metrics = BrokerMetrics(self) if self.config.metrics_port >= 0 else None
        self._health = health.HealthServicer(experimental_non_blocking=True)
        self._health_service_names = HEALTH_SERVICE_NAMES + (
            (CLUSTER_SERVICE_NAME,) if self.config.zookeeper_connect else ())
        for name in self._health_service_names:
            self._health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._late_services = LateServices()
        self._ready = threading.Event()
        self._locks = [DataDirLock(d) for d in self.log_dirs]
        self._failed_log_dirs: dict[str, str] = {}      # log.dirs that could not be prepared
        self._log_manager = None
        self._log_cleaner = None
        self._registry: TopicRegistry | None = None
        self._producer_ids: ProducerIdManager | None = None
        self._grpc_server: grpc.Server | None = None
        self._servicer: BrokerServicer | None = None
        self._txn_coordinator: TransactionCoordinator | None = None
        self._txn_link: BrokerLink | None = None
        self._group_coordinator: GroupCoordinator | None = None
        self._cluster = None   # broker.cluster_node.ClusterNode when zookeeper.connect is set
        self._authorizer: Authorizer | None = None
        self._entity_configs = None     # broker.zk_entity_configs.ZkEntityConfigs on a cluster
        self._dynamic_configs = None    # broker.dynamic_config.DynamicBrokerConfigs, once started
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._housekeeping_thread: threading.Thread | None = None
        self._state_lock = threading.Lock()
        self._started = False

    @property
    def address(self) -> str:
        if self.port is None:
            raise EosError("the broker is not started")
        return format_host_port(self.host, self.port)

    def address_of(self, listener_name: str) -> str:
        """host:port a client reaches `listener_name` at (its advertised address)."""
        node = self.listener_nodes.get(listener_name.upper())
        if node is None:
            raise EosError(f"no listener {listener_name} is bound (listeners: "
                           f"{', '.join(l.name for l in self.listeners)})")
        return format_host_port(node.host, node.port)

    @property
    def call_identity_observer(self):
        """`observer(method, CallIdentity)`, told the listener and principal of each gRPC
        call before its handler runs (tests and audit; None by default)."""
        return self._interceptors[0].observer

    @call_identity_observer.setter
    def call_identity_observer(self, observer) -> None:
        for interceptor in self._interceptors:
            interceptor.observer = observer

    def _calls_need_identity(self) -> bool:
        """With an authorizer every call needs its principal (an unauthenticated one is
        User:ANONYMOUS, which ACLs may allow or not); without one, only a broker whose
        listeners differ in what they tell about a call."""
        if self.config.authorizer_class_name:
            return True
        listeners = self.listeners
        return len(listeners) > 1 or any(listener.security_protocol != PLAINTEXT for listener in listeners)

    @property
    def authorizer(self) -> Authorizer | None:
        """The ACLs and their checks; None without authorizer.class.name."""
        return self._authorizer

    @property
    def certificates(self) -> ReloadingServerCertificates | None:
        """The SSL listener's certificates (reloaded when the files change), None without one."""
        return self._certificates

    @property
    def registry(self) -> TopicRegistry | None:
        return self._registry

    @property
    def log_cleaner(self):
        return self._log_cleaner

    @property
    def log_manager(self):
        return self._log_manager

    @property
    def producer_ids(self) -> ProducerIdManager | None:
        """The node's producer id source (`.next_id` is the transaction coordinator's
        `new_producer_id`)."""
        return self._producer_ids

    @property
    def servicer(self) -> BrokerServicer | None:
        return self._servicer

    @property
    def cluster(self):
        """broker.cluster_node.ClusterNode when zookeeper.connect is set, else None."""
        return self._cluster

    @property
    def ready(self) -> bool:
        """The logs are recovered and the coordinators loaded: health says SERVING."""
        return self._ready.is_set()

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics is served on, or None without metrics.port."""
        return None if self._metrics is None else self._metrics.port

    @property
    def metrics_url(self) -> str | None:
        """Where /metrics is served (its bind address), or None without metrics.port."""
        return None if self._metrics is None else self._metrics.url

    @property
    def metrics_registry(self):
        """The broker's prometheus_client registry, or None without metrics.port."""
        return None if self._metrics is None else self._metrics.registry

    def _became_ready(self) -> None:
        # Not under _state_lock: on a cluster this runs inside start(), which holds it. A stop
        # that began meanwhile has set _stopping before it clears _ready, so the second look
        # takes back a set that raced it.
        if self._stopping.is_set():          # the coordinator finished loading as stop began
            return
        self._ready.set()
        if self._stopping.is_set():
            self._ready.clear()
            return
        for name in self._health_service_names:
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("eos broker node %d ready: health SERVING", self.node_id)

    @property
    def fetch_waiter_count(self) -> int:
        """Long-poll fetches parked right now (for tests and metrics)."""
        return 0 if self._servicer is None else self._servicer.fetch_waiter_count

    # ---- start ------------------------------------------------------------------------------

    def start(self) -> "BrokerServer":
        with self._state_lock:
            if self._started:
                raise EosError("BrokerServer.start() called twice")
            self._started = True
            # request-sized buffers from the heap, not fresh pages (eos/allocator.py); also for
            # a broker embedded in a process (the demo, tests): the first call in it wins
            keep_large_buffers_in_the_heap(BROKER_THRESHOLD_BYTES)
            self.data_dir.mkdir(parents=True, exist_ok=True)
            try:
                self._locks[0].acquire()
                for directory, lock in zip(self.log_dirs[1:], self._locks[1:]):
                    try:
                        directory.mkdir(parents=True, exist_ok=True)
                    except OSError as exc:
                        # another disk is not this broker's end: it starts with that one offline
                        self._failed_log_dirs[str(directory)] = f"cannot create it: {exc}"
                        continue
                    lock.acquire()      # another broker on it is still an error
                self._start_locked()
            except BaseException:
                self._teardown_after_failed_start()
                raise
        log.info("eos broker node %d listening on %s (data dir %s, cluster %s)",
                 self.node_id, ", ".join(f"{l.name}://{self.address_of(l.name)}" for l in self.listeners),
                 self.data_dir, self.cluster_id)
        return self

    def _start_locked(self) -> None:
        """Data dirs, the gRPC servers (serving health, NOT_SERVING, and the metrics), storage,
        then the services (in that order: each step needs the ones before it)."""
        self._prepare_data_dirs()
        self._new_grpc_server()
        if self._metrics is not None:
            # bound where the inter-broker listener is (not its advertised name, which may be
            # another machine's address): 127.0.0.1 for the default listener
            self._metrics.start(self.inter_broker_listener.host or "0.0.0.0", self.config.metrics_port)
        self._open_storage()
        # What this node advertises on the inter-broker listener (its bound port unless
        # advertised.listeners says otherwise): the group coordinator's and a cluster's address.
        bound_port = self.listener_nodes[self.inter_broker_listener.name].port
        self._start_services(self._late_services, bound_port)
        self._housekeeping_thread = threading.Thread(
            target=self._housekeeping_loop, name="eos-broker-housekeeping", daemon=True)
        self._housekeeping_thread.start()

    def _prepare_data_dirs(self) -> None:
        """meta.properties in every log dir (joining the cluster first when there is one), and
        the list of log dirs this broker has used."""
        if self.config.zookeeper_connect:
            from broker.cluster_node import ClusterNode
            config = self.config
            security = inter_broker_security(
                self.inter_broker_listener, certificate_location=config.ssl_certificate_location,
                key_location=config.ssl_key_location, ca_location=config.ssl_ca_location)
            self._cluster = ClusterNode(self.node_id, config, host=self.host, now_ms_fn=self._now_ms,
                                        security=security)
            self.cluster_id = self._cluster.connect(new_cluster_id(), read_data_dir_cluster_id(self.data_dir))
            load_or_create_meta_properties(self.data_dir, self.node_id, cluster_id=self.cluster_id)
        else:
            self.cluster_id = load_or_create_meta_properties(self.data_dir, self.node_id)
        known_log_dirs = read_known_log_dirs(self.data_dir)
        for directory in self.log_dirs[1:]:
            if str(directory) in self._failed_log_dirs:
                continue
            if str(directory) in known_log_dirs and not (directory / META_PROPERTIES).exists():
                # It held this broker's partitions before: an empty directory in its place is
                # an unmounted or replaced disk, not a new one. Formatting it would let the
                # start-up sweep create its partitions again, empty, from offset 0.
                self._failed_log_dirs[str(directory)] = (
                    "it was a log dir of this broker but holds no meta.properties now (an unmounted or "
                    "replaced disk?); remove it from log.dirs to give its partitions up")
                continue
            # Kafka's rule: every log dir says which cluster and node it belongs to.
            load_or_create_meta_properties(directory, self.node_id, cluster_id=self.cluster_id)
        write_known_log_dirs(self.data_dir, known_log_dirs | {
            str(d) for d in self.log_dirs[1:] if str(d) not in self._failed_log_dirs})

    def _open_storage(self) -> None:
        """ACLs, the topic registry, the logs of every log dir, the cleaner, and (on a cluster
        of one) the logs swept against the registry and the producer-id file."""
        from broker.storage.log_dirs import LogDirs  # storage is the heavy import

        cluster = self._cluster
        if self.config.authorizer_class_name:
            if cluster is None:
                store, where = FileAclStore(self.data_dir), self.data_dir
            else:
                from broker.zk_acls import ZkAclStore
                store, where = ZkAclStore(cluster.store.client), "ZooKeeper"
            self._authorizer = Authorizer(store, super_users=self.config.super_users,
                                          allow_if_no_acl=self.config.allow_everyone_if_no_acl_found)
            log.info("authorizer on: %d ACL(s) loaded from %s, super users %s, allow.everyone.if.no.acl.found=%s",
                     self._authorizer.load(), where, sorted(self.config.super_users) or "none",
                     str(self.config.allow_everyone_if_no_acl_found).lower())
        if cluster is None:
            quota_entities, where = self._quotas.load(), self.data_dir
        else:
            # Users' SCRAM credentials and client quotas live in ZooKeeper, followed by every broker.
            from broker.zk_entity_configs import ZkEntityConfigs
            self._entity_configs = ZkEntityConfigs(cluster.store.client)
            self._entity_configs.start()
            self._scram_users = ZkScramUsers(self._entity_configs, self._sessions)
            quota_entities, where = self._quotas.follow_zookeeper(self._entity_configs), "ZooKeeper"
            for name in (SCRAM_FILE_NAME, QUOTA_FILE_NAME, ACL_FILE_NAME):
                if (self.data_dir / name).exists():
                    # Written offline (eos users add --data-dir) or by a single broker before:
                    # a cluster reads ZooKeeper only, so say so rather than ignore it silently.
                    log.warning("%s is ignored on a ZooKeeper cluster (its broker reads ACLs, SCRAM credentials "
                                "and quotas from ZooKeeper); set them again through a broker", self.data_dir / name)
        if quota_entities:
            log.info("client quotas: %d entit%s with quotas, from %s", quota_entities,
                     "y" if quota_entities == 1 else "ies", where)
        self._registry = TopicRegistry(self.data_dir, default_config=self.config.topic_defaults,
                                       default_num_partitions=self.config.num_partitions)
        # Before the topics load, so that they open with the defaults altered while running.
        from broker.dynamic_config import DynamicBrokerConfigs, TopicDefaultsFollower
        topic_defaults = TopicDefaultsFollower(self._registry)

        def apply_topic_defaults(defaults) -> None:
            topic_defaults.apply(defaults)
            if cluster is not None:     # its controller candidate takes unclean.leader.election.enable
                cluster.topic_defaults_changed(defaults)

        self._dynamic_configs = DynamicBrokerConfigs(
            self.node_id, self.config.topic_defaults, apply_topic_defaults,
            static_time_forms=dict(self.config.time_defaults_given),
            **({"data_dir": self.data_dir} if cluster is None else {"zk_configs": self._entity_configs}))
        self._dynamic_configs.start()
        topics = self._registry.load()
        self._log_manager = LogDirs([str(d) for d in self.log_dirs], now_ms_fn=self._now_ms,
                                    producer_id_expiration_ms=self.config.producer_id_expiration_ms,
                                    failed=self._failed_log_dirs)
        loaded = {info.name: info.config for info in topics}
        self._log_manager.load(loaded)
        topic_defaults.logs_loaded(self._log_manager, loaded)
        from broker.storage.cleaner import CleanerConfig, LogCleaner
        config = self.config
        self._log_cleaner = LogCleaner(
            str(self.data_dir), self._log_manager.all_logs,
            CleanerConfig(enable=config.log_cleaner_enable, threads=config.log_cleaner_threads,
                          dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
                          io_buffer_load_factor=config.log_cleaner_io_buffer_load_factor,
                          backoff_ms=config.log_cleaner_backoff_ms),
            now_ms_fn=self._now_ms)
        self._log_cleaner.start()
        if cluster is None:
            # On a cluster the controller decides which replicas live here (StopReplica
            # deletes), and the registry holds only what this broker learned.
            self._sweep_logs()
            producer_ids = ProducerIdManager(self.data_dir / PRODUCER_IDS_FILE_NAME)
        else:
            producer_ids = cluster.producer_ids
        self._producer_ids = producer_ids

    def _new_grpc_server(self) -> ServerGroup:
        """The gRPC servers (one per listener group, broker/listener_servers.py; one for
        most brokers), each pool sized by rpc_pool_limits, bound to their listeners, serving
        health and reflection now and the broker's services once they open."""
        config = self.config
        worker_threads, concurrent_rpcs_max = rpc_pool_limits(config)
        self._grpc_server = servers = ServerGroup([])     # set first: a failed start stops what is bound
        identity = self._calls_need_identity()
        for group, interceptor in zip(self._listener_groups, self._interceptors):
            server = grpc.server(
                concurrent.futures.ThreadPoolExecutor(max_workers=worker_threads,
                                                      thread_name_prefix="eos-broker-rpc"),
                maximum_concurrent_rpcs=concurrent_rpcs_max,
                options=[
                    ("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
                    ("grpc.max_receive_message_length", self.config.socket_request_max_bytes),
                    # without this a second broker on the same port would share the traffic
                    # silently instead of failing to start
                    ("grpc.so_reuseport", 0),
                ],
                interceptors=self._server_interceptors(interceptor if identity else None))
            servers.servers.append(server)
            self._bind_listeners(server, group)
        if config.socket_transport_port >= 0 and any(l.security_protocol == PLAINTEXT for l in self.listeners):
            servers.servers.append(self._new_socket_server(identity))
        # The broker's services first: gRPC asks the generic handlers in order, and health and
        # reflection are found as registered methods anyway.
        servers.add_generic_rpc_handlers((self._late_services,))
        from grpc_health.v1 import health_pb2_grpc
        health_pb2_grpc.add_HealthServicer_to_server(self._health, servers)
        reflection.enable_server_reflection(self._health_service_names[1:] + (
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME), servers)
        servers.start()
        return servers

    def _server_interceptors(self, identity_interceptor) -> list:
        # A broker with one PLAINTEXT listener has one address and one principal
        # (ANONYMOUS): it skips the identity interceptor (a wrapper and an auth_context()
        # call on every RPC, which the latency rows would pay for nothing). The request
        # quota's costs one dict lookup per call while no entity has one. Request
        # metrics, outermost so they time the throttles too, only with metrics.port.
        return (([self._metrics.interceptor] if self._metrics is not None else [])
                + ([identity_interceptor] if identity_interceptor is not None else []) + [self._request_quota])

    def _new_socket_server(self, identity: bool) -> SocketRpcServer:
        """socket.transport.port: the PLAINTEXT listener's calls as frames over plain TCP
        (broker/socket_server.py), on that listener's host, with the interceptors of the gRPC
        server that serves the listener (its identity interceptor names it)."""
        listener = next(l for l in self.listeners if l.security_protocol == PLAINTEXT)
        group_index = next(i for i, group in enumerate(self._listener_groups) if listener in group)
        bind_host = listener.host or "::"
        try:
            server = SocketRpcServer(
                bind_host, self.config.socket_transport_port,
                interceptors=self._server_interceptors(self._interceptors[group_index] if identity else None),
                request_bytes_max=self.config.socket_request_max_bytes,
                connections_max_idle_ms=self.config.connections_max_idle_ms)
        except OSError as exc:
            raise StorageError(f"cannot listen on {format_host_port(bind_host, self.config.socket_transport_port)} "
                               f"(socket.transport.port): {exc}") from None
        self.socket_port = server.port
        self.socket_listener = listener.name
        return server

    def _start_services(self, server: LateServices, bound_port: int) -> None:
        """The group coordinator, the Broker, Cluster, TxnCoordinator and GroupCoordinator
        services added to `server`, which then opens; the transaction coordinator loads
        after, and then the broker is ready."""
        config = self.config
        cluster = self._cluster
        producer_ids = self._producer_ids
        # Loaded before the services open (LateServices answers every call UNAVAILABLE until
        # then): it creates __consumer_offsets without the Broker service's admin lock, which
        # is safe only while no RPC can create topics.
        purgatory = FetchPurgatory(max_waiters=FETCH_WAITERS_MAX)
        if cluster is not None:
            cluster.build(registry=self._registry, log_manager=self._log_manager,
                          notify=lambda tp: purgatory.notify(TopicPartition(*tp)))
        self._group_coordinator = GroupCoordinator(
            self._log_manager, self._registry, now_ms_fn=self._now_ms, node_id=self.node_id, host=self.host,
            port=bound_port, initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=config.group_min_session_timeout_ms,
            max_session_timeout_ms=config.group_max_session_timeout_ms, max_group_size=config.group_max_size,
            offset_metadata_max_bytes=config.offset_metadata_max_bytes,
            offsets_topic_segment_bytes=config.offsets_topic_segment_bytes, verify_txn=self._verify_txn_partitions,
            offsets_partitions=config.offsets_topic_num_partitions, max_parked_requests=GROUP_PARKED_REQUESTS_MAX,
            replicated_append=None if cluster is None else cluster.append_offsets)
        # On a cluster the coordinator is partitioned: start() starts its timer, and each
        # __consumer_offsets partition loads when this broker becomes its leader.
        self._group_coordinator.start()
        if cluster is not None:
            cluster.group_coordinator = self._group_coordinator

        self._servicer = BrokerServicer(
            registry=self._registry, log_manager=self._log_manager, purgatory=purgatory,
            node=NodeAddress(self.node_id, self.host, bound_port), cluster_id=self.cluster_id,
            now_ms_fn=self._now_ms, auto_create_topics=self.config.auto_create_topics_enable,
            fetch_max_wait_cap_ms=FETCH_MAX_WAIT_CAP_MS, verify_txn=self._verify_txn_partitions,
            add_txn_partitions=self._add_txn_partitions,
            on_offsets_txn_marker=self._group_coordinator.on_txn_marker, max_produce_streams=PRODUCE_STREAMS_MAX,
            metadata=None if cluster is None else cluster.metadata,
            replicas=None if cluster is None else cluster.replicas,
            topic_admin=None if cluster is None else cluster.topic_admin,
            listener_nodes=self.listener_nodes, authorizer=self._authorizer, quotas=self._quotas,
            traffic=TopicTraffic() if self._metrics is not None else None, socket_port=self.socket_port or 0,
            socket_listener=self.socket_listener, broker_settings=self._settings,
            dynamic_configs=self._dynamic_configs)
        broker_pb2_grpc.add_BrokerServicer_to_server(self._servicer, server)
        if cluster is not None:
            from broker.cluster_service import ClusterServicer
            cluster_pb2_grpc.add_ClusterServicer_to_server(ClusterServicer(
                broker_id=self.node_id, replicas=cluster.replicas, metadata=cluster.metadata,
                log_manager=self._log_manager, controller=lambda: cluster.controller,
                on_metadata_updated=cluster.sync_registry, authorizer=self._authorizer), server)
        self._txn_coordinator = self._new_txn_coordinator(bound_port)
        if cluster is not None:
            cluster.txn_coordinator = self._txn_coordinator
            self._group_coordinator.find_override = lambda key_type, keys: cluster.find_coordinator(
                key_type, keys, listener_name=listener_name_of_call())
        txn_pb2_grpc.add_TxnCoordinatorServicer_to_server(
            TxnCoordinatorServicer(producer_ids, self._txn_coordinator, authorizer=self._authorizer), server)
        group_pb2_grpc.add_GroupCoordinatorServicer_to_server(GroupCoordinatorServicer(
            self._group_coordinator, node_for_call=self._servicer.node_for_call, authorizer=self._authorizer), server)
        security_pb2_grpc.add_SecurityServicer_to_server(self._security_servicer(), server)
        server.open()
        if cluster is None:
            threading.Thread(target=self._start_txn_coordinator, name="eos-txn-load", daemon=True).start()
        else:
            self._txn_coordinator.start()     # threads only: partitions load with leadership
            cluster.join(bound_port, self._advertised_endpoints(), self.socket_port or 0)
            self._became_ready()

    def _new_txn_coordinator(self, bound_port: int) -> TransactionCoordinator:
        """The transaction coordinator reaches this broker only through the Broker service's
        contract (DESIGN.md §1), here in process: its state writes and the markers for
        partitions this broker leads are handed to the servicer's handlers on the calling
        thread (broker/in_process.py), not sent over loopback. It loads its log once the
        server is up. On a cluster it is partitioned: it serves the ids of the
        __transaction_state partitions this broker leads, loading each as leadership
        arrives, and sends markers to each partition's leader (over gRPC when remote)."""
        cluster = self._cluster
        own_address = format_host_port(self.host, bound_port)
        own_stub = InProcessBrokerStub(self._servicer)
        own_paths = {"append_own": self._servicer.append_own_records,
                     "write_own_markers": self._servicer.write_own_markers}
        self._txn_link = (BrokerLink(own_address, stub=own_stub, **own_paths) if cluster is None
                          else RoutingBrokerLink(own_address, stub=own_stub, own_node_id=self.node_id,
                                                 security=cluster.security, **own_paths))
        return TransactionCoordinator(
            self._txn_link, self._producer_ids.next_id, now_ms_fn=self._now_ms,
            state_topic_partitions=self.config.transaction_state_log_num_partitions,
            expiry_interval_ms=self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            max_timeout_ms=self.config.transaction_max_timeout_ms,
            transactional_id_expiration_ms=self.config.transactional_id_expiration_ms,
            partitioned=cluster is not None, concurrent_waiters_max=TXN_PARKED_REQUESTS_MAX)

    def _advertised_endpoints(self) -> tuple[ListenerEndpoint, ...]:
        """Every listener's advertised address, as a cluster registration lists them."""
        return tuple(ListenerEndpoint(listener.name, listener.security_protocol, node.host, node.port)
                     for listener in self.listeners for node in [self.listener_nodes[listener.name]])

    def _security_servicer(self) -> SecurityServicer:
        """SCRAM logins and credentials, and client quotas."""
        return SecurityServicer(
            self._scram_users, self._sessions, enabled_mechanisms=self.config.sasl_enabled_mechanisms,
            authorizer=self._authorizer, sasl_listener=any(l.security_protocol == SASL_SSL for l in self.listeners),
            quotas=self._quotas)

    def _bind_listeners(self, server: grpc.Server, listeners: tuple[Listener, ...]) -> None:
        """One port per listener on its gRPC server: PLAINTEXT insecure, SSL with TLS
        credentials that follow the certificate files (see broker/security.py)."""
        config = self.config
        for listener in listeners:
            bind_address = format_host_port(listener.host or "::", listener.port)
            if transport_of(listener.security_protocol) == SSL:
                if self._certificates is None:
                    self._certificates = ReloadingServerCertificates(
                        config.ssl_certificate_location, config.ssl_key_location, config.ssl_ca_location or None,
                        client_auth=config.ssl_client_auth)
                bind = lambda: server.add_secure_port(bind_address, self._certificates.credentials())
            else:
                bind = lambda: server.add_insecure_port(bind_address)
            try:
                bound_port = bind()
            except RuntimeError as exc:  # grpc raises when the bind fails
                raise StorageError(f"cannot listen on {bind_address} (listener {listener.name}): {exc}") from None
            if not bound_port:
                raise StorageError(f"cannot listen on {bind_address} (listener {listener.name}): "
                                   f"the address is in use or invalid")
            self.bound_ports[listener.name] = bound_port
            host, port = self._advertised.get(listener.name, (advertised_host(listener.host), 0))
            self.listener_nodes[listener.name] = NodeAddress(self.node_id, host, port or bound_port)
        self.port = self.bound_ports[self.inter_broker_listener.name]

    def _start_txn_coordinator(self) -> None:
        for attempt in range(1, 31):
            if self._stopping.is_set():
                return
            try:
                self._txn_coordinator.start()
                self._became_ready()
                return
            except Exception:
                if self._stopping.is_set():
                    return   # the broker stopped while the coordinator loaded; nothing is wrong
                log.exception("loading the transaction coordinator failed (attempt %d); retrying", attempt)
                self._stopping.wait(1.0)
        log.error("the transaction coordinator did not load; transactional requests will be refused")

    @property
    def txn_coordinator(self) -> TransactionCoordinator | None:
        return self._txn_coordinator

    @property
    def group_coordinator(self) -> GroupCoordinator | None:
        return self._group_coordinator

    def _verify_txn_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                               partitions: list[TopicPartition], *,
                               add: bool = False) -> dict[TopicPartition, tuple[int, str]]:
        """The `verify_txn` of the Broker service and the group coordinator (KIP-890 part 1):
        are these partitions in the producer's open transaction? With `add`, the Broker
        service's `add_txn_partitions` (KIP-890 part 2): add them to it. Asked in-process of
        the embedded coordinator, which owns every transactional id on a single node; a
        broker in a cluster calls TxnCoordinator.AddPartitionsToTxn on the id's coordinator
        over gRPC unless that coordinator is its own."""
        if self._cluster is not None:
            return self._cluster.verify_txn(transactional_id, producer_id, producer_epoch, partitions, add=add)
        coordinator = self._txn_coordinator
        if coordinator is None or not coordinator.ready:
            # Its log is not replayed yet: not knowing the id proves nothing; retry later.
            return {tp: (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "the transaction coordinator is loading its log")
                    for tp in partitions}
        ask = coordinator.add_partitions if add else coordinator.verify_partitions
        decision = ask(transactional_id, producer_id, producer_epoch, partitions)
        return {tp: (int(decision.partition_errors.get(tp, decision.error)), decision.message) for tp in partitions}

    def _add_txn_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                            partitions: list[TopicPartition]) -> dict[TopicPartition, tuple[int, str]]:
        return self._verify_txn_partitions(transactional_id, producer_id, producer_epoch, partitions, add=True)

    def _sweep_logs(self) -> None:
        """Make the logs on disk match the registry: create what is missing (a create cut
        short, or storage lost), delete what no topic names (a delete cut short)."""
        wanted = {(info.name, p) for info in self._registry.topics() for p in range(info.partition_count)}
        for partition_log in self._log_manager.all_logs():
            topic, partition = partition_log.topic, partition_log.partition
            if (topic, partition) not in wanted:
                log.warning("deleting log %s-%d: no topic in the registry names it", topic, partition)
                self._log_manager.delete_log(topic, partition)
        missing = [(info, partition) for info in self._registry.topics() for partition in range(info.partition_count)
                   if self._log_manager.get_log(info.name, partition) is None]
        if missing and self._log_manager.any_offline():
            # The internal topics live in the first dir (LogDirs), which is online here.
            for info, partition in [m for m in missing if m[0].is_internal]:
                self._log_manager.create_log(info.name, partition, info.config)
            missing = [m for m in missing if not m[0].is_internal]
            # They may be on the failed directory: an empty log elsewhere would start them
            # again from offset 0 and fork them when the directory comes back.
            self._log_manager.mark_offline([(info.name, p) for info, p in missing],
                                           f"not found on the online log dirs while {self._log_manager.offline_dirs}")
            log.error("%d partition(s) not found while a log dir is offline stay offline: %s", len(missing),
                      ", ".join(f"{info.name}-{p}" for info, p in missing))
            return
        for info, partition in missing:
            log.warning("creating missing log %s-%d", info.name, partition)
            self._log_manager.create_log(info.name, partition, info.config)

    def _teardown_after_failed_start(self) -> None:
        self._stopping.set()
        if self._txn_coordinator is not None:
            self._txn_coordinator.stop()
        self._leave_the_cluster()
        if self._group_coordinator is not None:
            self._group_coordinator.stop()
        if self._grpc_server is not None:
            self._grpc_server.stop(0)
        if self._metrics is not None:
            self._metrics.stop()
        if self._log_cleaner is not None:
            self._log_cleaner.stop()
        if self._log_manager is not None:
            try:
                self._log_manager.shutdown()
            except Exception:
                log.exception("closing the logs after a failed start")
        for lock in self._locks:
            lock.release()
        self._stopped.set()

    def _leave_the_cluster(self) -> None:
        """The ZooKeeper followers' threads stop first (they read the session leave() ends),
        then the cluster membership, then the coordinator's links to other brokers."""
        if self._authorizer is not None:
            self._authorizer.close()
        if self._entity_configs is not None:
            self._entity_configs.stop()
        if self._cluster is not None:
            self._cluster.leave()
        if self._txn_link is not None:
            self._txn_link.close()

    # ---- housekeeping -------------------------------------------------------------------------

    def _housekeeping_loop(self) -> None:
        interval_s = self.config.log_retention_check_interval_ms / 1000.0
        while not self._stopping.wait(interval_s):
            try:
                self._log_manager.run_housekeeping(self._now_ms())
            except Exception:  # one bad tick must not end retention for good
                log.exception("log housekeeping failed; retrying at the next tick")

    # ---- stop ----------------------------------------------------------------------------------

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop serving and close the logs. Idempotent; safe from any thread."""
        with self._state_lock:
            if not self._started or self._stopped.is_set():
                return
            if self._cluster is not None:
                # Kafka's order: leaderships move away while this broker still serves, so
                # producers see a leader change, not a dead leader.
                self._cluster.controlled_shutdown()
            self._stopping.set()
            self._ready.clear()
            self._health.enter_graceful_shutdown()       # probes see NOT_SERVING while it stops
            if self._txn_coordinator is not None:
                self._txn_coordinator.stop()
            if self._group_coordinator is not None:
                self._group_coordinator.stop()   # answers parked JoinGroup/SyncGroup at once
            stopped_event = self._grpc_server.stop(grace_s)  # refuses new RPCs at once
            self._quotas.close()                 # calls held for a quota throttle go on now
            if not self._servicer.close_and_drain(grace_s):
                log.warning("requests still running after %.1f s; closing the logs anyway", grace_s)
            stopped_event.wait(grace_s)
            if self._metrics is not None:
                self._metrics.stop()
            if self._housekeeping_thread is not None:
                self._housekeeping_thread.join(HOUSEKEEPING_JOIN_TIMEOUT_S)
                if self._housekeeping_thread.is_alive():
                    log.warning("housekeeping still running at shutdown")
            self._leave_the_cluster()
            self._log_cleaner.stop()
            try:
                self._log_manager.shutdown()
            finally:
                for lock in self._locks:
                    lock.release()
                self._stopped.set()
            log.info("eos broker node %d stopped", self.node_id)

    def wait_for_termination(self, timeout_s: float | None = None) -> bool:
        """Block until stop() has finished; True if it has."""
        return self._stopped.wait(timeout_s)

    def __enter__(self) -> "BrokerServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()


# ---- the blocking entry point -----------------------------------------------------------------

def _configure_logging() -> None:
    root = logging.getLogger()
    if not root.handlers:
        level = os.environ.get("EOS_LOG_LEVEL", "INFO").upper()
        logging.basicConfig(stream=sys.stderr, level=getattr(logging, level, logging.INFO),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def run_broker(data_dir: str, host: str = "127.0.0.1", port: int = 9092, node_id: int = 0,
               config: dict[str, str] | None = None) -> int:
    """Run a broker in the foreground until SIGTERM or SIGINT; return the exit code
    (0 after a clean stop, 1 when it could not start)."""
    _configure_logging()
    stop_requested = threading.Event()
    try:
        server = BrokerServer(data_dir, host=host, port=port, node_id=node_id, config=config)
        server.start()
    except (EosError, OSError) as exc:
        log.error("the broker could not start: %s", exc)
        return 1

    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous_handlers[signum] = signal.signal(signum, lambda *_: stop_requested.set())
    try:
        print(f"eos broker listening on {server.address} (data dir {server.data_dir})", flush=True)
        if len(server.listeners) > 1 or server.listeners[0].security_protocol != PLAINTEXT:
            print("eos broker listeners: " + ", ".join(
                f"{listener.name}://{server.address_of(listener.name)}" for listener in server.listeners), flush=True)
        if server.metrics_port is not None:
            print(f"eos broker metrics on {server.metrics_url}", flush=True)
        if server.socket_port is not None:
            print(f"eos broker socket transport on port {server.socket_port} (socket.transport.port)", flush=True)
        # a timeout keeps the main thread returning to the interpreter, where signal
        # handlers run
        while not stop_requested.wait(0.5):
            pass
        log.info("stop requested; shutting down")
    finally:
        server.stop()
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)
    return 0
