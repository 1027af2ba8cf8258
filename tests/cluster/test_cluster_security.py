"""Security on a ZooKeeper cluster: TLS listeners with per-listener endpoints in the brokers'
registrations, mutual TLS between brokers, and ACLs kept in ZooKeeper that every broker
follows (broker/zk_acls.py).

The three-broker cluster here has one listener per broker, SSL, used by clients and brokers
alike; each broker shows its own certificate (CN=broker, a super user) to the others, and the
clients theirs (User:CN=admin, a super user; User:CN=alice, who gets only what an ACL grants).
"""
from __future__ import annotations

import json
import uuid

import grpc
import pytest

import eos
from broker.acl import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from broker.server import BrokerServer
from broker.zk_acls import LITERAL_ROOT, PREFIXED_ROOT
from eos import TopicPartition
from eos.client_config import security_of
from eos.errors import EosError, ErrorCode, TopicAuthorizationFailedError
from eos.local_cluster import LocalCluster, _ensure_chroot
from eos.net import open_channel
from eos.tls_certs import make_local_tls
from eos.v1 import broker_pb2, broker_pb2_grpc, cluster_pb2, cluster_pb2_grpc, common_pb2, group_pb2, group_pb2_grpc
from tests.integration.test_acls import copy_input_to_output
from tests.waits import wait_for

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
O = Operation
ALICE = "User:CN=alice"


def grant(resource_type, name, *operations, pattern=PatternType.LITERAL) -> list[AclBinding]:
    return [AclBinding(resource_type, name, pattern, ALICE, "*", op, Permission.ALLOW) for op in operations]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    return make_local_tls(tmp_path_factory.mktemp("tls"), clients={"admin": "admin", "alice": "alice"})


@pytest.fixture(scope="module")
def cluster(zookeeper_server, tmp_path_factory, tls):
    """One TLS cluster with an authorizer for the module (each test uses topics of its own)."""
    config = {**tls.broker_config(), "authorizer.class.name": "kafka.security.authorizer.AclAuthorizer",
              "super.users": "User:CN=broker;User:CN=admin", "group.initial.rebalance.delay.ms": "0",
              "controlled.shutdown.enable": "false"}      # the module's end need not move leaders
    local = LocalCluster(tmp_path_factory.mktemp("tls-cluster"), brokers=3, broker_config=config,
                         zookeeper_connect=zookeeper_server.connect_string, chroot=f"/eos-{uuid.uuid4().hex[:8]}",
                         listener_protocol="SSL", client_config=tls.client_config("admin"))
    local.start()
    try:
        yield local
    finally:
        local.stop()


def _address(cluster, broker_id: int) -> str:
    return cluster.processes[broker_id].address


def _zookeeper(cluster):
    from kazoo.client import KazooClient
    client = KazooClient(hosts=cluster.connect_string)
    client.start(timeout=30)
    return client


def test_a_transactional_copier_on_a_tls_cluster_with_exactly_its_acls(cluster, tls):
    admin_config = tls.client_config("admin")
    with eos.Admin(_address(cluster, 0), config=admin_config) as admin:
        admin.create_topic("input", partitions=2, replication_factor=3)
        admin.create_topic("output", partitions=2, replication_factor=3)
        # What kafka-acls.sh --consumer and --producer --transactional-id would give, made on broker 0.
        admin.create_acls(grant(T, "input", O.READ) + grant(G, "copier", O.READ)
                          + grant(T, "output", O.WRITE) + grant(X, "copier-0", O.WRITE))
    expected = [f"record-{i}".encode() for i in range(60)]
    with eos.Producer(cluster.bootstrap, config={**admin_config, "acks": "all"}) as producer:
        for value in expected:
            producer.send("input", value=value)
        producer.flush()

    # The copier starts at broker 2: the ACLs made on broker 0 reached it through ZooKeeper.
    copy_input_to_output(_address(cluster, 2), tls.client_config("alice"), len(expected))

    with eos.Admin(cluster.bootstrap, config=admin_config) as admin:
        ends = admin.list_offsets({("output", p): "latest" for p in range(2)}, isolation_level="read_committed")
        committed = admin.list_group_offsets("copier", require_stable=True)
        input_ends = admin.list_offsets({("input", p): "latest" for p in range(2)})
    assert {tp: committed.get(tp, 0) for tp in input_ends} == input_ends
    values = []
    with eos.Consumer(cluster.bootstrap, config={**admin_config, "auto.offset.reset": "earliest",
                                                 "isolation.level": "read_committed"}) as consumer:
        consumer.assign([("output", p) for p in range(2)])
        wait_for(lambda: values.extend(r.value for r in consumer.poll(200))
                 or all(consumer.position(tp) >= end for tp, end in ends.items()), "output read to its end")
    assert sorted(values) == sorted(expected)


