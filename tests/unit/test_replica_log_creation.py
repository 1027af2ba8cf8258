"""A LeaderAndIsr that creates many logs fsyncs each log directory once, after creating
them all, instead of once a log (a 1,000-partition topic cost every broker 1,000 fsyncs of
the same directory); a directory whose fsync fails takes its new partitions offline, and
they answer KAFKA_STORAGE_ERROR while the others are served."""
from __future__ import annotations

import collections
import os

import pytest

import broker.storage.log_manager as log_manager_module
from broker.replica.manager import PartitionAssignment, ReplicaManager
from broker.storage.log_dirs import LogDirs
from eos.config import TopicConfig
from eos.errors import ErrorCode

CONFIG = TopicConfig(segment_bytes=1 << 20, file_delete_delay_ms=0)
BROKER_ID = 1
PARTITIONS = 20


def _assignment(partition: int) -> PartitionAssignment:
    # even partitions led here, odd ones followed (their leader, broker 2, is not running:
    # the replica manager has no fetchers in this test)
    leader = BROKER_ID if partition % 2 == 0 else 2
    return PartitionAssignment(topic="many", partition=partition, controller_epoch=1, leader=leader,
                               leader_epoch=0, isr=(1, 2), zk_version=0, replicas=(1, 2))


@pytest.fixture
def log_dirs(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    managed = LogDirs(dirs, now_ms_fn=lambda: 1_000)
    managed.load({})
    yield managed
    managed.shutdown()


@pytest.fixture
def directory_fsyncs(monkeypatch):
    """Counts the fsyncs of each log directory (they still happen)."""
    counts: collections.Counter = collections.Counter()
    real = log_manager_module.fsync_directory

    def counted(path):
        counts[os.path.realpath(path)] += 1
        real(path)
    monkeypatch.setattr(log_manager_module, "fsync_directory", counted)
    return counts


def _replica_manager(log_dirs: LogDirs) -> ReplicaManager:
    return ReplicaManager(BROKER_ID, log_dirs, ensure_topic=lambda topic, highest, configs: CONFIG,
                          isr_writer=lambda *args, **kwargs: 1, notify=lambda tp: None,
                          now_ms_fn=lambda: 1_000)


def test_new_logs_fsync_each_directory_once(log_dirs, directory_fsyncs):
    manager = _replica_manager(log_dirs)
    results = manager.become_leader_or_follower(1, [_assignment(p) for p in range(PARTITIONS)])
    assert results == {("many", p): (ErrorCode.NONE, "") for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        assert log_dirs.get_log("many", p) is not None
    assert dict(directory_fsyncs) == {directory: 1 for directory in log_dirs.data_dirs}

    # the same LeaderAndIsr again creates nothing, so it fsyncs nothing
    directory_fsyncs.clear()
    assert manager.become_leader_or_follower(1, [_assignment(p) for p in range(PARTITIONS)]) == results
    assert not directory_fsyncs


def test_a_directory_whose_fsync_fails_takes_its_new_partitions_offline(log_dirs, monkeypatch):
    failing = log_dirs.data_dirs[1]
    real = log_manager_module.fsync_directory

    def fsync(path):
        if os.path.realpath(path) == failing:
            raise OSError(5, "Input/output error")
        real(path)
    monkeypatch.setattr(log_manager_module, "fsync_directory", fsync)
    results = _replica_manager(log_dirs).become_leader_or_follower(1, [_assignment(p) for p in range(PARTITIONS)])

    placed_on_failing = {tp for tp in results if log_dirs.offline_reason(*tp) is not None}
    assert placed_on_failing and len(placed_on_failing) < PARTITIONS     # the new logs were spread over both
    assert failing in log_dirs.offline_dirs
    for tp, (code, message) in results.items():
        if tp in placed_on_failing:
            assert code == ErrorCode.KAFKA_STORAGE_ERROR and failing in message
        else:
            assert code == ErrorCode.NONE and log_dirs.get_log(*tp) is not None
