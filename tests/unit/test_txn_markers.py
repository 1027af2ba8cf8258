"""The coordinator shell's marker thread, against a fake broker link (no gRPC, no broker).

One decision's markers (the owner's entry and its participants') go out in one
WriteTxnMarkersRequest; when some (entry, partition) pairs fail, only those are sent again;
Complete* is written once all are in; a restarted coordinator re-sends every decided group.
The marker thread runs for real, so the tests wait for it with a bounded deadline."""
from __future__ import annotations

import collections
import threading

import pytest

from eos.errors import ErrorCode
from eos.records.codec import decode_records
from eos.records.header import iter_headers
from eos.types import TopicPartition
from txn_coordinator.coordinator import STATE_TOPIC, TransactionCoordinator
from txn_coordinator.state import TxnState
from tests.waits import wait_for

OUT0, OUT1, OUT2 = TopicPartition("out", 0), TopicPartition("out", 1), TopicPartition("out", 2)
WAIT_S = 10.0


class FakeLink:
    """__transaction_state kept in lists; WriteTxnMarkers answered from a failure plan."""

    def __init__(self):
        self.state_log: dict[int, list[tuple[bytes, bytes]]] = collections.defaultdict(list)
        self.sent: list = []                  # every MarkerRequest group sent
        self.failures: dict[tuple[int, TopicPartition], int] = {}   # (pid, tp) -> times to fail
        self.lock = threading.Lock()
        self.markers_gate = threading.Event()  # cleared: WriteTxnMarkers holds until it is set
        self.markers_gate.set()
        self.markers_held = threading.Event()  # set once a WriteTxnMarkers waits at the gate

    def ensure_topic(self, name: str, partitions: int) -> int:
        return partitions

    def append(self, topic: str, partition: int, records: bytes) -> int:
        assert topic == STATE_TOPIC
        for header in iter_headers(records):
            for record in decode_records(records, header, topic, partition):
                self.state_log[partition].append((record.key, record.value))
        return len(self.state_log[partition]) - 1

    def read_all(self, topic: str, partition: int):
        yield from list(self.state_log.get(partition, []))

    def write_markers(self, group):
        if not self.markers_gate.is_set():
            self.markers_held.set()
            assert self.markers_gate.wait(WAIT_S), "the test never let the markers through"
        with self.lock:
            self.sent.append(group)
            results = {}
            for index, entry in enumerate(group.entries):
                for tp in entry.partitions:
                    left = self.failures.get((entry.producer_id, tp), 0)
                    if left:
                        self.failures[(entry.producer_id, tp)] = left - 1
                        results[(index, tp)] = (ErrorCode.NOT_LEADER_OR_FOLLOWER, "not now")
                    else:
                        results[(index, tp)] = (ErrorCode.NONE, "")
            return results

    def sent_pairs(self, group) -> set[tuple[int, int, bool, TopicPartition]]:
        return {(e.producer_id, e.producer_epoch, e.committed, tp) for e in group.entries for tp in e.partitions}


class Ids:
    def __init__(self):
        self.next = 1000

    def __call__(self) -> int:
        self.next += 1
        return self.next - 1


@pytest.fixture
def make_coordinator():
    started = []

    def make(link: FakeLink, ids: Ids | None = None, **options) -> TransactionCoordinator:
        coordinator = TransactionCoordinator(link, ids or Ids(), now_ms_fn=lambda: 1_000,
                                             state_topic_partitions=3, expiry_interval_ms=3_600_000, **options)
        coordinator.start()
        started.append(coordinator)
        return coordinator

    yield make
    for coordinator in started:
        coordinator.stop()


def open_with_participants(coordinator):
    """'app' with owner partition OUT2 and two participants (OUT0; OUT0 + OUT1)."""
    owner = coordinator.init_producer_id("app", 60_000)
    assert owner.ok, owner
    p1 = coordinator.init_participant("app", owner.producer_id, 0, [OUT0])
    p2 = coordinator.init_participant("app", owner.producer_id, 0, [OUT0, OUT1])
    assert p1.ok and p2.ok and (p1.producer_epoch, p2.producer_epoch) == (0, 0)
    assert coordinator.add_partitions("app", owner.producer_id, 0, [OUT2]).ok
    return owner.producer_id, p1.producer_id, p2.producer_id


def test_one_request_per_decision_and_only_failed_pairs_are_resent(make_coordinator):
    link = FakeLink()
    coordinator = make_coordinator(link)
    owner, p1, p2 = open_with_participants(coordinator)
    link.failures = {(p2, OUT1): 2, (owner, OUT2): 1}
    decided = coordinator.end_transaction("app", owner, 0, True, [p1])
    assert decided.ok and decided.producer_epoch == 1
    wait_for(lambda: coordinator.describe("app").state is TxnState.COMPLETE_COMMIT, "CompleteCommit")
    first, *retries = link.sent
    assert link.sent_pairs(first) == {
        (owner, 1, True, OUT2), (p1, 1, True, OUT0), (p2, 1, False, OUT0), (p2, 1, False, OUT1)}
    assert [link.sent_pairs(g) for g in retries] == [
        {(owner, 1, True, OUT2), (p2, 1, False, OUT1)}, {(p2, 1, False, OUT1)}]
    assert coordinator.describe("app").participants == ()


def test_a_decision_without_any_partition_completes_without_markers(make_coordinator):
    link = FakeLink()
    coordinator = make_coordinator(link)
    owner = coordinator.init_producer_id("app", 60_000)
    participant = coordinator.init_participant("app", owner.producer_id, 0, [])
    assert coordinator.end_transaction("app", owner.producer_id, 0, True, [participant.producer_id]).ok
    wait_for(lambda: coordinator.describe("app").state is TxnState.COMPLETE_COMMIT, "CompleteCommit")
    assert link.sent == []