def test_acls_live_in_zookeeper_in_kafkas_layout_and_every_broker_follows_them(cluster, tls):
    alice = tls.client_config("alice")
    with eos.Admin(_address(cluster, 0), config=tls.client_config("admin")) as admin:
        admin.create_topic("followed", partitions=1, replication_factor=3)

    def alice_can_describe(broker_id: int) -> bool:
        with eos.Admin(_address(cluster, broker_id), config={**alice, "default.api.timeout.ms": 5000}) as as_alice:
            try:
                as_alice.describe_topic("followed")
                return True
            except TopicAuthorizationFailedError:
                return False

    assert not any(alice_can_describe(b) for b in range(3))
    with eos.Admin(_address(cluster, 1), config=tls.client_config("admin")) as admin:
        admin.create_acls(grant(T, "follow", O.DESCRIBE, pattern=PatternType.PREFIXED))
    for broker_id in range(3):
        wait_for(lambda: alice_can_describe(broker_id), f"broker {broker_id} applies the ACL made on broker 1")

    zk = _zookeeper(cluster)
    try:
        data, _ = zk.get(f"{PREFIXED_ROOT}/Topic/follow")
        assert json.loads(data) == {"version": 1, "acls": [
            {"principal": ALICE, "permissionType": "Allow", "operation": "Describe", "host": "*"}]}
        assert zk.get_children("/kafka-acl-extended-changes"), "a change notification was written"
        assert zk.exists(f"{LITERAL_ROOT}/Topic/follow") is None

        # A name that cannot be a znode is refused alone; the other ACL of the call is made.
        with eos.Admin(_address(cluster, 0), config=tls.client_config("admin")) as admin:
            with pytest.raises(EosError, match="ZooKeeper node name"):
                admin.create_acls(grant(T, "elsewhere", O.WRITE) + grant(G, "team/a", O.READ))
            made = admin.describe_acls(AclFilter(T, "elsewhere"))
        assert [(b.resource_name, b.operation) for b in made] == [("elsewhere", O.WRITE)]
        assert zk.exists(f"{LITERAL_ROOT}/Group/team") is None
    finally:
        zk.stop()
        zk.close()

    with eos.Admin(_address(cluster, 2), config=tls.client_config("admin")) as admin:
        admin.delete_acls([AclFilter(T, "follow", PatternType.PREFIXED)])
    for broker_id in range(3):
        wait_for(lambda: not alice_can_describe(broker_id), f"broker {broker_id} drops the deleted ACL")


