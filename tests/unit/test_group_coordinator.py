"""The group coordinator shell (broker.group.coordinator) over a real LogManager in a temp dir.

The clock is fake and the timer thread is off unless a test is about the thread: timers fire
when a test calls `tick()`, so nothing depends on how fast this machine is. Transaction
markers are appended the way the broker's WriteTxnMarkers does (Log.append_txn_marker) and
then reported with `on_txn_marker`.
"""
from __future__ import annotations

import threading

import pytest

from broker.group.coordinator import OFFSETS_TOPIC_CONFIG, CoordinatorType, GroupCoordinator
from broker.group.records import OFFSETS_TOPIC, OffsetAndMetadata, partition_for_group
from broker.storage.log_manager import LogManager
from broker.topics import TopicRegistry
from eos.errors import ErrorCode
from eos.records.header import iter_headers
from eos.types import TopicPartition
from tests.waits import wait_for

TOPIC = "orders"
T0, T1, T2 = (TopicPartition(TOPIC, p) for p in range(3))
GROUP = "copier"
OFFSETS_PARTITIONS = 4
SESSION_TIMEOUT_MS = 10_000
REBALANCE_TIMEOUT_MS = 30_000
PROTOCOLS = [("range", b"subscription")]
WAIT_S = 10.0          # bound on every wait for another thread


class FakeClock:
    def __init__(self, now_ms: int = 1_700_000_000_000):
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


class Broker:
    """The pieces of a broker the coordinator uses: a topic registry and a LogManager."""

    def __init__(self, data_dir, clock: FakeClock):
        self.data_dir = data_dir
        self.clock = clock
        self.coordinator: GroupCoordinator | None = None
        self._open_storage()
        if self.registry.get(TOPIC) is None:
            self.registry.commit(self.registry.prepare_create(TOPIC, 3, 1, {}))

    def _open_storage(self) -> None:
        self.registry = TopicRegistry(self.data_dir)
        topics = self.registry.load()
        self.log_manager = LogManager(str(self.data_dir), now_ms_fn=self.clock)
        self.log_manager.load({info.name: info.config for info in topics})

    def start_coordinator(self, **settings) -> GroupCoordinator:
        settings.setdefault("offsets_partitions", OFFSETS_PARTITIONS)
        settings.setdefault("run_timer_thread", False)
        settings.setdefault("initial_rebalance_delay_ms", 0)
        self.coordinator = GroupCoordinator(self.log_manager, self.registry, now_ms_fn=self.clock,
                                            host="127.0.0.1", port=9999, **settings)
        self.coordinator.start()
        return self.coordinator

    def restart(self, **settings) -> GroupCoordinator:
        """Stop the coordinator, close the logs cleanly, open everything again from disk."""
        self.coordinator.stop()
        self.log_manager.shutdown()
        self._open_storage()
        return self.start_coordinator(**settings)

    def offsets_log(self, group_id: str):
        return self.log_manager.get_log(OFFSETS_TOPIC, partition_for_group(group_id, OFFSETS_PARTITIONS))

    def write_marker(self, group_id: str, producer_id: int, producer_epoch: int, committed: bool) -> None:
        """What the broker's WriteTxnMarkers does for a `__consumer_offsets` partition."""
        partition = partition_for_group(group_id, OFFSETS_PARTITIONS)
        self.offsets_log(group_id).append_txn_marker(producer_id, producer_epoch, 0, committed, self.clock())
        self.coordinator.on_txn_marker(partition, producer_id, committed)

    def close(self) -> None:
        if self.coordinator is not None:
            self.coordinator.stop()
        self.log_manager.shutdown()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def broker(tmp_path, clock):
    b = Broker(tmp_path / "data", clock)
    yield b
    b.close()


def offsets(**by_partition: int) -> dict[TopicPartition, OffsetAndMetadata]:
    """offsets(p0=5, p2=7) -> {orders-0: 5, orders-2: 7}"""
    return {TopicPartition(TOPIC, int(name[1:])): OffsetAndMetadata(offset) for name, offset in by_partition.items()}


def errors_of(results) -> dict[TopicPartition, ErrorCode]:
    return {TopicPartition(r.topic, r.partition): r.error for r in results}