def test_unknown_accepted_participant_is_refused_and_nothing_is_written(make_coordinator):
    link = FakeLink()
    coordinator = make_coordinator(link)
    owner, p1, p2 = open_with_participants(coordinator)
    records_before = sum(len(v) for v in link.state_log.values())
    refused = coordinator.end_transaction("app", owner, 0, True, [p1, 999_999])
    assert refused.error is ErrorCode.INVALID_PRODUCER_ID_MAPPING and "999999" in refused.message
    assert sum(len(v) for v in link.state_log.values()) == records_before
    assert coordinator.describe("app").state is TxnState.ONGOING and link.sent == []


def test_a_restart_resends_every_decided_group(make_coordinator):
    link = FakeLink()
    ids = Ids()
    first = make_coordinator(link, ids)
    owner, p1, p2 = open_with_participants(first)
    # every marker keeps failing while the first coordinator lives
    link.failures = {(pid, tp): 10**9 for pid in (owner, p1, p2) for tp in (OUT0, OUT1, OUT2)}
    assert first.end_transaction("app", owner, 0, True, [p2]).ok
    wait_for(lambda: len(link.sent) >= 1, "the first marker attempt")
    first.stop()
    assert first.describe("app").state is TxnState.PREPARE_COMMIT
    link.failures = {}
    sent_before = len(link.sent)
    second = make_coordinator(link, ids)
    wait_for(lambda: second.describe("app").state is TxnState.COMPLETE_COMMIT, "CompleteCommit after restart")
    assert link.sent_pairs(link.sent[sent_before]) == {
        (owner, 1, True, OUT2), (p1, 1, False, OUT0), (p2, 1, True, OUT0), (p2, 1, True, OUT1)}


# ---- a request meeting the previous transaction's completion waits for it --------------------

def committed_with_markers_held(coordinator, link):
    """'app' commits a transaction on OUT0 whose markers are held at the link's gate."""
    owner = coordinator.init_producer_id("app", 60_000)
    assert coordinator.add_partitions("app", owner.producer_id, 0, [OUT0]).ok
    link.markers_gate.clear()
    decided = coordinator.end_transaction("app", owner.producer_id, 0, True)
    assert decided.ok
    assert link.markers_held.wait(WAIT_S)
    return decided


def test_add_partitions_during_the_previous_commit_waits_for_it_instead_of_refusing(make_coordinator):
    link = FakeLink()
    coordinator = make_coordinator(link, concurrent_wait_ms=int(WAIT_S * 1000))
    decided = committed_with_markers_held(coordinator, link)
    answers = []
    caller = threading.Thread(target=lambda: answers.append(coordinator.add_partitions(
        "app", decided.producer_id, decided.producer_epoch, [OUT1])))
    caller.start()
    # It is parked: while the markers are held it has no answer and nothing of it is written.
    wait_for(lambda: coordinator._concurrent_waiters == 1, "the request parked")
    assert answers == [] and coordinator.describe("app").state is TxnState.PREPARE_COMMIT
    link.markers_gate.set()
    caller.join(WAIT_S)
    assert [a.error for a in answers] == [ErrorCode.NONE]
    described = coordinator.describe("app")
    assert described.state is TxnState.ONGOING and described.partitions == frozenset({OUT1})


def test_a_wait_that_runs_out_answers_concurrent_transactions_and_changes_nothing(make_coordinator):
    link = FakeLink()
    coordinator = make_coordinator(link, concurrent_wait_ms=50)
    decided = committed_with_markers_held(coordinator, link)
    records_before = sum(len(v) for v in link.state_log.values())
    answer = coordinator.add_partitions("app", decided.producer_id, decided.producer_epoch, [OUT1])
    assert answer.error is ErrorCode.CONCURRENT_TRANSACTIONS
    assert coordinator.describe("app").state is TxnState.PREPARE_COMMIT
    assert sum(len(v) for v in link.state_log.values()) == records_before
    link.markers_gate.set()
    wait_for(lambda: coordinator.describe("app").state is TxnState.COMPLETE_COMMIT, "CompleteCommit")


def test_past_the_cap_of_parked_requests_the_answer_is_concurrent_transactions_at_once(make_coordinator):
    link = FakeLink()
    # A wait far longer than the test's bound: a request parked despite the cap would still
    # be waiting when the test looks, with the markers held.
    coordinator = make_coordinator(link, concurrent_wait_ms=3_600_000, concurrent_waiters_max=0)
    decided = committed_with_markers_held(coordinator, link)
    answers = []
    caller = threading.Thread(target=lambda: answers.append(coordinator.add_partitions(
        "app", decided.producer_id, decided.producer_epoch, [OUT1])), daemon=True)
    caller.start()
    caller.join(WAIT_S)
    parked = caller.is_alive()
    link.markers_gate.set()
    assert not parked, "the request was parked although no more may be"
    assert [a.error for a in answers] == [ErrorCode.CONCURRENT_TRANSACTIONS]
    assert coordinator._concurrent_waiters == 0


def test_an_unreadable_record_in_the_log_is_skipped_and_the_rest_loads(make_coordinator):
    # Before, one keyed record the log could not decode (a client's Produce to
    # __transaction_state, refused now) made every load attempt fail: no transactional id of
    # the partition could ever be initialised again.
    link = FakeLink()
    first = make_coordinator(link)
    assert first.init_producer_id("kept", 60_000).ok
    partition = next(p for p, records in link.state_log.items() if records)
    link.state_log[partition].insert(0, (b"\xde\xad\xbe\xef junk key", b"junk value"))
    first.stop()

    restarted = make_coordinator(link)
    assert restarted.describe("kept") is not None
    assert restarted.init_producer_id("kept", 60_000).ok
