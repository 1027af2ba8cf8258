"""A leader's ISR write that meets a moved znode version (ClusterNode._write_isr), against
the module's real ZooKeeper: the state znode is rewritten behind the leader's back, as a new
controller does, and the leader must write over it while the leadership is still its own."""
from __future__ import annotations

import uuid

import pytest

from broker.cluster_node import ClusterNode
from broker.metadata.types import LeaderIsr
from broker.metadata.zk_store import StateVersionConflict, ZkStore, decode_leader_isr, encode_leader_isr, state_path
from broker.config import BrokerConfig


@pytest.fixture
def store(zookeeper):
    opened = ZkStore(zookeeper.connect_string)
    opened.start()
    yield opened
    opened.close()


def leader_node(store: ZkStore) -> ClusterNode:
    node = ClusterNode(0, BrokerConfig.from_dict({}), host="127.0.0.1", now_ms_fn=lambda: 0)
    node.store = store
    return node


def state_written(store: ZkStore, tp, state: LeaderIsr) -> None:
    store.client.create(state_path(*tp), encode_leader_isr(state), makepath=True)


def state_now(store: ZkStore, tp) -> tuple[LeaderIsr, int]:
    data, stat = store.client.get(state_path(*tp))
    return decode_leader_isr(data), stat.version


def test_a_rewrite_at_the_same_leader_epoch_is_written_over_at_the_new_version(store):
    tp = (f"isr-{uuid.uuid4().hex[:8]}", 0)
    state_written(store, tp, LeaderIsr(0, 5, (0, 1), 3))               # version 0, cached by the leader
    store.client.set(state_path(*tp), encode_leader_isr(LeaderIsr(0, 5, (0, 1), 4)))  # a new controller
    version = leader_node(store)._write_isr(*tp, 0, 5, (0, 1, 2), 3, 0)
    assert state_now(store, tp) == (LeaderIsr(0, 5, (0, 1, 2), 4), 2) and version == 2


@pytest.mark.parametrize("moved", [LeaderIsr(1, 6, (1, 2), 4), LeaderIsr(0, 6, (0, 1), 4)])
def test_a_changed_leadership_still_refuses_the_write(store, moved):
    tp = (f"isr-{uuid.uuid4().hex[:8]}", 0)
    state_written(store, tp, LeaderIsr(0, 5, (0, 1), 3))
    store.client.set(state_path(*tp), encode_leader_isr(moved))
    with pytest.raises(StateVersionConflict):
        leader_node(store)._write_isr(*tp, 0, 5, (0, 1, 2), 3, 0)
    assert state_now(store, tp) == (moved, 1)
