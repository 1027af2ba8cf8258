"""A follower's fetch round (broker/replica/fetcher.ReplicaFetcher._fetch_once) against a
leader stub and logs in memory: a round reads and lists only the partitions that moved.

The stub leader answers what each test sets, including the failures it breaks on purpose (an
error for one partition, OffsetsForLeaderEpoch down), and the logs count their lookups,
which no real broker shows; replication against real brokers and ZooKeeper is
tests/cluster/test_replication.py's."""
from __future__ import annotations

import collections
import contextlib
import time

import grpc

from broker.replica.fetcher import REPLICA_FETCH_BACKOFF_MS, FollowerSession, ReplicaFetcher
from eos.errors import ErrorCode
from eos.v1 import broker_pb2, cluster_pb2

Assignment = collections.namedtuple("Assignment", "leader leader_epoch")


class EpochCache:
    latest_epoch = 3

    @staticmethod
    def end_offset_for(epoch, log_end):
        return epoch, log_end


class MemoryLog:
    def __init__(self):
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.high_watermark = 0
        self.leader_epoch_cache = EpochCache()

    def append_as_follower(self, records, _now_ms):
        self.log_end_offset += len(records)      # one "record" a byte: enough for positions

    def update_high_watermark(self, offset):
        self.high_watermark = offset

    def truncate_to(self, offset):
        self.log_end_offset = offset

    def delete_records_before(self, offset, _now_ms):
        self.log_start_offset = max(self.log_start_offset, offset)
        return self.log_start_offset


class Logs:
    """The log manager's get_log, counting the lookups of each partition."""

    def __init__(self, tps):
        self.logs = {tp: MemoryLog() for tp in tps}
        self.lookups = collections.Counter()
        self.checkpoints = 0

    def get_log(self, topic, partition):
        self.lookups[(topic, partition)] += 1
        return self.logs.get((topic, partition))

    def checkpoint(self):
        self.checkpoints += 1


