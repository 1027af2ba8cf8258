"""Consumer groups through a real broker: `eos.Consumer.subscribe` against the group
coordinator.

Members are real consumers. Most tests drive several of them from the test's thread, one
short poll() each in turn (the heartbeats run on each consumer's own thread, as in Kafka);
the kill -9 test runs one member as a subprocess. Every rebalance listener call is recorded
with the generation it belongs to, so "no partition read by two members in one generation"
is checked on what the members were told, not on timing. Waits are bounded polls of
observable state; the broker runs with short group timeouts so a dead member is noticed in
seconds.
"""
from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import defaultdict

import pytest

import eos
from consumer import CommitFailedError, ConsumerGroupMetadata, OffsetAndMetadata
from eos.errors import EosError, ErrorCode
from eos.types import TopicPartition
from eos.v1 import group_pb2, group_pb2_grpc, txn_pb2
from tests.conftest import REPO_ROOT, BrokerProcess
from tests.waits import wait_for

WAIT_S = 60.0
FAST_GROUPS = {"group.min.session.timeout.ms": "500", "group.initial.rebalance.delay.ms": "200"}
MEMBER = dict(auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300,
              fetch_max_wait_ms=100)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(tmp_path_factory.mktemp("groups") / "data", config=FAST_GROUPS)
    process.start()
    yield process
    process.close()


_names = iter(range(10_000))


def fresh(prefix: str) -> str:
    return f"{prefix}-{next(_names)}"


def create_topic(broker, name: str, partitions: int) -> None:
    with eos.Admin(broker.address) as admin:
        admin.create_topic(name, partitions=partitions)


def produce(broker, topic: str, partitions: int, per_partition: int) -> None:
    with eos.Producer(broker.address, linger_ms=5) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, value=f"{p}:{i}".encode(), partition=p)
        producer.flush()


class Recorder:
    """A rebalance listener that records (kind, generation, partitions) and the records read."""

    def __init__(self, name: str):
        self.name = name
        self.consumer: eos.Consumer | None = None
        self.events: list[tuple[str, int, tuple[TopicPartition, ...]]] = []
        self.records: list = []

    def _generation(self) -> int:
        return self.consumer.group_metadata().generation_id

    def on_partitions_revoked(self, partitions):
        self.events.append(("revoked", self._generation(), tuple(sorted(partitions))))

    def on_partitions_assigned(self, partitions):
        self.events.append(("assigned", self._generation(), tuple(sorted(partitions))))

    def on_partitions_lost(self, partitions):
        self.events.append(("lost", self._generation(), tuple(sorted(partitions))))

    def assignments(self) -> dict[int, tuple[TopicPartition, ...]]:
        return {gen: tps for kind, gen, tps in self.events if kind == "assigned"}


def member(broker, group: str, topics, name: str, **config) -> tuple[eos.Consumer, Recorder]:
    consumer = eos.Consumer(broker.address, group_id=group, **{**MEMBER, **config})
    recorder = Recorder(name)
    recorder.consumer = consumer
    consumer.subscribe(topics, listener=recorder)
    return consumer, recorder


def drive(members, until, what: str, timeout_s: float = WAIT_S, commit: bool = True):
    """Poll every member in turn (committing what each read) until `until()` holds."""
    deadline = time.monotonic() + timeout_s
    while True:
        for consumer, recorder in members:
            records = consumer.poll(timeout_ms=20)
            recorder.records.extend((r.topic, r.partition, r.offset) for r in records)
            if records and commit:
                consumer.commit()
        if until():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def all_partitions(topic: str, count: int) -> set[TopicPartition]:
    return {TopicPartition(topic, p) for p in range(count)}


def same_generation_covers(members, expected: set[TopicPartition]) -> bool:
    generations = {c.group_metadata().generation_id for c, _ in members}
    if len(generations) != 1 or -1 in generations:
        return False
    owned = [c.assignment() for c, _ in members]
    return set().union(*owned) == expected and sum(len(o) for o in owned) == len(expected)


def assert_no_overlap_per_generation(assignments_by_member: dict[str, dict[int, tuple]]) -> None:
    by_generation: dict[int, dict[TopicPartition, str]] = defaultdict(dict)
    for name, assignments in assignments_by_member.items():
        for generation, partitions in assignments.items():
            for tp in partitions:
                other = by_generation[generation].get(tp)
                assert other is None, f"{tp} given to {other} and {name} in generation {generation}"
                by_generation[generation][tp] = name


def close_all(members) -> None:
    for consumer, _ in members:
        consumer.close()


# ---- membership -----------------------------------------------------------------------------

