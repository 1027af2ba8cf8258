"""A leader's ISR write that meets a moved znode version (ClusterNode._write_isr).

The ZooKeeper store is replaced by an in-memory one that keeps versioned states the way the
real znodes do (a write at another version is refused): the test breaks one thing on
purpose, a controller rewriting the state behind the leader's back."""
from __future__ import annotations

import pytest

from broker.cluster_node import ClusterNode
from broker.metadata.types import LeaderIsr
from broker.metadata.zk_store import StateVersionConflict
from broker.server import BrokerConfig

TP = ("orders", 0)


class VersionedStates:
    """Partition states with znode versions: a write must name the current version."""

    def __init__(self, state: LeaderIsr):
        self.state, self.version = state, 0
        self.notified: list = []

    def update_partition_states(self, updates, epoch_zk_version):
        results = {}
        for tp, (state, expected_version) in updates.items():
            if expected_version != self.version:
                results[tp] = StateVersionConflict(f"{tp}: state changed meanwhile")
                continue
            self.state, self.version = state, self.version + 1
            results[tp] = self.version
        return results

    def partition_state(self, topic, partition):
        return self.state, self.version

    def write_isr_change_notification(self, partitions):
        self.notified += list(partitions)


def node_with(store: VersionedStates) -> ClusterNode:
    node = ClusterNode(0, BrokerConfig.from_dict({}), host="127.0.0.1", now_ms_fn=lambda: 0)
    node.store = store
    return node


def test_a_rewrite_at_the_same_leader_epoch_is_written_over_at_the_new_version():
    store = VersionedStates(LeaderIsr(0, 5, (0, 1), 3))
    store.state, store.version = LeaderIsr(0, 5, (0, 1), 4), 1      # a new controller rewrote it
    version = node_with(store)._write_isr(*TP, 0, 5, (0, 1, 2), 3, 0)  # the leader's cached version: 0
    assert version == 2 and store.state == LeaderIsr(0, 5, (0, 1, 2), 4)
    assert store.notified == [TP]


@pytest.mark.parametrize("moved", [LeaderIsr(1, 6, (1, 2), 4), LeaderIsr(0, 6, (0, 1), 4)])
def test_a_changed_leadership_still_refuses_the_write(moved):
    store = VersionedStates(LeaderIsr(0, 5, (0, 1), 3))
    store.state, store.version = moved, 1
    with pytest.raises(StateVersionConflict):
        node_with(store)._write_isr(*TP, 0, 5, (0, 1, 2), 3, 0)
    assert store.state == moved and store.notified == []
