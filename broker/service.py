"""The Broker gRPC service: topics, produce, fetch, offsets and metadata of one node.

Theory of operation
-------------------
A thin shell: every RPC has the same shape (read the request, act per topic or partition
on the owner of the state, build the response). The owners are the `TopicRegistry`
(which topics exist, their partition counts and configs), the storage layer's
`LogManager` and `Log` (the bytes, offsets and producer state), and the `FetchPurgatory`
(long-poll waiters). The servicer keeps no state of its own beyond a lock that serialises
admin changes and a gate that lets shutdown wait for in-flight requests.

Errors are per partition (or per topic for admin RPCs), as Kafka's codes with a message
naming the problem. An `EosError` raised below carries its code; any other exception in one
partition is logged and answered with UNKNOWN_SERVER_ERROR for that partition only, and the
broker keeps serving. A request-level gRPC error is left for requests that cannot be read
at all (gRPC itself refuses messages over socket.request.max.bytes with RESOURCE_EXHAUSTED)
and for requests that arrive while the broker shuts down (UNAVAILABLE).

Produce and ProduceStream (acks, ordered produce streams, the transactional checks of a
write, client quotas on produce) are `broker/writes.py`'s `WriteHandlers`; Fetch and
ListOffsets (what a reader may see, long polls, client quotas on fetches, offsets by
timestamp) are `broker/reads.py`'s `ReadHandlers`; DeleteRecords is
`broker/delete_records.py`'s. This servicer inherits the three.

Transactions (KIP-98, KIP-890 part 1). WriteTxnMarkers, sent by the transaction
coordinator, appends one COMMIT or ABORT control batch per partition; the log checks the
producer and coordinator epochs and moves the LSO, so the fetch waiters of the partition
are woken. A marker on a `__consumer_offsets` partition also completes the transactional
offset commits the group coordinator holds pending (`on_offsets_txn_marker`), after the
marker is in the log. How a transactional batch is checked with the coordinator before
it is appended (KIP-890) is in `broker/writes.py`.
"""
from __future__ import annotations

import contextlib
import logging
import time
from typing import Callable, NamedTuple

from broker.acl import SUPPORTED_OPERATIONS, InvalidAclError, Operation, ResourceType
from broker.delete_records import DeleteRecordsHandler
from broker.log_dir_descriptions import describe_log_dirs
from broker.fetch_sessions import FetchSessionCache
from broker.purgatory import FetchPurgatory
from broker.security import PLAINTEXT, current_call, listener_name_of_call
from broker.local_topic_admin import LocalTopicAdmin
from broker.produce_streams import ProduceStreams
from broker.reads import FETCH_MAX_WAIT_CAP_MS, ReadHandlers
from broker.writes import PRODUCE_TIMEOUT_MS_DEFAULT, WriteHandlers
from broker.request_gate import RequestGate, gated
from broker.topics import TopicInfo, TopicRegistry, is_internal_topic, validate_topic_name
from broker.traffic import StorageErrors, TopicTraffic
from eos.errors import (
    EosError,
    ErrorCode,
    InvalidRequestError,
    StorageError,
    UnknownTopicOrPartitionError,
    error_code_and_message,
)
from broker.config import DYNAMIC_TOPIC_DEFAULT_NAMES
from eos.config_resources import (RESOURCE_BROKER, RESOURCE_TOPIC, SOURCE_DEFAULT_CONFIG, SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG,
                                  SOURCE_DYNAMIC_TOPIC_CONFIG, SOURCE_STATIC_BROKER_CONFIG)
from eos.acl import binding_from_proto, binding_to_proto, filter_from_proto
from eos.types import TopicPartition
from eos.v1 import broker_pb2, broker_pb2_grpc

# The refusals that carry the leader this broker knows (`add_leader_hints`).
_LEADER_HINT_CODES = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH})

log = logging.getLogger("eos.broker")

# A produce stream holds a gRPC worker for its lifetime, so their number is bounded; the
# broker sizes its worker pool for this many streams (broker/server.py).
PRODUCE_STREAMS_MAX = 32


OFFSETS_TOPIC = "__consumer_offsets"
# KIP-430: the operations cluster_authorized_operations may name (ALL is spelled out), and
# Kafka's value when the client did not ask for them.
CLUSTER_OPERATIONS = tuple(sorted(SUPPORTED_OPERATIONS[ResourceType.CLUSTER] - {Operation.ALL}))
AUTHORIZED_OPERATIONS_OMITTED = -2**31

# verify_txn(transactional_id, producer_id, producer_epoch, partitions) -> {partition: (code, message)};
# add_txn_partitions has the same shape and adds the partitions to the open transaction.
VerifyTxn = Callable[[str, int, int, list[TopicPartition]], dict[TopicPartition, tuple[int, str]]]
# on_offsets_txn_marker(__consumer_offsets partition, producer_id, committed)
OffsetsTxnMarkerHook = Callable[[int, int, bool], None]


class NodeAddress(NamedTuple):
    node_id: int
    host: str
    port: int


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _each(items, result_type, code: int, message: str) -> list:
    """One `result_type` answer per item, all with the same error (an ACL call refused or
    not stored as a whole)."""
    return [result_type(error_code=code, error_message=message) for _ in items]


