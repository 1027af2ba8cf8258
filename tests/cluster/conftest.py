"""Fixtures of the cluster tests: one real Apache ZooKeeper per test module.

`cluster_factory(broker_config, brokers=3, **options)` -> eos.local_cluster.LocalCluster
    Started brokers under a fresh chroot of the module's ZooKeeper; stopped at teardown.
    `options` are LocalCluster's (metrics_base_port=0: each broker's metrics on a free port).

`zookeeper` (module scope) -> eos.zookeeper.ZooKeeperServer
    A standalone ZooKeeper on a free 127.0.0.1 port with a temp data dir (jars fetched from
    Maven Central and cached on first use), stopped at the end of the module. Tests keep
    out of each other's way by rooting their clusters in a chroot of their own
    (`LocalCluster(..., zookeeper_connect=zookeeper.connect_string, chroot="/unique")`).
    A test may restart it (`stop()` / `start()` / `wait_ready()`); the fixture makes sure it
    is running again for the next test.
"""
from __future__ import annotations

import uuid

import pytest

from eos.local_cluster import LocalCluster, free_port
from eos.zookeeper import ZooKeeperServer


@pytest.fixture(scope="module")
def zookeeper_server(tmp_path_factory):
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), port=free_port())
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def zookeeper(zookeeper_server):
    if zookeeper_server.process is None or zookeeper_server.process.poll() is not None:
        zookeeper_server.start()
        zookeeper_server.wait_ready()
    yield zookeeper_server


@pytest.fixture
def cluster_factory(zookeeper, tmp_path):
    started = []

    def start(broker_config: dict, brokers: int = 3, **options) -> LocalCluster:
        cluster = LocalCluster(tmp_path / f"cluster-{len(started)}", brokers=brokers, broker_config=dict(broker_config),
                               zookeeper_connect=zookeeper.connect_string, chroot=f"/eos-{uuid.uuid4().hex[:8]}",
                               **options)
        started.append(cluster)
        cluster.start()
        return cluster
    try:
        yield start
    finally:
        for cluster in started:
            cluster.stop()
