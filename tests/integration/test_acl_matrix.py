"""Every RPC of the Broker, TxnCoordinator and GroupCoordinator services x {allowed principal,
denied principal, unauthenticated}, on one broker with an authorizer (broker/authorizer.py).

The broker has a PLAINTEXT listener (its calls are User:ANONYMOUS) and a mutual-TLS listener
whose certificates name User:admin (a super user, who sets each case up), User:alice (given
exactly the ACLs the RPC needs) and User:bob (given none). For each RPC: bob and ANONYMOUS get
the Kafka authorization error and the broker's whole state -- topics, every partition's log
end (the internal topics' included, so no offset commit or transaction record slipped in),
the ACLs, every transaction and every group -- reads back unchanged; then alice's call
succeeds (and a call that changes something did change it)."""
from __future__ import annotations

from typing import Callable, NamedTuple

import grpc
import pytest

from broker.acl import CLUSTER_NAME, AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from broker.server import BrokerServer
from eos.acl import binding_to_proto, filter_to_proto
from eos.errors import ErrorCode
from eos.v1 import broker_pb2, broker_pb2_grpc, common_pb2, group_pb2, group_pb2_grpc, txn_pb2, txn_pb2_grpc
from tests.certs import CertificateAuthority
from tests.storage_batches import make_batch
from tests.waits import wait_for

ALICE, BOB, ANONYMOUS, ADMIN = "User:alice", "User:bob", "User:ANONYMOUS", "User:admin"
T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
O = Operation
SESSION_MS = 60000     # members must not expire while a case runs: that would change the state


def grant(resource_type, name, *operations, principal=ALICE, permission=Permission.ALLOW,
          pattern=PatternType.LITERAL) -> list[AclBinding]:
    return [AclBinding(resource_type, name, pattern, principal, "*", op, permission) for op in operations]


class Stubs(NamedTuple):
    broker: broker_pb2_grpc.BrokerStub
    txn: txn_pb2_grpc.TxnCoordinatorStub
    group: group_pb2_grpc.GroupCoordinatorStub


def broker_config(pki: dict, **extra) -> dict:
    return {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "ssl.certificate.location": str(pki["server"].certificate_path),
        "ssl.key.location": str(pki["server"].key_path),
        "ssl.ca.location": str(pki["ca_path"]),
        "ssl.client.auth": "required",
        # CN=alice -> User:alice
        "ssl.principal.mapping.rules": "RULE:^CN=([^,]*)$/$1/,DEFAULT",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": ADMIN,
        "group.initial.rebalance.delay.ms": "0",
        **extra,
    }


def make_pki(directory) -> dict:
    ca = CertificateAuthority("eos ACL test CA")
    directory.mkdir(parents=True, exist_ok=True)
    pki = {"ca_path": ca.write_ca(directory / "ca.pem"), "server": ca.issue_server(directory, "server")}
    for name in ("alice", "bob", "admin"):
        pki[name] = ca.issue_client(directory, name, {"CN": name})
    return pki


def open_stubs(broker: BrokerServer, pki: dict, who: str, channels: list) -> Stubs:
    if who == ANONYMOUS:
        channel = grpc.insecure_channel(broker.address_of("PLAINTEXT"))
    else:
        issued = pki[who.split(":", 1)[1]]
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pki["ca_path"].read_bytes(), private_key=issued.key_path.read_bytes(),
            certificate_chain=issued.certificate_path.read_bytes())
        channel = grpc.secure_channel(broker.address_of("SSL"), credentials)
    channels.append(channel)
    return Stubs(broker_pb2_grpc.BrokerStub(channel), txn_pb2_grpc.TxnCoordinatorStub(channel),
                 group_pb2_grpc.GroupCoordinatorStub(channel))