def test_three_members_never_share_a_partition_in_a_generation(broker):
    topic, group = fresh("three"), fresh("g-three")
    create_topic(broker, topic, 7)
    produce(broker, topic, 7, 20)
    expected = all_partitions(topic, 7)
    members = [member(broker, group, [topic], "a"), member(broker, group, [topic], "b")]
    try:
        drive(members, lambda: same_generation_covers(members, expected), "two members to share the topic")
        members.append(member(broker, group, [topic], "c"))
        drive(members, lambda: same_generation_covers(members, expected), "three members to share the topic")
        assert all(len(c.assignment()) in (2, 3) for c, _ in members)   # range: 3, 2, 2
        produce(broker, topic, 7, 20)
        drive(members, lambda: sum(len(r.records) for _, r in members) >= 7 * 40, "every record read")
        leaving = members.pop(0)
        leaving[0].close()
        drive(members, lambda: same_generation_covers(members, expected), "two members after one left")
        produce(broker, topic, 7, 10)
        drive(members, lambda: sum(len(r.records) for _, r in members + [leaving]) >= 7 * 50, "every record read")
    finally:
        close_all(members)
    everyone = members + [leaving]
    assert_no_overlap_per_generation({r.name: r.assignments() for _, r in everyone})
    read = [rec for _, r in everyone for rec in r.records]
    # Each member committed after every poll and only ever gave partitions up at a rebalance
    # (eager: revoked before rejoining), so every record was read exactly once.
    assert sorted(read) == sorted((topic, p, o) for p in range(7) for o in range(50))
    # The leaving member's listener heard the revocation when it closed.
    assert leaving[1].events[-1][0] == "revoked"


def test_listener_calls_and_a_seek_in_on_partitions_assigned(broker):
    topic, group = fresh("listen"), fresh("g-listen")
    create_topic(broker, topic, 2)
    produce(broker, topic, 2, 10)

    class Seeker(Recorder):
        def on_partitions_assigned(self, partitions):
            super().on_partitions_assigned(partitions)
            for tp in partitions:
                self.consumer.seek(tp, 7)

    consumer = eos.Consumer(broker.address, group_id=group, **MEMBER)
    seeker = Seeker("seeker")
    seeker.consumer = consumer
    consumer.subscribe([topic], listener=seeker)
    first = (consumer, seeker)
    second = member(broker, group, [topic], "second")
    try:
        drive([first], lambda: len(seeker.records) == 6, "the records after the seek")
        assert sorted(seeker.records) == [(topic, p, o) for p in range(2) for o in (7, 8, 9)]
        assert [kind for kind, _, _ in seeker.events] == ["assigned"]
        both = [first, second]
        drive(both, lambda: same_generation_covers(both, all_partitions(topic, 2)), "a rebalance for the second")
    finally:
        close_all([second])
    kinds = [kind for kind, _, _ in seeker.events]
    assert kinds == ["assigned", "revoked", "assigned"]
    (_, gen1, owned1), (_, gen_revoked, revoked), (_, gen2, owned2) = seeker.events
    assert revoked == owned1 and gen_revoked == gen1 and gen2 > gen1 and len(owned2) == 1
    consumer.close()
    assert seeker.events[-1] == ("revoked", gen2, owned2)


def test_sticky_members_keep_their_partitions_when_one_leaves(broker):
    topic, group = fresh("sticky"), fresh("g-sticky")
    create_topic(broker, topic, 6)
    expected = all_partitions(topic, 6)
    members = [member(broker, group, [topic], n, partition_assignment_strategy="sticky") for n in ("a", "b", "c")]
    try:
        drive(members, lambda: same_generation_covers(members, expected), "three sticky members")
        before = {r.name: c.assignment() for c, r in members}
        leaving = members.pop(0)            # under range, both survivors' ranges would shift
        leaving[0].close()
        drive(members, lambda: same_generation_covers(members, expected), "the survivors to share the topic")
        for consumer, recorder in members:
            assert consumer.assignment() >= before[recorder.name]      # kept what they had, took a share
            assert len(consumer.assignment()) == 3
    finally:
        close_all(members)


