"""Two answers the web console is built on, against real in-process brokers: Kafka's
DescribeLogDirs (sizes of the replicas per log dir, an offline dir marked KAFKA_STORAGE_ERROR
with its cause, DESCRIBE on the cluster required) and KIP-430's cluster authorized operations
on Metadata (every cluster operation without an authorizer; with one, exactly what the ACLs
give the caller)."""
from __future__ import annotations

import os
import shutil

import grpc
import pytest

import eos
from broker.acl import CLUSTER_NAME, Operation, ResourceType
from broker.server import BrokerServer
from eos import TopicPartition
from eos.errors import ErrorCode
from eos.v1 import broker_pb2, broker_pb2_grpc
from tests.integration.test_acl_matrix import ADMIN, ALICE, BOB, broker_config, grant, make_pki
from tests.integration.test_acls import _admin

C, O = ResourceType.CLUSTER, Operation
CLUSTER_OPERATIONS = {O.CREATE, O.ALTER, O.DESCRIBE, O.CLUSTER_ACTION, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS,
                      O.IDEMPOTENT_WRITE}


def _segment_bytes(partition_dir) -> int:
    return sum(os.path.getsize(os.path.join(partition_dir, n)) for n in os.listdir(partition_dir) if n.endswith(".log"))


def test_log_dirs_show_each_replica_size_and_an_offline_dir(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b"]
    server = BrokerServer(dirs[0], port=0, config={"log.dirs": ",".join(map(str, dirs)),
                                                   "log.retention.check.interval.ms": "3600000"}).start()
    try:
        with eos.Admin(server.address) as admin, eos.Producer(server.address, linger_ms=0) as producer:
            admin.create_topic("sized", partitions=4)
            for partition in range(4):
                for _ in range(partition + 1):      # different sizes per partition
                    producer.send("sized", value=b"v" * 1000, partition=partition)
            producer.flush()
            assert admin.describe_cluster(include_authorized_operations=True)["authorized_operations"] \
                == CLUSTER_OPERATIONS           # no authorizer: everything
            assert "authorized_operations" not in admin.describe_cluster()

            [(broker_id, by_dir)] = admin.describe_log_dirs().items()
            assert broker_id == 0 and sorted(by_dir) == sorted(str(d) for d in dirs)
            sizes = {}
            for path, described in by_dir.items():
                assert described["error"] is None and described["total_bytes"] >= described["usable_bytes"] > 0
                for tp, replica in described["replicas"].items():
                    if tp.topic == "sized":
                        assert replica["size_bytes"] == _segment_bytes(os.path.join(path, f"sized-{tp.partition}"))
                        assert replica["offset_lag"] == 0 and replica["is_future"] is False
                        sizes[tp.partition] = replica["size_bytes"]
            assert sorted(sizes) == [0, 1, 2, 3] and sizes[0] < sizes[1] < sizes[2] < sizes[3]

            # one topic's partitions asked for: the others are left out, every dir still listed
            with grpc.insecure_channel(server.address) as channel:
                only = broker_pb2_grpc.BrokerStub(channel).DescribeLogDirs(broker_pb2.DescribeLogDirsRequest(
                    topics=[broker_pb2.DescribableLogDirTopic(topic="sized", partitions=[1])]))
            assert [(t.name, [p.partition for p in t.partitions]) for d in only.results for t in d.topics] \
                == [("sized", [1])] and len(only.results) == 2

            on_b = {TopicPartition("sized", p) for p in range(4) if (dirs[1] / f"sized-{p}").exists()}
            shutil.rmtree(dirs[1])                  # the disk is gone
            server._log_manager.run_housekeeping()  # the broker's probe, run now
            by_dir = admin.describe_log_dirs([0])[0]
            failed = by_dir[str(dirs[1])]
            assert failed["error"].code == ErrorCode.KAFKA_STORAGE_ERROR and "offline" in str(failed["error"])
            assert failed["replicas"] == {} and failed["total_bytes"] is None
            assert by_dir[str(dirs[0])]["error"] is None
            assert not on_b & set(by_dir[str(dirs[0])]["replicas"])
    finally:
        server.stop()


@pytest.fixture
def pki(tmp_path):
    return make_pki(tmp_path / "pki")


def test_authorized_operations_and_log_dirs_follow_the_acls(tmp_path, pki):
    server = BrokerServer(tmp_path / "data", port=0, config=broker_config(pki)).start()
    try:
        server.authorizer.create(grant(C, CLUSTER_NAME, O.ALTER, principal=ALICE))
        operations = {}
        for who in (ADMIN, ALICE, BOB):
            with _admin(pki, server, who) as admin:
                operations[who] = admin.describe_cluster(include_authorized_operations=True)["authorized_operations"]
        # ALTER implies DESCRIBE (Kafka's rule); the super user may do everything
        assert operations == {ADMIN: CLUSTER_OPERATIONS, ALICE: {O.ALTER, O.DESCRIBE}, BOB: set()}
        with _admin(pki, server, ALICE) as admin:
            assert admin.describe_log_dirs()[0]       # DESCRIBE on the cluster: allowed
        with _admin(pki, server, BOB) as admin, pytest.raises(eos.errors.EosError) as refused:
            admin.describe_log_dirs()
        assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and "User:bob" in str(refused.value)
    finally:
        server.stop()