class _OwnMarker(NamedTuple):
    """A marker of the embedded coordinator's (write_own_markers), as _write_marker reads one."""
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    committed: bool


class BrokerServicer(WriteHandlers, ReadHandlers, DeleteRecordsHandler, broker_pb2_grpc.BrokerServicer):
    """The Broker service of one node. Build with the owners of the state; see module doc."""

    def __init__(self, *, registry: TopicRegistry, log_manager, purgatory: FetchPurgatory,
                 node: NodeAddress, cluster_id: str, now_ms_fn: Callable[[], int] = _now_ms,
                 auto_create_topics: bool = False,
                 fetch_max_wait_cap_ms: int = FETCH_MAX_WAIT_CAP_MS,
                 verify_txn: VerifyTxn | None = None,
                 add_txn_partitions: VerifyTxn | None = None,
                 on_offsets_txn_marker: OffsetsTxnMarkerHook | None = None,
                 max_produce_streams: int = PRODUCE_STREAMS_MAX,
                 metadata=None, replicas=None, topic_admin=None,
                 listener_nodes: dict[str, NodeAddress] | None = None, authorizer=None, quotas=None,
                 traffic: TopicTraffic | None = None, socket_port: int = 0, socket_listener: str | None = None,
                 broker_settings: dict[str, tuple[str | None, bool]] | None = None, dynamic_configs=None):
        """`verify_txn` asks the transaction coordinator whether partitions are registered in
        a producer's open transaction (None: no coordinator, transactional writes are not
        verified); `add_txn_partitions` adds them for a request that asks it (KIP-890 part 2;
        None: such a request is only verified). `on_offsets_txn_marker` is the group coordinator's hook for markers
        written to `__consumer_offsets` partitions. At most `max_produce_streams`
        ProduceStream calls are open at once (each holds a gRPC worker for its lifetime).
        `listener_nodes` is this node's advertised address per listener name: a call that
        came in on a listener is answered with that listener's address (Kafka's rule).
        `authorizer` (broker.authorizer.Authorizer) checks each call's ACLs; None: no checks.
        `quotas` (broker.client_quotas.ClientQuotas) holds clients to their byte rates; None: none.
        `traffic` counts bytes and records per topic for the broker's metrics; None: not counted.
        `socket_port` is where this broker serves its calls over plain TCP (socket.transport.port,
        broker/socket_server.py), for the PLAINTEXT listener `socket_listener` (the brokers'
        ports are told to clients that came in on that listener only); 0: none.
        `broker_settings` is what DescribeConfigs of this broker answers (broker.config's
        `describe_settings`: name -> (value, set by the operator)); None: nothing.
        `dynamic_configs` (broker/dynamic_config.py) holds the broker configs altered on the
        running brokers; None: every broker config is static."""
        self._registry = registry
        self._log_manager = log_manager
        self._purgatory = purgatory
        # the followers' (broker/fetch_sessions.py); a dropped session's waiter leaves the purgatory
        self._fetch_sessions = FetchSessionCache(on_drop=self._drop_session_waiter)
        self._node = node
        self._listener_nodes = dict(listener_nodes or {})
        self._cluster_id = cluster_id
        self._now_ms = now_ms_fn
        self._auto_create_topics = auto_create_topics
        self._fetch_max_wait_cap_ms = fetch_max_wait_cap_ms
        self._verify_txn = verify_txn
        self._add_txn_partitions = add_txn_partitions
        self._on_offsets_txn_marker = on_offsets_txn_marker
        # Cluster mode (see "The cluster" in the module doc): the metadata cache answers
        # Metadata and the replica manager decides who leads and replicates (both None on a
        # cluster of one); topic changes go to ZooKeeper through the cluster's `topic_admin`,
        # or, on a cluster of one, to this broker's registry and logs (LocalTopicAdmin).
        self._metadata = metadata
        self._replicas = replicas
        self._topic_admin = topic_admin if topic_admin is not None else LocalTopicAdmin(
            registry, log_manager, node_id=node.node_id, notify=purgatory.notify)
        self._gate = RequestGate()
        self._streams = ProduceStreams(max_produce_streams)
        self._authorizer = authorizer
        self._quotas = quotas
        self.traffic = traffic
        self.storage_errors = StorageErrors()
        self._socket_port = socket_port
        self._socket_listener = socket_listener
        self._broker_settings = dict(broker_settings or {})
        self._dynamic_configs = dynamic_configs

    # ---- authorization (see "Authorization" in the module doc) ---------------------------------

    def _topic_denied(self, operation: Operation, topic: str) -> bool:
        return not self._authorizer.allowed(operation, ResourceType.TOPIC, topic)

    def _cluster_allows(self, *operations: Operation) -> bool:
        return any(self._authorizer.allowed(operation, ResourceType.CLUSTER) for operation in operations)

    def _denial(self, operation: Operation, what: str) -> str:
        return f"{self._authorizer.principal()} is not authorized to {operation.name} {what}"

    # ---- lifecycle -------------------------------------------------------------------------

    def close_and_drain(self, timeout_s: float) -> bool:
        """Refuse new requests, wake long polls, end produce streams once their request in
        flight is answered, wait for requests in flight."""
        self._purgatory.close()
        self._streams.close()
        return self._gate.close_and_drain(timeout_s)

    @property
    def fetch_waiter_count(self) -> int:
        return self._purgatory.waiter_count

    @property
    def produce_stream_count(self) -> int:
        """ProduceStream calls open right now (for tests and metrics)."""
        return self._streams.count

    # ---- lookups -----------------------------------------------------------------------------

    def _topic(self, topic: str, *, may_create: bool = False) -> TopicInfo:
        info = self._registry.get(topic)
        if info is None and may_create and self._auto_create_topics and (
                self._authorizer is None or self._cluster_allows(Operation.CREATE)
                or not self._topic_denied(Operation.CREATE, topic)):
            info = self._topic_admin.auto_create(topic)
        if info is None:
            raise UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        return info

    def _log_for(self, topic: str, partition: int, *, may_create: bool = False):
        info = self._topic(topic, may_create=may_create)
        if not 0 <= partition < info.partition_count:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{info.partition_count - 1}, "
                f"not {partition}")
        partition_log = self._log_manager.get_log(topic, partition)
        if partition_log is None:
            offline = self._log_manager.offline_reason(topic, partition)
            if offline is not None:
                raise StorageError(f"partition {topic}-{partition}: {offline}")
            raise UnknownTopicOrPartitionError(f"partition {topic}-{partition} has no log on this broker")
        return partition_log

    def add_leader_hints(self, results) -> None:
        """KIP-951: each result (PartitionProduceResult or FetchedPartition) refused as
        NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH names the leader this broker knows, the
        newer of the controller's LeaderAndIsr (a replica here) and its UpdateMetadata cache,
        so the client retries there at once instead of asking Metadata and backing off. A
        cluster of one has no other leader to name."""
        if self._replicas is None:
            return
        for result in results:
            if result.error_code not in _LEADER_HINT_CODES:
                continue
            known = self._replicas.known_leader(result.topic, result.partition)
            cached = self._metadata.partition(result.topic, result.partition) if self._metadata is not None else None
            if cached is not None and (known is None or cached.leader_epoch > known[1]):
                known = (cached.leader, cached.leader_epoch)
            if known is not None and known[0] >= 0:
                result.current_leader.leader_id, result.current_leader.leader_epoch = known

    def _log_partition_error(self, rpc: str, topic: str, partition: int, exc: BaseException) -> None:
        if isinstance(exc, EosError) and exc.code == ErrorCode.KAFKA_STORAGE_ERROR:
            # A failing disk answers every request with this: logged once per partition and
            # log dir, counted always (broker/traffic.py)
            log_dir = self._log_manager.log_dir_of(topic, partition) or ""
            if self.storage_errors.record(topic, partition, log_dir, str(exc)):
                log.error("%s %s-%d: storage error in log dir %s: %s (logged once for this partition; "
                          "eos_log_storage_errors_total counts them)", rpc, topic, partition, log_dir or "?", exc)
        elif isinstance(exc, EosError):
            log.debug("%s %s-%d: %s", rpc, topic, partition, exc)
        else:
            log.exception("%s %s-%d failed unexpectedly", rpc, topic, partition, exc_info=exc)

    # ---- Metadata ----------------------------------------------------------------------------

    @gated
    def Metadata(self, request: broker_pb2.MetadataRequest, context) -> broker_pb2.MetadataResponse:
        response = self._metadata_from_cache(request) if self._metadata is not None else self._local_metadata(request)
        response.cluster_authorized_operations = (self._cluster_authorized_operations()
                                                  if request.include_cluster_authorized_operations
                                                  else AUTHORIZED_OPERATIONS_OMITTED)
        return response

    def _cluster_authorized_operations(self) -> int:
        """KIP-430's bit field of the cluster operations the caller may perform (every one
        without an authorizer, as in Kafka)."""
        return sum(1 << operation for operation in CLUSTER_OPERATIONS
                   if self._authorizer is None or self._authorizer.allowed(operation, ResourceType.CLUSTER))

    def _local_metadata(self, request: broker_pb2.MetadataRequest) -> broker_pb2.MetadataResponse:
        """A cluster of one: this broker leads every partition of its registry."""
        topics = []
        checked = self._authorizer is not None
        if request.topics:
            for name in request.topics:
                if checked and self._topic_denied(Operation.DESCRIBE, name):
                    # Asked by name: refused (Kafka's answer, whether the topic exists or not).
                    topics.append(broker_pb2.TopicMetadata(
                        name=name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        error_message=self._denial(Operation.DESCRIBE, f"topic {name!r}")))
                    continue
                topics.append(self._topic_metadata_by_name(name))
        else:
            for info in self._registry.topics():
                if info.is_internal and not request.include_internal:
                    continue
                if checked and self._topic_denied(Operation.DESCRIBE, info.name):
                    continue    # all topics: the ones it may not describe do not exist for it
                topics.append(self._topic_metadata(info))
        node = self.node_for_call()
        return broker_pb2.MetadataResponse(
            brokers=[broker_pb2.BrokerNode(node_id=node.node_id, host=node.host, port=node.port,
                                           socket_port=self._socket_port_for_call())],
            controller_id=node.node_id, topics=topics, cluster_id=self._cluster_id)

    def node_for_call(self) -> NodeAddress:
        """This node's address on the listener the current call came in on (the
        inter-broker listener's for an in-process call)."""
        call = current_call()
        if call is None:
            return self._node
        return self._listener_nodes.get(call.listener.name, self._node)

    def _call_may_use_socket(self) -> bool:
        """Did the current call come in on the listener the socket port serves (the first
        PLAINTEXT one)? Only such a client is told the brokers' socket ports: one that came
        over TLS stays on TLS, and one of another PLAINTEXT listener (another network, other
        advertised addresses) stays on its listener."""
        call = current_call()
        if call is None:
            return True     # in process, or one PLAINTEXT listener without identities
        return call.listener.security_protocol == PLAINTEXT and call.listener.name == self._socket_listener

    def _socket_port_for_call(self) -> int:
        return self._socket_port if self._call_may_use_socket() else 0

    def _metadata_from_cache(self, request: broker_pb2.MetadataRequest) -> broker_pb2.MetadataResponse:
        """Cluster mode: what the controller last told this broker (UpdateMetadata). Brokers
        are named by their address on the listener the call came in on, and one without that
        listener is left out (Kafka's rule), so a client that came in over TLS stays on TLS."""
        snapshot = self._metadata.snapshot
        by_topic = snapshot.topics()
        names = list(request.topics) or sorted(by_topic)
        checked = self._authorizer is not None
        topics = []
        for name in names:
            if checked and self._topic_denied(Operation.DESCRIBE, name):
                if request.topics:   # asked by name: refused; all topics: it does not see them
                    topics.append(broker_pb2.TopicMetadata(
                        name=name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        error_message=self._denial(Operation.DESCRIBE, f"topic {name!r}")))
                continue
            partitions = by_topic.get(name)
            if partitions is None:
                topics.append(broker_pb2.TopicMetadata(
                    name=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=f"topic {name!r} does not exist (or its metadata has not reached this broker)"))
                continue
            internal = is_internal_topic(name)
            if internal and not request.topics and not request.include_internal:
                continue
            topics.append(broker_pb2.TopicMetadata(
                name=name, error_code=ErrorCode.NONE, is_internal=internal,
                configs=dict(snapshot.topic_configs.get(name, {})),
                partitions=[broker_pb2.PartitionMetadata(
                    partition=info.partition,
                    error_code=ErrorCode.NONE if info.leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE,
                    leader_id=info.leader, leader_epoch=info.leader_epoch, replica_ids=info.replicas,
                    isr_ids=info.isr, offline_replica_ids=info.offline_replicas) for info in partitions]))
        listener_name = listener_name_of_call()
        plaintext = self._call_may_use_socket()
        brokers = []
        for broker in sorted(snapshot.brokers.values(), key=lambda b: b.broker_id):
            address = broker.endpoint(listener_name)
            if address is not None:
                brokers.append(broker_pb2.BrokerNode(node_id=broker.broker_id, host=address[0], port=address[1],
                                                     rack=broker.rack or "",
                                                     socket_port=broker.socket_port if plaintext else 0))
        return broker_pb2.MetadataResponse(brokers=brokers, controller_id=snapshot.controller_id, topics=topics,
                                           cluster_id=self._cluster_id)

    def _topic_metadata_by_name(self, name: str) -> broker_pb2.TopicMetadata:
        try:
            validate_topic_name(name)
            info = self._topic(name, may_create=True)
        except Exception as exc:
            code, message = error_code_and_message(exc)
            self._log_partition_error("Metadata", name, -1, exc)
            return broker_pb2.TopicMetadata(name=name, error_code=code, error_message=message)
        return self._topic_metadata(info)

    def _topic_metadata(self, info: TopicInfo) -> broker_pb2.TopicMetadata:
        node_id = self._node.node_id
        partitions = [
            broker_pb2.PartitionMetadata(partition=i, error_code=ErrorCode.NONE, leader_id=node_id,
                                         leader_epoch=0, replica_ids=[node_id], isr_ids=[node_id])
            for i in range(info.partition_count)]
        return broker_pb2.TopicMetadata(
            name=info.name, error_code=ErrorCode.NONE, is_internal=info.is_internal,
            partitions=partitions, configs=dict(info.config_overrides))

    # ---- topic administration (a ZooKeeper cluster's controller, or broker/local_topic_admin.py) ----

    # Each is checked here, per topic, before the admin (a cluster of one's or ZooKeeper's)
    # sees the request: the refused topics are answered TOPIC_AUTHORIZATION_FAILED and left
    # out of what the admin gets, so nothing about them changes; the others go on (Kafka).

    @gated
    def CreateTopics(self, request: broker_pb2.CreateTopicsRequest, context) -> broker_pb2.CreateTopicsResponse:
        refused = {}
        if self._authorizer is not None and not self._cluster_allows(Operation.CREATE):
            # Kafka: CREATE on the cluster, or else CREATE on each topic.
            refused = {name: f"{why} (nor the cluster)" for name, why in
                       self._topic_refusals(Operation.CREATE, [t.name for t in request.topics]).items()}
        return self._admin_checked(request, "topics", refused, self._topic_admin.create_topics,
                                   broker_pb2.CreateTopicsResponse)

    @gated
    def DeleteTopics(self, request: broker_pb2.DeleteTopicsRequest, context) -> broker_pb2.DeleteTopicsResponse:
        refused = self._topic_refusals(Operation.DELETE, request.names)
        return self._admin_checked(request, "names", refused, self._topic_admin.delete_topics,
                                   broker_pb2.DeleteTopicsResponse)

    @gated
    def CreatePartitions(self, request: broker_pb2.CreatePartitionsRequest,
                         context) -> broker_pb2.CreatePartitionsResponse:
        refused = self._topic_refusals(Operation.ALTER, [t.name for t in request.topics])
        return self._admin_checked(request, "topics", refused, self._topic_admin.create_partitions,
                                   broker_pb2.CreatePartitionsResponse)

    def _topic_refusals(self, operation: Operation, names) -> dict[str, str]:
        """Topic name -> why the caller may not `operation` it (none without an authorizer)."""
        if self._authorizer is None:
            return {}
        return {name: self._denial(operation, f"topic {name!r}") for name in names
                if self._topic_denied(operation, name)}

    @staticmethod
    def _admin_checked(request, field: str, refused: dict[str, str], handle, response_type):
        """`handle` the request without the `refused` topics (name -> why); the answers in
        the request's order, one per topic."""
        if not refused:
            return handle(request)
        items = list(getattr(request, field))
        name_of = (lambda item: item) if field == "names" else (lambda item: item.name)
        allowed = [item for item in items if name_of(item) not in refused]
        answered = iter([])
        if allowed:
            narrowed = type(request)()
            narrowed.CopyFrom(request)
            del getattr(narrowed, field)[:]
            getattr(narrowed, field).extend(allowed)
            answered = iter(handle(narrowed).topics)
        results = []
        for item in items:
            name = name_of(item)
            if name in refused:
                results.append(broker_pb2.TopicResult(name=name, error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                      error_message=refused[name]))
            else:
                results.append(next(answered))
        return response_type(topics=results)

    # ---- topic configs (Kafka's DescribeConfigs, IncrementalAlterConfigs; broker/topic_configs.py) ----

    @gated
    def DescribeConfigs(self, request: broker_pb2.DescribeConfigsRequest,
                        context) -> broker_pb2.DescribeConfigsResponse:
        """Topics by the topic admin; this broker's own settings here (Kafka sends a
        broker's DescribeConfigs to that broker). Answers in request order."""
        brokers = [r for r in request.resources if r.resource_type == RESOURCE_BROKER]
        if not brokers:
            return self._with_dynamic_sources(self._topic_admin.describe_configs(request, self._config_refusals(
                Operation.DESCRIBE_CONFIGS, request.resources)))
        others = broker_pb2.DescribeConfigsRequest(
            resources=[r for r in request.resources if r.resource_type != RESOURCE_BROKER])
        answered = iter(self._with_dynamic_sources(self._topic_admin.describe_configs(others, self._config_refusals(
            Operation.DESCRIBE_CONFIGS, others.resources))).results if others.resources else ())
        return broker_pb2.DescribeConfigsResponse(results=[
            self._describe_broker(r) if r.resource_type == RESOURCE_BROKER else next(answered)
            for r in request.resources])

    def _with_dynamic_sources(self, response: broker_pb2.DescribeConfigsResponse) -> broker_pb2.DescribeConfigsResponse:
        """A topic's config that follows a dynamic broker config (no override of its own) has
        that config's source, as in Kafka, not the static setting's."""
        sources = {} if self._dynamic_configs is None else self._dynamic_configs.topic_sources()
        if sources:
            for result in response.results:
                for entry in result.configs:
                    if entry.config_source != SOURCE_DYNAMIC_TOPIC_CONFIG and entry.name in sources:
                        entry.config_source = sources[entry.name]
        return response

    def _describe_broker(self, resource: broker_pb2.ConfigResource) -> broker_pb2.DescribeConfigsResult:
        result = broker_pb2.DescribeConfigsResult(resource_type=resource.resource_type,
                                                  resource_name=resource.resource_name)
        if self._authorizer is not None and not self._cluster_allows(Operation.DESCRIBE_CONFIGS):
            result.error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            result.error_message = self._denial(Operation.DESCRIBE_CONFIGS, "the cluster")
        elif resource.resource_name == "":
            # the cluster-wide dynamic defaults (Kafka's empty name): only what was set
            wanted = set(resource.config_names)
            values = {} if self._dynamic_configs is None else self._dynamic_configs.values("")
            result.configs.extend(
                broker_pb2.ConfigEntry(name=name, value=value, read_only=False, is_sensitive=False,
                                       config_source=SOURCE_DYNAMIC_DEFAULT_BROKER_CONFIG)
                for name, value in sorted(values.items()) if not wanted or name in wanted)
        elif not resource.resource_name.isdigit() or int(resource.resource_name) != self._node.node_id:
            result.error_code = ErrorCode.INVALID_REQUEST
            result.error_message = (f"this is broker {self._node.node_id}, asked for the configs of broker "
                                    f"{resource.resource_name!r}: ask that broker")
        else:
            wanted = set(resource.config_names)
            dynamic = {} if self._dynamic_configs is None else self._dynamic_configs.in_force()
            for name, (value, given) in self._broker_settings.items():
                if wanted and name not in wanted:
                    continue
                source = SOURCE_STATIC_BROKER_CONFIG if given else SOURCE_DEFAULT_CONFIG
                if name in dynamic:
                    value, source = dynamic[name]
                result.configs.append(broker_pb2.ConfigEntry(
                    name=name, value=value or "", is_sensitive=False, config_source=source,
                    read_only=self._dynamic_configs is None or name not in DYNAMIC_TOPIC_DEFAULT_NAMES))
        return result

    @gated
    def IncrementalAlterConfigs(self, request: broker_pb2.IncrementalAlterConfigsRequest,
                                context) -> broker_pb2.IncrementalAlterConfigsResponse:
        """Topics by the topic admin, brokers' dynamic configs here (broker/dynamic_config.py);
        answered in request order."""
        refusals = self._config_refusals(Operation.ALTER_CONFIGS, request.resources)
        if all(r.resource_type != RESOURCE_BROKER for r in request.resources):
            return self._topic_admin.alter_configs(request, refusals)
        others = broker_pb2.IncrementalAlterConfigsRequest(
            resources=[r for r in request.resources if r.resource_type != RESOURCE_BROKER],
            validate_only=request.validate_only)
        answered = iter(self._topic_admin.alter_configs(others, refusals).results if others.resources else ())
        return broker_pb2.IncrementalAlterConfigsResponse(results=[
            self._alter_broker(r, refusals, request.validate_only) if r.resource_type == RESOURCE_BROKER
            else next(answered) for r in request.resources])

    def _alter_broker(self, resource: broker_pb2.AlterConfigsResource, refusals,
                      validate_only: bool) -> broker_pb2.AlterConfigsResult:
        result = broker_pb2.AlterConfigsResult(resource_type=resource.resource_type,
                                               resource_name=resource.resource_name)
        refused = refusals.get((RESOURCE_BROKER, resource.resource_name))
        try:
            if refused is not None:
                raise EosError(refused[1], refused[0])
            if self._dynamic_configs is None:
                raise InvalidRequestError("this broker's configs are all static")
            # (another broker's id is refused there: "ask that broker")
            self._dynamic_configs.alter(resource.resource_name, resource.configs, validate_only)
        except Exception as exc:
            if not isinstance(exc, EosError):
                log.exception("altering the configs of broker %r failed", resource.resource_name)
            code, message = error_code_and_message(exc)
            result.error_code, result.error_message = int(code), message
        return result

    def _config_refusals(self, operation: Operation, resources) -> dict[tuple[int, str], tuple[int, str]]:
        """(resource type, name) -> (code, why) for the topics the caller may not `operation`
        (TOPIC_AUTHORIZATION_FAILED) and, without `operation` on the cluster, the brokers
        (CLUSTER_AUTHORIZATION_FAILED); the others go on (Kafka)."""
        topics = [r.resource_name for r in resources if r.resource_type == RESOURCE_TOPIC]
        refusals = {(RESOURCE_TOPIC, name): (ErrorCode.TOPIC_AUTHORIZATION_FAILED, why)
                    for name, why in self._topic_refusals(operation, topics).items()}
        if self._authorizer is not None and not self._cluster_allows(operation):
            refusals.update({(RESOURCE_BROKER, r.resource_name): (
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED, self._denial(operation, "the cluster"))
                for r in resources if r.resource_type == RESOURCE_BROKER})
        return refusals

    # ---- transactions ------------------------------------------------------------------------

    @gated
    def WriteTxnMarkers(self, request: broker_pb2.WriteTxnMarkersRequest,
                        context) -> broker_pb2.WriteTxnMarkersResponse:
        """Append every marker, then (on a cluster) wait until the in-sync replicas have them
        all: Kafka writes markers with acks=-1, because a marker lost with its leader would
        leave the transaction open on that partition after the coordinator moved on."""
        if self._authorizer is not None and not self._cluster_allows(Operation.CLUSTER_ACTION, Operation.ALTER):
            # The coordinator's call (CLUSTER_ACTION), or an admin's abort of a hanging
            # transaction (ALTER on the cluster, KIP-1037); refused whole, as in Kafka.
            why = self._denial(Operation.CLUSTER_ACTION, "the cluster (nor ALTER it)")
            return broker_pb2.WriteTxnMarkersResponse(markers=[
                broker_pb2.TxnMarkerResult(producer_id=marker.producer_id, partitions=[
                    broker_pb2.PartitionError(topic=tp.topic, partition=tp.partition,
                                              error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED, error_message=why)
                    for tp in marker.partitions]) for marker in request.markers])
        now_ms = self._now_ms()
        answers = [[self._write_marker(marker, tp, now_ms) for tp in marker.partitions] for marker in request.markers]
        results = [[wait() if callable(wait) else wait for wait in waits] for waits in answers]
        return broker_pb2.WriteTxnMarkersResponse(markers=[
            broker_pb2.TxnMarkerResult(producer_id=marker.producer_id, partitions=partitions)
            for marker, partitions in zip(request.markers, results)])

    def write_own_markers(self, coordinator_epoch: int, entries) -> dict[tuple[int, TopicPartition], tuple[int, str]]:
        """The embedded transaction coordinator's markers for partitions this broker leads:
        what WriteTxnMarkers does with them (each appended, then on a cluster the wait for the
        in-sync replicas), inside the shutdown gate, without the request and response
        messages around them (the broker's own call passes the ACL check anyway). `entries`
        have producer_id, producer_epoch, committed and partitions (TopicPartition);
        returns {(entry index, partition): (error code, message)}, BROKER_NOT_AVAILABLE for
        every partition of a broker that stops."""
        if not self._gate.enter():
            return {(index, tp): (ErrorCode.BROKER_NOT_AVAILABLE, "the broker is shutting down")
                    for index, entry in enumerate(entries) for tp in entry.partitions}
        try:
            now_ms = self._now_ms()
            answers = [((index, tp), self._write_marker(
                _OwnMarker(entry.producer_id, entry.producer_epoch, coordinator_epoch, entry.committed), tp, now_ms))
                for index, entry in enumerate(entries) for tp in sorted(entry.partitions)]
            results = {}
            for key, answer in answers:      # (on a cluster: every marker appended before any wait)
                result = answer() if callable(answer) else answer
                results[key] = (result.error_code, result.error_message)
            return results
        finally:
            self._gate.exit()

    def _write_marker(self, marker: broker_pb2.TxnMarker | _OwnMarker, tp, now_ms: int):
        """The partition's answer, or on a cluster a callable that waits for replication and
        returns it."""
        replicas = self._replicas
        try:
            with (replicas.leader_append(tp.topic, tp.partition) if replicas is not None
                  else contextlib.nullcontext(0)) as leader_epoch:
                partition_log = self._log_for(tp.topic, tp.partition)
                partition_log.append_txn_marker(marker.producer_id, marker.producer_epoch, marker.coordinator_epoch,
                                                marker.committed, now_ms, leader_epoch=leader_epoch)
                end_offset = partition_log.log_end_offset
                if replicas is not None:
                    replicas.on_leader_append(tp.topic, tp.partition, partition_log)
        except Exception as exc:
            code, message = error_code_and_message(exc)
            self._log_partition_error("WriteTxnMarkers", tp.topic, tp.partition, exc)
            return broker_pb2.PartitionError(topic=tp.topic, partition=tp.partition, error_code=code,
                                             error_message=message)
        # the LSO may have moved: read_committed long polls re-read
        self._purgatory.notify(TopicPartition(tp.topic, tp.partition))
        if tp.topic == OFFSETS_TOPIC and self._on_offsets_txn_marker is not None:
            try:
                self._on_offsets_txn_marker(tp.partition, marker.producer_id, marker.committed)
            except Exception as exc:
                # The marker is in the log but the group coordinator did not take it in:
                # answer an error so the coordinator sends the marker again (a second marker
                # for a closed transaction is harmless) and the hook runs again.
                log.exception("WriteTxnMarkers %s-%d: completing the pending offset commits of producer %d "
                              "failed", tp.topic, tp.partition, marker.producer_id)
                return broker_pb2.PartitionError(
                    topic=tp.topic, partition=tp.partition, error_code=ErrorCode.UNKNOWN_SERVER_ERROR,
                    error_message=f"the marker is written, but the group coordinator could not complete the "
                                  f"offset commits of producer {marker.producer_id}: {type(exc).__name__}: {exc}")
        done = broker_pb2.PartitionError(topic=tp.topic, partition=tp.partition, error_code=ErrorCode.NONE)
        if replicas is None:
            return done
        min_isr = self._registry.get(tp.topic).config.min_insync_replicas

        def replicated() -> broker_pb2.PartitionError:
            code, message = replicas.wait_for_high_watermark(tp.topic, tp.partition, end_offset,
                                                             PRODUCE_TIMEOUT_MS_DEFAULT, min_isr)
            if code == ErrorCode.NONE:
                return done
            return broker_pb2.PartitionError(topic=tp.topic, partition=tp.partition, error_code=code,
                                             error_message=f"marker written, not yet replicated: {message}")
        return replicated

    # ---- ACLs (Kafka's CreateAcls, DescribeAcls, DeleteAcls) ----------------------------------

    def _acl_refusal(self, operation: Operation) -> tuple[int, str] | None:
        """Why this call may not touch the ACLs, or None: SECURITY_DISABLED without an
        authorizer (Kafka's answer), CLUSTER_AUTHORIZATION_FAILED without `operation` on the
        cluster (ALTER to change them, DESCRIBE to read them)."""
        if self._authorizer is None:
            return ErrorCode.SECURITY_DISABLED, ("no authorizer is configured on this broker "
                                                 "(authorizer.class.name): there are no ACLs")
        if not self._cluster_allows(operation):
            return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, self._denial(operation, "the cluster")
        return None

    @gated
    def CreateAcls(self, request: broker_pb2.CreateAclsRequest, context) -> broker_pb2.CreateAclsResponse:
        refusal = self._acl_refusal(Operation.ALTER)
        if refusal is not None:
            return broker_pb2.CreateAclsResponse(results=_each(request.creations, broker_pb2.AclCreationResult,
                                                               *refusal))
        try:
            problems = self._authorizer.create([binding_from_proto(c) for c in request.creations])
        except StorageError as exc:
            return broker_pb2.CreateAclsResponse(results=_each(request.creations, broker_pb2.AclCreationResult,
                                                               ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)))
        return broker_pb2.CreateAclsResponse(results=[
            broker_pb2.AclCreationResult(error_code=ErrorCode.NONE) if problem is None else
            broker_pb2.AclCreationResult(error_code=ErrorCode.INVALID_REQUEST, error_message=problem)
            for problem in problems])

    @gated
    def DescribeAcls(self, request: broker_pb2.DescribeAclsRequest, context) -> broker_pb2.DescribeAclsResponse:
        refusal = self._acl_refusal(Operation.DESCRIBE)
        if refusal is not None:
            return broker_pb2.DescribeAclsResponse(error_code=refusal[0], error_message=refusal[1])
        try:
            found = self._authorizer.describe(filter_from_proto(request.filter))
        except InvalidAclError as exc:
            return broker_pb2.DescribeAclsResponse(error_code=ErrorCode.INVALID_REQUEST, error_message=str(exc))
        return broker_pb2.DescribeAclsResponse(error_code=ErrorCode.NONE,
                                               acls=[binding_to_proto(b) for b in sorted(found)])

    @gated
    def DeleteAcls(self, request: broker_pb2.DeleteAclsRequest, context) -> broker_pb2.DeleteAclsResponse:
        refusal = self._acl_refusal(Operation.ALTER)
        if refusal is not None:
            return broker_pb2.DeleteAclsResponse(results=_each(request.filters, broker_pb2.DeleteAclsFilterResult,
                                                               *refusal))
        try:
            outcomes = self._authorizer.delete([filter_from_proto(f) for f in request.filters])
        except StorageError as exc:
            return broker_pb2.DeleteAclsResponse(results=_each(request.filters, broker_pb2.DeleteAclsFilterResult,
                                                               ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)))
        return broker_pb2.DeleteAclsResponse(results=[
            broker_pb2.DeleteAclsFilterResult(error_code=ErrorCode.NONE,
                                              matching_acls=[binding_to_proto(b) for b in sorted(removed)])
            if problem is None else
            broker_pb2.DeleteAclsFilterResult(error_code=ErrorCode.INVALID_REQUEST, error_message=problem)
            for problem, removed in outcomes])

    @gated
    def DescribeProducers(self, request: broker_pb2.DescribeProducersRequest,
                          context) -> broker_pb2.DescribeProducersResponse:
        if self._authorizer is not None:
            return broker_pb2.DescribeProducersResponse(partitions=[
                broker_pb2.PartitionProducers(topic=tp.topic, partition=tp.partition,
                                              error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                              error_message=self._denial(Operation.READ, f"topic {tp.topic!r}"))
                if self._topic_denied(Operation.READ, tp.topic) else self._describe_producers(tp)
                for tp in request.partitions])
        return broker_pb2.DescribeProducersResponse(partitions=[
            self._describe_producers(tp) for tp in request.partitions])

    def _describe_producers(self, tp) -> broker_pb2.PartitionProducers:
        try:
            partition_log = self._log_for(tp.topic, tp.partition)
            producers = [
                broker_pb2.ProducerStateInfo(
                    producer_id=entry.producer_id, producer_epoch=entry.producer_epoch,
                    last_sequence=entry.last_sequence, last_timestamp_ms=entry.last_timestamp_ms,
                    coordinator_epoch=entry.coordinator_epoch,
                    current_txn_start_offset=entry.current_txn_first_offset)
                for entry in partition_log.describe_producers()]
        except Exception as exc:
            code, message = error_code_and_message(exc)
            self._log_partition_error("DescribeProducers", tp.topic, tp.partition, exc)
            return broker_pb2.PartitionProducers(topic=tp.topic, partition=tp.partition,
                                                 error_code=code, error_message=message)
        return broker_pb2.PartitionProducers(topic=tp.topic, partition=tp.partition,
                                             error_code=ErrorCode.NONE, producers=producers)

    # ---- log directories (Kafka's DescribeLogDirs; the answer is broker/log_dir_descriptions.py's) ----

    @gated
    def DescribeLogDirs(self, request: broker_pb2.DescribeLogDirsRequest,
                        context) -> broker_pb2.DescribeLogDirsResponse:
        if self._authorizer is not None and not self._cluster_allows(Operation.DESCRIBE):
            return broker_pb2.DescribeLogDirsResponse(error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                                                      error_message=self._denial(Operation.DESCRIBE, "the cluster"))
        return describe_log_dirs(self._log_manager, request, self.storage_errors.by_log_dir())
