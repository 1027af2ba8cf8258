"""A leader's side of a follower's fetch session (broker/reads.py `_fetch_in_session`), on
BrokerServicer with the in-memory logs of test_broker_service and a fake replica manager:
only partitions with something new are answered, a refused session starts over, records of
a partition this broker no longer leads never go out, and the long poll wakes on an append."""
from __future__ import annotations

import threading

import pytest

from broker.purgatory import FetchPurgatory
from broker.service import BrokerServicer, NodeAddress
from broker.topics import TopicRegistry
from eos.errors import ErrorCode, NotLeaderOrFollowerError
from eos.types import TopicPartition
from eos.v1 import broker_pb2
from tests.unit.test_broker_service import FakeContext, FakeLogManager, create, one_record_batch
from tests.waits import wait_for

FOLLOWER = 1


class FakeReplicas:
    """What a session's fetch asks of the replica manager; `not_led` partitions are refused."""

    replica_lag_time_max_ms = 30_000

    def __init__(self):
        self.reports: list[tuple[str, int, int]] = []
        self.not_led: set[tuple[str, int]] = set()

    def on_replica_fetch(self, replica_id, topic, partition, fetch_offset, current_leader_epoch, partition_log,
                         log_start_offset=None):
        assert replica_id == FOLLOWER
        if (topic, partition) in self.not_led:
            raise NotLeaderOrFollowerError(f"not the leader of {topic}-{partition}")
        self.reports.append((topic, partition, fetch_offset))

    def replica_fetch_allowance(self, replica_id, topic, partition, max_bytes):
        return max_bytes

    def charge_replica_fetch(self, replica_id, topic, partition, sent_beyond_bytes):
        pass                      # no throttle here