def test_subscribe_by_pattern_follows_new_topics(broker):
    prefix = fresh("pat")
    create_topic(broker, f"{prefix}-a", 2)
    create_topic(broker, f"{prefix}-b", 1)
    create_topic(broker, f"other-{prefix}", 1)
    consumer, recorder = member(broker, fresh("g-pat"), re.compile(re.escape(prefix) + r"-.*"), "p",
                                metadata_max_age_ms=300)
    try:
        expected = {TopicPartition(f"{prefix}-a", 0), TopicPartition(f"{prefix}-a", 1), TopicPartition(f"{prefix}-b", 0)}
        drive([(consumer, recorder)], lambda: consumer.assignment() == expected, "the pattern's topics")
        assert consumer.subscription() == {f"{prefix}-a", f"{prefix}-b"}
        create_topic(broker, f"{prefix}-c", 1)
        produce(broker, f"{prefix}-c", 1, 3)
        expected.add(TopicPartition(f"{prefix}-c", 0))
        drive([(consumer, recorder)], lambda: consumer.assignment() == expected and len(recorder.records) == 3,
              "the new topic assigned and read")
    finally:
        consumer.close()


def test_the_leader_rejoins_when_partitions_are_added(broker):
    topic, group = fresh("grow"), fresh("g-grow")
    create_topic(broker, topic, 2)
    members = [member(broker, group, [topic], n, metadata_max_age_ms=300) for n in ("a", "b")]
    try:
        drive(members, lambda: same_generation_covers(members, all_partitions(topic, 2)), "the first assignment")
        generation = members[0][0].group_metadata().generation_id
        with eos.Admin(broker.address) as admin:
            admin.create_partitions(topic, 5)
        drive(members, lambda: same_generation_covers(members, all_partitions(topic, 5)), "the grown assignment")
        assert members[0][0].group_metadata().generation_id > generation
    finally:
        close_all(members)


@pytest.mark.parametrize("assignor", ["range", "sticky"])
def test_a_static_member_restarted_keeps_its_partitions_without_a_rebalance(broker, assignor):
    # Under "sticky" the subscription carries the partitions owned and their generation, so the
    # restarted member's JoinGroup metadata differs from the bytes the coordinator holds; the
    # coordinator still keeps the generation (Kafka's rule: only a change of protocol choice
    # rebalances a static restart).
    topic, group = fresh(f"static-{assignor}"), fresh(f"g-static-{assignor}")
    create_topic(broker, topic, 4)
    produce(broker, topic, 4, 5)
    config = dict(partition_assignment_strategy=[assignor])
    a = member(broker, group, [topic], "a", group_instance_id="instance-a", **config)
    try:
        # a alone first, then b: a rejoins for b's arrival, so the coordinator holds a's
        # subscription as a running member sends it (under "sticky": with what it owned).
        drive([a], lambda: same_generation_covers([a], all_partitions(topic, 4)), "a alone")
        b = member(broker, group, [topic], "b", group_instance_id="instance-b", **config)
        drive([a, b], lambda: same_generation_covers([a, b], all_partitions(topic, 4)), "both static members")
        drive([a, b], lambda: len(a[1].records) + len(b[1].records) == 20, "every record")
        generation = b[0].group_metadata().generation_id
        owned_a, owned_b = a[0].assignment(), b[0].assignment()
        old_member_id = a[0].group_metadata().member_id
        b_events = list(b[1].events)
        a[0].close()                        # static: no LeaveGroup; the coordinator keeps its place
        produce(broker, topic, 4, 5)
        restarted = member(broker, group, [topic], "a2", group_instance_id="instance-a", **config)
        drive([restarted, b], lambda: restarted[0].assignment() == owned_a and len(restarted[1].records) == 10,
              "the restarted member's partitions and new records")
        metadata = restarted[0].group_metadata()
        assert metadata.generation_id == generation and metadata.group_instance_id == "instance-a"
        assert metadata.member_id != old_member_id
        assert restarted[1].assignments() == {generation: tuple(sorted(owned_a))}
        assert b[1].events == b_events                     # b never saw a rebalance: nothing revoked
        assert b[0].assignment() == owned_b and b[0].group_metadata().generation_id == generation
        with eos.Admin(broker.address) as admin:
            described = admin.describe_group(group)
        assert (described["state"], described["protocol"], described["generation"]) == ("Stable", assignor, generation)
        by_instance = {m["group_instance_id"]: m for m in described["members"]}
        assert by_instance["instance-a"]["member_id"] == metadata.member_id
        assert set(by_instance["instance-a"]["assignment"]) == owned_a
        # It continued from a's committed offsets: only the new records.
        assert sorted(o for _, _, o in restarted[1].records) == sorted([5, 6, 7, 8, 9] * len(owned_a))
    finally:
        if "b" in locals():
            close_all([b])
        if "restarted" in locals():
            restarted[0].close()
        else:
            a[0].close()