class Env:
    def __init__(self, broker: BrokerServer, pki: dict):
        self.broker = broker
        self._channels: list = []
        self.stubs = {who: open_stubs(broker, pki, who, self._channels) for who in (ALICE, BOB, ANONYMOUS, ADMIN)}
        self.admin = self.stubs[ADMIN]

    def close(self) -> None:
        for channel in self._channels:
            channel.close()

    # ---- setting up, as the super user ----------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1) -> None:
        response = self.admin.broker.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
            broker_pb2.NewTopic(name=name, num_partitions=partitions, replication_factor=1)]))
        assert response.topics[0].error_code == ErrorCode.NONE, response

    def produce(self, topic: str, count: int = 1) -> None:
        response = self.admin.broker.Produce(broker_pb2.ProduceRequest(acks=-1, partitions=[
            broker_pb2.PartitionRecords(topic=topic, partition=0, records=make_batch(count))]))
        assert response.partitions[0].error_code == ErrorCode.NONE, response

    def init_producer(self, transactional_id: str) -> tuple[int, int]:
        response = self.admin.txn.InitProducerId(txn_pb2.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=600000, producer_id=-1, producer_epoch=-1))
        assert response.error_code == ErrorCode.NONE, response
        return response.producer_id, response.producer_epoch

    def add_partitions(self, transactional_id: str, producer: tuple[int, int], topic: str) -> None:
        response = self.admin.txn.AddPartitionsToTxn(txn_pb2.AddPartitionsToTxnRequest(
            transactional_id=transactional_id, producer_id=producer[0], producer_epoch=producer[1],
            partitions=[common_pb2.TopicPartition(topic=topic, partition=0)]))
        assert response.error_code == ErrorCode.NONE, response

    def join(self, group: str, stubs: Stubs | None = None) -> group_pb2.JoinGroupResponse:
        stubs = stubs or self.admin
        request = group_pb2.JoinGroupRequest(
            group_id=group, session_timeout_ms=SESSION_MS, rebalance_timeout_ms=SESSION_MS, protocol_type="consumer",
            protocols=[group_pb2.GroupProtocol(name="range", metadata=b"")])
        response = stubs.group.JoinGroup(request)
        if response.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            request.member_id = response.member_id
            response = stubs.group.JoinGroup(request)
        return response

    def join_and_sync(self, group: str) -> group_pb2.JoinGroupResponse:
        joined = self.join(group)
        assert joined.error_code == ErrorCode.NONE, joined
        synced = self.admin.group.SyncGroup(group_pb2.SyncGroupRequest(
            group_id=group, generation_id=joined.generation_id, member_id=joined.member_id,
            assignments=[group_pb2.SyncGroupAssignment(member_id=joined.member_id, assignment=b"")]))
        assert synced.error_code == ErrorCode.NONE, synced
        return joined

    # ---- reading the state back ---------------------------------------------------------------

    def state(self) -> dict:
        broker = self.broker
        groups = sorted(g.group_id for g in broker.group_coordinator.list_groups()[1])
        return {
            "topics": sorted((i.name, i.partition_count, tuple(sorted(i.config_overrides.items())))
                             for i in broker.registry.topics()),
            "log ends": sorted((log.topic, log.partition, log.log_start_offset, log.log_end_offset)
                               for log in broker.log_manager.all_logs()),
            "acls": broker.authorizer.acls,
            "transactions": sorted(broker.txn_coordinator.list(), key=lambda md: md.transactional_id),
            "groups": broker.group_coordinator.describe_groups(groups),
        }


class Case(NamedTuple):
    """One RPC: `setup(env)` as the super user (returns the case's context), `grants(ctx)`
    for alice, `call(env, stubs, ctx)` -> the error code the caller got, `denied` the code
    bob and ANONYMOUS get, `changes` whether alice's success changes the state."""
    name: str
    setup: Callable
    grants: Callable
    call: Callable
    denied: int
    changes: bool
    allowed: int = ErrorCode.NONE


def _tp(topic):
    return [common_pb2.TopicPartition(topic=topic, partition=0)]


def _metadata_all_call(env, stubs, ctx):
    # All topics: one the caller may not describe is simply not there.
    names = [t.name for t in stubs.broker.Metadata(broker_pb2.MetadataRequest()).topics]
    return ErrorCode.NONE if ctx["topic"] in names else ErrorCode.TOPIC_AUTHORIZATION_FAILED


