"""The GroupCoordinator service through a real broker process (gRPC on a free port).

Members here are small protocol loops written for the test (join, the leader assigns with
the range assignor, sync, heartbeat, rejoin when told to), so these tests exercise the
coordinator and not a consumer implementation. Waits are bounded polls on observable
state; session timeouts are shortened through broker config so a dead member is noticed
in seconds.
"""
from __future__ import annotations

import threading

import grpc
import pytest

from consumer.assignors import RangeAssignor, Subscription, assign_group, decode_assignment, encode_subscription
from eos.errors import ErrorCode
from eos.types import TopicPartition
from eos.v1 import broker_pb2, group_pb2, group_pb2_grpc, txn_pb2
from tests.waits import wait_for

TOPIC = "orders"
GROUP = "copier"
RPC_TIMEOUT_S = 30
WAIT_S = 30.0
FAST_GROUPS = {
    "group.min.session.timeout.ms": "500",
    "group.initial.rebalance.delay.ms": "300",
}
SESSION_TIMEOUT_MS = 2_000
HEARTBEAT_INTERVAL_S = 0.2
REBALANCE_TIMEOUT_MS = 10_000


def group_stub(broker) -> group_pb2_grpc.GroupCoordinatorStub:
    return group_pb2_grpc.GroupCoordinatorStub(broker.channel())


def create_topic(broker, name: str = TOPIC, partitions: int = 3) -> None:
    response = broker.broker_stub().CreateTopics(broker_pb2.CreateTopicsRequest(
        topics=[broker_pb2.NewTopic(name=name, num_partitions=partitions)]), timeout=RPC_TIMEOUT_S)
    assert [t.error_code for t in response.topics] == [ErrorCode.NONE], response


def commit_request(offsets: dict[int, int]) -> list[group_pb2.OffsetToCommit]:
    return [group_pb2.OffsetToCommit(topic=TOPIC, partition=p, offset=o, leader_epoch=-1) for p, o in offsets.items()]


def fetch(stub, require_stable: bool = False, group_id: str = GROUP) -> dict[int, tuple[int, int]]:
    """partition -> (offset, error code) for every partition the group has."""
    response = stub.OffsetFetch(group_pb2.OffsetFetchRequest(group_id=group_id, require_stable=require_stable),
                                timeout=RPC_TIMEOUT_S)
    assert response.error_code == ErrorCode.NONE, response
    return {p.partition: (p.offset, p.error_code) for p in response.partitions}


# ---- FindCoordinator and plain offsets -------------------------------------------------------

def test_find_coordinator_names_this_broker(broker):
    stub = group_stub(broker)
    for key_type, key in ((group_pb2.GROUP, GROUP), (group_pb2.TRANSACTION, "copier-0")):
        (found,) = stub.FindCoordinator(group_pb2.FindCoordinatorRequest(key_type=key_type, keys=[key]),
                                        timeout=RPC_TIMEOUT_S).coordinators
        assert (found.key, found.host, found.port, found.error_code) == (key, broker.host, broker.port,
                                                                         ErrorCode.NONE)


def test_committed_offsets_survive_kill_9(broker):
    create_topic(broker)
    stub = group_stub(broker)
    response = stub.OffsetCommit(group_pb2.OffsetCommitRequest(group_id=GROUP, generation_id=-1,
                                                               offsets=commit_request({0: 11, 2: 22})),
                                 timeout=RPC_TIMEOUT_S)
    assert [(p.partition, p.error_code) for p in response.partitions] == [(0, ErrorCode.NONE), (2, ErrorCode.NONE)]
    refused = stub.OffsetCommit(group_pb2.OffsetCommitRequest(group_id=GROUP, generation_id=-1, offsets=[
        group_pb2.OffsetToCommit(topic="missing", partition=0, offset=1)]), timeout=RPC_TIMEOUT_S)
    assert refused.partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "missing" in refused.partitions[0].error_message

    broker.kill()
    broker.start()
    stub = group_stub(broker)
    assert fetch(stub) == {0: (11, ErrorCode.NONE), 2: (22, ErrorCode.NONE)}
    listed = stub.ListGroups(group_pb2.ListGroupsRequest(), timeout=RPC_TIMEOUT_S)
    assert [(g.group_id, g.state) for g in listed.groups] == [(GROUP, "Empty")]


# ---- members -----------------------------------------------------------------------------------