def test_a_member_that_stops_polling_leaves_and_rejoins_when_it_polls_again(broker):
    topic, group = fresh("slow"), fresh("g-slow")
    create_topic(broker, topic, 2)
    slow = member(broker, group, [topic], "slow", max_poll_interval_ms=1500)
    busy = member(broker, group, [topic], "busy", max_poll_interval_ms=1500)
    both = [slow, busy]
    try:
        drive(both, lambda: same_generation_covers(both, all_partitions(topic, 2)), "both members")
        drive([busy], lambda: busy[0].assignment() == all_partitions(topic, 2),
              "the busy member to take everything while the other does not poll")
        assert slow[0].group_metadata().generation_id == -1     # it left: its generation is gone
        with pytest.raises(CommitFailedError):
            slow[0].commit({TopicPartition(topic, 0): 0})
        drive(both, lambda: same_generation_covers(both, all_partitions(topic, 2)), "the slow member back")
        assert [kind for kind, _, _ in slow[1].events][-2:] == ["lost", "assigned"]
    finally:
        close_all(both)


# ---- offsets --------------------------------------------------------------------------------

def test_commit_sync_async_and_committed(broker):
    topic, group = fresh("commit"), fresh("g-commit")
    create_topic(broker, topic, 2)
    produce(broker, topic, 2, 10)
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer, recorder = member(broker, group, [topic], "c")
    try:
        assert consumer.committed([tp0, tp1]) == {tp0: None, tp1: None}
        drive([(consumer, recorder)], lambda: len(recorder.records) == 20, "every record", commit=False)
        consumer.commit()                                           # positions
        assert consumer.committed([tp0, tp1]) == {tp0: 10, tp1: 10}
        consumer.commit({tp0: 3, tp1: OffsetAndMetadata(4, "note")})
        assert consumer.committed(tp0) == {tp0: 3}
        outcomes = []
        consumer.commit_async(lambda offsets, error: outcomes.append((offsets, error)), {tp0: 6})
        wait_for(lambda: consumer.poll(timeout_ms=20) == [] and outcomes, "the async commit's callback")
        assert outcomes == [({tp0: OffsetAndMetadata(6)}, None)]
        consumer.commit({tp1: 8}, asynchronous=True)
        wait_for(lambda: consumer.poll(timeout_ms=20) == [] and consumer.committed([tp1])[tp1] == 8,
                 "the asynchronous commit")
        assert consumer.committed([tp0, tp1]) == {tp0: 6, tp1: 8}
        with pytest.raises(ValueError, match="non-negative"):
            consumer.commit({tp0: -1})
        metadata = consumer.group_metadata()
        assert isinstance(metadata, ConsumerGroupMetadata) and metadata.group_id == group
        assert metadata.generation_id >= 1 and metadata.member_id and metadata.group_instance_id is None
    finally:
        consumer.close()
    # A new member of the group starts where the commits left off.
    again, recorder = member(broker, group, [topic], "again")
    try:
        drive([(again, recorder)], lambda: len(recorder.records) == 6, "the records after the commits")
        assert sorted(recorder.records) == sorted([(topic, 0, o) for o in range(6, 10)] +
                                                  [(topic, 1, o) for o in (8, 9)])
    finally:
        again.close()


def test_auto_commit_on_poll_and_on_close(broker):
    topic, group = fresh("auto"), fresh("g-auto")
    create_topic(broker, topic, 1)
    produce(broker, topic, 1, 10)
    tp = TopicPartition(topic, 0)
    consumer, recorder = member(broker, group, [topic], "auto", enable_auto_commit=True,
                                auto_commit_interval_ms=200, max_poll_records=4)
    try:
        drive([(consumer, recorder)], lambda: len(recorder.records) == 10, "every record", commit=False)
        drive([(consumer, recorder)], lambda: consumer.committed([tp])[tp] == 10, "the auto-commit", commit=False)
        produce(broker, topic, 1, 3)
        drive([(consumer, recorder)], lambda: len(recorder.records) == 13, "the new records", commit=False)
    finally:
        consumer.close()                                           # commits the position
    with eos.Consumer(broker.address, group_id=group) as reader:
        assert reader.committed([tp]) == {tp: 13}


