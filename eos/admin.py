"""`eos.Admin`: topics and offsets, after Kafka's Admin client.

Theory of operation
-------------------
Each method is one RPC with the same shape: build the request, send it to the bootstrap
broker (which answers for the cluster: in a single-node cluster it is the controller), and
turn each per-topic or per-partition error code into the eos exception for it
(`eos.errors.error_for`), naming the topic. A request that fails in transport (broker
restarting, deadline passed) is retried with backoff until default.api.timeout.ms; errors
in the answer are raised at once. The client keeps no state beyond its channels, so it is
safe to share between threads.

Groups have the same shape, asked of their coordinator, found with FindCoordinator; a
listing of groups asks every broker (each coordinates the groups of the __consumer_offsets
partitions it leads). A coordinator that is still loading its log (or moving) answers
with a retriable code; those answers are retried, like transport errors, until
default.api.timeout.ms. Group lag follows kafka-consumer-groups.sh: committed offset
against the log end, which for read_committed consumers is the last stable offset
(ListOffsets latest with isolation READ_COMMITTED). Transactions (kafka-transactions.sh's
questions, find-hanging included) are eos/admin_transactions.py, a base class of Admin.

ACLs (create_acls, describe_acls, delete_acls) are Kafka's CreateAcls, DescribeAcls and
DeleteAcls, asked of the bootstrap broker; bindings and filters are `eos.acl.AclBinding`
and `eos.acl.AclFilter`. What the caller itself may do to the cluster is KIP-430's
authorized operations, carried by Metadata (`describe_cluster(include_authorized_operations=True)`).

Storage is per broker: DescribeLogDirs is asked of every broker Metadata names (or those
given), one request each, since on a cluster each broker answers only for the replicas it
holds; the answers are put side by side by broker id.
"""
from __future__ import annotations

import time
from typing import Callable

import grpc

from eos import net, scram
from eos.client_config import (CLIENT_SECURITY_CONFIG, ConfigSpec, as_int, as_int32, as_optional_str, as_str,
                               channel_security, resolve_config)
from eos.admin_arguments import (config_strings, isolation_level_code, quota_entity_text, quota_entity_to_proto,
                                 topic_spec, tps)
from eos.acl import AclBinding, AclFilter, Operation, binding_from_proto, binding_to_proto, filter_to_proto
from eos.admin_offsets import OffsetAdmin
from eos.admin_transactions import TransactionAdmin
from eos.config_resources import (OP_APPEND, OP_DELETE, OP_SET, OP_SUBTRACT, RESOURCE_BROKER, RESOURCE_TOPIC,
                                  SOURCE_NAMES)
from eos.errors import EosError, ErrorCode, Reaction, error_for, raise_if_error, reaction_for
from eos.types import TopicPartition
from eos.v1 import broker_pb2, cluster_pb2, cluster_pb2_grpc, group_pb2, group_pb2_grpc

ADMIN_CONFIG: dict[str, ConfigSpec] = {
    "bootstrap.servers": ConfigSpec(None, as_optional_str),
    "client.id": ConfigSpec("", as_str),
    "request.timeout.ms": ConfigSpec(30000, as_int32(1)),
    "default.api.timeout.ms": ConfigSpec(60000, as_int32(1)),
    "retry.backoff.ms": ConfigSpec(100, as_int(0)),
    "retry.backoff.max.ms": ConfigSpec(1000, as_int(0)),
    **CLIENT_SECURITY_CONFIG,
}

# A call to partition leaders (list_offsets, ...) fetches Metadata first, as Kafka's admin
# client does for each such call, unless this client's metadata of the topics is younger
# than this: a describe_topic followed by list_offsets (the Spark source's snapshot of a
# topic) then asks Metadata once, not twice. A leader that moved meanwhile answers
# NOT_LEADER_OR_FOLLOWER, and the call is asked again after a refresh.
LEADERS_REUSE_MS = 1000
# CreateTopics and DeleteTopics wait at the broker up to their timeout_ms for the change to
# reach the cluster; the call itself is given this much longer, so the broker's answer (a
# REQUEST_TIMED_OUT naming what is still pending) arrives rather than the client's deadline.
TOPIC_WAIT_MARGIN_MS = 5_000
# KIP-430: the value of cluster_authorized_operations when the broker was not asked (or is
# too old to know the field, in which case it answers 0: nothing allowed, the safe reading).
_AUTHORIZED_OPERATIONS_OMITTED = -2**31



def _broker_resource_name(broker_id: int | None) -> str:
    """A broker's config resource name: its id, or "" for the cluster-wide defaults."""
    return "" if broker_id is None else str(broker_id)


def _alterations(set=None, delete=(), append=None, subtract=None) -> list:
    """IncrementalAlterConfigs' operations: SET {name: value}, DELETE names (one name may
    be a str), APPEND / SUBTRACT {name: "a,b"}."""
    alterations = [broker_pb2.AlterableConfig(name=name, config_operation=OP_SET, value=value)
                   for name, value in config_strings(set).items()]
    alterations += [broker_pb2.AlterableConfig(name=name, config_operation=OP_DELETE)
                    for name in ([delete] if isinstance(delete, str) else delete)]
    for op, given in ((OP_APPEND, append), (OP_SUBTRACT, subtract)):
        alterations += [broker_pb2.AlterableConfig(name=name, config_operation=op, value=value)
                        for name, value in config_strings(given).items()]
    return alterations


def _config_entries(result) -> dict[str, dict]:
    """A DescribeConfigs result's entries: {name: {"value", "source", "read_only", "sensitive"}}."""
    return {entry.name: {"value": entry.value, "source": SOURCE_NAMES.get(entry.config_source, "UNKNOWN"),
                         "read_only": entry.read_only, "sensitive": entry.is_sensitive}
            for entry in result.configs}