class Member:
    """One group member's protocol loop in a thread. `history` holds (generation, partitions)
    for every assignment it received."""

    def __init__(self, broker, name: str, topics: dict[str, int]):
        self._stub = group_stub(broker)
        self.name = name
        self._topics = topics
        self.member_id = ""
        self.generation_id = -1
        self.history: list[tuple[int, frozenset[TopicPartition]]] = []
        self._stop = threading.Event()
        self._leave_on_stop = True
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"member-{name}", daemon=True)
        self._thread.start()

    @property
    def assignment(self) -> tuple[int, frozenset[TopicPartition]] | None:
        return self.history[-1] if self.history else None

    def _metadata(self) -> bytes:
        return encode_subscription(Subscription(tuple(sorted(self._topics))))

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._join_and_sync():
                    self._heartbeat_until_told_to_rejoin()
                else:
                    self._stop.wait(0.1)
            if self._leave_on_stop and self.member_id:
                self._stub.LeaveGroup(group_pb2.LeaveGroupRequest(group_id=GROUP, member_id=self.member_id),
                                      timeout=RPC_TIMEOUT_S)
        except BaseException as exc:   # reported by stop()
            self.failure = exc

    def _join_and_sync(self) -> bool:
        join = self._stub.JoinGroup(group_pb2.JoinGroupRequest(
            group_id=GROUP, member_id=self.member_id, session_timeout_ms=SESSION_TIMEOUT_MS,
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS, protocol_type="consumer",
            protocols=[group_pb2.GroupProtocol(name="range", metadata=self._metadata())]),
            timeout=RPC_TIMEOUT_S, metadata=[("client-id", self.name)])
        if join.error_code == ErrorCode.MEMBER_ID_REQUIRED:
            self.member_id = join.member_id
            return False
        if join.error_code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = ""
            return False
        if join.error_code != ErrorCode.NONE:
            return False
        self.member_id = join.member_id
        assignments = {}
        if join.leader == self.member_id:
            assignments = assign_group(RangeAssignor(), self._topics,
                                       [(m.member_id, m.group_instance_id, m.metadata) for m in join.members])
        sync = self._stub.SyncGroup(group_pb2.SyncGroupRequest(
            group_id=GROUP, generation_id=join.generation_id, member_id=self.member_id,
            assignments=[group_pb2.SyncGroupAssignment(member_id=m, assignment=a) for m, a in assignments.items()]),
            timeout=RPC_TIMEOUT_S)
        if sync.error_code != ErrorCode.NONE:
            return False
        self.generation_id = join.generation_id
        self.history.append((join.generation_id, frozenset(decode_assignment(sync.assignment).partitions)))
        return True

    def _heartbeat_until_told_to_rejoin(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            beat = self._stub.Heartbeat(group_pb2.HeartbeatRequest(
                group_id=GROUP, generation_id=self.generation_id, member_id=self.member_id), timeout=RPC_TIMEOUT_S)
            if beat.error_code == ErrorCode.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            if beat.error_code != ErrorCode.NONE:
                return

    def stop(self, leave: bool = True) -> None:
        """leave=False is a crash: no LeaveGroup, no more heartbeats."""
        self._leave_on_stop = leave
        self._stop.set()
        self._thread.join(RPC_TIMEOUT_S + 5)
        assert not self._thread.is_alive(), f"member {self.name} did not stop"
        if self.failure is not None and not isinstance(self.failure, grpc.RpcError):
            raise self.failure


@pytest.fixture
def members():
    started: list[Member] = []
    yield started
    for member in started:
        if member._thread.is_alive():
            member.stop(leave=False)


def settled(stub, alive: list[Member]) -> int | None:
    """The generation in which the group is Stable and every live member holds an assignment."""
    (described,) = stub.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[GROUP]),
                                       timeout=RPC_TIMEOUT_S).groups
    if described.state != "Stable" or {m.member_id for m in described.members} != {m.member_id for m in alive}:
        return None
    if any(m.assignment is None or m.assignment[0] != described.generation_id for m in alive):
        return None
    return described.generation_id


def assert_no_partition_owned_twice_per_generation(everyone: list[Member]) -> None:
    owners: dict[tuple[int, TopicPartition], str] = {}
    for member in everyone:
        for generation, partitions in member.history:
            for tp in partitions:
                other = owners.setdefault((generation, tp), member.name)
                assert other == member.name, f"{tp} owned by {other} and {member.name} in generation {generation}"


