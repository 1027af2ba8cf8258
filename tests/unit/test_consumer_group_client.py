"""The consumer's group client (consumer.group.ConsumerCoordinator) against a scripted
coordinator: no broker, no threads, a fake clock. Each RPC of the fake stub records its
requests; unary calls answer from a script, JoinGroup/SyncGroup return futures the test
completes, so every step of the protocol is observed in order."""
from __future__ import annotations

import collections
import re
from types import SimpleNamespace

import pytest

from consumer.assignors import Assignment, Subscription, decode_assignment, decode_subscription, encode_assignment, \
    encode_subscription
from consumer.group import (CLIENT_ID_METADATA_KEY, CommitFailedError, ConsumerCoordinator, ConsumerGroupMetadata,
                            FencedInstanceIdError, MemberState, OffsetAndMetadata, assignor_names)
from eos import net
from eos.errors import EosError, ErrorCode
from eos.types import TopicPartition
from eos.v1 import group_pb2

TOPIC = "orders"
T0, T1, T2 = (TopicPartition(TOPIC, p) for p in range(3))


class Clock:
    def __init__(self):
        self.now_ms = 1_000

    def __call__(self) -> int:
        return self.now_ms

    def sleep(self, ms: int) -> None:
        self.now_ms += ms


class FakeFuture:
    def __init__(self):
        self._result = None
        self._done = False
        self._callbacks = []
        self.cancelled = False

    def done(self) -> bool:
        return self._done

    def result(self):
        return self._result

    def cancel(self) -> bool:
        self.cancelled = True
        return True

    def add_done_callback(self, callback) -> None:
        self._callbacks.append(callback)

    def set_result(self, value) -> None:
        self._result, self._done = value, True
        for callback in self._callbacks:
            callback(self)


class FakeRpc:
    """Unary: answers `script` in order (a callable is called with the request). Future:
    returns a FakeFuture, kept in `futures` for the test to complete."""

    def __init__(self, *script):
        self.script = collections.deque(script)
        self.requests = []
        self.metadata = []
        self.futures = []

    def __call__(self, request, timeout=None, metadata=None):
        self.requests.append(request)
        self.metadata.append(metadata)
        answer = self.script.popleft()
        return answer(request) if callable(answer) else answer

    def future(self, request, timeout=None, metadata=None):
        self.requests.append(request)
        self.metadata.append(metadata)
        future = FakeFuture()
        self.futures.append(future)
        return future


def found(request):
    return group_pb2.FindCoordinatorResponse(coordinators=[
        group_pb2.Coordinator(key=request.keys[0], node_id=0, host="b", port=1)])


class FakeStub:
    def __init__(self):
        self.FindCoordinator = FakeRpc(*[found] * 20)
        self.JoinGroup = FakeRpc()
        self.SyncGroup = FakeRpc()
        self.Heartbeat = FakeRpc()
        self.LeaveGroup = FakeRpc(*[group_pb2.LeaveGroupResponse()] * 5)
        self.OffsetCommit = FakeRpc()
        self.OffsetFetch = FakeRpc()


class FakeMetadata:
    any_broker_address = "b:1"
    bootstrap_addresses = ["b:1"]

    def __init__(self, counts: dict[str, int]):
        self.counts = dict(counts)
        self.fetched = []

    def brokers(self):
        return {0: "b:1"}

    def fetch(self, topics=None):
        self.fetched.append(topics)
        return SimpleNamespace(topics=[SimpleNamespace(name=n, error_code=0, is_internal=False) for n in self.counts])

    def partition_count(self, name):
        return self.counts.get(name)

    def coordinator_channel_address(self, host, port, timeout_s=None):
        return self.any_broker_address     # one broker behind the one bootstrap address


class Listener:
    def __init__(self):
        self.calls = []

    def on_partitions_revoked(self, partitions):
        self.calls.append(("revoked", sorted(partitions)))

    def on_partitions_assigned(self, partitions):
        self.calls.append(("assigned", sorted(partitions)))

    def on_partitions_lost(self, partitions):
        self.calls.append(("lost", sorted(partitions)))