class Unavailable(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.UNAVAILABLE


class Leader:
    """The leader's Fetch and OffsetsForLeaderEpoch: answers what the test queues."""

    def __init__(self):
        self.requests: list[broker_pb2.FetchRequest] = []
        self.answers: dict = {}      # tp -> FetchedPartition fields, for the next Fetch only
        self.epochs_unavailable = False

    def Fetch(self, request, timeout=None):
        self.requests.append(request)
        answers, self.answers = self.answers, {}
        return broker_pb2.FetchResponse(session_id=9, partitions=[
            broker_pb2.FetchedPartition(topic=tp[0], partition=tp[1], **fields) for tp, fields in answers.items()])

    def OffsetsForLeaderEpoch(self, request, timeout=None):
        if self.epochs_unavailable:
            raise Unavailable()
        return cluster_pb2.OffsetsForLeaderEpochResponse(partitions=[
            cluster_pb2.EpochEndOffset(topic=q.topic, partition=q.partition, leader_epoch=3, end_offset=0)
            for q in request.partitions])


@contextlib.contextmanager
def _following(partition_count: int):
    """(fetcher, logs, leader): a fetcher of `partition_count` partitions of topic t, its
    rounds run by the test (the thread never starts)."""
    tps = [("t", p) for p in range(partition_count)]
    logs, leader = Logs(tps), Leader()
    fetcher = ReplicaFetcher(2, 1, "127.0.0.1:1", logs, on_appended=lambda tp: None,
                             broker_epoch_fn=lambda: 5)
    fetcher._broker = fetcher._cluster = leader
    fetcher.add({tp: Assignment(1, 3) for tp in tps})
    try:
        yield fetcher, logs, leader
    finally:
        fetcher.shutdown()
        fetcher._channel.close()


def _listed(request):
    return {(p.topic, p.partition): p.fetch_offset for p in request.partitions}


def _forgotten(request):
    return {(p.topic, p.partition) for p in request.forgotten}


def test_an_incremental_round_reads_and_lists_only_the_partitions_that_moved():
    with _following(200) as (fetcher, logs, leader):
        leader.answers = {("t", 7): {"records": b"abc", "high_watermark": 3}}
        assert fetcher._fetch_once()
        assert len(_listed(leader.requests[-1])) == 200          # the first Fetch is full
        before = logs.lookups.copy()
        assert fetcher._fetch_once()
        assert _listed(leader.requests[-1]) == {("t", 7): 3}     # appended to: listed at its end
        looked_up = {tp for tp in logs.logs if logs.lookups[tp] != before[tp]}
        assert looked_up == {("t", 7)}                            # the 199 others not read again
        assert fetcher._fetch_once()
        assert _listed(leader.requests[-1]) == {} and _forgotten(leader.requests[-1]) == set()


def test_removed_failed_and_readded_partitions_leave_and_rejoin_the_session():
    with _following(5) as (fetcher, logs, leader):
        assert fetcher._fetch_once()
        fetcher.remove([("t", 1)])
        leader.answers = {("t", 2): {"error_code": ErrorCode.NOT_LEADER_OR_FOLLOWER}}
        assert fetcher._fetch_once()
        assert _forgotten(leader.requests[-1]) == {("t", 1)}
        assert fetcher._fetch_once()
        assert _forgotten(leader.requests[-1]) == {("t", 2)}      # backing off after its error
        time.sleep(REPLICA_FETCH_BACKOFF_MS / 1000 + 0.05)
        fetcher.add({("t", 1): Assignment(1, 4)})                # back, with a new leader epoch
        assert fetcher._fetch_once()
        request = leader.requests[-1]
        assert _listed(request) == {("t", 1): 0, ("t", 2): 0} and _forgotten(request) == set()
        assert {p.current_leader_epoch for p in request.partitions if p.partition == 1} == {4}


def test_a_move_made_in_a_round_that_sent_nothing_is_listed_in_the_next_fetch():
    with _following(3) as (fetcher, logs, leader):
        leader.answers = {("t", 0): {"records": b"abcd", "high_watermark": 4}}
        assert fetcher._fetch_once()
        sent = len(leader.requests)
        fetcher.add({("t", 2): Assignment(1, 4)})           # to truncate first: the leader is down
        leader.epochs_unavailable = True
        assert not fetcher._fetch_once()
        assert len(leader.requests) == sent                 # no Fetch went out
        leader.epochs_unavailable = False
        assert fetcher._fetch_once()
        assert _listed(leader.requests[-1]) == {("t", 0): 4, ("t", 2): 0}   # t-0's move too


def test_a_lost_session_makes_the_next_fetch_list_every_partition_again():
    with _following(20) as (fetcher, logs, leader):
        leader.answers = {("t", 3): {"records": b"ab", "high_watermark": 2}}
        assert fetcher._fetch_once()
        assert fetcher._fetch_once()
        fetcher._session.reset()                                   # as after a failed Fetch
        assert fetcher._fetch_once()
        listed = _listed(leader.requests[-1])
        assert len(listed) == 20 and listed[("t", 3)] == 2


def test_follower_session_forgets_and_holds_only_what_moved():
    session = FollowerSession()
    positions = {("t", 0): (10, 3), ("t", 1): (0, 3), ("t", 2): (5, 3)}
    session.answered(55, positions)
    moved = {("t", 0), ("t", 1)}
    now = {("t", 0): (12, 3), ("t", 2): (5, 3)}                   # t-1 left, t-0 moved on
    assert session.forgotten(now, moved) == [("t", 1)]
    assert session.forgotten(now, {("t", 0)}) == []                # t-1 is not a candidate
    session.answered(55, now, moved)
    assert session.full is False
    assert not session.needs_listing(("t", 0), (12, 3)) and not session.needs_listing(("t", 2), (5, 3))
    assert session.needs_listing(("t", 1), (0, 3))                 # no longer held


def test_the_leaders_log_start_is_taken_up_to_the_high_watermark_checkpointed_once_and_reported():
    with _following(3) as (fetcher, logs, leader):
        assert fetcher._fetch_once()
        leader.answers = {("t", 0): {"records": b"abcdef", "high_watermark": 6, "log_start_offset": 4},
                          ("t", 1): {"records": b"abc", "high_watermark": 3, "log_start_offset": 9}}
        assert fetcher._fetch_once()
        assert logs.logs[("t", 0)].log_start_offset == 4
        assert logs.logs[("t", 1)].log_start_offset == 3          # never past this replica's high watermark
        assert logs.checkpoints == 1                              # one for the round, before the next Fetch
        assert fetcher._fetch_once()
        reported = {(p.topic, p.partition): p.log_start_offset for p in leader.requests[-1].partitions}
        assert reported == {("t", 0): 4, ("t", 1): 3}
        # this replica's own retention moved t-2's log start; the leader's answer (an older log
        # start) moves nothing, but the next Fetch reports the real one
        logs.logs[("t", 2)].log_start_offset = 7
        logs.logs[("t", 2)].high_watermark = 10
        leader.answers = {("t", 2): {"high_watermark": 0, "log_start_offset": 5}}
        assert fetcher._fetch_once()
        assert logs.checkpoints == 1
        assert fetcher._fetch_once()
        assert {(p.topic, p.partition): p.log_start_offset for p in leader.requests[-1].partitions} == {("t", 2): 7}