def test_committed_waits_for_a_pending_transactional_commit(broker):
    """require_stable: while a TxnOffsetCommit waits for its marker, committed() retries
    UNSTABLE_OFFSET_COMMIT and answers the transaction's offset once it commits."""
    topic, group = fresh("txnoff"), fresh("g-txnoff")
    create_topic(broker, topic, 1)
    tp = TopicPartition(topic, 0)
    txn, groups = broker.txn_stub(), group_pb2_grpc.GroupCoordinatorStub(broker.channel())
    init = txn.InitProducerId(txn_pb2.InitProducerIdRequest(transactional_id=f"t-{group}", transaction_timeout_ms=60000,
                                                            producer_id=-1, producer_epoch=-1), timeout=30)
    assert init.error_code == ErrorCode.NONE, init
    pid, epoch = init.producer_id, init.producer_epoch
    added = txn.AddOffsetsToTxn(txn_pb2.AddOffsetsToTxnRequest(transactional_id=f"t-{group}", producer_id=pid,
                                                               producer_epoch=epoch, group_id=group), timeout=30)
    assert added.error_code == ErrorCode.NONE, added
    staged = groups.TxnOffsetCommit(group_pb2.TxnOffsetCommitRequest(
        transactional_id=f"t-{group}", group_id=group, producer_id=pid, producer_epoch=epoch, generation_id=-1,
        offsets=[group_pb2.OffsetToCommit(topic=topic, partition=0, offset=42, leader_epoch=-1)]), timeout=30)
    assert [p.error_code for p in staged.partitions] == [ErrorCode.NONE], staged
    with eos.Consumer(broker.address, group_id=group, retry_backoff_ms=50) as consumer:
        with pytest.raises(EosError) as refused:
            consumer.committed([tp], timeout_ms=300)
        assert refused.value.code == ErrorCode.UNSTABLE_OFFSET_COMMIT
        answer = []
        waiter = threading.Thread(target=lambda: answer.append(consumer.committed([tp], timeout_ms=30_000)))
        waiter.start()
        ended = txn.EndTxn(txn_pb2.EndTxnRequest(transactional_id=f"t-{group}", producer_id=pid, producer_epoch=epoch,
                                                 committed=True), timeout=30)
        assert ended.error_code == ErrorCode.NONE, ended
        waiter.join(WAIT_S)
        assert answer == [{tp: 42}]


def test_a_stale_generation_from_group_metadata_is_fenced_in_a_transaction(broker):
    """KIP-447: the group_metadata() a zombie holds is refused by TxnOffsetCommit."""
    topic, group = fresh("zombie"), fresh("g-zombie")
    create_topic(broker, topic, 2)
    first = member(broker, group, [topic], "first")
    drive([first], lambda: first[0].assignment() == all_partitions(topic, 2), "the first member")
    stale = first[0].group_metadata()
    second = member(broker, group, [topic], "second")
    both = [first, second]
    try:
        drive(both, lambda: same_generation_covers(both, all_partitions(topic, 2)), "the rebalance")
        current = first[0].group_metadata()
        assert current.generation_id > stale.generation_id
        txn, groups = broker.txn_stub(), group_pb2_grpc.GroupCoordinatorStub(broker.channel())
        tid = f"t-{group}"
        init = txn.InitProducerId(txn_pb2.InitProducerIdRequest(transactional_id=tid, transaction_timeout_ms=60000,
                                                                producer_id=-1, producer_epoch=-1), timeout=30)
        pid, epoch = init.producer_id, init.producer_epoch
        assert txn.AddOffsetsToTxn(txn_pb2.AddOffsetsToTxnRequest(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group), timeout=30).error_code == 0

        def txn_commit(metadata):
            response = groups.TxnOffsetCommit(group_pb2.TxnOffsetCommitRequest(
                transactional_id=tid, group_id=metadata.group_id, producer_id=pid, producer_epoch=epoch,
                generation_id=metadata.generation_id, member_id=metadata.member_id,
                group_instance_id=metadata.group_instance_id or "",
                offsets=[group_pb2.OffsetToCommit(topic=topic, partition=0, offset=1, leader_epoch=-1)]), timeout=30)
            return [p.error_code for p in response.partitions]

        assert txn_commit(stale) == [ErrorCode.ILLEGAL_GENERATION]
        assert txn_commit(current) == [ErrorCode.NONE]
        txn.EndTxn(txn_pb2.EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                         committed=False), timeout=30)
    finally:
        close_all(both)


# ---- kill -9 of a member ------------------------------------------------------------------

VICTIM = r"""
import sys, time
import eos
address, topic, group, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def say(*words):
    print(*words, flush=True)

class Listener:
    def on_partitions_revoked(self, partitions):
        say("revoked", consumer.group_metadata().generation_id, ",".join(str(tp.partition) for tp in sorted(partitions)))
    def on_partitions_assigned(self, partitions):
        say("assigned", consumer.group_metadata().generation_id, ",".join(str(tp.partition) for tp in sorted(partitions)))

consumer = eos.Consumer(address, group_id=group, auto_offset_reset="earliest", session_timeout_ms=6000,
                        heartbeat_interval_ms=300, fetch_max_wait_ms=100, max_poll_records=5)
consumer.subscribe([topic], listener=Listener())
read = 0
while True:
    records = consumer.poll(timeout_ms=50)
    for r in records:
        say("record", r.partition, r.offset)
    read += len(records)
    if records and read <= limit:
        consumer.commit()
        say("committed", ",".join(f"{tp.partition}:{o}" for tp, o in sorted(consumer.committed(consumer.assignment()).items()) if o is not None))
    if read > limit:
        say("stalled")          # the last records read are not committed: they will be read again
        time.sleep(3600)        # heartbeats go on until kill -9
"""


