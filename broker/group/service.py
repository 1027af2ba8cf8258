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

Authorization. With an `authorizer` (None: no checks) each handler checks what Kafka checks
before it asks the coordinator anything, so a refused request changes nothing:
FindCoordinator DESCRIBE on the group or transactional id (per key); JoinGroup, SyncGroup,
Heartbeat and LeaveGroup READ on the group (GROUP_AUTHORIZATION_FAILED); OffsetCommit READ on
the group, then READ on each topic (a refused topic's partitions answer
TOPIC_AUTHORIZATION_FAILED and are not committed; the others are, as in Kafka);
TxnOffsetCommit WRITE on the transactional id first, then the same as OffsetCommit;
OffsetFetch DESCRIBE on the group and on each topic (all offsets: the topics it may not
describe are left out); ListGroups DESCRIBE on the cluster, or else only the groups it may
DESCRIBE; DescribeGroups DESCRIBE on each group; DeleteGroups DELETE on each group.
"""
from __future__ import annotations

import functools
import logging

from broker.group.coordinator import GroupCoordinator
from broker.group.records import OffsetAndMetadata
from eos.acl import Operation, ResourceType
from eos.errors import ErrorCode
from broker.security import client_id_of_call
from eos.types import TopicPartition
from eos.v1 import group_pb2, group_pb2_grpc

log = logging.getLogger("eos.group_coordinator")


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
    def __init__(self, coordinator: GroupCoordinator, *, node_for_call=None, authorizer=None):
        """`node_for_call()`: this node's address on the listener of the current call, so
        FindCoordinator names it as the client reached it (None: the coordinator's own).
        `authorizer`: the broker's ACL checks (None: none)."""
        self._coordinator = coordinator
        self._node_for_call = node_for_call
        self._authorizer = authorizer

    # ---- authorization (see the module doc) ----------------------------------------------------

    def _refuse_group(self, group_id: str, operation: Operation = Operation.READ) -> str | None:
        return self._authorizer.refusal(operation, ResourceType.GROUP, group_id)

    def _refused_topics(self, topics, operation: Operation) -> dict[str, str]:
        who = self._authorizer.principal()
        return {topic: f"{who} is not authorized to {operation.name} topic {topic!r}" for topic in set(topics)
                if not self._authorizer.allowed(operation, ResourceType.TOPIC, topic)}

    def _commit_authorized(self, request, commit) -> list[group_pb2.PartitionOffsetResult]:
        """Commit the offsets of the topics the caller may READ (`commit(offsets)` -> results);
        the others answer TOPIC_AUTHORIZATION_FAILED and are not committed. In request order."""
        refused = {} if self._authorizer is None else self._refused_topics(
            (o.topic for o in request.offsets), Operation.READ)
        if not refused:
            return _partition_results(commit(_offsets(request.offsets)))
        allowed = [o for o in request.offsets if o.topic not in refused]
        done = {(r.topic, r.partition): r for r in commit(_offsets(allowed))} if allowed else {}
        return [group_pb2.PartitionOffsetResult(topic=o.topic, partition=o.partition,
                                                error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                                                error_message=refused[o.topic])
                if o.topic in refused else _partition_results([done[(o.topic, o.partition)]])[0]
                for o in request.offsets]

    @_unexpected(lambda request, code, message: group_pb2.FindCoordinatorResponse(coordinators=[
        group_pb2.Coordinator(key=key, node_id=-1, port=-1, error_code=code, error_message=message)
        for key in request.keys]))
    def FindCoordinator(self, request: group_pb2.FindCoordinatorRequest, context):
        refused: dict[str, tuple[int, str]] = {}
        if self._authorizer is not None:
            kind, code = ((ResourceType.GROUP, ErrorCode.GROUP_AUTHORIZATION_FAILED)
                          if request.key_type == group_pb2.GROUP else
                          (ResourceType.TRANSACTIONAL_ID, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
            refused = {key: (code, f"{self._authorizer.principal()} is not authorized to DESCRIBE "
                                   f"{kind.name.lower().replace('_', ' ')} {key!r}")
                       for key in request.keys if not self._authorizer.allowed(Operation.DESCRIBE, kind, key)}
        if refused:
            asked = [key for key in request.keys if key not in refused]
            found = {c.key: c for c in self._coordinator.find_coordinator(request.key_type, asked)} if asked else {}
            return group_pb2.FindCoordinatorResponse(coordinators=[
                group_pb2.Coordinator(key=key, node_id=-1, port=-1, error_code=refused[key][0],
                                      error_message=refused[key][1])
                if key in refused else self._coordinator_message(found[key]) for key in request.keys])
        found = self._coordinator.find_coordinator(request.key_type, list(request.keys))
        return group_pb2.FindCoordinatorResponse(coordinators=[self._coordinator_message(c) for c in found])

    def _coordinator_message(self, c) -> group_pb2.Coordinator:
        if self._node_for_call is not None:
            node = self._node_for_call()
            if c.node_id == node.node_id:
                c = c._replace(host=node.host, port=node.port)
        return group_pb2.Coordinator(key=c.key, node_id=c.node_id, host=c.host, port=c.port, error_code=int(c.error),
                                     error_message=c.message)

    @_unexpected(lambda request, code, message: group_pb2.JoinGroupResponse(
        error_code=code, error_message=message, generation_id=-1, member_id=request.member_id))
    def JoinGroup(self, request: group_pb2.JoinGroupRequest, context):
        if self._authorizer is not None:
            why = self._refuse_group(request.group_id)
            if why is not None:
                return group_pb2.JoinGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=why,
                                                   generation_id=-1, member_id=request.member_id)
        answer = self._coordinator.join(
            request.group_id, request.member_id, request.group_instance_id or None, request.protocol_type,
            [(p.name, p.metadata) for p in request.protocols], request.session_timeout_ms,
            request.rebalance_timeout_ms, client_id=client_id_of_call(context), client_host=_client_host(context))
        return group_pb2.JoinGroupResponse(
            error_code=int(answer.error), error_message=answer.message, generation_id=answer.generation_id,
            protocol_name=answer.protocol_name or "", leader=answer.leader, member_id=answer.member_id,
            skip_assignment=answer.skip_assignment,
            members=[group_pb2.JoinGroupMember(member_id=m.member_id, group_instance_id=m.group_instance_id or "",
                                               metadata=m.metadata)
                     for m in answer.members])

    @_unexpected(lambda request, code, message: group_pb2.SyncGroupResponse(error_code=code, error_message=message))
    def SyncGroup(self, request: group_pb2.SyncGroupRequest, context):
        if self._authorizer is not None:
            why = self._refuse_group(request.group_id)
            if why is not None:
                return group_pb2.SyncGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=why)
        assignments = {a.member_id: a.assignment for a in request.assignments}
        answer = self._coordinator.sync(request.group_id, request.generation_id, request.member_id,
                                        request.group_instance_id or None, assignments)
        return group_pb2.SyncGroupResponse(error_code=int(answer.error), error_message=answer.message,
                                           assignment=answer.assignment)

    @_unexpected(lambda request, code, message: group_pb2.HeartbeatResponse(error_code=code, error_message=message))
    def Heartbeat(self, request: group_pb2.HeartbeatRequest, context):
        if self._authorizer is not None:
            why = self._refuse_group(request.group_id)
            if why is not None:
                return group_pb2.HeartbeatResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=why)
        answer = self._coordinator.heartbeat(request.group_id, request.generation_id, request.member_id,
                                             request.group_instance_id or None)
        return group_pb2.HeartbeatResponse(error_code=int(answer.error), error_message=answer.message)

    @_unexpected(lambda request, code, message: group_pb2.LeaveGroupResponse(error_code=code, error_message=message))
    def LeaveGroup(self, request: group_pb2.LeaveGroupRequest, context):
        if self._authorizer is not None:
            why = self._refuse_group(request.group_id)
            if why is not None:
                return group_pb2.LeaveGroupResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=why)
        answer = self._coordinator.leave(request.group_id, request.member_id, request.group_instance_id or None)
        return group_pb2.LeaveGroupResponse(error_code=int(answer.error), error_message=answer.message)

    @_unexpected(lambda request, code, message: group_pb2.OffsetCommitResponse(
        partitions=_commit_error(request, code, message)))
    def OffsetCommit(self, request: group_pb2.OffsetCommitRequest, context):
        if self._authorizer is not None:
            why = self._refuse_group(request.group_id)
            if why is not None:
                return group_pb2.OffsetCommitResponse(
                    partitions=_commit_error(request, ErrorCode.GROUP_AUTHORIZATION_FAILED, why))
        return group_pb2.OffsetCommitResponse(partitions=self._commit_authorized(
            request, lambda offsets: self._coordinator.offset_commit(
                request.group_id, request.generation_id, request.member_id, request.group_instance_id or None,
                offsets)))

    @_unexpected(lambda request, code, message: group_pb2.TxnOffsetCommitResponse(
        partitions=_commit_error(request, code, message)))
    def TxnOffsetCommit(self, request: group_pb2.TxnOffsetCommitRequest, context):
        if self._authorizer is not None:
            why = self._authorizer.refusal(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, request.transactional_id)
            if why is not None:
                return group_pb2.TxnOffsetCommitResponse(partitions=_commit_error(
                    request, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, why))
            why = self._refuse_group(request.group_id)
            if why is not None:
                return group_pb2.TxnOffsetCommitResponse(
                    partitions=_commit_error(request, ErrorCode.GROUP_AUTHORIZATION_FAILED, why))
        return group_pb2.TxnOffsetCommitResponse(partitions=self._commit_authorized(
            request, lambda offsets: self._coordinator.txn_offset_commit(
                request.transactional_id, request.group_id, request.producer_id, request.producer_epoch,
                request.generation_id, request.member_id, request.group_instance_id or None, offsets)))

    @_unexpected(lambda request, code, message: group_pb2.OffsetFetchResponse(error_code=code, error_message=message))
    def OffsetFetch(self, request: group_pb2.OffsetFetchRequest, context):
        refused: dict[str, str] = {}
        if self._authorizer is not None:
            why = self._refuse_group(request.group_id, Operation.DESCRIBE)
            if why is not None:
                return group_pb2.OffsetFetchResponse(error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED, error_message=why)
            refused = self._refused_topics((p.topic for p in request.partitions), Operation.DESCRIBE)
        asked = [TopicPartition(p.topic, p.partition) for p in request.partitions if p.topic not in refused]
        if request.partitions and not asked:
            answered = []
            error, message = ErrorCode.NONE, ""
        else:
            answer = self._coordinator.offset_fetch(request.group_id, asked, request.require_stable)
            answered = [group_pb2.FetchedOffset(topic=p.topic, partition=p.partition, offset=p.offset,
                                                leader_epoch=p.leader_epoch, metadata=p.metadata,
                                                error_code=int(p.error))
                        for p in answer.partitions]
            error, message = answer.error, answer.message
            if self._authorizer is not None and not request.partitions:
                # All the group's offsets: the topics it may not describe are not shown.
                hidden = self._refused_topics({p.topic for p in answered}, Operation.DESCRIBE)
                answered = [p for p in answered if p.topic not in hidden]
        if refused:
            by_partition = {(p.topic, p.partition): p for p in answered}
            answered = [group_pb2.FetchedOffset(topic=p.topic, partition=p.partition, offset=-1, leader_epoch=-1,
                                                error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                        if p.topic in refused else by_partition[(p.topic, p.partition)] for p in request.partitions]
        return group_pb2.OffsetFetchResponse(error_code=int(error), error_message=message, partitions=answered)

    @_unexpected(lambda request, code, message: group_pb2.ListGroupsResponse(error_code=code))
    def ListGroups(self, request: group_pb2.ListGroupsRequest, context):
        try:
            error, groups = self._coordinator.list_groups(list(request.states_filter))
        except ValueError as exc:     # an unknown state name: the request is wrong, not the server
            log.info("ListGroups refused: %s", exc)
            return group_pb2.ListGroupsResponse(error_code=ErrorCode.INVALID_REQUEST)
        if self._authorizer is not None and not self._authorizer.allowed(Operation.DESCRIBE, ResourceType.CLUSTER):
            # Kafka: DESCRIBE on the cluster lists every group, else the ones it may describe.
            groups = [g for g in groups if self._authorizer.allowed(Operation.DESCRIBE, ResourceType.GROUP, g.group_id)]
        return group_pb2.ListGroupsResponse(error_code=int(error), groups=[
            group_pb2.GroupListing(group_id=g.group_id, protocol_type=g.protocol_type, state=g.state)
            for g in groups])

    @_unexpected(lambda request, code, message: group_pb2.DescribeGroupsResponse(groups=[
        group_pb2.GroupDescription(group_id=g, error_code=code, error_message=message, generation_id=-1)
        for g in request.group_ids]))
    def DescribeGroups(self, request: group_pb2.DescribeGroupsRequest, context):
        refused: dict[str, str] = {}
        if self._authorizer is not None:
            refused = {g: why for g in request.group_ids
                       if (why := self._refuse_group(g, Operation.DESCRIBE)) is not None}
        if refused:
            asked = [g for g in request.group_ids if g not in refused]
            found = {d.group_id: d for d in self._coordinator.describe_groups(asked)} if asked else {}
            return group_pb2.DescribeGroupsResponse(groups=[
                group_pb2.GroupDescription(group_id=g, error_code=ErrorCode.GROUP_AUTHORIZATION_FAILED,
                                           error_message=refused[g], generation_id=-1)
                if g in refused else self._group_description(found[g]) for g in request.group_ids])
        described = self._coordinator.describe_groups(list(request.group_ids))
        return group_pb2.DescribeGroupsResponse(groups=[self._group_description(d) for d in described])

    @_unexpected(lambda request, code, message: group_pb2.DeleteGroupsResponse(results=[
        group_pb2.DeletedGroupResult(group_id=g, error_code=code, error_message=message) for g in request.group_ids]))
    def DeleteGroups(self, request: group_pb2.DeleteGroupsRequest, context):
        """Kafka's rule: DELETE on the group; a group refused is left alone, the others go on."""
        refused: dict[str, str] = {}
        if self._authorizer is not None:
            refused = {g: why for g in request.group_ids
                       if (why := self._refuse_group(g, Operation.DELETE)) is not None}
        asked = list(dict.fromkeys(g for g in request.group_ids if g not in refused))
        deleted = {g: (error, message) for g, error, message in self._coordinator.delete_groups(asked)}
        results = []
        for group_id in request.group_ids:
            error, message = ((ErrorCode.GROUP_AUTHORIZATION_FAILED, refused[group_id]) if group_id in refused
                              else deleted[group_id])
            results.append(group_pb2.DeletedGroupResult(group_id=group_id, error_code=int(error),
                                                        error_message=message))
        return group_pb2.DeleteGroupsResponse(results=results)

    @staticmethod
    def _group_description(d) -> group_pb2.GroupDescription:
        return group_pb2.GroupDescription(
            group_id=d.group_id, error_code=int(d.error),
            error_message="" if d.error is ErrorCode.NONE else f"group {d.group_id!r}: {d.error.name}",
            state=d.state, protocol_type=d.protocol_type, protocol=d.protocol, generation_id=d.generation_id,
            members=[group_pb2.GroupMemberDescription(
                member_id=m.member_id, group_instance_id=m.group_instance_id or "", client_id=m.client_id,
                client_host=m.client_host, member_metadata=m.metadata, member_assignment=m.assignment)
                for m in d.members])
