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
