"""DeleteRecords' pure parts: the leader's rules, the low watermark over live replicas, a
follower's log start carried by an incremental fetch session, and the CLI's offset file."""
from __future__ import annotations

import random

import pytest

from broker.delete_records import HIGH_WATERMARK, deletion_offset
from broker.fetch_sessions import FetchSessionCache
from broker.replica.partition import LeaderState
from eos.cli_records import read_offsets
from eos.errors import EosError, ErrorCode
from eos.v1 import broker_pb2


def test_deletion_offset_follows_kafkas_rules():
    assert deletion_offset("t", 0, 40, high_watermark=100, delete_policy=True) == 40
    assert deletion_offset("t", 0, HIGH_WATERMARK, high_watermark=100, delete_policy=True) == 100
    assert deletion_offset("t", 0, 100, high_watermark=100, delete_policy=True) == 100
    refusals = [(("t", 0, 101, 100, True), ErrorCode.OFFSET_OUT_OF_RANGE),
                (("t", 0, -2, 100, True), ErrorCode.OFFSET_OUT_OF_RANGE),
                (("t", 0, 5, 100, False), ErrorCode.POLICY_VIOLATION),
                (("__transaction_state", 0, 5, 100, True), ErrorCode.INVALID_TOPIC_EXCEPTION),
                (("__consumer_offsets", 3, 5, 100, True), ErrorCode.INVALID_TOPIC_EXCEPTION)]
    for args, code in refusals:
        with pytest.raises(EosError) as refused:
            deletion_offset(*args)
        assert refused.value.code == code, args


def test_the_low_watermark_waits_for_every_live_follower_and_ignores_dead_ones():
    state = LeaderState(1, replicas=(1, 2, 3), isr=(1, 2, 3), leader_epoch=0, zk_version=0, leader_log_end=100,
                        high_watermark=100, now_ms=0)
    everyone = lambda broker_id: True            # noqa: E731
    assert state.low_watermark(50, everyone) == -1          # the followers have not said yet
    update = state.on_follower_fetch(2, 100, 100, 10, log_start_offset=50)
    assert update.log_start_moved
    assert state.low_watermark(50, everyone) == -1          # 3 still has not
    assert state.on_follower_fetch(3, 100, 100, 10, log_start_offset=20).log_start_moved
    assert state.low_watermark(50, everyone) == 20
    assert not state.on_follower_fetch(3, 100, 100, 20, log_start_offset=20).log_start_moved
    assert not state.on_follower_fetch(3, 100, 100, 30).log_start_moved      # not said: kept
    assert state.low_watermark(50, everyone) == 20
    assert state.low_watermark(50, lambda broker_id: broker_id != 3) == 50   # 3's broker is gone
    state.on_follower_fetch(3, 100, 100, 40, log_start_offset=60)
    assert state.low_watermark(50, everyone) == 50          # the leader's own is the smallest now


def test_an_incremental_fetch_carries_a_followers_new_log_start_and_keeps_it_when_unsaid():
    cache = FetchSessionCache(random.Random(3))
    session = cache.open(7, [broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=10, partition_max_bytes=1,
                                                       has_leader_epoch=True, current_leader_epoch=2,
                                                       log_start_offset=0),
                             broker_pb2.FetchPartition(topic="t", partition=1, fetch_offset=10, partition_max_bytes=1,
                                                       has_leader_epoch=True, current_leader_epoch=2)])
    assert session.partitions[("t", 0)].log_start_offset == 0
    assert session.partitions[("t", 1)].log_start_offset is None     # a consumer-like entry says nothing
    session.apply([broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=10, partition_max_bytes=1,
                                             has_leader_epoch=True, current_leader_epoch=2, log_start_offset=8)], [])
    assert session.partitions[("t", 0)].log_start_offset == 8
    session.apply([broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=12, partition_max_bytes=1,
                                             has_leader_epoch=True, current_leader_epoch=2)], [])
    assert session.partitions[("t", 0)].log_start_offset == 8