def test_a_client_without_cluster_action_cannot_speak_for_the_controller(cluster, tls):
    """Alice's certificate is valid, but only a broker (CLUSTER_ACTION) may send the
    controller's and brokers' requests, and only an operator (ALTER, DESCRIBE) elect leaders
    or move replicas: each is refused and the broker's metadata stays what it was."""
    with eos.Admin(_address(cluster, 0), config=tls.client_config("admin")) as admin:
        admin.create_topic("guarded", partitions=1, replication_factor=3)
    channel = open_channel(_address(cluster, 0), security_of(tls.client_config("alice")))
    admin_channel = open_channel(_address(cluster, 0), security_of(tls.client_config("admin")))
    try:
        stub = cluster_pb2_grpc.ClusterStub(channel)
        wait_for(lambda: broker_pb2_grpc.BrokerStub(admin_channel).Metadata(broker_pb2.MetadataRequest(
            topics=["guarded"]), timeout=10).topics[0].partitions[0].leader_id >= 0, "guarded has a leader")
        before = broker_pb2_grpc.BrokerStub(admin_channel).Metadata(broker_pb2.MetadataRequest(), timeout=10)
        tp = common_pb2.TopicPartition(topic="guarded", partition=0)
        calls = {
            "UpdateMetadata": cluster_pb2.UpdateMetadataRequest(controller_id=99, controller_epoch=1_000_000, full=True),
            "LeaderAndIsr": cluster_pb2.LeaderAndIsrRequest(controller_id=99, controller_epoch=1_000_000, partitions=[
                cluster_pb2.PartitionLeaderState(topic="guarded", partition=0, leader=99, leader_epoch=1_000)]),
            "StopReplica": cluster_pb2.StopReplicaRequest(controller_id=99, controller_epoch=1_000_000, partitions=[tp],
                                                          delete_partitions=True),
            "ControlledShutdown": cluster_pb2.ControlledShutdownRequest(broker_id=0, broker_epoch=0),
            "ElectLeaders": cluster_pb2.ElectLeadersRequest(election_type=cluster_pb2.UNCLEAN, all_partitions=True),
            "AlterPartitionReassignments": cluster_pb2.AlterPartitionReassignmentsRequest(reassignments=[
                cluster_pb2.Reassignment(topic="guarded", partition=0, replicas=[0])]),
            "ListPartitionReassignments": cluster_pb2.ListPartitionReassignmentsRequest(),
        }
        for method, request in calls.items():
            answer = getattr(stub, method)(request, timeout=10)
            assert answer.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED, method
        answer = stub.OffsetsForLeaderEpoch(cluster_pb2.OffsetsForLeaderEpochRequest(
            partitions=[cluster_pb2.EpochQuery(topic="guarded", partition=0, current_leader_epoch=-1, leader_epoch=0)]),
            timeout=10)
        assert [p.error_code for p in answer.partitions] == [ErrorCode.CLUSTER_AUTHORIZATION_FAILED]
        after = broker_pb2_grpc.BrokerStub(admin_channel).Metadata(broker_pb2.MetadataRequest(), timeout=10)
        assert after.controller_id == before.controller_id != 99
        assert sorted(b.node_id for b in after.brokers) == [0, 1, 2]
        [input_topic] = [t for t in after.topics if t.name == "guarded"]
        assert [(p.partition, p.leader_id, len(p.replica_ids)) for p in input_topic.partitions] == [
            (p.partition, p.leader_id, 3) for p in next(t for t in before.topics if t.name == "guarded").partitions]
    finally:
        channel.close()
        admin_channel.close()