def committed(coordinator: GroupCoordinator, group_id: str = GROUP, **kwargs) -> dict[TopicPartition, int]:
    result = coordinator.offset_fetch(group_id, **kwargs)
    assert result.error is ErrorCode.NONE
    return {TopicPartition(p.topic, p.partition): p.offset for p in result.partitions}


def fetch_errors(coordinator: GroupCoordinator, partitions, group_id: str = GROUP) -> dict[TopicPartition, ErrorCode]:
    result = coordinator.offset_fetch(group_id, partitions, require_stable=True)
    return {TopicPartition(p.topic, p.partition): p.error for p in result.partitions}


def join_alone(coordinator: GroupCoordinator, group_id: str = GROUP, instance_id: str | None = None):
    """One member joins and syncs (initial delay 0: the join completes within the call)."""
    first = coordinator.join(group_id, "", instance_id, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS,
                             REBALANCE_TIMEOUT_MS, client_id="c")
    member_id = first.member_id
    if first.error is ErrorCode.MEMBER_ID_REQUIRED:
        first = coordinator.join(group_id, member_id, instance_id, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS,
                                 REBALANCE_TIMEOUT_MS, client_id="c")
    assert first.error is ErrorCode.NONE, first
    synced = coordinator.sync(group_id, first.generation_id, first.member_id, instance_id,
                              {first.member_id: b"assignment"})
    assert synced.error is ErrorCode.NONE, synced
    return first


# ---- start, the offsets topic, phases --------------------------------------------------------

def test_start_creates_the_offsets_topic_with_its_configs(broker):
    broker.start_coordinator(offsets_partitions=50)
    info = broker.registry.get(OFFSETS_TOPIC)
    assert info.partition_count == 50 and info.is_internal
    assert dict(info.config_overrides) == OFFSETS_TOPIC_CONFIG
    assert info.config.segment_bytes == 100 * 1024 * 1024 and info.config.retention_ms == -1
    assert info.config.cleanup_policy == "compact"
    assert all(broker.log_manager.get_log(OFFSETS_TOPIC, p) is not None for p in range(50))


def test_an_existing_offsets_topic_keeps_its_partition_count(broker):
    broker.start_coordinator(offsets_partitions=OFFSETS_PARTITIONS)
    broker.coordinator.offset_commit(GROUP, -1, "", None, offsets(p0=3))
    coordinator = broker.restart(offsets_partitions=50)     # configured differently later
    assert coordinator.offsets_partitions == OFFSETS_PARTITIONS
    assert committed(coordinator) == {T0: 3}


def test_requests_before_start_and_after_stop_are_refused_with_retriable_errors(broker):
    coordinator = GroupCoordinator(broker.log_manager, broker.registry, now_ms_fn=broker.clock,
                                   offsets_partitions=OFFSETS_PARTITIONS, run_timer_thread=False)
    assert coordinator.offset_fetch(GROUP).error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert errors_of(coordinator.offset_commit(GROUP, -1, "", None, offsets(p0=1))) == {
        T0: ErrorCode.COORDINATOR_LOAD_IN_PROGRESS}
    assert coordinator.join(GROUP, "", None, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS,
                            REBALANCE_TIMEOUT_MS).error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    assert coordinator.find_coordinator(CoordinatorType.GROUP, [GROUP])[0].error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    coordinator.start()
    coordinator.stop()
    assert coordinator.offset_fetch(GROUP).error is ErrorCode.NOT_COORDINATOR
    assert coordinator.heartbeat(GROUP, 1, "m", None).error is ErrorCode.NOT_COORDINATOR
    assert coordinator.describe_groups([GROUP])[0].error is ErrorCode.NOT_COORDINATOR
    broker.coordinator = coordinator


def test_find_coordinator_answers_this_broker_for_groups_and_transactional_ids(broker):
    coordinator = broker.start_coordinator()
    (group,) = coordinator.find_coordinator(CoordinatorType.GROUP, [GROUP])
    (txn,) = coordinator.find_coordinator(CoordinatorType.TRANSACTION, ["copier-0"])
    (empty,) = coordinator.find_coordinator(CoordinatorType.GROUP, [""])
    assert (group.key, group.node_id, group.host, group.port, group.error) == (GROUP, 0, "127.0.0.1", 9999,
                                                                               ErrorCode.NONE)
    assert (txn.key, txn.port, txn.error) == ("copier-0", 9999, ErrorCode.NONE)
    assert empty.error is ErrorCode.INVALID_REQUEST
    assert coordinator.find_coordinator(7, [GROUP])[0].error is ErrorCode.INVALID_REQUEST


