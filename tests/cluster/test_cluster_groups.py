"""Consumer groups on a 3-broker cluster (RF 3, min.insync.replicas 2): the group
coordinator is the leader of the group's __consumer_offsets partition; when that broker
dies the partition's new leader replays the log and takes over, members find it, and
committed offsets -- plain and transactional, pending ones included -- survive the move."""
from __future__ import annotations

import pytest

import eos
from broker.group.records import OFFSETS_TOPIC, partition_for_group
from eos.errors import EosError
from eos.net import ClusterMetadata
from eos.v1 import group_pb2
from tests.cluster.test_cluster_failover import CLUSTER_CONFIG, describe, read_all, wait_for_leader
from tests.cluster.test_cluster_transactions import full_isr
from tests.waits import wait_for

GROUP_CONFIG = {**CLUSTER_CONFIG, "min.insync.replicas": "2", "group.initial.rebalance.delay.ms": "200",
                "group.min.session.timeout.ms": "500"}
MEMBER = dict(auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300, fetch_max_wait_ms=100)


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(GROUP_CONFIG)


def group_coordinator_of(cluster, group_id: str) -> int:
    metadata = ClusterMetadata(cluster.bootstrap)
    try:
        address = wait_for(lambda: _found(metadata, group_id), f"a coordinator for group {group_id!r}", timeout_s=60)
    finally:
        metadata.close()
    return next(b for b, p in cluster.processes.items() if p.address == address)


def _found(metadata, group_id):
    try:
        return metadata.coordinator_address(group_id, 2.0, key_type=group_pb2.GROUP)
    except EosError:
        return None


def produce(cluster, topic: str, values: list[bytes], partitions: int) -> None:
    with eos.Producer(bootstrap=cluster.bootstrap, acks="all", enable_idempotence=True) as producer:
        for i, value in enumerate(values):
            producer.send(topic, value=value, partition=i % partitions)
        producer.flush(60)


def test_the_group_coordinator_is_its_offsets_partition_leader_and_survives_its_death(cluster):
    group = "survivors"
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("in", partitions=3, replication_factor=3)
        full_isr(admin, "in")
        produce(cluster, "in", [f"a{i}".encode() for i in range(300)], 3)

        consumer = eos.Consumer(bootstrap=cluster.bootstrap, group_id=group, **MEMBER)
        consumer.subscribe(["in"])
        seen = []
        wait_for(lambda: seen.extend(consumer.poll(timeout_ms=50)) or len(seen) >= 300, "the first 300 records")
        consumer.commit()

        coordinator = group_coordinator_of(cluster, group)
        offsets = describe(admin, OFFSETS_TOPIC)
        assert len(offsets) == 50 and all(len(p["replicas"]) == 3 for p in offsets)
        assert offsets[partition_for_group(group, 50)]["leader"] == coordinator

        cluster.kill(coordinator)
        wait_for_leader(admin, OFFSETS_TOPIC, partition_for_group(group, 50), other_than=coordinator, timeout_s=60)
        # the live member finds the new coordinator and goes on consuming and committing
        produce(cluster, "in", [f"b{i}".encode() for i in range(150)], 3)
        wait_for(lambda: seen.extend(consumer.poll(timeout_ms=50)) or len(seen) >= 450, "the next 150 records",
                 timeout_s=90)
        wait_for(lambda: _committed_ok(consumer), "a commit to the new coordinator", timeout_s=60)
        consumer.close()
        assert sorted(r.value for r in seen) == sorted([f"a{i}".encode() for i in range(300)]
                                                       + [f"b{i}".encode() for i in range(150)])
        assert group_coordinator_of(cluster, group) != coordinator
        committed = admin.list_group_offsets(group)
        assert committed == {eos.TopicPartition("in", p): 150 for p in range(3)}

        # a second member of the group starts where the group is: nothing is read twice
        produce(cluster, "in", [f"c{i}".encode() for i in range(30)], 3)
        later = eos.Consumer(bootstrap=cluster.bootstrap, group_id=group, **MEMBER)
        later.subscribe(["in"])
        rest = []
        wait_for(lambda: rest.extend(later.poll(timeout_ms=50)) or len(rest) >= 30, "the last 30 records")
        later.close()
        assert sorted(r.value for r in rest) == sorted(f"c{i}".encode() for i in range(30))


