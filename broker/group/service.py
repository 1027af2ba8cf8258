"""The GroupCoordinator gRPC service: a thin shell over `broker.group.coordinator`.

Theory of operation
-------------------
One handler per RPC, each the same shape: read the request into plain values, call the
GroupCoordinator, build the response. Errors travel as Kafka error codes in the response,
never as gRPC failures, so clients handle them like any other Kafka error; an unexpected
exception becomes UNKNOWN_SERVER_ERROR with its message (and is logged with its traceback),
and the service keeps serving.

JoinGroup and SyncGroup may block the calling gRPC thread until the group's rebalance
completes (bounded: see GroupCoordinator). The member's client id comes from the optional
gRPC metadata key `client-id` (Kafka's request header carries it; our protos do not), its
host from the connection's peer address, as Kafka shows them in DescribeGroups.
"""
from __future__ import annotations

import functools
import logging

from broker.group.coordinator import GroupCoordinator
from broker.group.records import OffsetAndMetadata
from eos.errors import ErrorCode
from eos.types import TopicPartition
from eos.v1 import group_pb2, group_pb2_grpc

log = logging.getLogger("eos.group_coordinator")

CLIENT_ID_METADATA_KEY = "client-id"


def _unexpected(build_error):
    """Answer an unexpected exception with `build_error(request, code, message)`."""

    def decorate(handler):
        @functools.wraps(handler)
        def wrapper(self, request, context):
            try:
                return handler(self, request, context)
            except Exception as exc:   # the service keeps serving; the client sees a Kafka error
                log.exception("%s failed", handler.__name__)
                return build_error(request, ErrorCode.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        return wrapper
    return decorate


def _client_id(context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return ""


def _client_host(context) -> str:
    """gRPC's peer "ipv4:127.0.0.1:5555" / "ipv6:[::1]:5555" -> Kafka's "/127.0.0.1" form."""
    peer = context.peer() or ""
    kind, _, address = peer.partition(":")
    if kind == "ipv4":
        return "/" + address.rsplit(":", 1)[0]
    if kind == "ipv6":
        return "/" + address.rsplit(":", 1)[0].strip("[]")
    return peer


def _offsets(entries) -> dict[TopicPartition, OffsetAndMetadata]:
    """OffsetToCommit messages -> the coordinator's map (a partition named twice: the last wins)."""
    return {TopicPartition(e.topic, e.partition): OffsetAndMetadata(e.offset, e.leader_epoch, e.metadata)
            for e in entries}


def _partition_results(results) -> list[group_pb2.PartitionOffsetResult]:
    return [group_pb2.PartitionOffsetResult(topic=r.topic, partition=r.partition, error_code=int(r.error),
                                            error_message=r.message)
            for r in results]


def _commit_error(request, code, message):
    return [group_pb2.PartitionOffsetResult(topic=o.topic, partition=o.partition, error_code=code,
                                            error_message=message) for o in request.offsets]


class GroupCoordinatorServicer(group_pb2_grpc.GroupCoordinatorServicer):
    def __init__(self, coordinator: GroupCoordinator, *, node_for_call=None):
        """`node_for_call()`: this node's address on the listener of the current call, so
        FindCoordinator names it as the client reached it (None: the coordinator's own)."""
        self._coordinator = coordinator
        self._node_for_call = node_for_call

    @_unexpected(lambda request, code, message: group_pb2.FindCoordinatorResponse(coordinators=[
        group_pb2.Coordinator(key=key, node_id=-1, port=-1, error_code=code, error_message=message)
        for key in request.keys]))
    def FindCoordinator(self, request: group_pb2.FindCoordinatorRequest, context):
        found = self._coordinator.find_coordinator(request.key_type, list(request.keys))
        if self._node_for_call is not None:
            node = self._node_for_call()
            found = [c._replace(host=node.host, port=node.port) if c.node_id == node.node_id else c for c in found]
        return group_pb2.FindCoordinatorResponse(coordinators=[
            group_pb2.Coordinator(key=c.key, node_id=c.node_id, host=c.host, port=c.port, error_code=int(c.error),
                                  error_message=c.message)
            for c in found])

    @_unexpected(lambda request, code, message: group_pb2.JoinGroupResponse(
        error_code=code, error_message=message, generation_id=-1, member_id=request.member_id))
    def JoinGroup(self, request: group_pb2.JoinGroupRequest, context):
        answer = self._coordinator.join(
            request.group_id, request.member_id, request.group_instance_id or None, request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols], request.session_timeout_ms,
            request.rebalance_timeout_ms, client_id=_client_id(context), client_host=_client_host(context))
        return group_pb2.JoinGroupResponse(
            error_code=int(answer.error), error_message=answer.message, generation_id=answer.generation_id,
            protocol_name=answer.protocol_name or "", leader=answer.leader, member_id=answer.member_id,
            skip_assignment=answer.skip_assignment,
            members=[group_pb2.JoinGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id or "",
                                               metadata=m.metadata)
                     for m in answer.members])

    @_unexpected(lambda request, code, message: group_pb2.SyncGroupResponse(error_code=code, error_message=message))
    def SyncGroup(self, request: group_pb2.SyncGroupRequest, context):
        assignments = {a.member_id: a.assignment for a in request.assignments}
        answer = self._coordinator.sync(request.group_id, request.generation_id, request.member_id,
                                        request.group_instance_id or None, assignments)
        return group_pb2.SyncGroupResponse(error_code=int(answer.error), error_message=answer.message,
                                           assignment=answer.assignment)

    @_unexpected(lambda request, code, message: group_pb2.HeartbeatResponse(error_code=code, error_message=message))
    def Heartbeat(self, request: group_pb2.HeartbeatRequest, context):
        answer = self._coordinator.heartbeat(request.group_id, request.generation_id, request.member_id,
                                             request.group_instance_id or None)
        return group_pb2.HeartbeatResponse(error_code=int(answer.error), error_message=answer.message)

    @_unexpected(lambda request, code, message: group_pb2.LeaveGroupResponse(error_code=code, error_message=message))
    def LeaveGroup(self, request: group_pb2.LeaveGroupRequest, context):
        answer = self._coordinator.leave(request.group_id, request.member_id, request.group_instance_id or None)
        return group_pb2.LeaveGroupResponse(error_code=int(answer.error), error_message=answer.message)

    @_unexpected(lambda request, code, message: group_pb2.OffsetCommitResponse(
        partitions=_commit_error(request, code, message)))
    def OffsetCommit(self, request: group_pb2.OffsetCommitRequest, context):
        results = self._coordinator.offset_commit(request.group_id, request.generation_id, request.member_id,
                                                  request.group_instance_id or None, _offsets(request.offsets))
        return group_pb2.OffsetCommitResponse(partitions=_partition_results(results))

    @_unexpected(lambda request, code, message: group_pb2.TxnOffsetCommitResponse(
        partitions=_commit_error(request, code, message)))
    def TxnOffsetCommit(self, request: group_pb2.TxnOffsetCommitRequest, context):
        results = self._coordinator.txn_offset_commit(
            request.transactional_id, request.group_id, request.producer_id, request.producer_epoch,
            request.generation_id, request.member_id, request.group_instance_id or None, _offsets(request.offsets))
        return group_pb2.TxnOffsetCommitResponse(partitions=_partition_results(results))

    @_unexpected(lambda request, code, message: group_pb2.OffsetFetchResponse(error_code=code, error_message=message))
    def OffsetFetch(self, request: group_pb2.OffsetFetchRequest, context):
        answer = self._coordinator.offset_fetch(
            request.group_id, [TopicPartition(p.topic, p.partition) for p in request.partitions],
            request.require_stable)
        return group_pb2.OffsetFetchResponse(
            error_code=int(answer.error), error_message=answer.message,
            partitions=[group_pb2.FetchedOffset(topic=p.topic, partition=p.partition, offset=p.offset,
                                                leader_epoch=p.leader_epoch, metadata=p.metadata, error_code=int(p.error))
                        for p in answer.partitions])

    @_unexpected(lambda request, code, message: group_pb2.ListGroupsResponse(error_code=code))
    def ListGroups(self, request: group_pb2.ListGroupsRequest, context):
        try:
            error, groups = self._coordinator.list_groups(list(request.states_filter))
        except ValueError as exc:     # an unknown state name: the request is wrong, not the server
            log.info("ListGroups refused: %s", exc)
            return group_pb2.ListGroupsResponse(error_code=ErrorCode.INVALID_REQUEST)
        return group_pb2.ListGroupsResponse(error_code=int(error), groups=[
            group_pb2.GroupListing(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state)
            for g in groups])

    @_unexpected(lambda request, code, message: group_pb2.DescribeGroupsResponse(groups=[
        group_pb2.GroupDescription(group_id=g, error_code=code, error_message=message, generation_id=-1)
        for g in request.group_ids]))
    def DescribeGroups(self, request: group_pb2.DescribeGroupsRequest, context):
        described = self._coordinator.describe_groups(list(request.group_ids))
        return group_pb2.DescribeGroupsResponse(groups=[
            group_pb2.GroupDescription(
                group_id=d.group_id, error_code=int(d.error),
                error_message="" if d.error is ErrorCode.NONE else f"group {d.group_id!r}: {d.error.name}",
                state=d.state, protocol_type=d.protocol_type, protocol=d.protocol, generation_id=d.generation_id,
                members=[group_pb2.GroupMemberDescription(
                    member_id=m.member_id, group_instance_id=m.group_instance_id or "", client_id=m.client_id,
                    client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                    for m in d.members])
            for d in described])