class Victim:
    def __init__(self, broker, topic: str, group: str, limit: int):
        self.process = subprocess.Popen([sys.executable, "-c", VICTIM, broker.address, topic, group, str(limit)],
                                        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, text=True)
        self.lines: list[list[str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append(line.split())

    def generation_and_partitions(self) -> tuple[int, set[int]] | None:
        assigned = [words for words in self.lines if words[0] == "assigned"]
        if not assigned:
            return None
        words = assigned[-1]
        return int(words[1]), {int(p) for p in words[2].split(",")} if len(words) > 2 else set()

    def assignments(self) -> dict[int, tuple[int, ...]]:
        return {int(w[1]): tuple(int(p) for p in w[2].split(",")) if len(w) > 2 else ()
                for w in self.lines if w[0] == "assigned"}

    def records(self) -> list[tuple[int, int]]:
        return [(int(w[1]), int(w[2])) for w in self.lines if w[0] == "record"]

    def last_committed(self) -> dict[int, int]:
        committed = [w for w in self.lines if w[0] == "committed"]
        if not committed or len(committed[-1]) < 2:
            return {}
        return {int(p): int(o) for p, o in (item.split(":") for item in committed[-1][1].split(","))}

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(30)
        self._reader.join(10)


def test_kill_9_of_a_member_moves_its_partitions_from_the_committed_offsets(broker):
    topic, group = fresh("kill"), fresh("g-kill")
    partitions, per_partition = 6, 60
    create_topic(broker, topic, partitions)
    everything = all_partitions(topic, partitions)
    survivors = [member(broker, group, [topic], "a"), member(broker, group, [topic], "b")]
    victim = Victim(broker, topic, group, limit=12)
    try:
        def three_share_one_generation():
            seen = victim.generation_and_partitions()
            if seen is None or not seen[1]:
                return False
            generations = {c.group_metadata().generation_id for c, _ in survivors}
            owned = [c.assignment() for c, _ in survivors]
            theirs = {TopicPartition(topic, p) for p in seen[1]}
            return (generations == {seen[0]} and set().union(theirs, *owned) == everything
                    and len(theirs) + sum(map(len, owned)) == partitions)

        drive(survivors, three_share_one_generation, "three members sharing the topic")
        victim_partitions = victim.generation_and_partitions()[1]
        produce(broker, topic, partitions, per_partition)
        drive(survivors, lambda: ["stalled"] in victim.lines and
              len(survivors[0][1].records) + len(survivors[1][1].records) ==
              (partitions - len(victim_partitions)) * per_partition, "the victim to stall, the others to finish")
        committed_by_victim = victim.last_committed()
        read_by_victim = victim.records()
        victim.kill()

        def everything_read():
            read = {(p, o) for _, r in survivors for _, p, o in r.records} | set(read_by_victim)
            return len(read) == partitions * per_partition and set().union(*(c.assignment() for c, _ in survivors)) == everything

        drive(survivors, everything_read, "the dead member's partitions to move and be read")
    finally:
        victim.kill()
        close_all(survivors)

    assert committed_by_victim and set(committed_by_victim) <= victim_partitions
    # After the kill, each of the victim's partitions was read from exactly its last committed
    # offset (or from 0 where it had committed nothing): nothing committed was read again,
    # and what it had read without committing was read again (at least once).
    for p in victim_partitions:
        start = committed_by_victim.get(p, 0)
        after = sorted(o for _, r in survivors for _, q, o in r.records if q == p)
        assert after == list(range(start, per_partition)), (p, start, after[:5])
        assert {o for q, o in read_by_victim if q == p} >= set(range(start))
    # Nothing committed is lost: the group's offsets end at the end of every partition.
    with eos.Consumer(broker.address, group_id=group) as reader:
        assert reader.committed(sorted(everything)) == {tp: per_partition for tp in everything}
    names = {r.name: r.assignments() for _, r in survivors}
    names["victim"] = {g: tuple(TopicPartition(topic, p) for p in ps) for g, ps in victim.assignments().items()}
    assert_no_overlap_per_generation(names)


# ---- cooperative rebalancing (KIP-429) ------------------------------------------------------

class Feeder:
    """A producer thread that keeps writing one record to every partition in turn until stopped."""

    def __init__(self, broker, topic: str, partitions: int):
        self.broker, self.topic, self.partitions = broker, topic, partitions
        self.stopped = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"feeder-{topic}")
        self._thread.start()

    def _run(self):
        try:
            with eos.Producer(self.broker.address, linger_ms=5) as producer:
                i = 0
                while not self.stopped.is_set():
                    for p in range(self.partitions):
                        producer.send(self.topic, value=f"{p}:{i}".encode(), partition=p)
                    i += 1
                    producer.flush()
                    self.stopped.wait(0.005)
        except BaseException as exc:   # reported by stop()
            self.error = exc

    def stop(self):
        self.stopped.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the feeder did not stop"
        if self.error is not None:
            raise self.error


class ContinuousMember:
    """One member polling on its own thread without pause. Every moment its assignment can be
    seen is recorded (after each poll, and inside each listener call), with every record read
    and every listener call."""

    def __init__(self, broker, group: str, topic: str, name: str, assignors):
        self.name = name
        self.consumer = eos.Consumer(broker.address, group_id=group, partition_assignment_strategy=assignors,
                                     **MEMBER)
        self.events: list[tuple[str, int, tuple[TopicPartition, ...]]] = []
        self.snapshots: list[frozenset] = []        # the assignment at every moment recorded
        self.records: list[tuple[int, int]] = []    # (partition, offset) in the order read
        self.error: BaseException | None = None
        self.stopped = threading.Event()
        self.consumer.subscribe([topic], listener=self)
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"member-{name}")
        self._thread.start()

    def _note(self, kind, partitions):
        self.events.append((kind, self.consumer.group_metadata().generation_id, tuple(sorted(partitions))))
        self.snapshots.append(frozenset(self.consumer.assignment()))

    def on_partitions_revoked(self, partitions):
        self._note("revoked", partitions)

    def on_partitions_assigned(self, partitions):
        self._note("assigned", partitions)

    def on_partitions_lost(self, partitions):
        self._note("lost", partitions)

    def _run(self):
        try:
            while not self.stopped.is_set():
                records = self.consumer.poll(timeout_ms=20)
                self.records.extend((r.partition, r.offset) for r in records)
                self.snapshots.append(frozenset(self.consumer.assignment()))
        except BaseException as exc:   # reported by stop()
            self.error = exc

    def _raise_failure(self):
        if self.error is not None:     # a wait on this member fails at once, naming why
            raise AssertionError(f"member {self.name} failed: {self.error}") from self.error

    def assignment(self) -> frozenset:
        self._raise_failure()
        return self.snapshots[-1] if self.snapshots else frozenset()

    def read_from(self, partitions, since: int = 0) -> set[int]:
        """Partitions (numbers) among `partitions` with a record read at index `since` or later."""
        self._raise_failure()
        numbers = {tp.partition for tp in partitions}
        return {p for p, _ in self.records[since:] if p in numbers}

    def stop(self):
        self.stopped.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), f"member {self.name} did not stop polling"
        # What it heard and held while a member (close() then revokes the rest).
        self.live_events, self.live_snapshots = list(self.events), list(self.snapshots)
        self.consumer.close()
        if self.error is not None:
            raise self.error


