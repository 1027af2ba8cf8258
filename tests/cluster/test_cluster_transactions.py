"""Transactions on a 3-broker cluster (RF 3, min.insync.replicas 2): the transaction
coordinator is the leader of the id's __transaction_state partition; markers reach each
partition's leader; a transaction open while a leader dies commits or aborts as a whole."""
from __future__ import annotations


import grpc
import pytest

import eos
from eos.errors import ErrorCode
from eos.v1 import txn_pb2, txn_pb2_grpc
from tests.cluster.test_cluster_failover import CLUSTER_CONFIG, describe, read_all, wait_for_leader
from tests.waits import wait_for

TXN_CONFIG = {**CLUSTER_CONFIG, "min.insync.replicas": "2", "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(TXN_CONFIG)


def full_isr(admin, topic):
    return wait_for(lambda: (lambda ps: ps if ps and all(len(p["isr"]) == len(p["replicas"]) and p["leader"] >= 0
                                                         for p in ps) else None)(describe(admin, topic)),
                    f"{topic} with full ISRs", timeout_s=60)


def test_transactions_commit_and_abort_across_brokers(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("out", partitions=3, replication_factor=3)
        full_isr(admin, "out")
        producer = eos.Producer(bootstrap=cluster.bootstrap, transactional_id="copier-1")
        producer.init_transactions(timeout=120)
        with producer.transaction():
            for i in range(300):
                producer.send("out", value=f"c{i}".encode(), partition=i % 3)
        producer.begin_transaction()
        for i in range(30):
            producer.send("out", value=f"a{i}".encode(), partition=i % 3)
        producer.abort_transaction()
        producer.close()
        records = _read_committed(cluster, "out", 3, 300)
        assert sorted(r.value for r in records) == sorted(f"c{i}".encode() for i in range(300))
        leaders = {p["leader"] for p in describe(admin, "out")}
        assert len(leaders) > 1          # the markers went to more than one broker


def test_a_transaction_open_while_an_output_leader_dies_commits_whole(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("moving-out", partitions=2, replication_factor=3)
        before = full_isr(admin, "moving-out")
        producer = eos.Producer(bootstrap=cluster.bootstrap, transactional_id="mover", delivery_timeout_ms=120_000)
        producer.init_transactions(timeout=120)
        coordinator = _coordinator_of("mover", cluster)
        victim = next(p["leader"] for p in before if p["leader"] != coordinator)
        victim_partition = next(p["partition"] for p in before if p["leader"] == victim)
        producer.begin_transaction()
        for i in range(200):
            producer.send("moving-out", value=f"v{i}".encode(), partition=i % 2)
        producer.flush(60)
        cluster.kill(victim)
        wait_for_leader(admin, "moving-out", victim_partition, other_than=victim, timeout_s=60)
        for i in range(200, 400):
            producer.send("moving-out", value=f"v{i}".encode(), partition=i % 2)
        producer.commit_transaction(timeout=120)
        producer.close()
        records = _read_committed(cluster, "moving-out", 2, 400)
        assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(400))
        per_partition = {}
        for r in records:
            per_partition.setdefault(r.partition, []).append(int(r.value[1:]))
        assert all(values == sorted(values) for values in per_partition.values())


def _coordinator_of(transactional_id: str, cluster) -> int:
    from eos.net import ClusterMetadata
    metadata = ClusterMetadata(cluster.bootstrap)
    try:
        address = metadata.coordinator_address(transactional_id)
    finally:
        metadata.close()
    return next(b for b, p in cluster.processes.items() if p.address == address)


def _read_committed(cluster, topic, partitions, expected):
    records = read_all(cluster.bootstrap, topic, partitions, expected)
    return records


def test_the_coordinators_death_after_the_decision_still_commits(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("decided", partitions=3, replication_factor=3)
        full_isr(admin, "decided")
        producer = eos.Producer(bootstrap=cluster.bootstrap, transactional_id="decider")
        producer.init_transactions(timeout=120)
        coordinator = _coordinator_of("decider", cluster)
        producer.begin_transaction()
        for i in range(300):
            producer.send("decided", value=str(i).encode(), partition=i % 3)
        producer.commit_transaction(timeout=120)      # answered once PrepareCommit is written
        cluster.kill(coordinator)                      # markers may still be on their way
        producer.close()
        records = _read_committed(cluster, "decided", 3, 300)
        assert sorted(int(r.value) for r in records) == list(range(300))


def test_the_coordinators_death_before_the_decision_aborts_at_the_timeout(cluster):
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("undecided", partitions=1, replication_factor=3)
        full_isr(admin, "undecided")
        producer = eos.Producer(bootstrap=cluster.bootstrap, transactional_id="hesitant",
                                transaction_timeout_ms=3000)
        producer.init_transactions(timeout=120)
        coordinator = _coordinator_of("hesitant", cluster)
        producer.begin_transaction()
        for i in range(50):
            producer.send("undecided", value=b"never", partition=0)
        producer.flush(60)
        cluster.kill(coordinator)
        # the new coordinator expires the open transaction: the LSO moves past it
        wait_for(lambda: admin.list_offsets({("undecided", 0): "latest"}, isolation_level="read_committed")[
            eos.TopicPartition("undecided", 0)] >= 50, "the open transaction to be aborted", timeout_s=90)
        later = eos.Producer(bootstrap=cluster.bootstrap, transactional_id="hesitant")
        later.init_transactions(timeout=120)
        with later.transaction():
            later.send("undecided", value=b"after", partition=0)
        later.close()
        records = _read_committed(cluster, "undecided", 1, 1)
        assert [r.value for r in records] == [b"after"]


def test_every_coordinator_is_asked_so_live_transactions_are_listed_and_never_called_hanging(cluster):
    """Each broker coordinates the ids of the __transaction_state partitions it leads: a
    listing from one broker alone showed a third of the open transactions, and
    find-hanging called the rest hanging -- live transactions an operator would then abort."""
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic("spread", partitions=3, replication_factor=3)
        full_isr(admin, "spread")
        producers, coordinators = {}, {}
        for index in range(30):
            transactional_id = f"spread-{index}"
            producer = eos.Producer(bootstrap=cluster.bootstrap, transactional_id=transactional_id)
            producer.init_transactions(timeout=120)     # (the first also creates __transaction_state)
            coordinator = _coordinator_of(transactional_id, cluster)
            if list(coordinators.values()).count(coordinator) == 2:
                producer.close()
                continue
            producer.begin_transaction()
            producer.send("spread", value=b"open", partition=len(producers) % 3).result(timeout=60)
            producers[transactional_id], coordinators[transactional_id] = producer, coordinator
            if len(producers) == 6:
                break
        assert set(coordinators.values()) == set(cluster.processes)       # two ids on each broker
        listed = {t["transactional_id"]: t for t in admin.list_transactions(states=["Ongoing"])}
        assert {tid: (t["coordinator_id"], t["producer_id"]) for tid, t in listed.items()} == {
            tid: (coordinators[tid], p.producer_id) for tid, p in producers.items()}
        assert admin.describe_transaction("spread-0")["coordinator_id"] == coordinators["spread-0"]
        # another broker does not say "no such id" for it, but that it is not its coordinator
        other = next(b for b in cluster.processes if b != coordinators["spread-0"])
        with grpc.insecure_channel(cluster.processes[other].address) as channel:
            [answer] = txn_pb2_grpc.TxnCoordinatorStub(channel).DescribeTransactions(
                txn_pb2.DescribeTransactionsRequest(transactional_ids=["spread-0"]), timeout=30).transactions
        assert answer.error_code == ErrorCode.NOT_COORDINATOR
        assert admin.find_hanging_transactions("spread", max_duration_ms=0) == []
        for producer in producers.values():
            producer.abort_transaction(timeout=60)
            producer.close()
        assert admin.list_transactions(states=["Ongoing"]) == []