def test_metadata_and_find_coordinator_answer_on_the_listener_the_client_used(zookeeper_server, tmp_path, tls):
    """A broker with a PLAINTEXT listener (inter-broker) and an SSL one registers both; a
    client that came in over SSL is told SSL addresses, one over PLAINTEXT PLAINTEXT ones."""
    chroot = f"/eos-{uuid.uuid4().hex[:8]}"
    _ensure_chroot(zookeeper_server.connect_string, chroot)
    broker = BrokerServer(tmp_path / "data", node_id=5, config={
        **tls.broker_config(), "zookeeper.connect": zookeeper_server.connect_string + chroot,
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0", "inter.broker.listener.name": "PLAINTEXT",
        "group.initial.rebalance.delay.ms": "0", "controlled.shutdown.enable": "false"}).start()
    try:
        zk_client = broker._cluster.store.client
        registration = json.loads(zk_client.get("/brokers/ids/5")[0])
        assert registration["listener_security_protocol_map"] == {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL"}
        assert registration["endpoints"] == [f"PLAINTEXT://{broker.address_of('PLAINTEXT')}",
                                             f"SSL://{broker.address_of('SSL')}"]
        ssl_channel = open_channel(broker.address_of("SSL"), security_of(tls.client_config("admin")))
        plain_channel = grpc.insecure_channel(broker.address_of("PLAINTEXT"))
        try:
            for channel, listener in ((ssl_channel, "SSL"), (plain_channel, "PLAINTEXT")):
                wait_for(lambda: broker_pb2_grpc.BrokerStub(channel).Metadata(
                    broker_pb2.MetadataRequest(), timeout=10).brokers, "the controller's metadata arrived")
                answer = broker_pb2_grpc.BrokerStub(channel).Metadata(broker_pb2.MetadataRequest(), timeout=10)
                assert [f"{b.host}:{b.port}" for b in answer.brokers] == [broker.address_of(listener)]
                group = group_pb2_grpc.GroupCoordinatorStub(channel)

                def found():
                    reply = group.FindCoordinator(group_pb2.FindCoordinatorRequest(
                        key_type=group_pb2.GROUP, keys=["g"]), timeout=10).coordinators[0]
                    return reply if reply.error_code == ErrorCode.NONE else None
                coordinator = wait_for(found, "the group coordinator is elected")
                assert f"{coordinator.host}:{coordinator.port}" == broker.address_of(listener)
        finally:
            ssl_channel.close()
            plain_channel.close()
    finally:
        broker.stop()


def test_scram_credentials_and_quotas_live_in_zookeeper_for_every_broker(zookeeper_server, tmp_path, tls):
    """Two brokers, each with a PLAINTEXT listener (inter-broker, loopback) and a SASL_SSL one:
    a credential and a quota set through one broker are Kafka's /config/users znode, and the
    other broker logs the user in and holds it to the quota."""
    from broker.quotas import QuotaEntity
    from eos.errors import SaslAuthenticationError

    chroot = f"/eos-{uuid.uuid4().hex[:8]}"
    _ensure_chroot(zookeeper_server.connect_string, chroot)
    config = {"ssl.certificate.location": tls.broker_config()["ssl.certificate.location"],
              "ssl.key.location": tls.broker_config()["ssl.key.location"],
              "zookeeper.connect": zookeeper_server.connect_string + chroot,
              "listeners": "PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0", "inter.broker.listener.name": "PLAINTEXT",
              "sasl.enabled.mechanisms": "SCRAM-SHA-256", "group.initial.rebalance.delay.ms": "0",
              "controlled.shutdown.enable": "false"}      # not what this test is about: stop at once
    brokers = []
    try:
        for node_id in (21, 22):
            brokers.append(BrokerServer(tmp_path / f"b{node_id}", node_id=node_id, config=config).start())
        first, second = brokers

        def sasl(broker, password):
            return {"security.protocol": "SASL_SSL", "ssl.ca.location": tls.client_config("admin")["ssl.ca.location"],
                    "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": password,
                    "default.api.timeout.ms": 5000, "request.timeout.ms": 3000}

        with eos.Admin(first.address_of("PLAINTEXT")) as admin:
            admin.upsert_scram_credential("alice", "alice-secret", mechanism="SCRAM-SHA-256", iterations=4096)
            admin.alter_client_quotas([({"user": "alice"}, {"producer_byte_rate": 2048.0})])

        stored = json.loads(first._cluster.store.client.get("/config/users/alice")[0])["config"]
        assert stored["producer_byte_rate"] == "2048"
        assert stored["SCRAM-SHA-256"].startswith("salt=") and "iterations=4096" in stored["SCRAM-SHA-256"]

        def logs_in_at_second() -> bool:
            try:
                with eos.Admin(second.address_of("SASL_SSL"), config=sasl(second, "alice-secret")) as as_alice:
                    as_alice.list_topics()
                return True
            except SaslAuthenticationError:
                return False
        wait_for(logs_in_at_second, "the credential made at broker 21 logs alice in at broker 22")
        with pytest.raises(SaslAuthenticationError):
            with eos.Admin(second.address_of("SASL_SSL"), config=sasl(second, "wrong")) as as_mallory:
                as_mallory.list_topics()
        wait_for(lambda: second._quotas.describe().get(QuotaEntity("alice", None)) == {"producer_byte_rate": 2048.0},
                 "broker 22 holds alice to the quota set at broker 21")
        with eos.Admin(second.address_of("PLAINTEXT")) as admin:
            assert ({"user": "alice"}, {"producer_byte_rate": 2048.0}) in admin.describe_client_quotas()
            admin.delete_scram_credential("alice", mechanism="SCRAM-SHA-256")
        wait_for(lambda: first._scram_users.credential("alice", "SCRAM-SHA-256") is None,
                 "the deletion at broker 22 reaches broker 21")
        assert json.loads(first._cluster.store.client.get("/config/users/alice")[0])["config"] == {
            "producer_byte_rate": "2048"}, "deleting the credential keeps the user's quota"
    finally:
        for broker in brokers:
            broker.stop()