# ---- plain offset commits ------------------------------------------------------------------

def test_commit_and_fetch_round_trip_survives_a_restart(broker):
    coordinator = broker.start_coordinator()
    member = join_alone(coordinator)
    results = coordinator.offset_commit(GROUP, member.generation_id, member.member_id, None, offsets(p0=5, p1=7))
    assert errors_of(results) == {T0: ErrorCode.NONE, T1: ErrorCode.NONE}
    assert errors_of(coordinator.offset_commit(GROUP, member.generation_id, member.member_id, None,
                                               offsets(p0=9))) == {T0: ErrorCode.NONE}
    assert committed(coordinator) == {T0: 9, T1: 7}

    coordinator = broker.restart()
    assert committed(coordinator) == {T0: 9, T1: 7}
    assert committed(coordinator, partitions=[T1, T2]) == {T1: 7, T2: -1}
    # The group came back Stable with its member, who may keep committing.
    described = coordinator.describe_groups([GROUP])[0]
    assert (described.state, described.generation_id) == ("Stable", member.generation_id)
    assert [m.member_id for m in described.members] == [member.member_id]
    assert errors_of(coordinator.offset_commit(GROUP, member.generation_id, member.member_id, None,
                                               offsets(p2=1))) == {T2: ErrorCode.NONE}


def test_refused_partitions_are_named_and_the_rest_are_written(broker):
    coordinator = broker.start_coordinator()
    too_long = OffsetAndMetadata(1, metadata="x" * 5000)
    results = coordinator.offset_commit(GROUP, -1, "", None, {
        T0: OffsetAndMetadata(4), TopicPartition("missing", 0): OffsetAndMetadata(1),
        TopicPartition(TOPIC, 3): OffsetAndMetadata(1), T1: too_long})
    by_partition = {(r.topic, r.partition): r for r in results}
    assert [(r.topic, r.partition) for r in results] == [(TOPIC, 0), ("missing", 0), (TOPIC, 3), (TOPIC, 1)]
    assert by_partition[(TOPIC, 0)].error is ErrorCode.NONE
    assert by_partition[("missing", 0)].error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "missing" in by_partition[("missing", 0)].message
    assert by_partition[(TOPIC, 3)].error is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert by_partition[(TOPIC, 1)].error is ErrorCode.OFFSET_METADATA_TOO_LARGE
    assert "offset.metadata.max.bytes" in by_partition[(TOPIC, 1)].message
    assert committed(coordinator) == {T0: 4}


def test_a_refused_commit_writes_nothing(broker):
    coordinator = broker.start_coordinator()
    member = join_alone(coordinator)
    end_before = broker.offsets_log(GROUP).log_end_offset
    cases = [
        ((GROUP, member.generation_id + 1, member.member_id, None), ErrorCode.ILLEGAL_GENERATION),
        ((GROUP, member.generation_id, "someone-else", None), ErrorCode.UNKNOWN_MEMBER_ID),
        ((GROUP, -1, "", None), ErrorCode.UNKNOWN_MEMBER_ID),         # the group has members
        (("", -1, "", None), ErrorCode.INVALID_GROUP_ID),
    ]
    for args, error in cases:
        results = coordinator.offset_commit(*args, offsets(p0=1, p1=2))
        assert errors_of(results) == {T0: error, T1: error}, args
        assert all(r.message for r in results)
    assert broker.offsets_log(GROUP).log_end_offset == end_before
    assert committed(coordinator) == {}


def test_a_commit_the_log_refuses_changes_nothing(broker):
    """A batch over max.message.bytes: Kafka's INVALID_COMMIT_OFFSET_SIZE for every partition of it."""
    broker.registry.commit(broker.registry.prepare_create("wide", 400, 1, {}))
    coordinator = broker.start_coordinator()
    big = {TopicPartition("wide", p): OffsetAndMetadata(p, metadata="m" * 4000) for p in range(400)}
    end_before = broker.offsets_log(GROUP).log_end_offset
    results = coordinator.offset_commit(GROUP, -1, "", None, big)
    assert {r.error for r in results} == {ErrorCode.INVALID_COMMIT_OFFSET_SIZE}
    assert broker.offsets_log(GROUP).log_end_offset == end_before
    assert fetch_errors(coordinator, list(big)[:3]) == {tp: ErrorCode.NONE for tp in list(big)[:3]}
    assert committed(coordinator) == {}