def test_a_static_member_keeps_its_generation_and_assignment_across_a_coordinator_move(cluster):
    """Kafka loads a group Stable on the new coordinator; its members heartbeat on with the
    same generation, so nothing rebalances and every assignment stays where it was."""
    group = "static-survivors"
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("static-in", partitions=4, replication_factor=3)
        full_isr(admin, "static-in")
        members = [eos.Consumer(bootstrap=cluster.bootstrap, group_id=group, group_instance_id=f"worker-{i}", **MEMBER)
                   for i in range(2)]
        for member in members:
            member.subscribe(["static-in"])

        def stable_description():
            for member in members:
                member.poll(timeout_ms=20)
            try:
                described = admin.describe_group(group)
            except EosError:
                return None
            assigned = sum(len(m["assignment"]) for m in described["members"])
            return described if described["state"] == "Stable" and assigned == 4 else None
        before = wait_for(stable_description, "a stable group of two static members")
        coordinator = group_coordinator_of(cluster, group)
        cluster.kill(coordinator)
        wait_for_leader(admin, OFFSETS_TOPIC, partition_for_group(group, 50), other_than=coordinator, timeout_s=60)
        produce(cluster, "static-in", [f"s{i}".encode() for i in range(40)], 4)
        seen = []
        wait_for(lambda: seen.extend(r for m in members for r in m.poll(timeout_ms=20)) or len(seen) >= 40,
                 "the records after the move")
        after = wait_for(stable_description, "the group stable on the new coordinator")
        for member in members:
            member.close()
        assert group_coordinator_of(cluster, group) != coordinator
        assert after["generation"] == before["generation"]
        assignment = {m["group_instance_id"]: m["assignment"] for m in before["members"]}
        assert {m["group_instance_id"]: m["assignment"] for m in after["members"]} == assignment


def _committed_ok(consumer) -> bool:
    try:
        consumer.commit(timeout_ms=5000)
        return True
    except EosError:
        return False


def test_transactional_offsets_pending_when_the_group_coordinator_dies_commit_with_the_transaction(cluster):
    group = "copier-group"
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("src", partitions=1, replication_factor=3)
        admin.create_topic("dst", partitions=1, replication_factor=3)
        full_isr(admin, "src")
        full_isr(admin, "dst")
        coordinator = group_coordinator_of(cluster, group)
        producer = eos.Producer(bootstrap=cluster.bootstrap, transactional_id="offsets-mover",
                                delivery_timeout_ms=120_000)
        producer.init_transactions(timeout=120)

        with producer.transaction():            # a committed transaction: its offsets are durable
            producer.send("dst", value=b"first", partition=0)
            producer.send_offsets_to_transaction({eos.TopicPartition("src", 0): 10}, group, timeout=120)
        assert admin.list_group_offsets(group, require_stable=True) == {eos.TopicPartition("src", 0): 10}

        producer.begin_transaction()             # one open when the group coordinator dies
        producer.send("dst", value=b"second", partition=0)
        producer.send_offsets_to_transaction({eos.TopicPartition("src", 0): 25}, group, timeout=120)
        producer.flush(60)
        cluster.kill(coordinator)
        producer.commit_transaction(timeout=120)
        producer.close()

        wait_for_leader(admin, OFFSETS_TOPIC, partition_for_group(group, 50), other_than=coordinator, timeout_s=60)
        offsets = wait_for(lambda: _stable_offsets(admin, group), "the group's offsets on the new coordinator",
                           timeout_s=90)
        assert offsets == {eos.TopicPartition("src", 0): 25}
        assert sorted(r.value for r in read_all(cluster.bootstrap, "dst", 1, 2)) == [b"first", b"second"]


def test_transactional_offsets_of_an_aborted_transaction_stay_invisible_after_the_move(cluster):
    group = "aborter-group"
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("src2", partitions=1, replication_factor=3)
        full_isr(admin, "src2")
        coordinator = group_coordinator_of(cluster, group)
        producer = eos.Producer(bootstrap=cluster.bootstrap, transactional_id="offsets-aborter")
        producer.init_transactions(timeout=120)
        with producer.transaction():
            producer.send_offsets_to_transaction({eos.TopicPartition("src2", 0): 7}, group, timeout=120)
        producer.begin_transaction()
        producer.send_offsets_to_transaction({eos.TopicPartition("src2", 0): 99}, group, timeout=120)
        cluster.kill(coordinator)
        producer.abort_transaction(timeout=120)
        producer.close()
        offsets = wait_for(lambda: _stable_offsets(admin, group), "the group's offsets on the new coordinator",
                           timeout_s=90)
        assert offsets == {eos.TopicPartition("src2", 0): 7}


def _stable_offsets(admin, group):
    try:
        return admin.list_group_offsets(group, require_stable=True) or None
    except EosError:
        return None