class Admin(OffsetAdmin, TransactionAdmin):
    """``Admin(bootstrap="127.0.0.1:9092", *, config=None, **kwargs)``"""

    def __init__(self, bootstrap: str = net.DEFAULT_BOOTSTRAP, *, config: dict | None = None,
                 **kwargs):
        settings, _ = resolve_config("admin", ADMIN_CONFIG, config, kwargs)
        if settings["bootstrap.servers"]:
            bootstrap = settings["bootstrap.servers"]
        self.config = settings
        self._request_timeout_ms = settings["request.timeout.ms"]
        self._api_timeout_ms = settings["default.api.timeout.ms"]
        self._backoff = net.Backoff(settings["retry.backoff.ms"], settings["retry.backoff.max.ms"])
        self._metadata = net.ClusterMetadata(
            bootstrap, request_timeout_ms=self._request_timeout_ms,
            retry_backoff_ms=settings["retry.backoff.ms"],
            retry_backoff_max_ms=settings["retry.backoff.max.ms"],
            security=channel_security(settings))
        self._any_broker = self._metadata.any_broker_stub()

    # ---- plumbing ------------------------------------------------------------------------

    def _call(self, what: str, rpc: Callable, request, timeout_ms: int | None = None, *,
              stub: Callable | None = None, answer_code: Callable | None = None):
        """One RPC (to any broker, or to `stub()`), retried on transport errors until
        the timeout; with `answer_code(response)`, also while the answer's code is retriable
        (a coordinator loading its log)."""
        deadline = time.monotonic() + (timeout_ms if timeout_ms is not None else self._api_timeout_ms) / 1000
        attempt = 0
        while True:
            remaining_s = deadline - time.monotonic()
            try:
                response = rpc(stub() if stub is not None else self._any_broker)(
                    request, timeout=max(0.001, min(self._request_timeout_ms / 1000, remaining_s)))
            except grpc.RpcError as exc:
                error = net.error_from_rpc(exc, what, self._metadata.security)
            else:
                code = answer_code(response) if answer_code is not None else ErrorCode.NONE
                if code == ErrorCode.NONE or reaction_for(code) is not Reaction.RETRY:
                    return response
                error = error_for(code, f"{what}: {ErrorCode(code).name}")
            attempt += 1
            delay_s = self._backoff.delay_ms(attempt) / 1000
            if not error.retriable or time.monotonic() + delay_s >= deadline:
                raise error from None
            time.sleep(delay_s)

    @staticmethod
    def _raise_topic_errors(results, what: str) -> None:
        errors = [(r.name, r.error_code, r.error_message) for r in results if r.error_code != ErrorCode.NONE]
        if not errors:
            return
        name, code, message = errors[0]
        text = f"{what} {name!r}: {message or ErrorCode(code).name}"
        if len(errors) > 1:
            text += "; also " + "; ".join(f"{n!r}: {m or ErrorCode(c).name}" for n, c, m in errors[1:])
        raise error_for(code, text)

    # ---- topics --------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: dict | None = None, *, validate_only: bool = False,
                     timeout_ms: int | None = None) -> None:
        """Create one topic; `config` holds Kafka topic configs ({"retention.ms": "1000"})."""
        self.create_topics([{"name": name, "partitions": partitions,
                             "replication_factor": replication_factor, "config": config}],
                           validate_only=validate_only, timeout_ms=timeout_ms)

    def create_topics(self, topics, *, validate_only: bool = False, timeout_ms: int | None = None) -> None:
        """Create several topics in one request: each a name, a dict (name, partitions,
        replication_factor, config, assignments) or a tuple in that order; "assignments" is a
        manual replica assignment {partition: [broker ids]}. Raises the first failure's error,
        naming every topic that failed; the others are created."""
        new_topics = []
        for item in topics:
            name, partitions, replication_factor, config = topic_spec(item)
            assignments = item.get("assignments") if isinstance(item, dict) else None
            if not isinstance(name, str):
                raise TypeError(f"topic name must be a str, got {name!r}")
            for label, number in (("partitions", partitions), ("replication_factor", replication_factor)):
                if isinstance(number, bool) or not isinstance(number, int):
                    raise TypeError(f"{label} of topic {name!r} must be an int, got {number!r}")
                if number == 0 or number < -1:
                    # On the wire 0 reads as "unset" (proto3); here it can only be a mistake.
                    code = ErrorCode.INVALID_PARTITIONS if label == "partitions" else ErrorCode.INVALID_REPLICATION_FACTOR
                    raise error_for(code, f"{label} of topic {name!r} must be at least 1 (or -1 for the "
                                          f"broker default), got {number}")
            new_topic = broker_pb2.NewTopic(
                name=name, num_partitions=partitions, replication_factor=replication_factor,
                configs=config_strings(config))
            for partition, brokers in sorted((assignments or {}).items()):
                new_topic.assignments.add(partition=int(partition), broker_ids=[int(b) for b in brokers])
            new_topics.append(new_topic)
        if not new_topics:
            return
        timeout = timeout_ms if timeout_ms is not None else self._api_timeout_ms
        response = self._call("CreateTopics", lambda s: s.CreateTopics, broker_pb2.CreateTopicsRequest(
            topics=new_topics, timeout_ms=timeout, validate_only=validate_only), timeout + TOPIC_WAIT_MARGIN_MS)
        self._raise_topic_errors(response.topics, "cannot create topic")
        for topic in new_topics:
            self._metadata.mark_stale(topic.name)

    def delete_topic(self, name: str, *, timeout_ms: int | None = None) -> None:
        self.delete_topics([name], timeout_ms=timeout_ms)

    def delete_topics(self, names, *, timeout_ms: int | None = None) -> None:
        names = [names] if isinstance(names, str) else list(names)
        if not names:
            return
        timeout = timeout_ms if timeout_ms is not None else self._api_timeout_ms
        response = self._call("DeleteTopics", lambda s: s.DeleteTopics, broker_pb2.DeleteTopicsRequest(
            names=names, timeout_ms=timeout), timeout + TOPIC_WAIT_MARGIN_MS)
        self._raise_topic_errors(response.topics, "cannot delete topic")

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        """Grow `name` to `total` partitions (partitions can only be added, as in Kafka)."""
        if isinstance(total, bool) or not isinstance(total, int):
            raise TypeError(f"total must be an int, got {total!r}")
        response = self._call("CreatePartitions", lambda s: s.CreatePartitions,
                              broker_pb2.CreatePartitionsRequest(
                                  topics=[broker_pb2.NewPartitions(name=name, count=total)],
                                  validate_only=validate_only))
        self._raise_topic_errors(response.topics, "cannot create partitions for topic")
        self._metadata.mark_stale(name)

    def describe_configs(self, topic: str, names=None) -> dict[str, dict]:
        """Kafka's describeConfigs of one topic: {config name: {"value", "source"
        (DYNAMIC_TOPIC_CONFIG: the topic's override, STATIC_BROKER_CONFIG: the broker's log.*
        setting, DEFAULT_CONFIG), "read_only", "sensitive"}} for every config, or only
        `names` (names the broker does not know are left out, as Kafka leaves them). Raises
        UnknownTopicOrPartitionError, TopicAuthorizationFailedError (DESCRIBE_CONFIGS)."""
        response = self._call("DescribeConfigs", lambda s: s.DescribeConfigs, broker_pb2.DescribeConfigsRequest(
            resources=[broker_pb2.ConfigResource(resource_type=RESOURCE_TOPIC, resource_name=topic,
                                                 config_names=list(names or ()))]))
        [result] = response.results
        raise_if_error(result, f"cannot describe the configs of topic {topic!r}")
        return _config_entries(result)

    def describe_broker_configs(self, broker_id: int | None, names=None) -> dict[str, dict]:
        """Kafka's describeConfigs of a broker (asked of that broker): its settings as
        `describe_configs` gives a topic's, source DYNAMIC_BROKER_CONFIG or
        DYNAMIC_DEFAULT_BROKER_CONFIG (altered while running: `alter_broker_configs`),
        STATIC_BROKER_CONFIG (set when it was started) or DEFAULT_CONFIG ("value" "" for a
        setting without one); only the dynamic ones are not read-only. `broker_id` None: the
        cluster-wide dynamic defaults (Kafka's --entity-default), only those set. Needs
        DESCRIBE_CONFIGS on the cluster."""
        response = self._call("DescribeConfigs", lambda s: s.DescribeConfigs, broker_pb2.DescribeConfigsRequest(
            resources=[broker_pb2.ConfigResource(resource_type=RESOURCE_BROKER,
                                                 resource_name=_broker_resource_name(broker_id),
                                                 config_names=list(names or ()))]),
            **self._broker_route(broker_id))
        [result] = response.results
        raise_if_error(result, "cannot describe the cluster-wide broker configs" if broker_id is None
                       else f"cannot describe the configs of broker {broker_id}")
        return _config_entries(result)

    def _broker_route(self, broker_id: int | None) -> dict:
        """`_call`'s routing of a broker resource: that broker's own, or (None: the
        cluster-wide defaults) any broker."""
        return {} if broker_id is None else {"stub": lambda: self._stub_of_broker(broker_id)}

    def alter_broker_configs(self, broker_id: int | None, set=None, delete=(), *,
                             validate_only: bool = False) -> None:
        """Kafka's incrementalAlterConfigs of a broker (`broker_id`, asked of that broker) or
        of every broker (None: the cluster-wide default, Kafka's --entity-default): `set`
        ({name: value}) and `delete` (names, back to the next in Kafka's precedence: the
        cluster-wide value, the static setting, the default). The dynamic ones are the topic
        defaults (log.retention.ms, log.segment.bytes, message.max.bytes, ...): every topic
        without its own override follows the change at once. All or nothing: another name
        raises InvalidRequestError, a bad value InvalidConfigError. Needs ALTER_CONFIGS on
        the cluster."""
        response = self._call("IncrementalAlterConfigs", lambda s: s.IncrementalAlterConfigs,
                              broker_pb2.IncrementalAlterConfigsRequest(
                                  resources=[broker_pb2.AlterConfigsResource(
                                      resource_type=RESOURCE_BROKER, resource_name=_broker_resource_name(broker_id),
                                      configs=_alterations(set, delete))],
                                  validate_only=validate_only),
                              **self._broker_route(broker_id))
        [result] = response.results
        raise_if_error(result, "cannot alter the cluster-wide broker configs" if broker_id is None
                       else f"cannot alter the configs of broker {broker_id}")

    def incremental_alter_configs(self, topic: str, set=None, delete=(), append=None, subtract=None, *,
                                  validate_only: bool = False) -> None:
        """Kafka's incrementalAlterConfigs of one topic: `set` ({name: value}) overrides,
        `delete` (names) goes back to the broker's default, `append` / `subtract` ({name:
        "a,b"}) add items to or remove them from a list config (cleanup.policy). All or
        nothing: an unknown name, a bad value or a name given twice raises (INVALID_CONFIG,
        INVALID_REQUEST) and changes nothing. The change applies at once on every broker."""
        alterations = _alterations(set, delete, append, subtract)
        response = self._call("IncrementalAlterConfigs", lambda s: s.IncrementalAlterConfigs,
                              broker_pb2.IncrementalAlterConfigsRequest(
                                  resources=[broker_pb2.AlterConfigsResource(
                                      resource_type=RESOURCE_TOPIC, resource_name=topic, configs=alterations)],
                                  validate_only=validate_only))
        [result] = response.results
        raise_if_error(result, f"cannot alter the configs of topic {topic!r}")
        self._metadata.mark_stale(topic)

    def list_topics(self, include_internal: bool = False) -> list[str]:
        """Topic names, sorted; internal ones (__consumer_offsets, ...) only when asked."""
        response = self._call("Metadata", lambda s: s.Metadata,
                              broker_pb2.MetadataRequest(include_internal=include_internal))
        return sorted(t.name for t in response.topics
                      if t.error_code == ErrorCode.NONE and (include_internal or not t.is_internal))

    def describe_topic(self, name: str) -> dict:
        """{"name", "internal", "partitions": [{"partition", "leader", "leader_epoch",
        "replicas", "isr", "offline_replicas"}], "configs": {per-topic overrides}}; leader -1
        when the partition has none (offline)."""
        described = self.describe_topics([name])
        if name not in described:
            raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} is not in the answer")
        return described[name]

    def describe_topics(self, names=None, *, include_internal: bool = False) -> dict[str, dict]:
        """{name: describe_topic's dict} from one Metadata request: of `names` (each raises
        its error: unknown, not authorized), or of every topic the caller may describe
        (internal ones only when asked), sorted by name."""
        names = [names] if isinstance(names, str) else list(names or [])
        response = self._call("Metadata", lambda s: s.Metadata, broker_pb2.MetadataRequest(
            topics=names, include_internal=include_internal or bool(names)))
        if names:
            self._metadata.apply(response, names)     # the leaders for a call that follows
        described = {}
        for topic in sorted(response.topics, key=lambda t: t.name):
            if names:
                raise_if_error(topic, f"cannot describe topic {topic.name!r}")
            elif topic.error_code != ErrorCode.NONE or (topic.is_internal and not include_internal):
                continue
            described[topic.name] = {
                "name": topic.name,
                "internal": topic.is_internal,
                "partitions": [
                    {"partition": p.partition, "leader": p.leader_id, "leader_epoch": p.leader_epoch,
                     "replicas": list(p.replica_ids), "isr": list(p.isr_ids),
                     "offline_replicas": list(p.offline_replica_ids)}
                    for p in sorted(topic.partitions, key=lambda p: p.partition)],
                "configs": dict(topic.configs),
            }
        return described

    def describe_cluster(self, *, include_authorized_operations: bool = False) -> dict:
        """{"cluster_id", "controller_id", "brokers": {node_id: "host:port"}, "racks": {node_id: rack}};
        with `include_authorized_operations` also "authorized_operations": the frozenset of
        eos.acl.Operation this client may perform on the cluster (KIP-430; every cluster
        operation when the broker has no authorizer), None if the broker did not say."""
        response = self._call("Metadata", lambda s: s.Metadata, broker_pb2.MetadataRequest(
            topics=[], include_cluster_authorized_operations=include_authorized_operations))
        described = {"cluster_id": response.cluster_id, "controller_id": response.controller_id,
                     "brokers": {b.node_id: f"{b.host}:{b.port}" for b in response.brokers},
                     "racks": {b.node_id: b.rack for b in response.brokers if b.rack}}
        if include_authorized_operations:
            bits = response.cluster_authorized_operations
            described["authorized_operations"] = None if bits == _AUTHORIZED_OPERATIONS_OMITTED else frozenset(
                operation for operation in Operation if operation > Operation.ALL and bits & (1 << operation))
        return described

    def describe_log_dirs(self, brokers=None) -> dict[int, dict[str, dict]]:
        """Kafka's describeLogDirs: {broker id: {log dir path: {"error" (None, or the EosError:
        KAFKA_STORAGE_ERROR for an offline dir, with its cause), "total_bytes", "usable_bytes"
        (None when unknown), "storage_errors" (requests answered KAFKA_STORAGE_ERROR since the
        broker started: eos's own), "last_storage_error" (its message, or None),
        "replicas": {TopicPartition: {"size_bytes", "offset_lag", "is_future"}}}}} of
        `brokers` (ids; None: every broker). One request per broker;
        raises the first broker's failure (unreachable, CLUSTER_AUTHORIZATION_FAILED without
        DESCRIBE on the cluster)."""
        if brokers is None:
            self._metadata.fetch([])
            brokers = sorted(self._metadata.brokers())
        elif not self._metadata.brokers():
            self._metadata.fetch([])
        described = {}
        for broker_id in brokers:
            response = self._call("DescribeLogDirs", lambda s: s.DescribeLogDirs, broker_pb2.DescribeLogDirsRequest(),
                                  stub=lambda broker_id=broker_id: self._stub_of_broker(broker_id))
            raise_if_error(response, f"cannot describe the log dirs of broker {broker_id}")
            described[broker_id] = {d.log_dir: {
                "error": None if d.error_code == ErrorCode.NONE else error_for(
                    d.error_code, f"log dir {d.log_dir} of broker {broker_id}: "
                                  f"{d.error_message or ErrorCode(d.error_code).name}"),
                "total_bytes": d.total_bytes if d.total_bytes >= 0 else None,
                "usable_bytes": d.usable_bytes if d.usable_bytes >= 0 else None,
                "storage_errors": d.storage_error_count, "last_storage_error": d.last_storage_error or None,
                "replicas": {TopicPartition(t.name, p.partition): {
                    "size_bytes": p.size_bytes, "offset_lag": p.offset_lag, "is_future": p.is_future}
                    for t in d.topics for p in t.partitions}} for d in response.results}
        return described

    def _stub_of_broker(self, broker_id: int):
        stub = self._metadata.broker_stub(broker_id)
        if stub is None:    # not known yet (a broker that joined since): ask Metadata once
            self._metadata.fetch([])
            stub = self._metadata.broker_stub(broker_id)
        if stub is None:
            raise error_for(ErrorCode.BROKER_NOT_AVAILABLE, f"broker {broker_id} is not in the cluster's metadata")
        return stub

    # ---- the cluster: elections and reassignments (answered by the controller) -------------

    def _controller_stub(self) -> cluster_pb2_grpc.ClusterStub:
        response = self._metadata.fetch([])
        address = self._metadata.address_of(response.controller_id)
        if address is None:
            raise error_for(ErrorCode.NOT_CONTROLLER, "the cluster has no active controller right now")
        return cluster_pb2_grpc.ClusterStub(self._metadata.channel(address))

    def _controller_call(self, what: str, rpc_name: str, request):
        """An RPC to the controller, found anew on each try (NOT_CONTROLLER is retried)."""
        return self._call(what, lambda stub: getattr(stub, rpc_name), request, stub=self._controller_stub,
                          answer_code=lambda r: r.error_code)

    @staticmethod
    def _partition_results(response, what: str) -> dict[TopicPartition, EosError | None]:
        raise_if_error(response, what)
        return {TopicPartition(r.topic, r.partition): (None if r.error_code == ErrorCode.NONE else error_for(
                    r.error_code, f"{what} {r.topic}-{r.partition}: {r.error_message or ErrorCode(r.error_code).name}"))
                for r in response.partitions}

    def elect_leaders(self, election_type: str = "preferred", partitions=None) -> dict[TopicPartition, EosError | None]:
        """kafka-leader-election: "preferred" or "unclean" for `partitions` (None: all).
        Returns per partition None (elected) or the error (ELECTION_NOT_NEEDED when the
        preferred replica already leads, PREFERRED_LEADER_NOT_AVAILABLE, ...)."""
        if election_type not in ("preferred", "unclean"):
            raise ValueError(f"election_type must be 'preferred' or 'unclean', got {election_type!r}")
        request = cluster_pb2.ElectLeadersRequest(
            election_type=cluster_pb2.UNCLEAN if election_type == "unclean" else cluster_pb2.PREFERRED,
            all_partitions=partitions is None, partitions=[] if partitions is None else tps(partitions))
        return self._partition_results(self._controller_call("ElectLeaders", "ElectLeaders", request),
                                       "leader election for")

    def alter_partition_reassignments(self, plan: dict, *,
                                      throttle_bytes_per_s: int = 0) -> dict[TopicPartition, EosError | None]:
        """{(topic, partition): [broker ids] | None} -- None cancels an ongoing reassignment.
        `throttle_bytes_per_s` bounds the replication to the new replicas while they catch up."""
        request = cluster_pb2.AlterPartitionReassignmentsRequest(throttle_bytes_per_s=max(0, throttle_bytes_per_s))
        for (topic, partition), replicas in plan.items():
            request.reassignments.add(topic=topic, partition=partition, replicas=list(replicas or ()),
                                      cancel=replicas is None)
        return self._partition_results(
            self._controller_call("AlterPartitionReassignments", "AlterPartitionReassignments", request),
            "reassignment of")

    def list_partition_reassignments(self, partitions=None) -> dict[TopicPartition, dict]:
        """Ongoing reassignments: {tp: {"replicas", "adding", "removing"}}."""
        request = cluster_pb2.ListPartitionReassignmentsRequest(partitions=tps(partitions or ()))
        response = self._controller_call("ListPartitionReassignments", "ListPartitionReassignments", request)
        if response.error_code != ErrorCode.NONE:
            raise error_for(response.error_code, response.error_message)
        return {TopicPartition(r.topic, r.partition): {"replicas": list(r.replicas), "adding": list(r.adding_replicas),
                                                       "removing": list(r.removing_replicas)}
                for r in response.reassignments}

    # ---- asking partition leaders (list_offsets, end_offsets, delete_records: eos/admin_offsets.py) ----

    def _ask_once(self, what: str, method: Callable, request, timeout_s: float):
        """One attempt of a call to a partition's leader, a transport failure raised at once:
        _ask_leaders asks again after a metadata refresh, of whoever leads by then. (Retried
        at the same broker until request.timeout.ms instead, a call to a leader just killed
        spent that whole time on a refused port while the leadership had moved on.)"""
        try:
            return method(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise net.error_from_rpc(exc, what, self._metadata.security) from None

    def _ask_leaders(self, items: list, ask: Callable, unanswered: Callable) -> list:
        """Each of `items` (with .topic and .partition) asked of its partition's leader, one
        request per leader: `ask(stub, items of that leader, timeout_s)` returns their answers (with
        .topic, .partition, .error_code). An item whose leader is unknown or unreachable, or
        whose answer is retriable (the leader moved), is asked again after a metadata
        refresh until default.api.timeout.ms; `unanswered(item, code, message)` makes the
        answer of one that never got any (UNKNOWN_TOPIC_OR_PARTITION at once for a
        partition the metadata does not have: waiting cannot help a typo). The answers, in
        the order of `items`. Metadata is fetched first unless it is younger than
        LEADERS_REUSE_MS and names every item's partition."""
        topics = sorted({p.topic for p in items})
        answers: dict[tuple[str, int], object] = {}
        pending = list(items)
        deadline = time.monotonic() + self._api_timeout_ms / 1000
        attempt = 0
        # (`or 0`: another thread's refresh may have dropped the topic since)
        cached_is_fresh = not self._metadata.needs_refresh(topics, LEADERS_REUSE_MS) and all(
            p.partition < (self._metadata.partition_count(p.topic) or 0) for p in items)
        while True:
            try:
                if not cached_is_fresh:
                    self._metadata.fetch(topics)
                cached_is_fresh = False      # a retry asks again
            except EosError as exc:
                # a single bootstrap broker restarting, or busy: ridden out until the deadline
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
                attempt += 1
                time.sleep(self._backoff.delay_ms(attempt) / 1000)
                continue
            by_leader: dict[int, list] = {}
            for p in pending:
                info = self._metadata.topic(p.topic)
                if info is None or not 0 <= p.partition < info.partition_count:
                    answers[(p.topic, p.partition)] = unanswered(
                        p, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic-partition {p.topic}-{p.partition} does not exist")
                    continue
                by_leader.setdefault(self._metadata.leader(p.topic, p.partition), []).append(p)
            retry = []
            for leader, group in by_leader.items():
                stub = None if leader == net.NO_LEADER else self._metadata.broker_stub(leader)
                if stub is None:
                    retry.extend(group)
                    continue
                try:
                    # one attempt per round: a dead leader is not retried, the metadata is
                    answered = ask(stub, group, max(0.001, min(self._request_timeout_ms / 1000,
                                                               deadline - time.monotonic())))
                except EosError as exc:
                    if not exc.retriable or time.monotonic() >= deadline:
                        raise
                    for p in group:
                        self._metadata.mark_stale(p.topic)
                    retry.extend(group)
                    continue
                asked = {(p.topic, p.partition): p for p in group}
                for answer in answered:
                    if (answer.error_code != ErrorCode.NONE and reaction_for(answer.error_code) is Reaction.RETRY
                            and time.monotonic() < deadline):
                        retry.append(asked[(answer.topic, answer.partition)])
                    else:
                        answers[(answer.topic, answer.partition)] = answer
            if not retry or time.monotonic() >= deadline:
                for p in retry:
                    answers[(p.topic, p.partition)] = unanswered(
                        p, ErrorCode.LEADER_NOT_AVAILABLE, "no leader answered before default.api.timeout.ms")
                return [answers[(p.topic, p.partition)] for p in items]
            pending = retry
            attempt += 1
            time.sleep(self._backoff.delay_ms(attempt) / 1000)

    # ---- consumer groups -----------------------------------------------------------------

    def _group_coordinator(self, group_id: str):
        """A callable giving the stub of the group's coordinator: found with FindCoordinator,
        found again when it answers NOT_COORDINATOR (on a cluster it follows the leadership
        of the group's __consumer_offsets partition)."""
        if not isinstance(group_id, str) or not group_id:
            raise ValueError(f"a group id is a non-empty string, got {group_id!r}")
        stub = self._metadata.group_coordinator_stub(group_id)
        return lambda: stub

    def _address_of(self, host: str, port: int) -> str:
        # As net.ClusterMetadata: one bootstrap address and one broker means the bootstrap
        # channel, whatever the broker advertises.
        if len(self._metadata.bootstrap_addresses) == 1 and len(self._metadata.brokers()) <= 1:
            return self._metadata.bootstrap_addresses[0]
        return f"{host}:{port}"

    def _every_broker(self, *, refresh: bool = True) -> list[tuple[int, str]]:
        """(node id, address) of every broker, by node id, from a fresh Metadata answer (or,
        `refresh` false, the last one when there is one). (-1, any broker's address) when
        Metadata cannot be had for now (the call to it is then retried as any other)."""
        if refresh or not self._metadata.brokers():
            try:
                self._metadata.fetch()
            except EosError as exc:
                if not exc.retriable:
                    raise
        brokers = self._metadata.brokers()
        if not brokers:
            return [(-1, self._metadata.any_broker_address)]
        return [(node_id, self._address_of(*address.rsplit(":", 1))) for node_id, address in sorted(brokers.items())]

    def _list_at_every_broker(self, what: str, stub_class, request, unknown_state_message: str):
        """(node id, answer) of the listing RPC `what` (ListGroups, ListTransactions) at every
        broker: each knows only its own share, the groups or transactional ids of the
        internal partitions it leads. A broker that cannot be asked fails the call, and so
        does a state filter the brokers do not know (ValueError(`unknown_state_message`))."""
        for node_id, address in self._every_broker():
            response = self._call(what, lambda s: getattr(s, what), request,
                                  stub=lambda a=address: stub_class(self._metadata.channel(a)),
                                  answer_code=lambda r: r.error_code)
            if response.error_code == ErrorCode.INVALID_REQUEST:
                raise ValueError(unknown_state_message)
            if response.error_code != ErrorCode.NONE:
                raise error_for(response.error_code, f"{what} at {address}: {ErrorCode(response.error_code).name}")
            yield node_id, response

    def list_groups(self, states=None) -> list[dict]:
        """Every group: [{"group_id", "protocol_type", "state"}], sorted by id; `states`
        (e.g. ["Stable", "Empty"]) keeps only groups in those states."""
        states = [states] if isinstance(states, str) else list(states or [])
        listed = {}
        for _, response in self._list_at_every_broker(
                "ListGroups", group_pb2_grpc.GroupCoordinatorStub, group_pb2.ListGroupsRequest(states_filter=states),
                f"unknown group state in {states}: known are Empty, PreparingRebalance, CompletingRebalance, "
                f"Stable, Dead"):
            for g in response.groups:
                listed[g.group_id] = {"group_id": g.group_id, "protocol_type": g.protocol_type, "state": g.state}
        return [listed[g] for g in sorted(listed)]

    def describe_group(self, group_id: str) -> dict:
        """{"group_id", "state", "protocol_type", "protocol", "generation", "members": [{"member_id",
        "group_instance_id", "client_id", "host", "assignment": [TopicPartition]}]}. A group
        that does not exist raises GROUP_ID_NOT_FOUND."""
        from consumer.assignors import CONSUMER_PROTOCOL_TYPE, decode_assignment

        stub = self._group_coordinator(group_id)
        response = self._call("DescribeGroups", lambda s: s.DescribeGroups,
                              group_pb2.DescribeGroupsRequest(group_ids=[group_id]), stub=stub,
                              answer_code=lambda r: r.groups[0].error_code if r.groups else 0)
        found = [g for g in response.groups if g.group_id == group_id]
        if not found:
            raise EosError(f"DescribeGroups did not answer for group {group_id!r}", ErrorCode.UNKNOWN_SERVER_ERROR)
        g = found[0]
        if g.error_code == ErrorCode.GROUP_ID_NOT_FOUND:
            raise error_for(g.error_code, f"consumer group {group_id!r} does not exist")
        raise_if_error(g, f"cannot describe group {group_id!r}")
        members = []
        for m in g.members:
            assignment: list[TopicPartition] = []
            if g.protocol_type == CONSUMER_PROTOCOL_TYPE and m.member_assignment:
                try:
                    assignment = sorted(decode_assignment(m.member_assignment).partitions)
                except ValueError:
                    assignment = []   # not a ConsumerProtocol assignment: shown as none
            members.append({"member_id": m.member_id, "group_instance_id": m.group_instance_id or None,
                            "client_id": m.client_id, "host": m.client_host, "assignment": assignment})
        return {"group_id": g.group_id, "state": g.state, "protocol_type": g.protocol_type, "protocol": g.protocol,
                "generation": g.generation_id, "members": sorted(members, key=lambda m: m["member_id"])}

    def list_group_offsets(self, group_id: str, partitions=None, *,
                           require_stable: bool = False) -> dict[TopicPartition, int]:
        """The group's committed offsets: {tp: offset}, only partitions with a commit (all of
        the group's, or those of `partitions`). With `require_stable`, a partition whose
        transactional commit is still pending is waited for (UNSTABLE_OFFSET_COMMIT retried)."""
        stub = self._group_coordinator(group_id)
        wanted = tps(partitions or [])

        def unstable_or_group_code(r):
            if r.error_code != ErrorCode.NONE:
                return r.error_code
            return next((p.error_code for p in r.partitions if p.error_code != ErrorCode.NONE), 0)

        response = self._call("OffsetFetch", lambda s: s.OffsetFetch,
                              group_pb2.OffsetFetchRequest(group_id=group_id, partitions=wanted,
                                                           require_stable=require_stable),
                              stub=stub, answer_code=unstable_or_group_code)
        raise_if_error(response, f"cannot fetch offsets of group {group_id!r}")
        result = {}
        for p in response.partitions:
            if p.error_code != ErrorCode.NONE:
                raise error_for(p.error_code, f"offset of group {group_id!r} for {p.topic}-{p.partition}: "
                                              f"{ErrorCode(p.error_code).name}")
            if p.offset >= 0:
                result[TopicPartition(p.topic, p.partition)] = p.offset
        return dict(sorted(result.items()))

    def alter_group_offsets(self, group_id: str, offsets) -> None:
        """Kafka's alterConsumerGroupOffsets: commit `offsets` ({tp: offset of the next record
        to read}) for a group that has no active members -- what `eos groups reset-offsets
        --execute` does. A group with members refuses it (UNKNOWN_MEMBER_ID, as Kafka's
        coordinator answers a commit without a member): they would go on from their own
        positions and overwrite it."""
        entries = []
        for tp, offset in dict(offsets).items():
            topic, partition = tp
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise ValueError(f"the offset for {topic}-{partition} must be a non-negative int, got {offset!r}")
            entries.append(group_pb2.OffsetToCommit(topic=topic, partition=partition, offset=offset, leader_epoch=-1))
        if not entries:
            return
        response = self._call("OffsetCommit", lambda s: s.OffsetCommit,
                              group_pb2.OffsetCommitRequest(group_id=group_id, generation_id=-1, offsets=entries),
                              stub=self._group_coordinator(group_id),
                              answer_code=lambda r: next((p.error_code for p in r.partitions if p.error_code), 0))
        failed = next((p for p in response.partitions if p.error_code != ErrorCode.NONE), None)
        if failed is None:
            return
        if failed.error_code == ErrorCode.UNKNOWN_MEMBER_ID:
            raise error_for(failed.error_code, f"consumer group {group_id!r} has active members: its offsets can be "
                                               f"altered only while it has none (stop its consumers first)")
        raise error_for(failed.error_code, f"cannot alter the offset of group {group_id!r} for "
                                           f"{failed.topic}-{failed.partition}: {failed.error_message or ErrorCode(failed.error_code).name}")

    def delete_groups(self, group_ids) -> dict[str, EosError | None]:
        """Kafka's deleteConsumerGroups: {group: None when deleted, else the error that kept
        it}. Only a group without members is deleted (NON_EMPTY_GROUP otherwise), and its
        committed offsets go with it; a group that does not exist answers GROUP_ID_NOT_FOUND."""
        results: dict[str, EosError | None] = {}
        for group_id in dict.fromkeys(group_ids):
            response = self._call("DeleteGroups", lambda s: s.DeleteGroups,
                                  group_pb2.DeleteGroupsRequest(group_ids=[group_id]),
                                  stub=self._group_coordinator(group_id),
                                  answer_code=lambda r: r.results[0].error_code if r.results else 0)
            answer = next((r for r in response.results if r.group_id == group_id), None)
            if answer is None:
                raise EosError(f"DeleteGroups did not answer for group {group_id!r}", ErrorCode.UNKNOWN_SERVER_ERROR)
            results[group_id] = None if answer.error_code == ErrorCode.NONE else error_for(
                answer.error_code, f"consumer group {group_id!r} could not be deleted: "
                                   f"{answer.error_message or ErrorCode(answer.error_code).name}")
        return results

    def delete_group(self, group_id: str) -> None:
        """`delete_groups` of one group; raises its error."""
        error = self.delete_groups([group_id])[group_id]
        if error is not None:
            raise error

    def group_lag(self, group_id: str, *, isolation_level: str = "read_committed",
                  description: dict | None = None) -> list[dict]:
        """kafka-consumer-groups.sh --describe as data: one row per partition that a member
        owns or the group has committed, sorted by (topic, partition): {"topic", "partition",
        "current_offset" (None: no commit), "log_end_offset" (the LSO under read_committed;
        None if unknown), "lag" (None without both), "member_id", "group_instance_id", "host",
        "client_id" (None for a partition no member owns)}. `description`: the group's
        `describe_group` answer when the caller has it already (the rows then show the members
        of that moment); None: asked here."""
        isolation_level_code(isolation_level)
        exists = description is not None
        if description is None:
            try:
                description = self.describe_group(group_id)
                exists = True
            except EosError as exc:
                if exc.code != ErrorCode.GROUP_ID_NOT_FOUND:
                    raise
                description = {"members": []}
        committed = self.list_group_offsets(group_id)
        if not exists and not committed:
            raise error_for(ErrorCode.GROUP_ID_NOT_FOUND, f"consumer group {group_id!r} does not exist")
        owners = {tp: m for m in description["members"] for tp in m["assignment"]}
        partitions = set(committed) | set(owners)
        ends = self.end_offsets(partitions, isolation_level)
        rows = []
        for tp in sorted(partitions):
            current, end, owner = committed.get(tp), ends.get(tp), owners.get(tp)
            rows.append({"topic": tp.topic, "partition": tp.partition, "current_offset": current,
                         "log_end_offset": end,
                         "lag": max(0, end - current) if current is not None and end is not None else None,
                         "member_id": owner["member_id"] if owner else None,
                         "group_instance_id": owner["group_instance_id"] if owner else None,
                         "host": owner["host"] if owner else None,
                         "client_id": owner["client_id"] if owner else None})
        return rows

    # ---- lifecycle -----------------------------------------------------------------------

    # ---- ACLs ----------------------------------------------------------------------------

    def create_acls(self, acls) -> None:
        """Add `acls` (AclBindings); raises for the first one the broker refused (the others
        given are in force), e.g. CLUSTER_AUTHORIZATION_FAILED without ALTER on the cluster."""
        acls = list(acls)
        if not acls:
            return
        response = self._call("CreateAcls", lambda s: s.CreateAcls,
                              broker_pb2.CreateAclsRequest(creations=[binding_to_proto(b) for b in acls]))
        for binding, result in zip(acls, response.results):
            raise_if_error(result, f"cannot create ACL {binding.describe()}")

    def describe_acls(self, acl_filter: AclFilter = AclFilter()) -> list[AclBinding]:
        """The ACLs `acl_filter` matches (by default: every ACL)."""
        response = self._call("DescribeAcls", lambda s: s.DescribeAcls,
                              broker_pb2.DescribeAclsRequest(filter=filter_to_proto(acl_filter)))
        raise_if_error(response, "cannot describe ACLs")
        return [binding_from_proto(b) for b in response.acls]

    def delete_acls(self, filters) -> list[AclBinding]:
        """Remove every ACL one of `filters` matches; the ACLs removed."""
        filters = list(filters)
        if not filters:
            return []
        response = self._call("DeleteAcls", lambda s: s.DeleteAcls,
                              broker_pb2.DeleteAclsRequest(filters=[filter_to_proto(f) for f in filters]))
        removed: list[AclBinding] = []
        for result in response.results:
            raise_if_error(result, "cannot delete ACLs")
            removed.extend(binding_from_proto(b) for b in result.matching_acls)
        return removed

    # ---- SCRAM users (Kafka's AlterUserScramCredentials / DescribeUserScramCredentials) ----------

    def _security_stub(self):
        from eos.v1 import security_pb2_grpc
        return self._metadata.any_broker_stub(security_pb2_grpc.SecurityStub)

    def upsert_scram_credential(self, user: str, password: str, *, mechanism: str = "SCRAM-SHA-512",
                                iterations: int = scram.DEFAULT_ITERATIONS) -> None:
        """Set `user`'s credential for `mechanism`. The password is salted and hashed here;
        the broker receives the salt and the salted password, never the password."""
        import secrets
        from eos.v1 import security_pb2
        scram.hash_name(mechanism)
        scram.check_iterations(iterations)
        salt = secrets.token_bytes(32)
        self._alter_scram(security_pb2.AlterUserScramCredentialsRequest(upsertions=[
            security_pb2.ScramCredentialUpsertion(
                name=user, mechanism=mechanism, iterations=iterations, salt=salt,
                salted_password=scram.salted_password(mechanism, password, salt, iterations))]))

    def delete_scram_credential(self, user: str, *, mechanism: str = "SCRAM-SHA-512") -> None:
        from eos.v1 import security_pb2
        self._alter_scram(security_pb2.AlterUserScramCredentialsRequest(deletions=[
            security_pb2.ScramCredentialDeletion(name=user, mechanism=mechanism)]))

    def _alter_scram(self, request) -> None:
        response = self._call("AlterUserScramCredentials", lambda s: s.AlterUserScramCredentials, request,
                              stub=self._security_stub)
        for result in response.results:
            raise_if_error(result, f"cannot alter the SCRAM credentials of {result.user!r}")

    def describe_user_scram_credentials(self, users=None) -> dict[str, dict[str, int]]:
        """{user: {mechanism: iterations}} for `users` (None: every user). A user named
        without a credential raises RESOURCE_NOT_FOUND."""
        from eos.v1 import security_pb2
        response = self._call("DescribeUserScramCredentials", lambda s: s.DescribeUserScramCredentials,
                              security_pb2.DescribeUserScramCredentialsRequest(users=list(users or [])),
                              stub=self._security_stub)
        raise_if_error(response, "cannot describe SCRAM credentials")
        found = {}
        for result in response.results:
            raise_if_error(result, f"cannot describe the SCRAM credentials of {result.user!r}")
            found[result.user] = {info.mechanism: info.iterations for info in result.credential_infos}
        return found

    # ---- client quotas (Kafka's AlterClientQuotas / DescribeClientQuotas) -------------------------

    def alter_client_quotas(self, alterations, *, validate_only: bool = False) -> None:
        """`alterations`: [(entity, {key: value, or None to remove it})], where an entity is
        {"user": name or None, "client-id": name or None} and None names the default
        (`<default>`). Kafka's keys: producer_byte_rate, consumer_byte_rate (bytes/s), request_percentage
        (the share of one request thread, in percent). All
        are applied, or none (the first refusal raises)."""
        from eos.v1 import security_pb2
        entries = [security_pb2.QuotaAlteration(
            entity=quota_entity_to_proto(entity),
            ops=[security_pb2.QuotaOp(key=key, remove=True) if value is None
                 else security_pb2.QuotaOp(key=key, value=float(value)) for key, value in changes.items()])
            for entity, changes in alterations]
        response = self._call("AlterClientQuotas", lambda s: s.AlterClientQuotas,
                              security_pb2.AlterClientQuotasRequest(entries=entries, validate_only=validate_only),
                              stub=self._security_stub)
        # the refused entry first: the others only say they were not attempted because of it
        for result in sorted(response.results, key=lambda r: r.error_code == ErrorCode.OPERATION_NOT_ATTEMPTED):
            raise_if_error(result, f"cannot alter the client quotas of {quota_entity_text(result.entity)}")

    def describe_client_quotas(self) -> list[tuple[dict, dict[str, float]]]:
        """Every entity with quotas: [({"user": ..., "client-id": ...}, {key: value})], the
        default as "<default>"; an entity part it does not name is absent."""
        from eos.v1 import security_pb2
        response = self._call("DescribeClientQuotas", lambda s: s.DescribeClientQuotas,
                              security_pb2.DescribeClientQuotasRequest(), stub=self._security_stub)
        raise_if_error(response, "cannot describe client quotas")
        return [({c.entity_type: "<default>" if c.is_default else c.name for c in entry.entity}, dict(entry.values))
                for entry in response.entries]

    def close(self) -> None:
        self._metadata.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