def test_a_deleted_group_and_its_offsets_stay_deleted_after_kill_9(broker_factory, members):
    broker = broker_factory(config=FAST_GROUPS)
    create_topic(broker, partitions=2)
    stub = group_stub(broker)
    members.append(Member(broker, "m0", {TOPIC: 2}))
    generation = wait_for(lambda: settled(stub, members), "the member in a Stable generation")
    committed = stub.OffsetCommit(group_pb2.OffsetCommitRequest(
        group_id=GROUP, generation_id=generation, member_id=members[0].member_id,
        offsets=commit_request({0: 5, 1: 6})), timeout=RPC_TIMEOUT_S)
    assert [p.error_code for p in committed.partitions] == [ErrorCode.NONE, ErrorCode.NONE]

    def delete(group_id: str = GROUP) -> tuple[int, str]:
        (result,) = stub.DeleteGroups(group_pb2.DeleteGroupsRequest(group_ids=[group_id]),
                                      timeout=RPC_TIMEOUT_S).results
        return result.error_code, result.error_message

    code, message = delete()
    assert code == ErrorCode.NON_EMPTY_GROUP and "Stable" in message
    assert fetch(stub) == {0: (5, ErrorCode.NONE), 1: (6, ErrorCode.NONE)}       # refused: nothing changed
    members[0].stop()
    wait_for(lambda: delete()[0] == ErrorCode.NONE, "the deletion once the group is Empty")
    assert fetch(stub) == {}
    assert delete()[0] == ErrorCode.GROUP_ID_NOT_FOUND

    # the group's tombstone and its offsets' tombstones are in __consumer_offsets: a replay
    # after kill -9 finds neither the group nor an offset
    broker.kill()
    broker.start()
    stub = group_stub(broker)
    assert fetch(stub) == {}
    assert stub.ListGroups(group_pb2.ListGroupsRequest(), timeout=RPC_TIMEOUT_S).groups == []
    (described,) = stub.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[GROUP]),
                                       timeout=RPC_TIMEOUT_S).groups
    assert described.error_code == ErrorCode.GROUP_ID_NOT_FOUND


def test_three_members_split_the_partitions_without_overlap(broker_factory, members):
    broker = broker_factory(config=FAST_GROUPS)
    create_topic(broker, partitions=10)
    stub = group_stub(broker)
    members += [Member(broker, f"m{i}", {TOPIC: 10}) for i in range(3)]
    generation = wait_for(lambda: settled(stub, members), "three members in one Stable generation")
    owned = [m.assignment[1] for m in members]
    assert sorted(len(p) for p in owned) == [3, 3, 4]          # range: 10 over 3
    assert frozenset().union(*owned) == {TopicPartition(TOPIC, p) for p in range(10)}
    assert_no_partition_owned_twice_per_generation(members)
    (described,) = stub.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[GROUP])).groups
    assert (described.protocol_type, described.protocol, described.generation_id) == ("consumer", "range", generation)
    assert {m.client_id for m in described.members} == {"m0", "m1", "m2"}
    for member in members:
        member.stop()


def test_a_dead_members_partitions_move_within_the_session_timeout(broker_factory, members):
    broker = broker_factory(config=FAST_GROUPS)
    create_topic(broker, partitions=10)
    stub = group_stub(broker)
    members += [Member(broker, f"m{i}", {TOPIC: 10}) for i in range(3)]
    before = wait_for(lambda: settled(stub, members), "three members in one Stable generation")
    dead, survivors = members[0], members[1:]
    dead.stop(leave=False)                     # a crash: it just goes silent
    after = wait_for(lambda: settled(stub, survivors), "the survivors to take over",
                       timeout_s=(SESSION_TIMEOUT_MS + REBALANCE_TIMEOUT_MS) / 1000 + 10)
    assert after > before
    owned = [m.assignment[1] for m in survivors]
    assert frozenset().union(*owned) == {TopicPartition(TOPIC, p) for p in range(10)}
    assert sorted(len(p) for p in owned) == [5, 5]
    assert_no_partition_owned_twice_per_generation(members)
    for member in survivors:
        member.stop()
    wait_for(lambda: stub.DescribeGroups(group_pb2.DescribeGroupsRequest(group_ids=[GROUP])).groups[0].state
               == "Empty", "the group to be empty after everyone left")


# ---- offsets in transactions ------------------------------------------------------------------

def retried(call, what: str):
    """Call until the answer is not one a client retries (the coordinator still loading, or
    the previous transaction still completing), as the producer does; bounded."""
    retriable = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.CONCURRENT_TRANSACTIONS)
    response = wait_for(lambda: (lambda answer: None if answer.error_code in retriable else answer)(call()), what)
    assert response.error_code == ErrorCode.NONE, response
    return response


def init_producer(broker, transactional_id: str = "copier-0") -> tuple[int, int]:
    response = retried(lambda: broker.txn_stub().InitProducerId(txn_pb2.InitProducerIdRequest(
        transactional_id=transactional_id, transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1),
        timeout=RPC_TIMEOUT_S), "InitProducerId")
    return response.producer_id, response.producer_epoch