def settled(members, expected: set[TopicPartition]) -> bool:
    generations = {m.consumer.group_metadata().generation_id for m in members}
    owned = [m.assignment() for m in members]
    return (len(generations) == 1 and -1 not in generations and set().union(*owned) == expected
            and sum(len(o) for o in owned) == len(expected))


def test_cooperative_a_fourth_member_joining_three_does_not_stop_what_they_keep(broker):
    partitions = 12
    topic, group = fresh("coop"), fresh("g-coop")
    create_topic(broker, topic, partitions)
    expected = all_partitions(topic, partitions)
    feeder = Feeder(broker, topic, partitions)
    old = [ContinuousMember(broker, group, topic, n, ["cooperative-sticky"]) for n in ("a", "b", "c")]
    newcomer = None
    try:
        wait_for(lambda: settled(old, expected), "three members to share the topic")
        before = {m.name: m.assignment() for m in old}
        wait_for(lambda: all(m.read_from(before[m.name]) == {tp.partition for tp in before[m.name]} for m in old),
                 "each of the three to read every partition it owns")
        joined_at = {m.name: len(m.records) for m in old}
        snapshots_at = {m.name: len(m.snapshots) for m in old}
        newcomer = ContinuousMember(broker, group, topic, "d", ["cooperative-sticky"])
        everyone = old + [newcomer]
        wait_for(lambda: settled(everyone, expected) and len(newcomer.assignment()) == 3,
                 "the fourth member to get its share")
        after = {m.name: m.assignment() for m in old + [newcomer]}
        kept = {m.name: before[m.name] & after[m.name] for m in old}
        marks = {m.name: len(m.records) for m in old}
        # Records keep coming after the rebalance too, on every kept partition and to the newcomer.
        wait_for(lambda: all(m.read_from(kept[m.name], since=marks[m.name]) == {tp.partition for tp in kept[m.name]}
                             for m in old) and newcomer.read_from(newcomer.assignment()) ==
                 {tp.partition for tp in newcomer.assignment()}, "records on every partition after the rebalance")
    finally:
        for m in old + ([newcomer] if newcomer is not None else []):
            m.stop()
        feeder.stop()

    for m in old:
        assert len(before[m.name]) == 4 and len(after[m.name]) == 3 and len(kept[m.name]) == 3, (m.name, before, after)
        moved = before[m.name] - after[m.name]
        # The listener heard of the one partition that moved, and of nothing else; nothing was lost.
        revoked = [tps for kind, _, tps in m.live_events if kind == "revoked"]
        assert revoked == [tuple(sorted(moved))], (m.name, m.live_events)
        assert not any(kind == "lost" for kind, _, _ in m.live_events)
        # Assigned: the initial four, then only newly added partitions (none).
        assigned = [tps for kind, _, tps in m.live_events if kind == "assigned"]
        assert assigned[0] == tuple(sorted(before[m.name])) and all(tps == () for tps in assigned[1:]), m.live_events
        # At every moment recorded from the newcomer's start on, the kept partitions were assigned.
        for snapshot in m.live_snapshots[snapshots_at[m.name]:]:
            assert kept[m.name] <= snapshot, (m.name, sorted(kept[m.name]), sorted(snapshot))
        # And they were read without a gap or a repeat across the rebalance: the member never
        # gave them up, so its position simply moved on.
        for tp in kept[m.name]:
            offsets = [o for p, o in m.records if p == tp.partition]
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), (m.name, tp)
            assert any(p == tp.partition for p, _ in m.records[:joined_at[m.name]])
            assert any(p == tp.partition for p, _ in m.records[marks[m.name]:])
    # The newcomer got exactly the three partitions the others gave up, each once. Usually in
    # one call; but a member whose SyncGroup meets the next rebalance (another member already
    # revoked and rejoined) is answered REBALANCE_IN_PROGRESS, rejoins still owning its four
    # and gives one up a generation later -- Kafka's cooperative protocol does the same.
    gave_up = set().union(*(before[m.name] - after[m.name] for m in old))
    assert after["d"] == gave_up
    handed = [tp for kind, _, tps in newcomer.live_events if kind == "assigned" for tp in tps]
    assert sorted(handed) == sorted(gave_up), newcomer.live_events
    # No partition was ever assigned to two members in one generation.
    by_member = {}
    for m in everyone:
        owned, per_generation = set(), {}
        for kind, generation, tps in m.live_events:
            owned = owned | set(tps) if kind == "assigned" else owned - set(tps)
            per_generation[generation] = tuple(sorted(owned))
        by_member[m.name] = per_generation
    assert_no_overlap_per_generation(by_member)


