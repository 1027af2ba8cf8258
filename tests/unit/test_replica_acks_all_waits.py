"""An acks=all write waiting for the in-sync replicas and a LeaderAndIsr that arrives
meanwhile. One that keeps this broker leader at a new epoch (the controller shrinking the
ISR in a controlled shutdown) must not fail the write: it is in this log and the new ISR
commits it, as in Kafka. Before, every such update answered the waiting writes
NOT_LEADER_OR_FOLLOWER and the producers retried them elsewhere. One that makes this broker a
follower still answers NOT_LEADER_OR_FOLLOWER."""
from __future__ import annotations

import threading

from broker.replica.manager import PartitionAssignment, ReplicaManager
from eos.errors import ErrorCode
from tests.unit.test_replica_new_leader_offsets import CONFIG, OneLog, follower_log_with_records
from tests.waits import wait_for


def assignment(leader: int, epoch: int, isr: tuple[int, ...]) -> PartitionAssignment:
    return PartitionAssignment(topic="t", partition=0, controller_epoch=1, leader=leader, leader_epoch=epoch,
                               isr=isr, zk_version=epoch, replicas=(2, 3))


def leading_manager(log) -> ReplicaManager:
    manager = ReplicaManager(2, OneLog(log), ensure_topic=lambda topic, highest, configs: CONFIG,
                             isr_writer=lambda *args, **kwargs: 1, notify=lambda tp: None, now_ms_fn=lambda: 1_000)
    assert manager.become_leader_or_follower(1, [assignment(2, 1, (2, 3))]) == {("t", 0): (ErrorCode.NONE, "")}
    return manager


def waiting_write(manager: ReplicaManager) -> tuple[threading.Thread, list]:
    """A write of offsets 0..24 waiting (up to 30 s) for the ISR, on its own thread."""
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(
        manager.wait_for_high_watermark("t", 0, 25, 30_000, min_insync_replicas=1)), daemon=True)
    thread.start()
    wait_for(lambda: manager.produce_waiters == 1, "the write waiting for its followers")
    return thread, outcome


def test_a_new_epoch_of_the_same_leader_keeps_the_write_waiting_and_commits_it(tmp_path):
    log = follower_log_with_records(tmp_path, 25)
    manager = leading_manager(log)
    tenure = manager._leaders[("t", 0)].tenure
    thread, outcome = waiting_write(manager)

    assert manager.become_leader_or_follower(1, [assignment(2, 2, (2, 3))]) == {("t", 0): (ErrorCode.NONE, "")}
    assert manager.known_leader("t", 0) == (2, 2)
    assert manager._leaders[("t", 0)].tenure is tenure
    assert thread.is_alive() and outcome == []        # still waiting, not refused

    manager.on_replica_fetch(3, "t", 0, 25, 2, log)   # the follower copies the write
    thread.join(30)
    assert outcome == [(ErrorCode.NONE, "")]
    assert log.high_watermark == 25


def test_becoming_a_follower_answers_the_waiting_write_not_leader(tmp_path):
    log = follower_log_with_records(tmp_path, 25)
    manager = leading_manager(log)
    thread, outcome = waiting_write(manager)

    manager.become_leader_or_follower(1, [assignment(3, 2, (2, 3))])
    thread.join(30)
    [(code, message)] = outcome
    assert code == ErrorCode.NOT_LEADER_OR_FOLLOWER and "moved while the write waited" in message
    assert manager.known_leader("t", 0) == (3, 2)     # what a refusal names (KIP-951)

    # Leading again after a time as a follower is a new tenure: a write of the old one could
    # have been truncated away meanwhile, so nothing may wait on across it.
    manager.become_leader_or_follower(1, [assignment(2, 3, (2, 3))])
    first = manager._leaders[("t", 0)].tenure
    manager.become_leader_or_follower(1, [assignment(2, 4, (2,))])
    assert manager._leaders[("t", 0)].tenure is first
    manager.become_leader_or_follower(1, [assignment(3, 5, (3, 2))])
    manager.become_leader_or_follower(1, [assignment(2, 6, (2, 3))])
    assert manager._leaders[("t", 0)].tenure is not first
