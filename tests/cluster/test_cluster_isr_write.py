"""Both ends of an ISR change, against the module's real ZooKeeper.

The leader's write (ClusterNode._write_isr) that meets a moved znode version: the state
znode is rewritten behind the leader's back, as a new controller does, and the leader must
write over it while the leadership is still its own.

The controller's read of the change notifications (Controller._on_isr_change) that loses
ZooKeeper half-way: the change must still reach the controller once it reads again (the
brokers' metadata is what the controller learns; a change it misses stays unseen). And a
controller whose term ended cannot delete the notifications (nor the admin requests) that
its successor has to read.
"""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from kazoo.exceptions import ConnectionLoss

from broker.cluster_node import ClusterNode
from broker.controller.core import ControllerConfig
from broker.controller.shell import Controller
from eos.local_cluster import _ensure_chroot
from broker.metadata.types import LeaderIsr
from broker.metadata.zk_store import BrokerRegistration, ControllerMoved, StateVersionConflict, ZkStore, decode_leader_isr, encode_leader_isr, state_path
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


@pytest.fixture
def rooted_store(zookeeper):
    """A store in a chroot of its own, with the base paths a cluster creates."""
    chroot = f"/eos-{uuid.uuid4().hex[:8]}"
    _ensure_chroot(zookeeper.connect_string, chroot)
    opened = ZkStore(zookeeper.connect_string + chroot)
    opened.start()
    opened.ensure_paths()
    yield opened
    opened.close()


def test_a_controller_whose_term_ended_deletes_no_notification_and_no_admin_request(rooted_store):
    store = rooted_store
    _, stale_version = store.try_become_controller(0)
    store.resign_controller(0)
    store.try_become_controller(1)                              # the successor's election moves the epoch
    store.write_isr_change_notification([("t", 0)])
    store.set_preferred_election_request([("t", 0)])
    names = store.isr_change_notifications()
    with pytest.raises(ControllerMoved):
        store.delete_isr_changes(names, epoch_zk_version=stale_version)
    with pytest.raises(ControllerMoved):
        store.delete_preferred_election_request(epoch_zk_version=stale_version)
    with pytest.raises(ControllerMoved):
        store.set_reassignment_request({("t", 0): (1, 2)}, epoch_zk_version=stale_version)
    assert store.isr_change_notifications() == names and store.read_isr_changes(names) == {("t", 0)}
    assert store.preferred_election_request() == [("t", 0)] and store.reassignment_request() is None


def wait_for(condition, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_an_isr_change_read_cut_short_reaches_the_controller_when_it_reads_again(rooted_store, monkeypatch):
    store = rooted_store
    controller = Controller(0, store, config=ControllerConfig(auto_leader_rebalance_enable=False),
                            now_ms_fn=lambda: int(time.time() * 1000))
    try:
        store.register_broker(BrokerRegistration(0, "127.0.0.1", 1))   # nothing listens: requests retry
        store.create_topic("t", {0: (0,)}, {})
        controller.start()
        tp = ("t", 0)
        assert wait_for(lambda: controller.is_active and tp in controller._core.states)
        state, version = controller._core.states[tp]

        # The read of the partition states after the notification fails once, as when
        # ZooKeeper goes away mid-read; the change is the leader's (a new ISR at its epoch).
        lose_once = threading.Event()
        real_partition_states = store.partition_states

        def partition_states_losing_once(partitions):
            if not lose_once.is_set() and list(partitions) == [tp]:
                lose_once.set()
                raise ConnectionLoss()
            return real_partition_states(partitions)

        monkeypatch.setattr(store, "partition_states", partition_states_losing_once)
        changed = LeaderIsr(state.leader, state.leader_epoch, (0,), state.controller_epoch)
        new_version = store.update_partition_states({tp: (changed, version)}, epoch_zk_version=None)[tp]
        store.write_isr_change_notification([tp])

        assert wait_for(lambda: lose_once.is_set() and controller._core.states[tp][1] == new_version), \
            f"the controller kept {controller._core.states[tp]} after the change to version {new_version}"
        assert wait_for(lambda: not store.isr_change_notifications()), "the notification was not deleted once applied"
    finally:
        controller.stop()


def test_a_reassignment_write_that_meets_added_partitions_keeps_them(rooted_store):
    """A broker's CreatePartitions wrote the topic's assignment after the controller last read
    it (its watch event not handled yet): the controller's reassignment write must not undo
    the new partitions."""
    from broker.controller.core import WriteAssignment
    from broker.metadata.zk_store import TopicAssignment

    store = rooted_store
    _, epoch_zk_version = store.try_become_controller(0)
    controller = Controller(0, store, config=ControllerConfig(), now_ms_fn=lambda: 0)
    controller._epoch_zk_version = epoch_zk_version
    store.create_topic("t", {0: (0,)}, {})
    controller._read_topics(["t"])                                 # version 0 cached
    store.add_partitions("t", TopicAssignment({0: (0,), 1: (0,)}), expected_version=0)
    controller._write_assignment(WriteAssignment("t", {0: (0, 1)}, {0: (1,)}, {}))
    assignment, version = store.topic_assignment("t")
    assert assignment == TopicAssignment({0: (0, 1), 1: (0,)}, {0: (1,)}, {})
    assert controller._topic_versions["t"] == version == 2


def test_a_call_waiting_when_the_controller_stops_is_refused_at_once(rooted_store):
    """A ControlledShutdown queued behind a busy event when the controller stops (its broker
    stopping too) is answered NOT_CONTROLLER, so the asking broker tries the next controller;
    it used to wait CALL_TIMEOUT_S for an answer nobody would give."""
    from eos.errors import NotControllerError

    store = rooted_store
    controller = Controller(0, store, config=ControllerConfig(auto_leader_rebalance_enable=False),
                            now_ms_fn=lambda: int(time.time() * 1000))
    gate, busy = threading.Event(), threading.Event()
    real_handle = controller._handle

    def handle_holding_elections(event):
        if event.kind == "elect_leaders":
            busy.set()
            gate.wait(30)
            return {}
        return real_handle(event)

    controller._handle = handle_holding_elections
    outcomes: dict[str, object] = {}

    def outcome_of(name, call):
        try:
            outcomes[name] = call()
        except Exception as exc:
            outcomes[name] = exc

    threads = [threading.Thread(target=outcome_of, args=("elect", lambda: controller.elect_leaders("preferred", set())))]
    try:
        controller.start()
        assert wait_for(lambda: controller.is_active)
        threads[0].start()
        assert busy.wait(30)
        threads.append(threading.Thread(target=outcome_of, args=("shutdown", lambda: controller.controlled_shutdown(5, 0))))
        threads[-1].start()
        assert wait_for(lambda: any(e.kind == "controlled_shutdown" for e in list(controller._events.queue)))
        threads.append(threading.Thread(target=controller.stop))
        threads[-1].start()
        assert wait_for(lambda: controller._stopping.is_set())
        gate.set()
        for thread in threads:
            thread.join(60)
        assert isinstance(outcomes["shutdown"], NotControllerError), outcomes
        # and once stopped, a new call is refused without being queued
        with pytest.raises(NotControllerError):
            controller._call("controlled_shutdown", (5, 0))
    finally:
        gate.set()
        controller.stop()