def txn_offsets(broker, producer_id: int, epoch: int, offsets: dict[int, int], *, generation_id: int = -1,
                member_id: str = "") -> dict[int, int]:
    response = group_stub(broker).TxnOffsetCommit(group_pb2.TxnOffsetCommitRequest(
        transactional_id="copier-0", group_id=GROUP, producer_id=producer_id, producer_epoch=epoch,
        generation_id=generation_id, member_id=member_id, offsets=commit_request(offsets)), timeout=RPC_TIMEOUT_S)
    return {p.partition: p.error_code for p in response.partitions}


def add_offsets(broker, producer_id: int, epoch: int) -> None:
    retried(lambda: broker.txn_stub().AddOffsetsToTxn(txn_pb2.AddOffsetsToTxnRequest(
        transactional_id="copier-0", producer_id=producer_id, producer_epoch=epoch, group_id=GROUP),
        timeout=RPC_TIMEOUT_S), "AddOffsetsToTxn")


def end_txn(broker, producer_id: int, epoch: int, committed: bool) -> int:
    response = retried(lambda: broker.txn_stub().EndTxn(txn_pb2.EndTxnRequest(
        transactional_id="copier-0", producer_id=producer_id, producer_epoch=epoch, committed=committed),
        timeout=RPC_TIMEOUT_S), "EndTxn")
    return response.producer_epoch


def stable(stub):
    offsets = fetch(stub, require_stable=True)
    return None if any(error == ErrorCode.UNSTABLE_OFFSET_COMMIT for _, error in offsets.values()) else offsets


def test_txn_offsets_appear_with_the_commit_and_vanish_with_the_abort(broker):
    create_topic(broker)
    stub = group_stub(broker)
    producer_id, epoch = init_producer(broker)

    add_offsets(broker, producer_id, epoch)
    assert txn_offsets(broker, producer_id, epoch, {0: 100, 1: 200}) == {0: ErrorCode.NONE, 1: ErrorCode.NONE}
    assert fetch(stub) == {}
    assert fetch(stub, require_stable=True) == {0: (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT),
                                                1: (-1, ErrorCode.UNSTABLE_OFFSET_COMMIT)}
    epoch = end_txn(broker, producer_id, epoch, committed=True)
    assert wait_for(lambda: stable(stub), "the commit marker") == {0: (100, ErrorCode.NONE),
                                                                      1: (200, ErrorCode.NONE)}

    add_offsets(broker, producer_id, epoch)
    assert txn_offsets(broker, producer_id, epoch, {0: 999}) == {0: ErrorCode.NONE}
    end_txn(broker, producer_id, epoch, committed=False)
    assert wait_for(lambda: stable(stub), "the abort marker") == {0: (100, ErrorCode.NONE),
                                                                     1: (200, ErrorCode.NONE)}

    # The finished transaction's epoch is fenced (KIP-890 bumps it at every end): by the
    # transaction coordinator's verification if the broker wires it, else by the log's epoch rule.
    fenced = txn_offsets(broker, producer_id, epoch, {0: 5})
    assert fenced[0] in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED), fenced
    assert fetch(stub, require_stable=True) == {0: (100, ErrorCode.NONE), 1: (200, ErrorCode.NONE)}

    broker.kill()
    broker.start()
    assert fetch(group_stub(broker), require_stable=True) == {0: (100, ErrorCode.NONE), 1: (200, ErrorCode.NONE)}


def test_a_zombie_members_txn_offset_commit_is_refused(broker_factory, members):
    broker = broker_factory(config=FAST_GROUPS)
    create_topic(broker)
    stub = group_stub(broker)
    first = Member(broker, "m0", {TOPIC: 3})
    members.append(first)
    wait_for(lambda: settled(stub, [first]), "the first member's generation")
    zombie_generation, zombie_id = first.generation_id, first.member_id
    second = Member(broker, "m1", {TOPIC: 3})
    members.append(second)
    wait_for(lambda: settled(stub, members), "a generation with both members")

    producer_id, epoch = init_producer(broker)
    add_offsets(broker, producer_id, epoch)
    assert txn_offsets(broker, producer_id, epoch, {0: 7}, generation_id=zombie_generation,
                       member_id=zombie_id) == {0: ErrorCode.ILLEGAL_GENERATION}
    assert txn_offsets(broker, producer_id, epoch, {0: 7}, generation_id=second.generation_id,
                       member_id="gone-member") == {0: ErrorCode.UNKNOWN_MEMBER_ID}
    assert fetch(stub, require_stable=True) == {}
    assert txn_offsets(broker, producer_id, epoch, {0: 7}, generation_id=second.generation_id,
                       member_id=second.member_id) == {0: ErrorCode.NONE}
    end_txn(broker, producer_id, epoch, committed=True)
    assert wait_for(lambda: stable(stub), "the commit marker") == {0: (7, ErrorCode.NONE)}
    for member in members:
        member.stop()