def _list_transactions_call(env, stubs, ctx):
    listed = stubs.txn.ListTransactions(txn_pb2.ListTransactionsRequest())
    assert listed.error_code == ErrorCode.NONE
    ids = [t.transactional_id for t in listed.transactions]
    return ErrorCode.NONE if ctx["tid"] in ids else ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def _list_groups_call(env, stubs, ctx):
    listed = stubs.group.ListGroups(group_pb2.ListGroupsRequest())
    assert listed.error_code == ErrorCode.NONE
    ids = [g.group_id for g in listed.groups]
    return ErrorCode.NONE if ctx["group"] in ids else ErrorCode.GROUP_AUTHORIZATION_FAILED


def _offset_fetch_all_call(env, stubs, ctx):
    answer = stubs.group.OffsetFetch(group_pb2.OffsetFetchRequest(group_id=ctx["group"]))
    if answer.error_code != ErrorCode.NONE:
        return answer.error_code
    return ErrorCode.NONE if ctx["topic"] in {p.topic for p in answer.partitions} else -100


def _setup_topic(env, name, count=0):
    env.create_topic(name)
    if count:
        env.produce(name, count)
    return {"topic": name}


def _setup_txn(env, name, *, add=True, group=None):
    env.create_topic(name)
    producer = env.init_producer(name)
    if add:
        env.add_partitions(name, producer, name)
    ctx = {"topic": name, "tid": name, "producer": producer, "group": group or name}
    return ctx


def _setup_group_member(env, name):
    env.create_topic(name)
    joined = env.join_and_sync(name)
    return {"topic": name, "group": name, "member": joined.member_id, "generation": joined.generation_id}


def _setup_joined_unsynced(env, name):
    joined = env.join(name)
    assert joined.error_code == ErrorCode.NONE, joined
    return {"group": name, "member": joined.member_id, "generation": joined.generation_id}


def _setup_txn_offsets(env, name):
    ctx = _setup_txn(env, name, add=False)
    pid, epoch = ctx["producer"]
    added = env.admin.txn.AddOffsetsToTxn(txn_pb2.AddOffsetsToTxnRequest(
        transactional_id=name, producer_id=pid, producer_epoch=epoch, group_id=name))
    assert added.error_code == ErrorCode.NONE, added
    return ctx


def _setup_acl_to_delete(env, name):
    env.broker.authorizer.create(grant(T, name, O.READ, principal="User:carol"))
    return {"topic": name}


def _produce_request(ctx, *, transactional=False):
    if not transactional:
        return broker_pb2.ProduceRequest(acks=-1, partitions=[
            broker_pb2.PartitionRecords(topic=ctx["topic"], partition=0, records=make_batch(1))])
    pid, epoch = ctx["producer"]
    return broker_pb2.ProduceRequest(acks=-1, transactional_id=ctx["tid"], add_partitions_to_txn=True, partitions=[
        broker_pb2.PartitionRecords(topic=ctx["topic"], partition=0, records=make_batch(
            1, producer_id=pid, producer_epoch=epoch, base_sequence=0, transactional=True))])


