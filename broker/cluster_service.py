"""The Cluster gRPC service: what the controller tells a broker, and what only the controller does.

Theory of operation
-------------------
A thin shell with one handler per RPC, each of the same shape (read the request, call the
owner of the state, build the response):

- LeaderAndIsr, StopReplica -> the `ReplicaManager` (roles, logs, fetchers);
- UpdateMetadata -> the `MetadataCache` (and the topic registry learns new topics' configs);
- OffsetsForLeaderEpoch -> the partition's log (its leader epoch cache), leaders only;
- ControlledShutdown, ElectLeaders, Alter/ListPartitionReassignments -> the controller, when
  this broker is it; any other broker answers NOT_CONTROLLER and the caller asks the one
  Metadata names.

Every controller request is checked against the highest controller epoch this broker has
seen before anything changes (STALE_CONTROLLER_EPOCH otherwise), so a controller that was
paused past its ZooKeeper session and wakes up cannot undo its successor's decisions.

With an authorizer, each RPC first needs what Kafka's needs (`@needs`): the brokers' own
requests (LeaderAndIsr, UpdateMetadata, StopReplica, ControlledShutdown,
OffsetsForLeaderEpoch) CLUSTER_ACTION on the cluster, an operator's ElectLeaders and
AlterPartitionReassignments ALTER, ListPartitionReassignments DESCRIBE; a refused call
changes nothing and answers CLUSTER_AUTHORIZATION_FAILED.
"""
from __future__ import annotations

import functools
import logging
from typing import Callable

from broker.acl import Operation, ResourceType
from broker.metadata.cache import BrokerEndpoint, PartitionInfo
from broker.metadata.types import ListenerEndpoint
from broker.replica.manager import PartitionAssignment
from eos.errors import EosError, ErrorCode, NotControllerError
from eos.v1 import cluster_pb2, cluster_pb2_grpc

log = logging.getLogger("eos.broker.cluster")


def assignment_from_proto(p: cluster_pb2.PartitionLeaderState) -> PartitionAssignment:
    return PartitionAssignment(
        topic=p.topic, partition=p.partition, controller_epoch=p.controller_epoch, leader=p.leader,
        leader_epoch=p.leader_epoch, isr=tuple(p.isr), zk_version=p.zk_version, replicas=tuple(p.replicas),
        adding=tuple(p.adding_replicas), removing=tuple(p.removing_replicas), is_new=p.is_new,
        topic_configs=dict(p.topic_configs), throttle_bytes_per_s=p.reassignment_throttle_bytes_per_s,
        unclean_election=p.unclean_election)


def partition_info_from_proto(p: cluster_pb2.PartitionLeaderState) -> PartitionInfo:
    return PartitionInfo(topic=p.topic, partition=p.partition, leader=p.leader, leader_epoch=p.leader_epoch,
                         replicas=tuple(p.replicas), isr=tuple(p.isr), offline_replicas=tuple(p.offline_replicas),
                         adding=tuple(p.adding_replicas), removing=tuple(p.removing_replicas))


def _describe(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, EosError):
        return int(exc.code), str(exc)
    return int(ErrorCode.UNKNOWN_SERVER_ERROR), f"{type(exc).__name__}: {exc}"


def needs(operation: Operation, refuse: Callable | None = None):
    """The handler runs only for a caller allowed `operation` on the cluster (see the module
    doc); otherwise `refuse(request, code, why)` answers, by default the handler's response
    with CLUSTER_AUTHORIZATION_FAILED as its error."""

    def decorate(handler):
        response_type = getattr(cluster_pb2, handler.__name__ + "Response")
        answer = refuse or (lambda request, code, why: response_type(error_code=code, error_message=why))

        @functools.wraps(handler)
        def wrapper(self, request, context):
            why = None if self._authorizer is None else self._authorizer.refusal(operation, ResourceType.CLUSTER)
            if why is None:
                return handler(self, request, context)
            log.warning("%s refused: %s", handler.__name__, why)
            return answer(request, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, why)
        return wrapper
    return decorate