def test_eager_and_cooperative_only_members_cannot_share_a_group(broker):
    topic, group = fresh("mixed"), fresh("g-mixed")
    create_topic(broker, topic, 2)
    eager = member(broker, group, [topic], "eager", partition_assignment_strategy=["range"])
    try:
        drive([eager], lambda: eager[0].assignment() == all_partitions(topic, 2), "the eager member alone")
        coop = eos.Consumer(broker.address, group_id=group, partition_assignment_strategy=["cooperative-sticky"],
                            **MEMBER)
        try:
            coop.subscribe([topic])

            def refused():
                try:
                    coop.poll(timeout_ms=20)
                except EosError as exc:
                    return exc
                eager[0].poll(timeout_ms=20)
                return None

            error = wait_for(refused, "the cooperative-only member to be refused")
            assert error.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
            assert "cannot be mixed" in str(error) and "cooperative-sticky" in str(error)
        finally:
            coop.close()
        # The upgrade path joins: a member listing both is eager until range is dropped everywhere.
        upgrading = member(broker, group, [topic], "upgrading", partition_assignment_strategy=["cooperative-sticky", "range"])
        both = [eager, upgrading]
        try:
            drive(both, lambda: same_generation_covers(both, all_partitions(topic, 2)), "the upgrading member to join")
            with eos.Admin(broker.address) as admin:
                assert admin.describe_group(group)["protocol"] == "range"
        finally:
            close_all([upgrading])
    finally:
        close_all([eager])
