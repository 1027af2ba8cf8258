"""A replica that just became leader with a high watermark behind its log end (it learned
the previous leader's HW one fetch late) answers a client's "latest" and a timestamp lookup
past its HW with OFFSET_NOT_AVAILABLE, as Kafka's Partition.fetchOffsetForTimestamp does,
until its followers fetch and the HW reaches the epoch's start offset. Before, it answered
"latest" with its old HW: 0 for a partition holding 25 acknowledged records."""
from __future__ import annotations

import pytest

from broker.reads import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ReadHandlers
from broker.replica.manager import PartitionAssignment, ReplicaManager
from broker.storage.log import Log
from eos.config import TopicConfig
from eos.errors import ErrorCode, OffsetNotAvailableError, Reaction, reaction_for
from eos.v1 import common_pb2
from tests.storage_batches import make_batch

CONFIG = TopicConfig(segment_bytes=1 << 20, file_delete_delay_ms=0)
UNCOMMITTED = common_pb2.READ_UNCOMMITTED


class OneLog:
    """The log manager's two lookups the replica manager makes, over one real Log."""

    def __init__(self, log: Log):
        self.log = log

    def get_log(self, topic: str, partition: int) -> Log:
        return self.log

    def create_log(self, topic: str, partition: int, config) -> Log:
        return self.log


def follower_log_with_records(tmp_path, count: int) -> Log:
    """A follower's copy of `count` records (timestamps 1000 + offset) whose HW it never
    learned: the previous leader died before the follower's next fetch."""
    log = Log.open(str(tmp_path / "t-0"), CONFIG, now_ms=1_000)
    log.set_replicated(True)
    log.append_as_follower(make_batch(count, timestamp_ms=[1_000 + i for i in range(count)]), 1_000)
    assert (log.log_end_offset, log.high_watermark) == (count, 0)
    return log


def make_leader(log: Log, isr: tuple[int, ...]) -> ReplicaManager:
    manager = ReplicaManager(2, OneLog(log), ensure_topic=lambda topic, highest, configs: CONFIG,
                             isr_writer=lambda *args, **kwargs: 1, notify=lambda tp: None, now_ms_fn=lambda: 1_000)
    results = manager.become_leader_or_follower(1, [PartitionAssignment(
        topic="t", partition=0, controller_epoch=1, leader=2, leader_epoch=1, isr=isr, zk_version=1,
        replicas=(2, 3))])
    assert results == {("t", 0): (ErrorCode.NONE, "")}
    return manager


def test_a_new_leader_behind_its_epoch_start_refuses_latest_until_its_follower_fetches(tmp_path):
    log = follower_log_with_records(tmp_path, 25)
    manager = make_leader(log, isr=(2, 3))
    lagging = manager.lagging_high_watermark("t", 0, log)
    assert lagging is not None and "(0)" in lagging and "(25)" in lagging
    with pytest.raises(OffsetNotAvailableError):
        ReadHandlers._find_offset(log, LATEST_TIMESTAMP, UNCOMMITTED, lagging)
    with pytest.raises(OffsetNotAvailableError):       # offset 10's timestamp: past the HW
        ReadHandlers._find_offset(log, 1_010, UNCOMMITTED, lagging)
    assert ReadHandlers._find_offset(log, EARLIEST_TIMESTAMP, UNCOMMITTED, lagging) == (-1, 0)
    assert reaction_for(ErrorCode.OFFSET_NOT_AVAILABLE) is Reaction.RETRY

    manager.on_replica_fetch(3, "t", 0, 25, None, log)   # the follower has everything
    assert manager.lagging_high_watermark("t", 0, log) is None
    assert ReadHandlers._find_offset(log, LATEST_TIMESTAMP, UNCOMMITTED, None) == (-1, 25)
    assert ReadHandlers._find_offset(log, 1_010, UNCOMMITTED, None) == (1_010, 10)


def test_a_leader_alone_in_its_isr_answers_at_once(tmp_path):
    log = follower_log_with_records(tmp_path, 25)
    manager = make_leader(log, isr=(2,))
    assert manager.lagging_high_watermark("t", 0, log) is None
    assert ReadHandlers._find_offset(log, LATEST_TIMESTAMP, UNCOMMITTED, None) == (-1, 25)


def test_a_lookup_past_the_end_is_no_answer_when_the_leader_is_not_lagging(tmp_path):
    log = follower_log_with_records(tmp_path, 25)
    make_leader(log, isr=(2,))
    assert ReadHandlers._find_offset(log, 99_999, UNCOMMITTED, None) == (-1, -1)


def test_a_leader_and_isr_sent_again_at_the_same_epoch_keeps_the_epochs_start(tmp_path):
    """A new controller sends every LeaderAndIsr again: a leader told its own epoch once more
    keeps that epoch's start offset (as Kafka does), so a HW behind records appended since
    does not turn into OFFSET_NOT_AVAILABLE. Only a new epoch starts at the log end."""
    log = follower_log_with_records(tmp_path, 25)
    manager = make_leader(log, isr=(2, 3))
    manager.on_replica_fetch(3, "t", 0, 25, None, log)
    log.append_as_leader(make_batch(5), 1_000, leader_epoch=1)
    manager.on_leader_append("t", 0, log)
    assert (log.log_end_offset, log.high_watermark) == (30, 25)     # the follower has not fetched them yet

    def assign(leader_epoch: int) -> None:
        assert manager.become_leader_or_follower(1, [PartitionAssignment(
            topic="t", partition=0, controller_epoch=1, leader=2, leader_epoch=leader_epoch, isr=(2, 3),
            zk_version=1, replicas=(2, 3))]) == {("t", 0): (ErrorCode.NONE, "")}

    assign(1)
    assert manager.lagging_high_watermark("t", 0, log) is None
    assign(2)
    assert "(30)" in manager.lagging_high_watermark("t", 0, log)