CASES = [
    # ---- Broker ----
    Case("Produce", lambda env: _setup_topic(env, "produce"), lambda ctx: grant(T, ctx["topic"], O.WRITE),
         lambda env, s, ctx: s.broker.Produce(_produce_request(ctx)).partitions[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, True),
    Case("Produce transactional", lambda env: _setup_txn(env, "produce-txn", add=False),
         lambda ctx: grant(T, ctx["topic"], O.WRITE) + grant(X, ctx["tid"], O.WRITE),
         lambda env, s, ctx: s.broker.Produce(_produce_request(ctx, transactional=True)).partitions[0].error_code,
         ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
    Case("ProduceStream", lambda env: _setup_topic(env, "produce-stream"), lambda ctx: grant(T, ctx["topic"], O.WRITE),
         lambda env, s, ctx: list(s.broker.ProduceStream(iter([_produce_request(ctx)])))[0].partitions[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, True),
    Case("Fetch", lambda env: _setup_topic(env, "fetch", 3), lambda ctx: grant(T, ctx["topic"], O.READ),
         lambda env, s, ctx: _fetch_code(s, ctx), ErrorCode.TOPIC_AUTHORIZATION_FAILED, False),
    # A follower's fetch needs CLUSTER_ACTION; allowed, a single broker then says it has no followers.
    Case("Fetch as a follower", lambda env: _setup_topic(env, "fetch-replica", 1),
         lambda ctx: grant(C, CLUSTER_NAME, O.CLUSTER_ACTION),
         lambda env, s, ctx: _fetch_code(s, ctx, replica=True), ErrorCode.TOPIC_AUTHORIZATION_FAILED, False,
         allowed=ErrorCode.NOT_LEADER_OR_FOLLOWER),
    Case("ListOffsets", lambda env: _setup_topic(env, "list-offsets", 2), lambda ctx: grant(T, ctx["topic"], O.DESCRIBE),
         lambda env, s, ctx: s.broker.ListOffsets(broker_pb2.ListOffsetsRequest(partitions=[
             broker_pb2.ListOffsetsPartition(topic=ctx["topic"], partition=0, timestamp=-1)])).partitions[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, False),
    Case("Metadata of a topic", lambda env: _setup_topic(env, "metadata"), lambda ctx: grant(T, ctx["topic"], O.DESCRIBE),
         lambda env, s, ctx: s.broker.Metadata(broker_pb2.MetadataRequest(topics=[ctx["topic"]])).topics[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, False),
    Case("Metadata of all topics", lambda env: _setup_topic(env, "metadata-all"),
         lambda ctx: grant(T, ctx["topic"], O.DESCRIBE), _metadata_all_call,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, False),
    Case("CreateTopics", lambda env: {"topic": "created"}, lambda ctx: grant(T, ctx["topic"], O.CREATE),
         lambda env, s, ctx: s.broker.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
             broker_pb2.NewTopic(name=ctx["topic"], num_partitions=2, replication_factor=1)])).topics[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, True),
    Case("DeleteTopics", lambda env: _setup_topic(env, "deleted", 1), lambda ctx: grant(T, ctx["topic"], O.DELETE),
         lambda env, s, ctx: s.broker.DeleteTopics(broker_pb2.DeleteTopicsRequest(
             names=[ctx["topic"]])).topics[0].error_code, ErrorCode.TOPIC_AUTHORIZATION_FAILED, True),
    Case("CreatePartitions", lambda env: _setup_topic(env, "grown"), lambda ctx: grant(T, ctx["topic"], O.ALTER),
         lambda env, s, ctx: s.broker.CreatePartitions(broker_pb2.CreatePartitionsRequest(topics=[
             broker_pb2.NewPartitions(name=ctx["topic"], count=3)])).topics[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, True),
    Case("DescribeConfigs", lambda env: _setup_topic(env, "configs-read"), lambda ctx: grant(T, ctx["topic"], O.DESCRIBE_CONFIGS),
         lambda env, s, ctx: s.broker.DescribeConfigs(broker_pb2.DescribeConfigsRequest(resources=[
             broker_pb2.ConfigResource(resource_type=2, resource_name=ctx["topic"])])).results[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, False),
    Case("DescribeConfigs of a broker", lambda env: {}, lambda ctx: grant(C, CLUSTER_NAME, O.DESCRIBE_CONFIGS),
         lambda env, s, ctx: s.broker.DescribeConfigs(broker_pb2.DescribeConfigsRequest(resources=[
             broker_pb2.ConfigResource(resource_type=4, resource_name=str(env.broker.node_id))])).results[0].error_code,
         ErrorCode.CLUSTER_AUTHORIZATION_FAILED, False),
    Case("IncrementalAlterConfigs of a broker", lambda env: {}, lambda ctx: grant(C, CLUSTER_NAME, O.ALTER_CONFIGS),
         lambda env, s, ctx: s.broker.IncrementalAlterConfigs(broker_pb2.IncrementalAlterConfigsRequest(resources=[
             broker_pb2.AlterConfigsResource(resource_type=4, resource_name=str(env.broker.node_id), configs=[
                 broker_pb2.AlterableConfig(name="num.partitions", config_operation=0, value="5")])])).results[0].error_code,
         ErrorCode.CLUSTER_AUTHORIZATION_FAILED, False, allowed=ErrorCode.INVALID_REQUEST),   # allowed, but static
    Case("IncrementalAlterConfigs", lambda env: _setup_topic(env, "configs-altered"),
         lambda ctx: grant(T, ctx["topic"], O.ALTER_CONFIGS),
         lambda env, s, ctx: s.broker.IncrementalAlterConfigs(broker_pb2.IncrementalAlterConfigsRequest(resources=[
             broker_pb2.AlterConfigsResource(resource_type=2, resource_name=ctx["topic"], configs=[
                 broker_pb2.AlterableConfig(name="retention.ms", config_operation=0, value="60000")])])).results[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, True),
    Case("DeleteRecords", lambda env: _setup_topic(env, "records-deleted", 3), lambda ctx: grant(T, ctx["topic"], O.DELETE),
         lambda env, s, ctx: s.broker.DeleteRecords(broker_pb2.DeleteRecordsRequest(partitions=[
             broker_pb2.DeleteRecordsPartition(topic=ctx["topic"], partition=0, offset=2)])).partitions[0].error_code,
         ErrorCode.TOPIC_AUTHORIZATION_FAILED, True),
    Case("WriteTxnMarkers", lambda env: _setup_topic(env, "markers"), lambda ctx: grant(C, CLUSTER_NAME, O.CLUSTER_ACTION),
         lambda env, s, ctx: s.broker.WriteTxnMarkers(broker_pb2.WriteTxnMarkersRequest(markers=[
             broker_pb2.TxnMarker(producer_id=999_999, producer_epoch=0, committed=False, coordinator_epoch=0,
                                  partitions=_tp(ctx["topic"]))])).markers[0].partitions[0].error_code,
         ErrorCode.CLUSTER_AUTHORIZATION_FAILED, True),
    Case("DescribeProducers", lambda env: _setup_topic(env, "producers", 1), lambda ctx: grant(T, ctx["topic"], O.READ),
         lambda env, s, ctx: s.broker.DescribeProducers(broker_pb2.DescribeProducersRequest(
             partitions=_tp(ctx["topic"]))).partitions[0].error_code, ErrorCode.TOPIC_AUTHORIZATION_FAILED, False),
    Case("DescribeLogDirs", lambda env: _setup_topic(env, "log-dirs", 1), lambda ctx: grant(C, CLUSTER_NAME, O.DESCRIBE),
         lambda env, s, ctx: s.broker.DescribeLogDirs(broker_pb2.DescribeLogDirsRequest()).error_code,
         ErrorCode.CLUSTER_AUTHORIZATION_FAILED, False),
    Case("CreateAcls", lambda env: {"topic": "acl-made"}, lambda ctx: grant(C, CLUSTER_NAME, O.ALTER),
         lambda env, s, ctx: s.broker.CreateAcls(broker_pb2.CreateAclsRequest(creations=[binding_to_proto(
             grant(T, ctx["topic"], O.READ, principal="User:dave")[0])])).results[0].error_code,
         ErrorCode.CLUSTER_AUTHORIZATION_FAILED, True),
    Case("DescribeAcls", lambda env: {}, lambda ctx: grant(C, CLUSTER_NAME, O.DESCRIBE),
         lambda env, s, ctx: s.broker.DescribeAcls(broker_pb2.DescribeAclsRequest(
             filter=filter_to_proto(AclFilter()))).error_code, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, False),
    Case("DeleteAcls", lambda env: _setup_acl_to_delete(env, "acl-gone"), lambda ctx: grant(C, CLUSTER_NAME, O.ALTER),
         lambda env, s, ctx: s.broker.DeleteAcls(broker_pb2.DeleteAclsRequest(filters=[filter_to_proto(
             AclFilter(T, ctx["topic"], PatternType.LITERAL, principal="User:carol"))])).results[0].error_code,
         ErrorCode.CLUSTER_AUTHORIZATION_FAILED, True),
    # ---- TxnCoordinator ----
    Case("InitProducerId", lambda env: {"tid": "init-pid"}, lambda ctx: grant(X, ctx["tid"], O.WRITE),
         lambda env, s, ctx: s.txn.InitProducerId(txn_pb2.InitProducerIdRequest(
             transactional_id=ctx["tid"], transaction_timeout_ms=600000, producer_id=-1,
             producer_epoch=-1)).error_code, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
    Case("InitProducerId idempotent", lambda env: {}, lambda ctx: grant(C, CLUSTER_NAME, O.IDEMPOTENT_WRITE),
         lambda env, s, ctx: s.txn.InitProducerId(txn_pb2.InitProducerIdRequest(
             producer_id=-1, producer_epoch=-1)).error_code, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, False),
    Case("AddPartitionsToTxn", lambda env: _setup_txn(env, "add-partitions", add=False),
         lambda ctx: grant(X, ctx["tid"], O.WRITE) + grant(T, ctx["topic"], O.WRITE),
         lambda env, s, ctx: s.txn.AddPartitionsToTxn(txn_pb2.AddPartitionsToTxnRequest(
             transactional_id=ctx["tid"], producer_id=ctx["producer"][0], producer_epoch=ctx["producer"][1],
             partitions=_tp(ctx["topic"]))).error_code, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
    Case("AddOffsetsToTxn", lambda env: _setup_txn(env, "add-offsets", add=False),
         lambda ctx: grant(X, ctx["tid"], O.WRITE) + grant(G, ctx["group"], O.READ),
         lambda env, s, ctx: s.txn.AddOffsetsToTxn(txn_pb2.AddOffsetsToTxnRequest(
             transactional_id=ctx["tid"], producer_id=ctx["producer"][0], producer_epoch=ctx["producer"][1],
             group_id=ctx["group"])).error_code, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
    Case("EndTxn", lambda env: _setup_txn(env, "end-txn"), lambda ctx: grant(X, ctx["tid"], O.WRITE),
         lambda env, s, ctx: s.txn.EndTxn(txn_pb2.EndTxnRequest(
             transactional_id=ctx["tid"], producer_id=ctx["producer"][0], producer_epoch=ctx["producer"][1],
             committed=True)).error_code, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
    Case("InitParticipant", lambda env: _setup_txn(env, "participant"),
         lambda ctx: grant(X, ctx["tid"], O.WRITE) + grant(T, ctx["topic"], O.WRITE),
         lambda env, s, ctx: s.txn.InitParticipant(txn_pb2.InitParticipantRequest(
             transactional_id=ctx["tid"], producer_id=ctx["producer"][0], producer_epoch=ctx["producer"][1],
             partitions=_tp(ctx["topic"]))).error_code, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
    Case("ListTransactions", lambda env: _setup_txn(env, "listed"), lambda ctx: grant(X, ctx["tid"], O.DESCRIBE),
         _list_transactions_call, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, False),
    Case("DescribeTransactions", lambda env: _setup_txn(env, "described"),
         lambda ctx: grant(X, ctx["tid"], O.DESCRIBE),
         lambda env, s, ctx: s.txn.DescribeTransactions(txn_pb2.DescribeTransactionsRequest(
             transactional_ids=[ctx["tid"]])).transactions[0].error_code,
         ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, False),
    Case("AbortTransaction", lambda env: _setup_topic(env, "aborted"), lambda ctx: grant(C, CLUSTER_NAME, O.ALTER),
         lambda env, s, ctx: s.txn.AbortTransaction(txn_pb2.AbortTransactionRequest(
             partition=common_pb2.TopicPartition(topic=ctx["topic"], partition=0), producer_id=888_888,
             producer_epoch=1, coordinator_epoch=0)).error_code, ErrorCode.CLUSTER_AUTHORIZATION_FAILED, True),
    # ---- GroupCoordinator ----
    Case("FindCoordinator for a group", lambda env: {"group": "find-group"}, lambda ctx: grant(G, ctx["group"], O.DESCRIBE),
         lambda env, s, ctx: s.group.FindCoordinator(group_pb2.FindCoordinatorRequest(
             key_type=group_pb2.GROUP, keys=[ctx["group"]])).coordinators[0].error_code,
         ErrorCode.GROUP_AUTHORIZATION_FAILED, False),
    Case("FindCoordinator for a transaction", lambda env: {"tid": "find-txn"},
         lambda ctx: grant(X, ctx["tid"], O.DESCRIBE),
         lambda env, s, ctx: s.group.FindCoordinator(group_pb2.FindCoordinatorRequest(
             key_type=group_pb2.TRANSACTION, keys=[ctx["tid"]])).coordinators[0].error_code,
         ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, False),
    Case("JoinGroup", lambda env: {"group": "joined"}, lambda ctx: grant(G, ctx["group"], O.READ),
         lambda env, s, ctx: env.join(ctx["group"], s).error_code, ErrorCode.GROUP_AUTHORIZATION_FAILED, True),
    Case("SyncGroup", lambda env: _setup_joined_unsynced(env, "synced"), lambda ctx: grant(G, ctx["group"], O.READ),
         lambda env, s, ctx: s.group.SyncGroup(group_pb2.SyncGroupRequest(
             group_id=ctx["group"], generation_id=ctx["generation"], member_id=ctx["member"],
             assignments=[group_pb2.SyncGroupAssignment(member_id=ctx["member"], assignment=b"x")])).error_code,
         ErrorCode.GROUP_AUTHORIZATION_FAILED, True),
    Case("Heartbeat", lambda env: _setup_group_member(env, "heartbeat"), lambda ctx: grant(G, ctx["group"], O.READ),
         lambda env, s, ctx: s.group.Heartbeat(group_pb2.HeartbeatRequest(
             group_id=ctx["group"], generation_id=ctx["generation"], member_id=ctx["member"])).error_code,
         ErrorCode.GROUP_AUTHORIZATION_FAILED, False),
    Case("LeaveGroup", lambda env: _setup_group_member(env, "left"), lambda ctx: grant(G, ctx["group"], O.READ),
         lambda env, s, ctx: s.group.LeaveGroup(group_pb2.LeaveGroupRequest(
             group_id=ctx["group"], member_id=ctx["member"])).error_code, ErrorCode.GROUP_AUTHORIZATION_FAILED, True),
    Case("OffsetCommit", lambda env: _setup_topic(env, "committed", 5) | {"group": "committed"},
         lambda ctx: grant(G, ctx["group"], O.READ) + grant(T, ctx["topic"], O.READ),
         lambda env, s, ctx: s.group.OffsetCommit(group_pb2.OffsetCommitRequest(
             group_id=ctx["group"], generation_id=-1, offsets=[group_pb2.OffsetToCommit(
                 topic=ctx["topic"], partition=0, offset=3, leader_epoch=-1)])).partitions[0].error_code,
         ErrorCode.GROUP_AUTHORIZATION_FAILED, True),
    Case("TxnOffsetCommit", lambda env: _setup_txn_offsets(env, "txn-committed"),
         lambda ctx: grant(X, ctx["tid"], O.WRITE) + grant(G, ctx["group"], O.READ) + grant(T, ctx["topic"], O.READ),
         lambda env, s, ctx: s.group.TxnOffsetCommit(group_pb2.TxnOffsetCommitRequest(
             transactional_id=ctx["tid"], group_id=ctx["group"], producer_id=ctx["producer"][0],
             producer_epoch=ctx["producer"][1], generation_id=-1, offsets=[group_pb2.OffsetToCommit(
                 topic=ctx["topic"], partition=0, offset=0, leader_epoch=-1)])).partitions[0].error_code,
         ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, True),
    Case("OffsetFetch", lambda env: _setup_committed(env, "fetched"),
         lambda ctx: grant(G, ctx["group"], O.DESCRIBE) + grant(T, ctx["topic"], O.DESCRIBE),
         lambda env, s, ctx: s.group.OffsetFetch(group_pb2.OffsetFetchRequest(
             group_id=ctx["group"], partitions=_tp(ctx["topic"]))).error_code,
         ErrorCode.GROUP_AUTHORIZATION_FAILED, False),
    Case("OffsetFetch of all the group's offsets", lambda env: _setup_committed(env, "fetched-all"),
         lambda ctx: grant(G, ctx["group"], O.DESCRIBE) + grant(T, ctx["topic"], O.DESCRIBE),
         _offset_fetch_all_call, ErrorCode.GROUP_AUTHORIZATION_FAILED, False),
    Case("ListGroups", lambda env: _setup_group_member(env, "listed-group"), lambda ctx: grant(G, ctx["group"], O.DESCRIBE),
         _list_groups_call, ErrorCode.GROUP_AUTHORIZATION_FAILED, False),
    Case("DescribeGroups", lambda env: _setup_group_member(env, "described-group"),
         lambda ctx: grant(G, ctx["group"], O.DESCRIBE),
         lambda env, s, ctx: s.group.DescribeGroups(group_pb2.DescribeGroupsRequest(
             group_ids=[ctx["group"]])).groups[0].error_code, ErrorCode.GROUP_AUTHORIZATION_FAILED, False),
    Case("DeleteGroups", lambda env: _setup_committed(env, "deleted-group"),
         lambda ctx: grant(G, ctx["group"], O.DELETE),
         lambda env, s, ctx: s.group.DeleteGroups(group_pb2.DeleteGroupsRequest(
             group_ids=[ctx["group"]])).results[0].error_code, ErrorCode.GROUP_AUTHORIZATION_FAILED, True),
]


def _fetch_code(stubs: Stubs, ctx, replica: bool = False) -> int:
    response = stubs.broker.Fetch(broker_pb2.FetchRequest(
        max_wait_ms=0, min_bytes=1, is_replica=replica, replica_id=7 if replica else -1, partitions=[
            broker_pb2.FetchPartition(topic=ctx["topic"], partition=0, fetch_offset=0)]))
    result = response.partitions[0]
    if result.error_code == ErrorCode.TOPIC_AUTHORIZATION_FAILED:
        assert result.records == b"", "a refused fetch returns no records"
    elif not replica:
        assert result.records, "an allowed fetch reads the records"
    return result.error_code


def _setup_committed(env, name):
    env.create_topic(name)
    env.produce(name, 4)
    response = env.admin.group.OffsetCommit(group_pb2.OffsetCommitRequest(
        group_id=name, generation_id=-1, offsets=[group_pb2.OffsetToCommit(topic=name, partition=0, offset=2,
                                                                           leader_epoch=-1)]))
    assert response.partitions[0].error_code == ErrorCode.NONE, response
    return {"topic": name, "group": name}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    directory = tmp_path_factory.mktemp("acl-matrix")
    pki = make_pki(directory / "pki")
    broker = BrokerServer(directory / "data", port=0, config=broker_config(pki)).start()
    wait_for(lambda: broker.txn_coordinator.ready, "the transaction coordinator loaded")
    environment = Env(broker, pki)
    yield environment
    environment.close()
    broker.stop()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rpc_authorization(env, case: Case):
    ctx = case.setup(env)
    env.broker.authorizer.create(case.grants(ctx))
    for who in (BOB, ANONYMOUS):
        before = env.state()
        code = case.call(env, env.stubs[who], ctx)
        assert code == case.denied, f"{case.name} as {who}: {ErrorCode(code).name}"
        assert env.state() == before, f"{case.name} as {who} changed the broker's state"
    before = env.state()
    code = case.call(env, env.stubs[ALICE], ctx)
    assert code == case.allowed, f"{case.name} as {ALICE}: {ErrorCode(code).name}"
    if case.changes:
        wait_for(lambda: env.state() != before, f"{case.name} as {ALICE} changed the state")


def test_the_matrix_covers_every_rpc_of_the_three_services():
    covered = {c.name.split(" ")[0] for c in CASES}
    for service in (broker_pb2.DESCRIPTOR.services_by_name["Broker"], txn_pb2.DESCRIPTOR.services_by_name[
            "TxnCoordinator"], group_pb2.DESCRIPTOR.services_by_name["GroupCoordinator"]):
        missing = {m.name for m in service.methods} - covered
        assert not missing, f"{service.name}: no authorization case for {sorted(missing)}"