class Harness:
    def __init__(self, *, assignors=("range",), instance_id=None, auto_commit=False, counts=None, **config):
        self.clock = Clock()
        self.stub = FakeStub()
        self.metadata = FakeMetadata(counts or {TOPIC: 3})
        self.assigned: list[list[TopicPartition]] = []
        self.positions: dict[TopicPartition, int] = {}
        self.listener = Listener()
        self.coordinator = ConsumerCoordinator(
            self.metadata, group_id="g", group_instance_id=instance_id, client_id="client-1", assignors=assignors,
            session_timeout_ms=10_000, heartbeat_interval_ms=1_000, max_poll_interval_ms=30_000,
            request_timeout_ms=5_000, backoff=net.Backoff(100, 100), enable_auto_commit=auto_commit,
            auto_commit_interval_ms=5_000, metadata_max_age_ms=config.get("metadata_max_age_ms", 300_000),
            assign_partitions=self.assigned.append, positions=lambda: dict(self.positions),
            clock=self.clock, sleep_ms=self.clock.sleep, stub_for=lambda address: self.stub,
            start_heartbeat_thread=False)

    def poll(self):
        self.coordinator.poll(self.clock() + 1_000)

    def join_request(self, index=-1) -> group_pb2.JoinGroupRequest:
        return self.stub.JoinGroup.requests[index]

    def answer_join(self, index=-1, **fields):
        fields.setdefault("generation_id", 1)
        fields.setdefault("protocol_name", "range")
        self.stub.JoinGroup.futures[index].set_result(group_pb2.JoinGroupResponse(**fields))

    def answer_sync(self, partitions=(), index=-1, error=ErrorCode.NONE):
        assignment = encode_assignment(Assignment(tuple(partitions))) if error == ErrorCode.NONE else b""
        self.stub.SyncGroup.futures[index].set_result(group_pb2.SyncGroupResponse(error_code=error,
                                                                                  assignment=assignment))

    def become_stable(self, partitions=(T0, T1, T2), generation=1, member_id="m-1"):
        """Join alone as leader and get `partitions`."""
        self.poll()
        subscription = self.join_request().protocols[0].metadata
        self.answer_join(generation_id=generation, member_id=member_id, leader=member_id,
                         members=[group_pb2.JoinGroupMember(member_id=member_id, metadata=subscription)])
        self.poll()
        self.answer_sync(partitions)
        self.poll()
        assert self.coordinator.state is MemberState.STABLE


def subscribed(**kwargs) -> Harness:
    h = Harness(**kwargs)
    h.coordinator.subscribe(topics=[TOPIC], listener=h.listener)
    return h


# ---- joining ---------------------------------------------------------------------------------

def test_join_with_the_member_id_required_then_lead_and_assign():
    h = subscribed()
    h.poll()
    first = h.join_request()
    assert (first.member_id, first.protocol_type, [p.name for p in first.protocols]) == ("", "consumer", ["range"])
    assert first.rebalance_timeout_ms == 30_000 and first.session_timeout_ms == 10_000
    assert h.stub.JoinGroup.metadata[-1] == ((CLIENT_ID_METADATA_KEY, "client-1"),)
    assert decode_subscription(first.protocols[0].metadata).topics == (TOPIC,)
    h.answer_join(error_code=ErrorCode.MEMBER_ID_REQUIRED, member_id="m-1", generation_id=-1)
    h.poll()
    assert h.join_request().member_id == "m-1"                 # KIP-394: rejoined at once with the id
    assert not h.coordinator.ready()
    members = [group_pb2.JoinGroupMember(member_id=m, metadata=encode_subscription(Subscription((TOPIC,))))
               for m in ("m-1", "m-2")]
    h.answer_join(generation_id=3, member_id="m-1", leader="m-1", members=members)
    h.poll()
    sync = h.stub.SyncGroup.requests[-1]
    plan = {a.member_id: decode_assignment(a.assignment).partitions for a in sync.assignments}
    assert plan == {"m-1": (T0, T1), "m-2": (T2,)}             # range: 2 and 1
    assert (sync.generation_id, sync.member_id) == (3, "m-1")
    assert h.listener.calls == [] and not any(h.assigned)         # nothing handed out before SyncGroup
    h.answer_sync([T0, T1])
    h.poll()
    assert h.coordinator.ready() and h.assigned[-1] == [T0, T1]
    assert h.listener.calls == [("assigned", [T0, T1])]
    assert h.coordinator.group_metadata() == ConsumerGroupMetadata("g", 3, "m-1", None)