def _refuse_each_epoch_query(request, code: int, why: str) -> cluster_pb2.OffsetsForLeaderEpochResponse:
    """OffsetsForLeaderEpoch answers per partition (its response has no error of its own)."""
    return cluster_pb2.OffsetsForLeaderEpochResponse(partitions=[
        cluster_pb2.EpochEndOffset(topic=q.topic, partition=q.partition, error_code=code, error_message=why,
                                   leader_epoch=-1, end_offset=-1) for q in request.partitions])


class ClusterServicer(cluster_pb2_grpc.ClusterServicer):
    """The Cluster service of one broker. `controller()` returns this broker's controller
    (active or not); `on_metadata_updated()` runs after each accepted UpdateMetadata (the
    topic registry learns new topics' partition counts and configs)."""

    def __init__(self, *, broker_id: int, replicas, metadata, log_manager,
                 controller: Callable[[], object | None], on_metadata_updated: Callable[[], None] = lambda: None,
                 authorizer=None):
        self._broker_id = broker_id
        self._authorizer = authorizer
        self._replicas = replicas
        self._metadata = metadata
        self._log_manager = log_manager
        self._controller = controller
        self._on_metadata_updated = on_metadata_updated

    # ---- controller -> broker ------------------------------------------------------------------

    @needs(Operation.CLUSTER_ACTION)
    def LeaderAndIsr(self, request, context):
        try:
            results = self._replicas.become_leader_or_follower(
                request.controller_epoch, [assignment_from_proto(p) for p in request.partitions])
        except Exception as exc:
            code, message = _describe(exc)
            log.info("LeaderAndIsr from controller %d refused: %s", request.controller_id, message)
            return cluster_pb2.LeaderAndIsrResponse(error_code=code, error_message=message)
        return cluster_pb2.LeaderAndIsrResponse(partitions=[
            cluster_pb2.PartitionResult(topic=tp[0], partition=tp[1], error_code=code, error_message=message)
            for tp, (code, message) in results.items()])

    @needs(Operation.CLUSTER_ACTION)
    def UpdateMetadata(self, request, context):
        try:
            self._replicas.check_controller_epoch(request.controller_epoch, "UpdateMetadata")
            configs = {}
            for p in request.partitions:
                configs.setdefault(p.topic, dict(p.topic_configs))
            self._metadata.update(
                controller_id=request.controller_id, controller_epoch=request.controller_epoch,
                brokers=[BrokerEndpoint(b.broker_id, b.host, b.port, b.rack or None, b.broker_epoch,
                                        tuple(ListenerEndpoint(e.listener_name, e.security_protocol, e.host, e.port)
                                              for e in b.endpoints), b.socket_port)
                         for b in request.live_brokers],
                partitions=[partition_info_from_proto(p) for p in request.partitions],
                topic_configs=configs, full=request.full, deleted_topics=list(request.deleted_topics))
        except Exception as exc:
            code, message = _describe(exc)
            log.info("UpdateMetadata from controller %d refused: %s", request.controller_id, message)
            return cluster_pb2.UpdateMetadataResponse(error_code=code, error_message=message)
        self._on_metadata_updated()
        return cluster_pb2.UpdateMetadataResponse()

    @needs(Operation.CLUSTER_ACTION)
    def StopReplica(self, request, context):
        try:
            results = self._replicas.stop_replicas(
                request.controller_epoch, [(tp.topic, tp.partition) for tp in request.partitions],
                request.delete_partitions)
        except Exception as exc:
            code, message = _describe(exc)
            return cluster_pb2.StopReplicaResponse(error_code=code, error_message=message)
        return cluster_pb2.StopReplicaResponse(partitions=[
            cluster_pb2.PartitionResult(topic=tp[0], partition=tp[1], error_code=code, error_message=message)
            for tp, (code, message) in results.items()])

    # ---- follower -> leader -----------------------------------------------------------------------

    @needs(Operation.CLUSTER_ACTION, refuse=_refuse_each_epoch_query)
    def OffsetsForLeaderEpoch(self, request, context):
        answers = []
        for q in request.partitions:
            try:
                current = q.current_leader_epoch if q.current_leader_epoch >= 0 else None
                self._replicas.check_leader(q.topic, q.partition, current)
                partition_log = self._log_manager.get_log(q.topic, q.partition)
                if partition_log is None:
                    raise EosError(f"no log of {q.topic}-{q.partition} here", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                epoch, end_offset = partition_log.leader_epoch_cache.end_offset_for(
                    q.leader_epoch, partition_log.log_end_offset)
                answers.append(cluster_pb2.EpochEndOffset(topic=q.topic, partition=q.partition,
                                                          leader_epoch=epoch, end_offset=end_offset))
            except Exception as exc:
                code, message = _describe(exc)
                answers.append(cluster_pb2.EpochEndOffset(topic=q.topic, partition=q.partition, error_code=code,
                                                          error_message=message, leader_epoch=-1, end_offset=-1))
        return cluster_pb2.OffsetsForLeaderEpochResponse(partitions=answers)

    # ---- to the controller ---------------------------------------------------------------------------

    def _active_controller(self):
        controller = self._controller()
        if controller is None or not controller.is_active:
            raise NotControllerError(
                f"broker {self._broker_id} is not the controller (the controller is broker "
                f"{self._metadata.snapshot.controller_id})")
        return controller

    @needs(Operation.CLUSTER_ACTION)
    def ControlledShutdown(self, request, context):
        try:
            remaining = self._active_controller().controlled_shutdown(request.broker_id, request.broker_epoch)
        except Exception as exc:
            code, message = _describe(exc)
            return cluster_pb2.ControlledShutdownResponse(error_code=code, error_message=message)
        response = cluster_pb2.ControlledShutdownResponse()
        for topic, partition in sorted(remaining):
            response.remaining_partitions.add(topic=topic, partition=partition)
        return response

    @needs(Operation.ALTER)
    def ElectLeaders(self, request, context):
        try:
            tps = None if request.all_partitions else {(tp.topic, tp.partition) for tp in request.partitions}
            election = "unclean" if request.election_type == cluster_pb2.UNCLEAN else "preferred"
            results = self._active_controller().elect_leaders(election, tps)
        except Exception as exc:
            code, message = _describe(exc)
            return cluster_pb2.ElectLeadersResponse(error_code=code, error_message=message)
        return cluster_pb2.ElectLeadersResponse(partitions=[
            cluster_pb2.PartitionResult(topic=tp[0], partition=tp[1], error_code=code, error_message=message)
            for tp, (code, message) in sorted(results.items())])

    @needs(Operation.ALTER)
    def AlterPartitionReassignments(self, request, context):
        try:
            plan = {(r.topic, r.partition): (None if r.cancel else tuple(r.replicas)) for r in request.reassignments}
            results = self._active_controller().reassign(plan, throttle_bytes_per_s=request.throttle_bytes_per_s)
        except Exception as exc:
            code, message = _describe(exc)
            return cluster_pb2.AlterPartitionReassignmentsResponse(error_code=code, error_message=message)
        return cluster_pb2.AlterPartitionReassignmentsResponse(partitions=[
            cluster_pb2.PartitionResult(topic=tp[0], partition=tp[1], error_code=code, error_message=message)
            for tp, (code, message) in sorted(results.items())])

    @needs(Operation.DESCRIBE)
    def ListPartitionReassignments(self, request, context):
        try:
            ongoing = self._active_controller().ongoing_reassignments()
        except Exception as exc:
            code, message = _describe(exc)
            return cluster_pb2.ListPartitionReassignmentsResponse(error_code=code, error_message=message)
        wanted = {(tp.topic, tp.partition) for tp in request.partitions}
        response = cluster_pb2.ListPartitionReassignmentsResponse()
        for tp, (replicas, adding, removing) in sorted(ongoing.items()):
            if wanted and tp not in wanted:
                continue
            response.reassignments.add(topic=tp[0], partition=tp[1], replicas=replicas, adding_replicas=adding,
                                       removing_replicas=removing)
        return response
