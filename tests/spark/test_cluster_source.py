"""The Spark source on a 3-broker cluster: it reads each partition from its leader, also after
a leader was killed (real ZooKeeper, real broker processes)."""
from __future__ import annotations

import uuid

import pytest

import eos
from eos.local_cluster import LocalCluster, free_port
from eos.zookeeper import ZooKeeperServer
from tests.waits import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    base = tmp_path_factory.mktemp("spark-cluster")
    zookeeper = ZooKeeperServer(base / "zookeeper", port=free_port())
    zookeeper.start()
    try:
        zookeeper.wait_ready()
        c = LocalCluster(base / "brokers", brokers=3, zookeeper_connect=zookeeper.connect_string,
                         chroot=f"/eos-{uuid.uuid4().hex[:8]}",
                         # the module's end need not move leaders (a controlled shutdown costs ~15 s)
                         broker_config={"zookeeper.session.timeout.ms": "6000", "controlled.shutdown.enable": "false"})
        c.start()
        try:
            yield c
        finally:
            c.stop()
    finally:
        zookeeper.stop()


def test_batch_read_from_leaders_after_a_leader_is_killed(spark, cluster):
    topic = "spark-cluster"
    with eos.Admin(bootstrap=cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=3, replication_factor=3, config={"min.insync.replicas": "2"})
        wait_for(lambda: all(len(p["isr"]) == 3 for p in admin.describe_topic(topic)["partitions"]), "full ISRs")
        producer = eos.Producer(bootstrap=cluster.bootstrap, acks="all", enable_idempotence=True)
        for i in range(3000):
            producer.send(topic, value=str(i).encode(), partition=i % 3)
        producer.flush(60)
        producer.close()
        victim = admin.describe_topic(topic)["partitions"][0]["leader"]
        cluster.kill(victim)
        wait_for(lambda: all(p["leader"] not in (victim, -1) for p in admin.describe_topic(topic)["partitions"]),
                 "new leaders for every partition", timeout_s=40)
    rows = (spark.read.format("eos").option("bootstrap", cluster.bootstrap).option("subscribe", topic)
            .load().select("partition", "value").collect())
    values = sorted(int(bytes(r.value)) for r in rows)
    assert values == list(range(3000))
    assert {r.partition for r in rows} == {0, 1, 2}