# ---- transactional offset commits ----------------------------------------------------------

PRODUCER_ID, EPOCH = 4000, 3


def txn_commit(coordinator, member=None, producer_epoch=EPOCH, group_id=GROUP, **by_partition):
    generation, member_id = (member.generation_id, member.member_id) if member is not None else (-1, "")
    return errors_of(coordinator.txn_offset_commit("copier-0", group_id, PRODUCER_ID, producer_epoch, generation,
                                                   member_id, None, offsets(**by_partition)))


def test_txn_offsets_are_invisible_until_the_commit_marker(broker):
    coordinator = broker.start_coordinator()
    member = join_alone(coordinator)
    coordinator.offset_commit(GROUP, member.generation_id, member.member_id, None, offsets(p0=1))
    partition_log = broker.offsets_log(GROUP)
    batch_offset = partition_log.log_end_offset
    assert txn_commit(coordinator, member, p0=10, p1=20) == {T0: ErrorCode.NONE, T1: ErrorCode.NONE}

    # One transactional batch of the producer, without sequence numbers, holding the LSO back.
    data = partition_log.read(batch_offset, 1 << 20)
    (header,) = list(iter_headers(data.records))
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (PRODUCER_ID, EPOCH, -1)
    assert header.is_transactional and header.records_count == 2
    assert partition_log.last_stable_offset == batch_offset

    assert committed(coordinator) == {T0: 1}
    assert fetch_errors(coordinator, [T0, T1, T2]) == {
        T0: ErrorCode.UNSTABLE_OFFSET_COMMIT, T1: ErrorCode.UNSTABLE_OFFSET_COMMIT, T2: ErrorCode.NONE}
    # require_stable for the whole group names the pending partitions too.
    assert {p.error for p in coordinator.offset_fetch(GROUP, require_stable=True).partitions} == {
        ErrorCode.UNSTABLE_OFFSET_COMMIT}

    broker.write_marker(GROUP, PRODUCER_ID, EPOCH + 1, committed=True)
    assert committed(coordinator) == {T0: 10, T1: 20}
    assert fetch_errors(coordinator, [T0, T1]) == {T0: ErrorCode.NONE, T1: ErrorCode.NONE}
    assert partition_log.last_stable_offset == partition_log.log_end_offset

    coordinator = broker.restart()
    assert committed(coordinator, require_stable=True) == {T0: 10, T1: 20}


def test_txn_offsets_are_dropped_on_abort_also_after_a_restart(broker):
    coordinator = broker.start_coordinator()
    coordinator.offset_commit(GROUP, -1, "", None, offsets(p0=1))
    assert txn_commit(coordinator, p0=10, p1=20) == {T0: ErrorCode.NONE, T1: ErrorCode.NONE}
    broker.write_marker(GROUP, PRODUCER_ID, EPOCH + 1, committed=False)
    assert committed(coordinator, require_stable=True) == {T0: 1}
    coordinator = broker.restart()
    assert committed(coordinator, require_stable=True) == {T0: 1}
    assert fetch_errors(coordinator, [T0, T1]) == {T0: ErrorCode.NONE, T1: ErrorCode.NONE}


def test_a_pending_txn_commit_survives_a_restart_and_completes_with_its_marker(broker):
    coordinator = broker.start_coordinator()
    assert txn_commit(coordinator, p2=30) == {T2: ErrorCode.NONE}
    coordinator = broker.restart()
    assert fetch_errors(coordinator, [T2]) == {T2: ErrorCode.UNSTABLE_OFFSET_COMMIT}
    assert committed(coordinator) == {}
    broker.write_marker(GROUP, PRODUCER_ID, EPOCH + 1, committed=True)
    assert committed(coordinator, require_stable=True) == {T2: 30}


def test_a_plain_commit_after_the_txn_commit_wins_over_it(broker):
    """Kafka's log-order rule, through the shell: the record written later wins."""
    coordinator = broker.start_coordinator()
    assert txn_commit(coordinator, p0=10) == {T0: ErrorCode.NONE}
    assert errors_of(coordinator.offset_commit(GROUP, -1, "", None, offsets(p0=15))) == {T0: ErrorCode.NONE}
    broker.write_marker(GROUP, PRODUCER_ID, EPOCH + 1, committed=True)
    assert committed(coordinator) == {T0: 15}
    assert committed(broker.restart()) == {T0: 15}