def test_the_offset_file_is_kafkas_and_is_checked_whole():
    text = '{"partitions": [{"topic": "a", "partition": 0, "offset": 5}, {"topic": "a", "partition": 1, "offset": -1}], "version": 1}'
    assert read_offsets(text, "f") == {("a", 0): 5, ("a", 1): -1}
    bad = ['not json', '{"partitions": []}', '{"partitions": [{"topic": "a", "partition": 0, "offset": 5}], "version": 2}',
           '{"partitions": [{"topic": "a", "partition": 0, "offset": -2}]}',
           '{"partitions": [{"topic": "a", "partition": -1, "offset": 1}]}',
           '{"partitions": [{"topic": "", "partition": 0, "offset": 1}]}',
           '{"partitions": [{"topic": "a", "partition": 0, "offset": true}]}',
           '{"partitions": [{"topic": "a", "partition": 0, "offset": 1}, {"topic": "a", "partition": 0, "offset": 2}]}']
    for text in bad:
        with pytest.raises(ValueError):
            read_offsets(text, "f")


# ---- the leader's wait (a real ReplicaManager over a real log) ----------------------------

def _leading(tmp_path, live: set):
    from broker.replica.manager import PartitionAssignment, ReplicaManager
    from tests.unit.test_replica_new_leader_offsets import CONFIG, OneLog, follower_log_with_records

    log = follower_log_with_records(tmp_path, 25)
    manager = ReplicaManager(2, OneLog(log), ensure_topic=lambda topic, highest, configs: CONFIG,
                             isr_writer=lambda *args, **kwargs: 1, notify=lambda tp: None, now_ms_fn=lambda: 1_000,
                             is_live_broker=lambda broker_id: broker_id in live)
    assignment = lambda epoch: PartitionAssignment(topic="t", partition=0, controller_epoch=1, leader=2,  # noqa: E731
                                                   leader_epoch=epoch, isr=(2, 3), zk_version=epoch, replicas=(2, 3))
    manager.become_leader_or_follower(1, [assignment(1)])
    manager.on_replica_fetch(3, "t", 0, 25, 1, log, log_start_offset=0)     # the follower has it all
    assert log.high_watermark == 25
    return manager, log, assignment


def _waiting(manager, log, offset: int, timeout_ms: int = 30_000):
    import threading

    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(
        manager.wait_for_low_watermark("t", 0, offset, timeout_ms, log)), daemon=True)
    thread.start()
    return thread, outcome


def test_the_leader_answers_once_the_follower_reports_the_new_log_start(tmp_path):
    manager, log, assignment = _leading(tmp_path, live={2, 3})
    log.delete_records_before(10, 1_000)
    assert manager.wait_for_low_watermark("t", 0, 10, 0, log) == (
        ErrorCode.REQUEST_TIMED_OUT, 0, "t-0: the live replicas' log start reached 0, not 10, within 0 ms")
    thread, outcome = _waiting(manager, log, 10)
    manager.become_leader_or_follower(1, [assignment(2)])       # a new epoch of the same leadership
    manager.on_replica_fetch(3, "t", 0, 25, 2, log, log_start_offset=4)
    thread.join(0.3)
    assert thread.is_alive() and outcome == []                   # 4 is not 10 yet
    manager.on_replica_fetch(3, "t", 0, 25, 2, log, log_start_offset=10)
    thread.join(30)
    assert outcome == [(ErrorCode.NONE, 10, "")]


def test_a_follower_on_a_dead_broker_is_not_waited_for(tmp_path):
    live = {2, 3}
    manager, log, _ = _leading(tmp_path, live)
    log.delete_records_before(20, 1_000)
    thread, outcome = _waiting(manager, log, 20)
    thread.join(0.3)
    assert thread.is_alive()
    live.discard(3)                       # the controller's UpdateMetadata no longer lists broker 3
    thread.join(30)
    assert outcome == [(ErrorCode.NONE, 20, "")]


def test_a_leadership_lost_while_waiting_is_not_leader(tmp_path):
    from broker.replica.manager import PartitionAssignment

    manager, log, _ = _leading(tmp_path, live={2, 3})
    log.delete_records_before(20, 1_000)
    thread, outcome = _waiting(manager, log, 20)
    manager.become_leader_or_follower(1, [PartitionAssignment(topic="t", partition=0, controller_epoch=1, leader=3,
                                                              leader_epoch=2, isr=(3, 2), zk_version=2, replicas=(2, 3))])
    thread.join(30)
    assert [code for code, _, _ in outcome] == [ErrorCode.NOT_LEADER_OR_FOLLOWER]