@pytest.fixture
def leader(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    servicer = BrokerServicer(registry=registry, log_manager=FakeLogManager(), purgatory=FetchPurgatory(max_waiters=4),
                              node=NodeAddress(0, "127.0.0.1", 1234), cluster_id="c1")
    assert create(servicer, "t", 3).error_code == ErrorCode.NONE
    for partition in range(3):
        append(servicer, partition)
    servicer._replicas = FakeReplicas()
    return servicer


def append(servicer, partition: int) -> None:
    servicer._log_manager.get_log("t", partition).append_as_leader(one_record_batch(b"r%d" % partition), 0)
    servicer._purgatory.notify(TopicPartition("t", partition))


def fetch(servicer, *, session_id=0, epoch, listed=(), forgotten=(), max_wait_ms=0, max_bytes=1 << 20):
    request = broker_pb2.FetchRequest(max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes, is_replica=True,
                                      replica_id=FOLLOWER, session_id=session_id, session_epoch=epoch)
    for partition, offset in listed:
        request.partitions.add(topic="t", partition=partition, fetch_offset=offset, partition_max_bytes=1 << 20)
    for partition in forgotten:
        request.forgotten.add(topic="t", partition=partition)
    return servicer.Fetch(request, FakeContext())


def waiting_fetch(servicer, session_id: int, epoch: int) -> tuple[threading.Thread, list]:
    """An incremental Fetch with nothing new, started on a thread and seen waiting in the
    purgatory; its answer lands in the list."""
    answers: list = []
    thread = threading.Thread(target=lambda: answers.append(
        fetch(servicer, session_id=session_id, epoch=epoch, max_wait_ms=60_000)))
    thread.start()
    wait_for(lambda: servicer._purgatory.waiter_count == 1, "the fetch waiting in the purgatory")
    return thread, answers


def answered(response) -> dict[int, int]:
    """{partition: bytes of records} of an answer."""
    return {p.partition: len(p.records) for p in response.partitions}


def opened(servicer) -> int:
    response = fetch(servicer, epoch=0, listed=[(0, 0), (1, 0), (2, 0)])
    assert response.session_id != 0 and all(size > 0 for size in answered(response).values())
    assert set(answered(response)) == {0, 1, 2}
    # the follower appends what came and lists the new offsets once
    assert answered(fetch(servicer, session_id=response.session_id, epoch=1,
                          listed=[(0, 1), (1, 1), (2, 1)])) == {}
    return response.session_id


def test_an_incremental_fetch_answers_only_the_partitions_with_something_new(leader):
    session_id = opened(leader)
    append(leader, 2)
    response = fetch(leader, session_id=session_id, epoch=2)           # lists nothing: nothing moved here
    assert list(answered(response)) == [2] and answered(response)[2] > 0
    assert response.partitions[0].high_watermark == 2
    assert ("t", 2, 1) in leader._replicas.reports                      # reported before it was read
    assert answered(fetch(leader, session_id=session_id, epoch=3, listed=[(2, 2)])) == {}
    # a forgotten partition is no longer answered, however it moves
    assert answered(fetch(leader, session_id=session_id, epoch=4, forgotten=[0])) == {}
    append(leader, 0)
    assert answered(fetch(leader, session_id=session_id, epoch=5)) == {}


def test_a_stale_epoch_or_an_unknown_session_is_refused_and_a_full_fetch_starts_over(leader):
    session_id = opened(leader)
    stale = fetch(leader, session_id=session_id, epoch=1)
    assert stale.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH and not stale.partitions
    unknown = fetch(leader, session_id=session_id + 1, epoch=2)
    assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    again = fetch(leader, epoch=0, listed=[(0, 1), (1, 1), (2, 1)])
    assert again.error_code == ErrorCode.NONE and again.session_id not in (0, session_id)
    assert fetch(leader, session_id=session_id, epoch=2).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_the_final_epoch_closes_the_session_and_is_answered_as_a_full_fetch(leader):
    session_id = opened(leader)
    closing = fetch(leader, session_id=session_id, epoch=-1, listed=[(0, 0), (1, 1)])
    assert closing.error_code == ErrorCode.NONE and closing.session_id == 0
    offsets = answered(closing)
    assert set(offsets) == {0, 1} and offsets[0] > 0 and offsets[1] == 0
    assert fetch(leader, session_id=session_id, epoch=2).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_records_of_a_partition_this_broker_no_longer_leads_never_go_out(leader):
    session_id = opened(leader)
    leader._replicas.not_led.add(("t", 1))
    append(leader, 1)
    [refused] = fetch(leader, session_id=session_id, epoch=2).partitions
    assert (refused.partition, refused.error_code, refused.records) == (1, ErrorCode.NOT_LEADER_OR_FOLLOWER, b"")


def test_an_incremental_fetch_with_nothing_new_waits_for_an_append(leader):
    session_id = opened(leader)
    waiting, answers = waiting_fetch(leader, session_id, 2)
    append(leader, 1)
    waiting.join(10)
    assert not waiting.is_alive() and list(answered(answers[0])) == [1]


class DenyCluster:
    """An authorizer that refuses CLUSTER_ACTION (the inter-broker principal's ACL removed)."""

    def allowed(self, operation, resource_type, name=None):
        return False

    def principal(self):
        return "User:broker"


def test_an_incremental_fetch_without_cluster_action_is_refused_even_when_it_lists_nothing(leader):
    session_id = opened(leader)
    leader._authorizer = DenyCluster()
    append(leader, 0)
    refused = fetch(leader, session_id=session_id, epoch=2)
    assert refused.error_code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED and not refused.partitions
    assert "CLUSTER_ACTION" in refused.error_message
    # the session is over: the follower's full fetch is refused partition by partition
    assert fetch(leader, session_id=session_id, epoch=3).error_code != ErrorCode.NONE
    full = fetch(leader, epoch=0, listed=[(0, 1)])
    assert [p.error_code for p in full.partitions] == [ErrorCode.TOPIC_AUTHORIZATION_FAILED]


def test_a_session_keeps_one_waiter_across_its_fetches_and_moves_it_with_its_partitions(leader):
    """The session's purgatory registration outlives each Fetch (registering a thousand
    partitions afresh on every Fetch cost more than the read) and follows what it holds."""
    session_id = opened(leader)
    purgatory = leader._purgatory
    assert answered(fetch(leader, session_id=session_id, epoch=2, max_wait_ms=20)) == {}   # waited, timed out
    assert purgatory.waiter_count == 1                 # still registered after the answer
    assert answered(fetch(leader, session_id=session_id, epoch=3, max_wait_ms=20)) == {}
    assert purgatory.waiter_count == 1                 # the same registration, not a second
    assert answered(fetch(leader, session_id=session_id, epoch=4, forgotten=[0], max_wait_ms=20)) == {}
    assert purgatory.notify(TopicPartition("t", 0)) == 0 and purgatory.notify(TopicPartition("t", 1)) == 1
    # listed again: answered at once with its high watermark (no records), and watched again
    assert answered(fetch(leader, session_id=session_id, epoch=5, listed=[(0, 1)], max_wait_ms=20)) == {0: 0}
    assert purgatory.notify(TopicPartition("t", 0)) == 1 and purgatory.waiter_count == 1
    closing = fetch(leader, session_id=session_id, epoch=-1, listed=[(0, 1)])
    assert closing.error_code == ErrorCode.NONE and purgatory.waiter_count == 0


def test_a_fetch_waiting_on_a_replaced_session_returns_and_the_new_session_waits_alone(leader):
    session_id = opened(leader)
    waiting, answers = waiting_fetch(leader, session_id, 2)
    replacing = fetch(leader, epoch=0, listed=[(0, 1), (1, 1), (2, 1)])   # the follower started over
    assert replacing.error_code == ErrorCode.NONE and replacing.session_id != session_id
    waiting.join(10)      # well inside the fetch's deadline (FETCH_MAX_WAIT_CAP_MS): it was told to stop
    assert not waiting.is_alive() and answered(answers[0]) == {}
    assert leader._purgatory.waiter_count == 0          # the old session's place is free
    again, new_answers = waiting_fetch(leader, replacing.session_id, 1)
    append(leader, 2)
    again.join(30)
    assert not again.is_alive() and list(answered(new_answers[0])) == [2]


class Untouchable:
    """A session partition's log that must not be looked at."""

    def __getattr__(self, name):
        raise AssertionError(f"an untouched partition's log was read ({name})")


def test_a_fetch_woken_by_one_partition_reads_that_partition_only(leader, monkeypatch):
    monkeypatch.setattr("broker.reads.report_interval_s", lambda _ms: 3600.0)   # no periodic read of all here
    session_id = opened(leader)
    # the session's waiter is registered: that first waiting read looks at everything
    assert answered(fetch(leader, session_id=session_id, epoch=2, max_wait_ms=20)) == {}
    session = leader._fetch_sessions._by_id[session_id]
    session.partitions[("t", 0)].log = Untouchable()
    waiting, answers = waiting_fetch(leader, session_id, 3)
    append(leader, 1)
    waiting.join(10)
    assert not waiting.is_alive() and list(answered(answers[0])) == [1]


def test_records_a_full_answer_left_out_go_in_the_next_without_another_append(leader):
    session_id = opened(leader)
    append(leader, 0)
    append(leader, 1)
    # room for one batch: the partition read first gets it, the other only its high watermark
    first = fetch(leader, session_id=session_id, epoch=2, max_wait_ms=20, max_bytes=1)
    sent = [p for p in first.partitions if p.records]
    assert len(sent) == 1 and len(first.partitions) == 2
    left_out = ({0, 1} - {sent[0].partition}).pop()
    # the follower lists only what it got; nothing else is appended meanwhile
    second = fetch(leader, session_id=session_id, epoch=3, max_wait_ms=20,
                   listed=[(sent[0].partition, 2)])
    assert [p.partition for p in second.partitions if p.records] == [left_out]