def test_a_zombies_txn_offset_commit_is_refused_and_stages_nothing(broker):
    coordinator = broker.start_coordinator()
    old = join_alone(coordinator)
    # The leader rejoining starts a new generation (it is alone, so the join completes at once).
    new = coordinator.join(GROUP, old.member_id, None, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS,
                           REBALANCE_TIMEOUT_MS)
    assert new.error is ErrorCode.NONE and new.generation_id == old.generation_id + 1
    end_before = broker.offsets_log(GROUP).log_end_offset

    assert txn_commit(coordinator, old, p0=10) == {T0: ErrorCode.ILLEGAL_GENERATION}
    stranger = type(old)(generation_id=new.generation_id, member_id="not-a-member")
    assert txn_commit(coordinator, stranger, p0=10) == {T0: ErrorCode.UNKNOWN_MEMBER_ID}
    assert broker.offsets_log(GROUP).log_end_offset == end_before
    assert fetch_errors(coordinator, [T0]) == {T0: ErrorCode.NONE}

    # The live member of the current generation commits; a producer whose transaction already
    # ended (the marker bumped its epoch, KIP-890) is fenced by the log's epoch rule.
    assert txn_commit(coordinator, new, p0=10) == {T0: ErrorCode.NONE}
    broker.write_marker(GROUP, PRODUCER_ID, EPOCH + 1, committed=True)
    assert txn_commit(coordinator, new, producer_epoch=EPOCH, p0=99) == {T0: ErrorCode.INVALID_PRODUCER_EPOCH}
    assert fetch_errors(coordinator, [T0]) == {T0: ErrorCode.NONE}
    assert committed(coordinator) == {T0: 10}


def test_a_fenced_static_member_cannot_commit_in_a_transaction(broker):
    coordinator = broker.start_coordinator()
    old = join_alone(coordinator, instance_id="copier-a")
    # The same group.instance.id restarts: the old member id is fenced.
    new = coordinator.join(GROUP, "", "copier-a", "consumer", PROTOCOLS, SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS)
    assert new.error is ErrorCode.NONE and new.member_id != old.member_id
    results = coordinator.txn_offset_commit("copier-0", GROUP, PRODUCER_ID, EPOCH, old.generation_id,
                                            old.member_id, "copier-a", offsets(p0=5))
    assert errors_of(results) == {T0: ErrorCode.FENCED_INSTANCE_ID}
    results = coordinator.txn_offset_commit("copier-0", GROUP, PRODUCER_ID, EPOCH, new.generation_id,
                                            new.member_id, "copier-a", offsets(p0=5))
    assert errors_of(results) == {T0: ErrorCode.NONE}


def test_a_txn_offset_commit_without_a_producer_is_an_invalid_request(broker):
    coordinator = broker.start_coordinator()
    results = coordinator.txn_offset_commit("copier-0", GROUP, -1, 0, -1, "", None, offsets(p0=5))
    assert errors_of(results) == {T0: ErrorCode.INVALID_REQUEST}
    assert "producer id" in results[0].message


def test_verify_txn_refuses_a_commit_outside_the_producers_transaction(broker):
    """KIP-890 part 1: the group's offsets partition must be in the open transaction."""
    asked = []
    registered: set[TopicPartition] = set()

    def verify_txn(transactional_id, producer_id, producer_epoch, partitions):
        asked.append((transactional_id, producer_id, producer_epoch, list(partitions)))
        return {tp: (ErrorCode.NONE, "") if tp in registered else
                (ErrorCode.INVALID_TXN_STATE, "not added with AddOffsetsToTxn") for tp in partitions}

    coordinator = broker.start_coordinator(verify_txn=verify_txn)
    offsets_tp = TopicPartition(OFFSETS_TOPIC, partition_for_group(GROUP, OFFSETS_PARTITIONS))
    end_before = broker.offsets_log(GROUP).log_end_offset
    results = coordinator.txn_offset_commit("copier-0", GROUP, PRODUCER_ID, EPOCH, -1, "", None, offsets(p0=5))
    assert errors_of(results) == {T0: ErrorCode.INVALID_TXN_STATE}
    assert "AddOffsetsToTxn" in results[0].message and "copier-0" in results[0].message
    assert asked == [("copier-0", PRODUCER_ID, EPOCH, [offsets_tp])]
    assert broker.offsets_log(GROUP).log_end_offset == end_before
    assert fetch_errors(coordinator, [T0]) == {T0: ErrorCode.NONE}

    registered.add(offsets_tp)
    assert txn_commit(coordinator, p0=5) == {T0: ErrorCode.NONE}
    assert fetch_errors(coordinator, [T0]) == {T0: ErrorCode.UNSTABLE_OFFSET_COMMIT}