def test_a_follower_sends_no_assignment_and_ignores_unsubscribed_topics():
    h = subscribed()
    h.poll()
    h.answer_join(generation_id=1, member_id="m-2", leader="m-1")
    h.poll()
    assert list(h.stub.SyncGroup.requests[-1].assignments) == []
    h.answer_sync([T1, TopicPartition("elsewhere", 0)])
    h.poll()
    assert [T1] in h.assigned                       # only what it subscribed to ...
    assert len(h.stub.JoinGroup.requests) == 2      # ... and it rejoins: the leader's view was stale


def test_fatal_join_errors_are_raised_by_poll():
    h = subscribed()
    h.poll()
    h.answer_join(error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL, error_message="no common protocol")
    with pytest.raises(EosError) as raised:
        h.poll()
    assert raised.value.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    with pytest.raises(EosError):
        h.poll()


def test_coordinator_errors_are_retried_after_a_backoff():
    h = subscribed()
    h.poll()
    h.answer_join(error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
    h.poll()
    assert len(h.stub.JoinGroup.requests) == 1      # backing off
    h.clock.sleep(200)
    h.poll()
    assert len(h.stub.JoinGroup.requests) == 2


# ---- rebalances ------------------------------------------------------------------------------

def test_a_rebalance_revokes_everything_before_rejoining():
    h = subscribed()
    h.become_stable([T0, T1, T2])
    h.coordinator.handle_heartbeat_response(1, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    assert not h.coordinator.ready()
    h.poll()
    assert h.listener.calls[-1] == ("revoked", [T0, T1, T2])
    assert h.assigned[-1] == []
    assert h.join_request().member_id == "m-1"
    assert h.coordinator.group_metadata().generation_id == 1   # still the old one until the join answers


def test_a_lost_generation_is_lost_not_revoked_and_the_member_id_kept_or_reset():
    h = subscribed()
    h.become_stable([T0])
    h.coordinator.handle_heartbeat_response(1, "m-1", ErrorCode.ILLEGAL_GENERATION)
    assert h.coordinator.group_metadata() == ConsumerGroupMetadata("g", -1, "m-1", None)
    with pytest.raises(CommitFailedError):
        h.coordinator.commit_sync({T0: OffsetAndMetadata(1)}, 1_000)
    h.poll()
    assert h.listener.calls[-1] == ("lost", [T0])
    assert h.join_request().member_id == "m-1"

    h2 = subscribed()
    h2.become_stable([T0])
    h2.coordinator.handle_heartbeat_response(1, "m-1", ErrorCode.UNKNOWN_MEMBER_ID)
    h2.poll()
    assert h2.join_request().member_id == ""


def test_an_answer_for_an_old_generation_changes_nothing():
    h = subscribed()
    h.become_stable([T0], generation=4)
    h.coordinator.handle_heartbeat_response(3, "m-1", ErrorCode.ILLEGAL_GENERATION)
    assert h.coordinator.ready() and h.coordinator.group_metadata().generation_id == 4


def test_fenced_instance_id_is_fatal():
    h = subscribed(instance_id="i-1")
    h.become_stable([T0])
    assert h.join_request().group_instance_id == "i-1"
    h.coordinator.handle_heartbeat_response(1, "m-1", ErrorCode.FENCED_INSTANCE_ID, "taken over")
    with pytest.raises(FencedInstanceIdError):
        h.poll()


def test_heartbeats_are_due_every_interval_and_a_missed_poll_leaves_the_group():
    h = subscribed()
    h.become_stable([T0])
    c = h.coordinator
    action, wait_s = c.heartbeat_step(h.clock())
    assert action is None and 0 < wait_s <= 1.0
    h.clock.sleep(1_000)
    h.stub.Heartbeat.script.append(group_pb2.HeartbeatResponse())
    action, _ = c.heartbeat_step(h.clock())
    action()
    assert h.stub.Heartbeat.requests[-1].generation_id == 1
    h.clock.sleep(30_001)                                      # max.poll.interval.ms without poll()
    action, _ = c.heartbeat_step(h.clock())
    action()
    assert [r.member_id for r in h.stub.LeaveGroup.requests] == ["m-1"]
    assert c.group_metadata() == ConsumerGroupMetadata("g", -1, "", None)
    h.poll()
    assert h.listener.calls[-1] == ("lost", [T0]) and h.join_request().member_id == ""


def test_a_static_member_does_not_send_leave_group():
    h = subscribed(instance_id="i-1")
    h.become_stable([T0])
    h.clock.sleep(30_001)
    action, _ = h.coordinator.heartbeat_step(h.clock())
    action()
    h.coordinator.close(1_000)
    assert h.stub.LeaveGroup.requests == []


def test_close_revokes_and_a_dynamic_member_leaves():
    h = subscribed()
    h.become_stable([T0, T1])
    h.coordinator.close(1_000)
    assert h.listener.calls[-1] == ("revoked", [T0, T1])
    assert [r.member_id for r in h.stub.LeaveGroup.requests] == ["m-1"]


def test_the_leader_rejoins_when_a_partition_count_changes():
    h = subscribed(metadata_max_age_ms=1_000)
    h.become_stable([T0, T1, T2])
    h.clock.sleep(1_000)
    h.poll()
    assert h.coordinator.ready()
    h.metadata.counts[TOPIC] = 5
    h.clock.sleep(1_000)
    h.poll()
    assert h.listener.calls[-1] == ("revoked", [T0, T1, T2]) and len(h.stub.JoinGroup.requests) == 2


def test_a_pattern_subscription_follows_the_topics():
    h = Harness(counts={"a-1": 1, "b-1": 1}, metadata_max_age_ms=1_000)
    h.coordinator.subscribe(pattern=re.compile("a-.*"), listener=h.listener)
    h.poll()
    assert decode_subscription(h.join_request().protocols[0].metadata).topics == ("a-1",)
    h.metadata.counts["a-2"] = 2
    h.clock.sleep(1_000)
    h.poll()
    assert h.coordinator.subscription == {"a-1", "a-2"}


def test_subscription_bytes_carry_owned_partitions_only_for_sticky():
    h = subscribed(assignors=("sticky", "range"))
    h.become_stable([T1, T2], generation=7)
    h.coordinator.handle_heartbeat_response(7, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    h.poll()
    by_name = {p.name: decode_subscription(p.metadata) for p in h.join_request().protocols}
    assert by_name["sticky"].owned_partitions == (T1, T2) and by_name["sticky"].generation_id == 7
    assert by_name["range"].owned_partitions == () and by_name["range"].generation_id == -1


# ---- offsets ---------------------------------------------------------------------------------

def fetched(*entries, error=ErrorCode.NONE):
    return group_pb2.OffsetFetchResponse(error_code=error, partitions=[
        group_pb2.FetchedOffset(topic=tp.topic, partition=tp.partition, offset=o, error_code=e) for tp, o, e in entries])


def test_committed_retries_an_unstable_offset_until_it_is_stable():
    h = Harness()
    unstable = fetched((T0, -1, ErrorCode.UNSTABLE_OFFSET_COMMIT), (T1, 5, ErrorCode.NONE))
    h.stub.OffsetFetch.script.extend([unstable, unstable, fetched((T0, 9, ErrorCode.NONE))])
    assert h.coordinator.fetch_committed([T0, T1], 10_000) == {T0: 9, T1: 5}
    assert all(r.require_stable for r in h.stub.OffsetFetch.requests)
    assert [len(r.partitions) for r in h.stub.OffsetFetch.requests] == [2, 1, 1]   # only what is unresolved


def test_committed_gives_up_at_its_deadline():
    h = Harness()
    h.stub.OffsetFetch.script.extend([fetched((T0, -1, ErrorCode.UNSTABLE_OFFSET_COMMIT))] * 100)
    with pytest.raises(EosError) as raised:
        h.coordinator.fetch_committed([T0], 1_000)
    assert raised.value.code == ErrorCode.UNSTABLE_OFFSET_COMMIT
    assert h.coordinator.fetch_committed([T0], 1_000, raise_on_timeout=False) is None
    h.stub.OffsetFetch.script.appendleft(fetched((T0, -1, ErrorCode.NONE)))
    assert h.coordinator.fetch_committed([T0], 1_000) == {T0: None}


def committed_ok(request):
    return group_pb2.OffsetCommitResponse(partitions=[
        group_pb2.PartitionOffsetResult(topic=o.topic, partition=o.partition) for o in request.offsets])


def commit_error(code):
    return lambda request: group_pb2.OffsetCommitResponse(partitions=[
        group_pb2.PartitionOffsetResult(topic=o.topic, partition=o.partition, error_code=code) for o in request.offsets])


def test_commit_carries_the_generation_and_retries_a_moved_coordinator():
    h = subscribed()
    h.become_stable([T0])
    h.stub.OffsetCommit.script.extend([commit_error(ErrorCode.NOT_COORDINATOR), committed_ok])
    h.coordinator.commit_sync({T0: OffsetAndMetadata(4, "m")}, 10_000)
    request = h.stub.OffsetCommit.requests[-1]
    assert (request.generation_id, request.member_id) == (1, "m-1")
    assert [(o.offset, o.metadata) for o in request.offsets] == [(4, "m")]
    assert len(h.stub.OffsetCommit.requests) == 2


@pytest.mark.parametrize("code,member_id_after", [(ErrorCode.ILLEGAL_GENERATION, "m-1"),
                                                  (ErrorCode.UNKNOWN_MEMBER_ID, "")])
def test_a_commit_refused_for_the_generation_raises_commit_failed(code, member_id_after):
    h = subscribed()
    h.become_stable([T0])
    h.stub.OffsetCommit.script.append(commit_error(code))
    with pytest.raises(CommitFailedError) as raised:
        h.coordinator.commit_sync({T0: OffsetAndMetadata(4)}, 10_000)
    assert raised.value.code == code
    assert h.coordinator.group_metadata() == ConsumerGroupMetadata("g", -1, member_id_after, None)


def test_a_commit_outside_group_management_carries_no_generation():
    h = Harness()
    h.stub.OffsetCommit.script.append(committed_ok)
    h.coordinator.commit_sync({T0: OffsetAndMetadata(1)}, 1_000)
    request = h.stub.OffsetCommit.requests[-1]
    assert (request.generation_id, request.member_id, request.group_instance_id) == (-1, "", "")


def test_async_commit_callbacks_run_on_the_next_poll():
    h = subscribed()
    h.become_stable([T0])
    outcomes = []
    h.coordinator.commit_async({T0: OffsetAndMetadata(3)}, lambda offsets, error: outcomes.append((offsets, error)))
    assert outcomes == []
    h.stub.OffsetCommit.futures[-1].set_result(committed_ok(h.stub.OffsetCommit.requests[-1]))
    assert outcomes == []                                      # not on the gRPC thread
    h.poll()
    assert outcomes == [({T0: OffsetAndMetadata(3)}, None)]


def test_auto_commit_commits_positions_every_interval():
    h = subscribed(auto_commit=True)
    h.become_stable([T0])
    h.positions = {T0: 12}
    h.poll()
    assert h.stub.OffsetCommit.futures == []
    h.clock.sleep(5_000)
    h.poll()
    assert [(o.partition, o.offset) for o in h.stub.OffsetCommit.requests[-1].offsets] == [(0, 12)]


def test_auto_commit_before_a_rebalance_is_synchronous_and_before_the_revocation():
    h = subscribed(auto_commit=True)
    h.become_stable([T0])
    h.positions = {T0: 8}
    order = []
    h.stub.OffsetCommit.script.append(lambda request: (order.append("commit"), committed_ok(request))[1])
    h.listener.on_partitions_revoked = lambda partitions: order.append("revoked")
    h.coordinator.handle_heartbeat_response(1, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    h.poll()
    assert order == ["commit", "revoked"]


# ---- cooperative rebalancing (KIP-429) --------------------------------------------------------

def cooperative(**kwargs) -> Harness:
    h = subscribed(assignors=("cooperative-sticky",), **kwargs)
    return h


def stable_cooperative(partitions=(T0, T1, T2), generation=1, **kwargs) -> Harness:
    h = cooperative(**kwargs)
    h.poll()
    subscription = h.join_request().protocols[0].metadata
    h.answer_join(generation_id=generation, member_id="m-1", leader="m-1", protocol_name="cooperative-sticky",
                  members=[group_pb2.JoinGroupMember(member_id="m-1", metadata=subscription)])
    h.poll()
    h.answer_sync(partitions)
    h.poll()
    assert h.coordinator.state is MemberState.STABLE
    return h


def rejoin_as_follower(h: Harness, generation: int, partitions, error=ErrorCode.NONE) -> None:
    """The JoinGroup in flight answered (a follower, so no assignment to compute), then SyncGroup."""
    h.answer_join(generation_id=generation, member_id="m-1", leader="m-0", protocol_name="cooperative-sticky")
    h.poll()
    h.answer_sync(partitions, error=error)
    h.poll()


def test_a_cooperative_rebalance_keeps_everything_and_claims_it_in_the_subscription():
    h = stable_cooperative([T0, T1], generation=4)
    assert h.listener.calls == [("assigned", [T0, T1])]
    h.coordinator.handle_heartbeat_response(4, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    assert h.coordinator.ready()                     # still fetching: nothing is revoked up front
    h.poll()
    assert h.coordinator.state is MemberState.JOINING and h.coordinator.ready()
    assert h.listener.calls == [("assigned", [T0, T1])] and h.assigned[-1] == [T0, T1]
    sub = decode_subscription(h.join_request().protocols[0].metadata)
    assert (sub.owned_partitions, sub.generation_id) == ((T0, T1), 4)
    h.answer_join(generation_id=5, member_id="m-1", leader="m-0", protocol_name="cooperative-sticky")
    h.poll()
    assert h.coordinator.state is MemberState.SYNCING and h.coordinator.ready()


def test_after_sync_only_the_lost_partitions_are_committed_and_revoked_then_it_rejoins():
    h = stable_cooperative([T0, T1], generation=4, auto_commit=True)
    h.positions = {T0: 11, T1: 22}
    order = []
    h.stub.OffsetCommit.script.extend([
        lambda request: (order.append(("commit", [(o.partition, o.offset) for o in request.offsets])),
                         committed_ok(request))[1]] * 3)
    h.listener.on_partitions_revoked = lambda partitions: order.append(("revoked", sorted(partitions)))
    h.listener.on_partitions_assigned = lambda partitions: order.append(("assigned", sorted(partitions)))
    h.coordinator.handle_heartbeat_response(4, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    h.poll()
    assert order == [("commit", [(0, 11), (1, 22)])]            # auto-commit before rejoining (Kafka's)
    joins = len(h.stub.JoinGroup.requests)
    h.positions = {T0: 15, T1: 30}                               # it kept reading meanwhile
    rejoin_as_follower(h, 5, [T0])
    assert order[1:4] == [("commit", [(1, 30)]), ("revoked", [T1]), ("assigned", [])]
    assert order[4][0] == "commit"      # the auto-commit before the immediate rejoin (the fake's positions stay)
    assert h.assigned[-1] == [T0]
    assert h.stub.OffsetCommit.requests[-1].generation_id == 5
    # It rejoined at once, claiming only what it kept, so the leader can hand T1 on.
    assert len(h.stub.JoinGroup.requests) == joins + 1
    sub = decode_subscription(h.join_request().protocols[0].metadata)
    assert (sub.owned_partitions, sub.generation_id) == ((T0,), 5)
    assert h.coordinator.ready()


def test_newly_added_partitions_are_the_only_ones_assigned_and_nothing_revoked_means_no_rejoin():
    h = stable_cooperative([T0], generation=2)
    h.coordinator.handle_heartbeat_response(2, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    h.poll()
    joins = len(h.stub.JoinGroup.requests)
    rejoin_as_follower(h, 3, [T0, T2])
    assert h.listener.calls[-1] == ("assigned", [T2])
    assert not any(kind == "revoked" for kind, _ in h.listener.calls)
    assert h.assigned[-1] == [T0, T2] and len(h.stub.JoinGroup.requests) == joins
    assert h.coordinator.ready() and h.coordinator.group_metadata().generation_id == 3


def test_a_generation_dropped_during_a_cooperative_rebalance_loses_what_was_kept():
    h = stable_cooperative([T0, T1], generation=4)
    h.coordinator.handle_heartbeat_response(4, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    h.poll()
    rejoin_as_follower(h, 5, (), error=ErrorCode.ILLEGAL_GENERATION)
    assert not h.coordinator.ready()
    h.poll()
    assert h.listener.calls[-1] == ("lost", [T0, T1]) and h.assigned[-1] == []
    sub = decode_subscription(h.join_request().protocols[0].metadata)
    assert sub.owned_partitions == ()


def test_rebalance_in_progress_answering_sync_keeps_the_partitions_and_rejoins():
    h = stable_cooperative([T0, T1], generation=4)
    h.coordinator.handle_heartbeat_response(4, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    h.poll()
    joins = len(h.stub.JoinGroup.requests)
    rejoin_as_follower(h, 5, (), error=ErrorCode.REBALANCE_IN_PROGRESS)
    assert h.coordinator.ready() and h.assigned[-1] == [T0, T1]
    assert [kind for kind, _ in h.listener.calls] == ["assigned"]
    assert len(h.stub.JoinGroup.requests) == joins + 1
    sub = decode_subscription(h.join_request().protocols[0].metadata)
    assert (sub.owned_partitions, sub.generation_id) == ((T0, T1), 4)   # claimed at the generation it got them


def test_a_cooperative_member_revokes_a_dropped_topic_before_rejoining():
    other = TopicPartition("other", 0)
    h = Harness(assignors=("cooperative-sticky",), counts={TOPIC: 3, "other": 1})
    h.coordinator.subscribe(topics=[TOPIC, "other"], listener=h.listener)
    h.poll()
    subscription = h.join_request().protocols[0].metadata
    h.answer_join(generation_id=1, member_id="m-1", leader="m-1", protocol_name="cooperative-sticky",
                  members=[group_pb2.JoinGroupMember(member_id="m-1", metadata=subscription)])
    h.poll()
    h.answer_sync([T0, other])
    h.poll()
    h.coordinator.subscribe(topics=[TOPIC], listener=h.listener)
    h.poll()
    assert h.listener.calls[-1] == ("revoked", [other]) and h.assigned[-1] == [T0]
    assert decode_subscription(h.join_request().protocols[0].metadata).owned_partitions == (T0,)


def test_the_cooperative_leader_holds_back_partitions_still_owned_by_another_member():
    h = stable_cooperative([T0, T1, T2], generation=1)
    h.coordinator.handle_heartbeat_response(1, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    h.poll()
    mine = h.join_request().protocols[0].metadata
    newcomer = encode_subscription(Subscription((TOPIC,)))
    h.answer_join(generation_id=2, member_id="m-1", leader="m-1", protocol_name="cooperative-sticky",
                  members=[group_pb2.JoinGroupMember(member_id="m-1", metadata=mine),
                           group_pb2.JoinGroupMember(member_id="m-2", metadata=newcomer)])
    h.poll()
    plan = {a.member_id: decode_assignment(a.assignment).partitions for a in h.stub.SyncGroup.requests[-1].assignments}
    assert len(plan["m-1"]) == 2 and plan["m-2"] == ()         # the third waits for m-1 to revoke it


def test_the_upgrade_list_is_eager_and_claims_nothing_for_cooperative_sticky():
    h = subscribed(assignors=("cooperative-sticky", "range"))
    h.become_stable([T1, T2], generation=7)
    h.coordinator.handle_heartbeat_response(7, "m-1", ErrorCode.REBALANCE_IN_PROGRESS)
    assert not h.coordinator.ready()
    h.poll()
    assert h.listener.calls[-1] == ("revoked", [T1, T2])        # eager: everything, before rejoining
    by_name = {p.name: decode_subscription(p.metadata) for p in h.join_request().protocols}
    assert list(by_name) == ["cooperative-sticky", "range"]
    assert by_name["cooperative-sticky"].owned_partitions == ()


def test_inconsistent_group_protocol_says_how_to_mix_eager_and_cooperative():
    h = cooperative()
    h.poll()
    h.answer_join(error_code=ErrorCode.INCONSISTENT_GROUP_PROTOCOL,
                  error_message="none of the protocols ['cooperative-sticky'] is supported by every member")
    with pytest.raises(EosError, match=r"\['cooperative-sticky'\] \(COOPERATIVE rebalancing\).*cannot be mixed") as raised:
        h.poll()
    assert raised.value.code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL


# ---- configuration ---------------------------------------------------------------------------

def test_assignor_names_accept_lists_strings_and_kafka_class_names():
    assert assignor_names("s", "range, sticky") == ("range", "sticky")
    assert assignor_names("s", ["org.apache.kafka.clients.consumer.RoundRobinAssignor"]) == ("roundrobin",)
    assert assignor_names("s", ["org.apache.kafka.clients.consumer.CooperativeStickyAssignor", "range"]) == (
        "cooperative-sticky", "range")
    with pytest.raises(ValueError, match="cooperative-sticky"):
        assignor_names("s", ["cooperative"])           # the message lists the known names
    with pytest.raises(ValueError, match="names no assignor"):
        assignor_names("s", "")


def test_consumer_group_config_is_checked_without_a_broker():
    from consumer import Consumer
    with pytest.raises(ValueError, match="heartbeat.interval.ms"):
        Consumer("127.0.0.1:1", group_id="g", session_timeout_ms=3000, heartbeat_interval_ms=3000)
    with pytest.raises(ValueError, match="group.instance.id"):
        Consumer("127.0.0.1:1", group_instance_id="i")
    with pytest.raises(ValueError, match="partition.assignment.strategy|unknown"):
        Consumer("127.0.0.1:1", group_id="g", partition_assignment_strategy="fair")
    with Consumer("127.0.0.1:1") as plain:
        with pytest.raises(EosError, match="group_id") as raised:
            plain.subscribe(["t"])
        assert raised.value.code == ErrorCode.INVALID_GROUP_ID
    with Consumer("127.0.0.1:1", group_id="g") as grouped:
        with pytest.raises(TypeError, match="list of topic names"):
            grouped.subscribe("t")
        grouped.assign([T0])
        with pytest.raises(RuntimeError, match="exclude"):
            grouped.subscribe(["t"])