# ---- membership through threads ------------------------------------------------------------

def test_three_members_joining_together_complete_one_generation(broker, clock):
    coordinator = broker.start_coordinator(initial_rebalance_delay_ms=3000)
    answers: dict[int, object] = {}

    def member(i: int) -> None:
        first = coordinator.join(GROUP, "", None, "consumer", [("range", b"m%d" % i)], SESSION_TIMEOUT_MS,
                                 REBALANCE_TIMEOUT_MS, client_id=f"c{i}")
        assert first.error is ErrorCode.MEMBER_ID_REQUIRED
        answers[i] = coordinator.join(GROUP, first.member_id, None, "consumer", [("range", b"m%d" % i)],
                                      SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS, client_id=f"c{i}")

    threads = [threading.Thread(target=member, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    wait_for(lambda: coordinator.parked_request_count() == 3, "three parked joins")
    assert coordinator.describe_groups([GROUP])[0].state == "PreparingRebalance"
    # Kafka's initial delay: members joined during the first 3 s, so it waits another 3 s
    # (up to the rebalance timeout) in case more are coming; then the join phase completes.
    clock.advance(3000)
    coordinator.tick()
    assert coordinator.parked_request_count() == 3
    clock.advance(3000)
    coordinator.tick()
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive()

    responses = list(answers.values())
    assert {r.error for r in responses} == {ErrorCode.NONE}
    assert {r.generation_id for r in responses} == {1}
    assert len({r.member_id for r in responses}) == 3
    (leader,) = {r.leader for r in responses}
    by_member = {r.member_id: r for r in responses}
    assert {m.member_id for m in by_member[leader].members} == set(by_member)
    assert all(not r.members for m, r in by_member.items() if m != leader)

    # Followers wait in SyncGroup for the leader's assignment; each gets its own.
    synced: dict[str, object] = {}
    followers = [m for m in by_member if m != leader]

    def follow(member_id: str) -> None:
        synced[member_id] = coordinator.sync(GROUP, 1, member_id, None, {})

    threads = [threading.Thread(target=follow, args=(m,)) for m in followers]
    for t in threads:
        t.start()
    wait_for(lambda: coordinator.parked_request_count() == 2, "two parked syncs")
    assignment = {m: m.encode() for m in by_member}
    synced[leader] = coordinator.sync(GROUP, 1, leader, None, assignment)
    for t in threads:
        t.join(WAIT_S)
        assert not t.is_alive()
    assert {m: r.assignment for m, r in synced.items()} == assignment
    described = coordinator.describe_groups([GROUP])[0]
    assert (described.state, described.generation_id, len(described.members)) == ("Stable", 1, 3)
    assert {m.client_id for m in described.members} == {"c0", "c1", "c2"}


def test_session_expiry_by_the_clock_empties_the_group_and_keeps_its_offsets(broker, clock):
    coordinator = broker.start_coordinator()
    member = join_alone(coordinator)
    coordinator.offset_commit(GROUP, member.generation_id, member.member_id, None, offsets(p0=5))
    clock.advance(SESSION_TIMEOUT_MS - 1)
    coordinator.tick()
    assert coordinator.heartbeat(GROUP, member.generation_id, member.member_id, None).error is ErrorCode.NONE
    clock.advance(SESSION_TIMEOUT_MS)        # no heartbeat for a whole session
    coordinator.tick()
    assert coordinator.describe_groups([GROUP])[0].state == "Empty"
    assert coordinator.heartbeat(GROUP, member.generation_id, member.member_id, None).error is \
        ErrorCode.UNKNOWN_MEMBER_ID
    assert committed(coordinator) == {T0: 5}
    # The Empty group was recorded: after a restart nobody is a member.
    coordinator = broker.restart()
    described = coordinator.describe_groups([GROUP])[0]
    assert (described.state, described.members) == ("Empty", ())
    assert committed(coordinator) == {T0: 5}


def test_the_timer_thread_expires_sessions_without_any_request(broker, clock):
    coordinator = broker.start_coordinator(run_timer_thread=True, tick_interval_ms=5)
    join_alone(coordinator)
    clock.advance(SESSION_TIMEOUT_MS + 1)
    wait_for(lambda: coordinator.describe_groups([GROUP])[0].state == "Empty", "the session to expire")


def test_leave_group_rebalances_at_once(broker):
    coordinator = broker.start_coordinator()
    member = join_alone(coordinator)
    assert coordinator.leave(GROUP, member.member_id, None).error is ErrorCode.NONE
    assert coordinator.describe_groups([GROUP])[0].state == "Empty"
    assert coordinator.leave(GROUP, member.member_id, None).error is ErrorCode.UNKNOWN_MEMBER_ID


# ---- parked requests: bounds and shutdown --------------------------------------------------

def park_join(coordinator, results: list, rebalance_timeout_ms: int = REBALANCE_TIMEOUT_MS) -> threading.Thread:
    def run():
        first = coordinator.join(GROUP, "", None, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS, rebalance_timeout_ms)
        results.append(coordinator.join(GROUP, first.member_id, None, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS,
                                        rebalance_timeout_ms))
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_stop_answers_a_parked_join_not_coordinator(broker):
    coordinator = broker.start_coordinator(initial_rebalance_delay_ms=3000)
    results: list = []
    thread = park_join(coordinator, results)
    wait_for(lambda: coordinator.parked_request_count() == 1, "a parked join")
    coordinator.stop()
    thread.join(WAIT_S)
    assert not thread.is_alive()
    assert results[0].error is ErrorCode.NOT_COORDINATOR


def test_a_parked_join_that_outlives_its_bound_is_answered_request_timed_out(broker):
    # The fake clock never moves, so the join phase never completes; the real-time bound does.
    coordinator = broker.start_coordinator(initial_rebalance_delay_ms=3000, request_wait_margin_ms=0)
    results: list = []
    thread = park_join(coordinator, results, rebalance_timeout_ms=50)
    thread.join(WAIT_S)
    assert not thread.is_alive()
    timed_out = results[0]
    assert timed_out.error is ErrorCode.REQUEST_TIMED_OUT and timed_out.member_id
    assert coordinator.parked_request_count() == 1      # the core still holds the abandoned request
    # The member rejoins with its id: the core answers the abandoned request (superseded), so
    # abandoned requests do not pile up.
    again = coordinator.join(GROUP, timed_out.member_id, None, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS, 50)
    assert again.error is ErrorCode.REQUEST_TIMED_OUT
    assert coordinator.parked_request_count() == 1


def test_parked_requests_are_bounded(broker):
    coordinator = broker.start_coordinator(initial_rebalance_delay_ms=3000, max_parked_requests=1)
    results: list = []
    thread = park_join(coordinator, results)
    wait_for(lambda: coordinator.parked_request_count() == 1, "a parked join")
    refused = coordinator.join(GROUP, "", None, "consumer", PROTOCOLS, SESSION_TIMEOUT_MS, REBALANCE_TIMEOUT_MS)
    assert refused.error is ErrorCode.COORDINATOR_NOT_AVAILABLE
    coordinator.stop()
    thread.join(WAIT_S)


# ---- listing and describing ----------------------------------------------------------------

def test_groups_with_only_offsets_are_listed_and_described_as_empty(broker):
    coordinator = broker.start_coordinator()
    join_alone(coordinator, group_id="members")
    coordinator.offset_commit("offsets-only", -1, "", None, offsets(p1=4))
    error, listed = coordinator.list_groups()
    assert error is ErrorCode.NONE
    assert [(g.group_id, g.state) for g in listed] == [("members", "Stable"), ("offsets-only", "Empty")]
    assert [g.group_id for g in coordinator.list_groups(["Empty"])[1]] == ["offsets-only"]
    with pytest.raises(ValueError):
        coordinator.list_groups(["Sleeping"])
    only, missing = coordinator.describe_groups(["offsets-only", "missing"])
    assert (only.error, only.state, only.members) == (ErrorCode.NONE, "Empty", ())
    assert missing.error is ErrorCode.GROUP_ID_NOT_FOUND
    assert committed(coordinator, "offsets-only") == {T1: 4}
