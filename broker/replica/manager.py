"""The replica manager: which partitions this broker leads or follows, and the data path between them.

Theory of operation
-------------------
The controller decides roles; this class carries them out (Kafka's ReplicaManager in
ZooKeeper mode). It is the one owner of the per-partition role on this broker:

    LeaderAndIsr(controller_epoch, partitions)  --> become leader  | become follower
    StopReplica(partitions, delete)             --> stop following | delete the log

A request from a controller older than the newest one seen is refused whole with
STALE_CONTROLLER_EPOCH; a partition state whose leader epoch is not newer than the one
applied is skipped (Kafka's rule), so a late or repeated request changes nothing.

Leader: the partition's `LeaderState` (the pure core in `broker/replica/partition.py`)
tracks each follower's log end offset, the ISR and the high watermark. A follower's Fetch
reports its log end (its fetch offset); the core moves the HW (the smallest log end in
the ISR) and the log publishes it, which wakes consumers' long polls and acks=all waiters.
An ISR change is a proposal: it is written to the partition's state znode with the
znode's version (a stale version means the controller changed the state meanwhile; the
next LeaderAndIsr brings the new one) and announced under /isr_change_notification for
the controller. A follower that has not caught up for replica.lag.time.max.ms is dropped by
the maintenance thread; one that reaches the HW is added back on its next fetch.

Follower: one `ReplicaFetcher` thread per leader broker fetches all the partitions this
broker follows from that leader in one Fetch. Becoming a follower first truncates the log
to where it agrees with the leader (KIP-101/KIP-279 through OffsetsForLeaderEpoch, done by
the fetcher before its first fetch of the partition).

Produce with acks=all waits (bounded by the request's timeout) until the HW passes the
appended batch; min.insync.replicas is checked before the append (NOT_ENOUGH_REPLICAS,
nothing appended) and again when the wait ends (NOT_ENOUGH_REPLICAS_AFTER_APPEND). A
LeaderAndIsr that keeps this broker leader at a new epoch (the controller shrinking the ISR
during a controlled shutdown, a reassignment step) hands the leadership over without a gap
and the waits go on under it: the write is still in this log and the new ISR commits it, as
in Kafka, where a leader's pending produces outlive such an update. Only a leadership that
ended (another leader, or this one after a time as a follower, when the log may have been
truncated under the write) answers them NOT_LEADER_OR_FOLLOWER. Each unbroken leadership is
one `_Leader.tenure`.

DeleteRecords waits likewise, on the same condition, until the low watermark (the smallest
log start offset over this leader and the followers on live brokers, which each Fetch
reports) reaches the offset asked: `wait_for_low_watermark`.

Locks: `_lock` guards the role map and is never held during I/O; each leader partition's
core has its own lock (`_Leader.lock`) held only for core calls.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from eos.errors import (
    EosError,
    ErrorCode,
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
    StaleControllerEpochError,
    UnknownLeaderEpochError,
)

log = logging.getLogger("eos.broker.replica")

REPLICA_LAG_TIME_MAX_MS_DEFAULT = 30_000
ISR_CHECK_INTERVAL_MIN_MS = 100
LOW_WATERMARK_RECHECK_S = 0.5


@dataclass(frozen=True)
class PartitionAssignment:
    """One partition's state as the controller sent it."""

    topic: str
    partition: int
    controller_epoch: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    zk_version: int
    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()
    is_new: bool = False
    topic_configs: dict = field(default_factory=dict)
    throttle_bytes_per_s: int = 0      # what the adding replicas may be sent (a throttled reassignment)
    unclean_election: bool = False     # chosen with no in-sync replica alive

    @property
    def tp(self) -> tuple[str, int]:
        return (self.topic, self.partition)


class _Leader:
    """This broker leads the partition: the core plus the lock that orders calls into it."""

    def __init__(self, assignment: PartitionAssignment, core, tenure: object | None = None):
        self.assignment = assignment
        self.core = core
        # The same object for every epoch of one unbroken leadership of this broker (see the
        # module doc): an acks=all wait outlives a new epoch only within its tenure.
        self.tenure = tenure if tenure is not None else object()
        self.lock = threading.Lock()
        self.hw_changed = threading.Condition(self.lock)
        self.isr_write_in_flight = False
        # Held across a client append (and taken by a change of role), so nothing is appended
        # as leader after this broker stopped leading (Kafka's leaderIsrUpdateLock).
        self.append_lock = threading.Lock()
        self.throttle = (None if assignment.throttle_bytes_per_s <= 0 or not assignment.adding
                         else ThrottleBucket(assignment.throttle_bytes_per_s))


class _Follower:
    def __init__(self, assignment: PartitionAssignment):
        self.assignment = assignment


class ReplicaManager:
    """Roles of this broker's replicas; see the module doc.

    `log_manager` gives and creates logs; `ensure_topic(topic, partition, configs)` makes
    sure the local topic registry knows the topic and returns its TopicConfig (so the
    replica's log opens with the right config);
    `isr_writer(topic, partition, leader, leader_epoch, isr, controller_epoch, zk_version)`
    writes an ISR change to ZooKeeper and returns the new znode version (raising on a stale
    version); `fetchers` is the follower side (`broker.replica.fetcher.FetcherManager`);
    `notify(tp)` wakes long polls of a partition; `is_live_broker(id)` says whether a
    broker is alive as the last UpdateMetadata had it (the low watermark counts those).
    """

    def __init__(self, broker_id: int, log_manager, *, ensure_topic: Callable[[str, int, dict], object],
                 isr_writer: Callable[..., int], notify: Callable[[tuple[str, int]], None],
                 now_ms_fn: Callable[[], int], replica_lag_time_max_ms: int = REPLICA_LAG_TIME_MAX_MS_DEFAULT,
                 is_live_broker: Callable[[int], bool] = lambda broker_id: True):
        self.broker_id = broker_id
        self._is_live_broker = is_live_broker
        self._log_manager = log_manager
        self._ensure_topic = ensure_topic
        self._isr_writer = isr_writer
        self._notify = notify
        self._now_ms = now_ms_fn
        self.replica_lag_time_max_ms = replica_lag_time_max_ms
        self.fetchers = None   # set by the server: broker.replica.fetcher.FetcherManager
        # Set when this broker asks for its controlled shutdown: the replicas it is then left
        # to follow (its leaderships, moved away) are not fetched. A follower on its way out
        # would rejoin the new leader's ISR within milliseconds and, once gone, hold every
        # acks=all write there until the controller noticed (Kafka, KIP-841: a broker in
        # controlled shutdown is not eligible for the ISR).
        self.in_controlled_shutdown = False
        # (tp, is_leader, leader_epoch) after each applied change of role: the coordinators
        # follow the leadership of their internal topics' partitions
        self.on_role_change: Callable[[tuple[str, int], bool, int], None] | None = None
        self._lock = threading.Lock()
        self._controller_epoch = 0
        self._leaders: dict[tuple[str, int], _Leader] = {}
        self._followers: dict[tuple[str, int], _Follower] = {}
        self._stopping = threading.Event()
        self._isr_thread: threading.Thread | None = None
        # ISR changes this broker wrote as leader (Kafka's IsrShrinksPerSec/IsrExpandsPerSec),
        # for the broker's metrics
        self.isr_shrinks = 0
        self.isr_expands = 0
        # acks=all produces waiting for the ISR to copy them (Kafka's Produce purgatory)
        self.produce_waiters = 0
        # the three counts are written from several threads, under different partitions'
        # locks: they have their own
        self._counts_lock = threading.Lock()

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        self._isr_thread = threading.Thread(target=self._isr_maintenance_loop, name="eos-isr", daemon=True)
        self._isr_thread.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            leaders = list(self._leaders.values())
        for leader in leaders:
            with leader.lock:
                leader.hw_changed.notify_all()
        if self.fetchers is not None:
            self.fetchers.stop()
        if self._isr_thread is not None:
            self._isr_thread.join(5.0)

    @property
    def controller_epoch(self) -> int:
        return self._controller_epoch

    # ---- controller requests --------------------------------------------------------------

    def check_controller_epoch(self, controller_epoch: int, what: str) -> None:
        with self._lock:
            if controller_epoch < self._controller_epoch:
                raise StaleControllerEpochError(
                    f"{what} from a controller at epoch {controller_epoch}; this broker has seen epoch "
                    f"{self._controller_epoch}")
            self._controller_epoch = controller_epoch

    def become_leader_or_follower(self, controller_epoch: int,
                                  partitions: list[PartitionAssignment]) -> dict[tuple[str, int], tuple[int, str]]:
        """Apply a LeaderAndIsr; per partition (code, message)."""
        self.check_controller_epoch(controller_epoch, "LeaderAndIsr")
        # Fetchers let go of these partitions first (waiting out an append in flight), so no
        # follower append races a change of role below.
        if self.fetchers is not None:
            self.fetchers.remove_partitions([a.tp for a in partitions])
        results: dict[tuple[str, int], tuple[int, str]] = {}
        new_follows: dict[tuple[str, int], PartitionAssignment] = {}
        # the local registry learns each topic once (not once per partition: each is a file write)
        topic_configs = {}
        for assignment in partitions:
            highest, configs = topic_configs.get(assignment.topic, (-1, {}))
            topic_configs[assignment.topic] = (max(highest, assignment.partition),
                                               assignment.topic_configs or configs)
        configs_by_topic = {}
        for topic, (highest, configs) in topic_configs.items():
            try:
                configs_by_topic[topic] = self._ensure_topic(topic, highest, configs)
            except Exception:
                log.exception("LeaderAndIsr: cannot record topic %s", topic)
        # New logs are created without an fsync of their directory each; the directories
        # are fsynced once, below, before any of them is served or answered for (a
        # 1,000-partition topic cost every broker 1,000 fsyncs of the same directory).
        created: list[tuple[str, int]] = []
        for assignment in partitions:
            tp = assignment.tp
            if self.broker_id not in assignment.replicas:
                results[tp] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                               f"broker {self.broker_id} is not a replica of {tp[0]}-{tp[1]}")
                continue
            current = self._current_epoch(tp)
            if current is not None and assignment.leader_epoch < current:
                results[tp] = (ErrorCode.STALE_CONTROLLER_EPOCH,
                               f"leader epoch {assignment.leader_epoch} is older than {current} applied here")
                continue
            try:
                config = configs_by_topic.get(assignment.topic)
                if config is None:
                    raise EosError(f"topic {assignment.topic} could not be recorded", ErrorCode.KAFKA_STORAGE_ERROR)
                partition_log = self._log_manager.get_log(*tp)
                if partition_log is None:
                    partition_log = self._log_manager.create_log(assignment.topic, assignment.partition, config,
                                                                 sync_directory=False)
                    created.append(tp)
                partition_log.set_replicated(True)
                if assignment.leader == self.broker_id:
                    self._become_leader(assignment, partition_log)
                else:
                    self._stop_leading(tp)
                    with self._lock:
                        self._followers[tp] = _Follower(assignment)
                    new_follows[tp] = assignment
                results[tp] = (ErrorCode.NONE, "")
            except Exception as exc:   # one partition's failure must not stop the others
                log.exception("LeaderAndIsr %s-%d failed", *tp)
                code = exc.code if isinstance(exc, EosError) else ErrorCode.UNKNOWN_SERVER_ERROR
                results[tp] = (int(code), f"{type(exc).__name__}: {exc}")
        if created:
            # a partition whose directory failed its fsync is not served here
            for tp, reason in self._log_manager.sync_directories(created).items():
                results[tp] = (ErrorCode.KAFKA_STORAGE_ERROR, reason)
                new_follows.pop(tp, None)
        if self.fetchers is not None and new_follows and not self.in_controlled_shutdown:
            self.fetchers.add_partitions(new_follows)
        if self.on_role_change is not None:
            for assignment in partitions:
                if results.get(assignment.tp, (ErrorCode.UNKNOWN_SERVER_ERROR,))[0] == ErrorCode.NONE:
                    self.on_role_change(assignment.tp, assignment.leader == self.broker_id, assignment.leader_epoch)
        return results

    def _current_epoch(self, tp) -> int | None:
        with self._lock:
            leader = self._leaders.get(tp)
            if leader is not None:
                return leader.assignment.leader_epoch
            follower = self._followers.get(tp)
            return None if follower is None else follower.assignment.leader_epoch

    def _become_leader(self, assignment: PartitionAssignment, partition_log) -> None:
        from broker.replica.partition import LeaderState

        now_ms = self._now_ms()
        # A LeaderAndIsr sent again at the same epoch (a new controller re-sends them all)
        # keeps the epoch's start offset, as Kafka does: only a new epoch starts at the log end.
        current = self._leaders.get(assignment.tp)
        same_epoch_start = (current.core.epoch_start_offset
                            if current is not None and current.assignment.leader_epoch == assignment.leader_epoch
                            else None)
        core = LeaderState(self.broker_id, replicas=assignment.replicas, isr=assignment.isr,
                           leader_epoch=assignment.leader_epoch, zk_version=assignment.zk_version,
                           leader_log_end=partition_log.log_end_offset,
                           high_watermark=partition_log.high_watermark, now_ms=now_ms,
                           epoch_start_offset=same_epoch_start)
        partition_log.leader_epoch_cache.assign(assignment.leader_epoch, partition_log.log_end_offset)
        leader = _Leader(assignment, core, tenure=None if current is None else current.tenure)
        self._stop_leading(assignment.tp, successor=leader)
        with self._lock:
            self._followers.pop(assignment.tp, None)
            self._leaders[assignment.tp] = leader
        # A single-replica ISR commits at once; otherwise the HW waits for the followers.
        self._apply_high_watermark(assignment.tp, leader, partition_log,
                                   core.on_leader_append(partition_log.log_end_offset))
        log.info("%s-%d: leader at epoch %d, ISR %s", assignment.topic, assignment.partition,
                 assignment.leader_epoch, list(assignment.isr))
        if assignment.unclean_election:
            log.warning("%s-%d: leader at epoch %d through an UNCLEAN election: this replica was not in sync, "
                        "records the previous in-sync replicas acknowledged past offset %d may be lost",
                        assignment.topic, assignment.partition, assignment.leader_epoch, partition_log.log_end_offset)

    def _stop_leading(self, tp, successor: _Leader | None = None) -> None:
        """Forget the leadership of `tp` -- or hand it to `successor`, this broker's own at a
        new epoch, with no moment without a leader -- after any client append in flight (so
        none lands after this returns), and wake its acks=all waiters (they answer
        NOT_LEADER, or go on waiting under the successor of their tenure)."""
        leader = self._leaders.get(tp)
        if leader is None:
            return
        with leader.append_lock:
            with self._lock:
                if self._leaders.get(tp) is leader:
                    if successor is None:
                        del self._leaders[tp]
                    else:
                        self._leaders[tp] = successor
        with leader.lock:
            leader.hw_changed.notify_all()

    def stop_replicas(self, controller_epoch: int, partitions: list[tuple[str, int]],
                      delete: bool) -> dict[tuple[str, int], tuple[int, str]]:
        self.check_controller_epoch(controller_epoch, "StopReplica")
        for tp in partitions:
            self._stop_leading(tp)
        with self._lock:
            for tp in partitions:
                self._followers.pop(tp, None)
        if self.fetchers is not None:
            self.fetchers.remove_partitions(partitions)
        results = {}
        for tp in partitions:
            try:
                if delete:
                    self._log_manager.delete_log(*tp)
                results[tp] = (ErrorCode.NONE, "")
            except Exception as exc:
                results[tp] = (ErrorCode.KAFKA_STORAGE_ERROR, f"{type(exc).__name__}: {exc}")
            self._notify(tp)
            if self.on_role_change is not None:
                self.on_role_change(tp, False, -1)
        return results

    # ---- the produce and fetch paths --------------------------------------------------------

    @contextlib.contextmanager
    def leader_append(self, topic: str, partition: int):
        """Around a client append: yields the leader epoch to stamp; NOT_LEADER_OR_FOLLOWER
        if this broker does not lead. Leadership cannot end while the block runs."""
        leader = self._leader(topic, partition)
        with leader.append_lock:
            if self._leaders.get((topic, partition)) is not leader:
                raise NotLeaderOrFollowerError(f"broker {self.broker_id} stopped leading {topic}-{partition}")
            yield leader.assignment.leader_epoch

    def check_leader(self, topic: str, partition: int, current_leader_epoch: int | None = None) -> None:
        leader = self._leaders.get((topic, partition))
        if leader is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} is not the leader of {topic}-{partition}")
        _check_epoch(leader.assignment, current_leader_epoch)

    def lagging_high_watermark(self, topic: str, partition: int, partition_log) -> str | None:
        """Why this leader cannot answer a client's offset lookup yet, or None. A replica that
        just became leader keeps the high watermark it had as a follower, which can be behind
        what the previous leader had committed (the followers learn the HW one fetch late);
        until its followers fetch again it would answer "latest" with an older offset. Kafka
        answers OFFSET_NOT_AVAILABLE while the HW is below the epoch's start offset, and the
        client retries. The HW compared is the log's, the one the answer would carry (the
        leader state's moves first, and the log's just after, outside the lock)."""
        leader = self._leaders.get((topic, partition))
        if leader is None:
            return None
        with leader.lock:
            epoch_start, epoch = leader.core.epoch_start_offset, leader.core.leader_epoch
        high_watermark = partition_log.high_watermark
        if high_watermark >= epoch_start:
            return None
        return (f"{topic}-{partition}: the high watermark ({high_watermark}) of this leader (epoch {epoch}) is "
                f"behind the start offset of its epoch ({epoch_start}); retry once its followers have fetched")

    def check_min_isr(self, topic: str, partition: int, min_insync_replicas: int) -> None:
        leader = self._leader(topic, partition)
        with leader.lock:
            isr = tuple(leader.core.isr)
        if len(isr) < min_insync_replicas:
            raise NotEnoughReplicasError(
                f"{topic}-{partition} has {len(isr)} in-sync replicas {list(isr)}; acks=all needs "
                f"min.insync.replicas={min_insync_replicas}")

    def on_leader_append(self, topic: str, partition: int, partition_log) -> None:
        leader = self._leaders.get((topic, partition))
        if leader is None:
            return
        with leader.lock:
            new_hw = leader.core.on_leader_append(partition_log.log_end_offset)
        self._apply_high_watermark((topic, partition), leader, partition_log, new_hw)

    def wait_for_high_watermark(self, topic: str, partition: int, offset_exclusive: int, timeout_ms: int,
                                min_insync_replicas: int) -> tuple[int, str]:
        """acks=all: wait until the HW reaches `offset_exclusive`; (code, message)."""
        leader = self._leaders.get((topic, partition))
        if leader is None:
            return (ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    f"broker {self.broker_id} stopped leading {topic}-{partition} before the write was replicated")
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        tenure = leader.tenure
        with self._counts_lock:
            self.produce_waiters += 1
        try:
            while True:
                with leader.lock:
                    while leader.core.high_watermark < offset_exclusive:
                        remaining = deadline - time.monotonic()
                        if (remaining <= 0 or self._stopping.is_set()
                                or self._leaders.get((topic, partition)) is not leader):
                            break
                        leader.hw_changed.wait(remaining)
                    reached = leader.core.high_watermark >= offset_exclusive
                    isr_size = len(leader.core.isr)
                current = self._leaders.get((topic, partition))
                if current is leader:
                    break
                if current is None or current.tenure is not tenure:
                    return (ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            f"leadership of {topic}-{partition} moved while the write waited for replication")
                leader = current     # still the leader, at a new epoch: wait on under it
                if reached:
                    break
        finally:
            with self._counts_lock:
                self.produce_waiters -= 1
        if not reached:
            return (ErrorCode.REQUEST_TIMED_OUT,
                    f"{topic}-{partition}: the in-sync replicas did not all copy the write within {timeout_ms} ms")
        if isr_size < min_insync_replicas:
            return (ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                    f"{topic}-{partition}: the ISR shrank to {isr_size} while the write waited "
                    f"(min.insync.replicas={min_insync_replicas})")
        return (ErrorCode.NONE, "")

    def on_replica_fetch(self, replica_id: int, topic: str, partition: int, fetch_offset: int,
                         current_leader_epoch: int | None, partition_log, log_start_offset: int | None = None) -> None:
        """A follower fetched at `fetch_offset` (its log end), its log start offset being
        `log_start_offset` (None: not said): move the HW, maybe expand the ISR, and wake
        DeleteRecords waiting for the low watermark."""
        leader = self._leader(topic, partition)
        _check_epoch(leader.assignment, current_leader_epoch)
        if replica_id not in leader.assignment.replicas:
            raise NotLeaderOrFollowerError(f"broker {replica_id} is not a replica of {topic}-{partition}")
        now_ms = self._now_ms()
        with leader.lock:
            update = leader.core.on_follower_fetch(replica_id, fetch_offset, partition_log.log_end_offset, now_ms,
                                                   log_start_offset)
            if update.log_start_moved:
                leader.hw_changed.notify_all()      # a DeleteRecords may wait for it
        self._apply_high_watermark((topic, partition), leader, partition_log, update.high_watermark)
        if update.expand_isr is not None:
            self._write_isr((topic, partition), leader, update.expand_isr)

    def wait_for_low_watermark(self, topic: str, partition: int, offset: int, timeout_ms: int,
                               partition_log) -> tuple[int, int, str]:
        """DeleteRecords (Kafka's DelayedDeleteRecords): wait until the low watermark reaches
        `offset` -- every live replica moved its log start there. (code, low watermark,
        message). As an acks=all wait, it goes on under a new epoch of the same tenure."""
        leader = self._leaders.get((topic, partition))
        if leader is None:
            return (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1,
                    f"broker {self.broker_id} stopped leading {topic}-{partition} before its replicas followed")
        tenure = leader.tenure
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        while True:
            with leader.lock:
                while True:
                    low = leader.core.low_watermark(partition_log.log_start_offset, self._is_live_broker)
                    remaining = deadline - time.monotonic()
                    if (low >= offset or remaining <= 0 or self._stopping.is_set()
                            or self._leaders.get((topic, partition)) is not leader):
                        break
                    # a follower's fetch wakes this (its log start moved); the bound re-reads
                    # liveness, which changes without a fetch (a broker died)
                    leader.hw_changed.wait(min(remaining, LOW_WATERMARK_RECHECK_S))
            current = self._leaders.get((topic, partition))
            if current is leader or low >= offset:
                break
            if current is None or current.tenure is not tenure:
                return (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1,
                        f"leadership of {topic}-{partition} moved while its replicas deleted the records")
            leader = current      # still the leader, at a new epoch: wait on under it
        if low >= offset:
            return ErrorCode.NONE, low, ""
        return (ErrorCode.REQUEST_TIMED_OUT, low,
                f"{topic}-{partition}: the live replicas' log start reached {low}, not {offset}, "
                f"within {timeout_ms} ms")

    def charge_replica_fetch(self, replica_id: int, topic: str, partition: int, sent_beyond_bytes: int) -> None:
        """A throttled follower's fetch carried `sent_beyond_bytes` more than its allowance
        (its first whole batch): the throttle charges them (see ThrottleBucket)."""
        leader = self._leaders.get((topic, partition))
        if leader is not None and leader.throttle is not None and replica_id in leader.assignment.adding:
            leader.throttle.charge(sent_beyond_bytes)

    def replica_fetch_allowance(self, replica_id: int, topic: str, partition: int, max_bytes: int) -> int:
        """How many bytes a follower's fetch may carry: `max_bytes`, unless the follower is
        being added by a throttled reassignment (then what the throttle allows now, maybe 0)."""
        leader = self._leaders.get((topic, partition))
        if leader is None or leader.throttle is None or replica_id not in leader.assignment.adding:
            return max_bytes
        return leader.throttle.take(max_bytes, time.monotonic())

    def _leader(self, topic: str, partition: int) -> _Leader:
        leader = self._leaders.get((topic, partition))
        if leader is None:
            raise NotLeaderOrFollowerError(f"broker {self.broker_id} is not the leader of {topic}-{partition}")
        return leader

    def _apply_high_watermark(self, tp, leader: _Leader, partition_log, new_hw: int | None) -> None:
        if new_hw is None:
            return
        partition_log.update_high_watermark(new_hw)
        with leader.lock:
            leader.hw_changed.notify_all()
        self._notify(tp)

    # ---- ISR changes --------------------------------------------------------------------------

    def _write_isr(self, tp, leader: _Leader, proposed_isr) -> None:
        with leader.lock:
            if leader.isr_write_in_flight:
                return
            proposal = leader.core.propose_isr(tuple(proposed_isr))
            if proposal is None:
                return
            leader.isr_write_in_flight = True
            isr_before = set(leader.core.isr)
        a = leader.assignment
        try:
            new_version = self._isr_writer(tp[0], tp[1], self.broker_id, a.leader_epoch, tuple(proposal.isr),
                                           a.controller_epoch, proposal.expected_zk_version)
        except Exception as exc:
            log.warning("%s-%d: ISR change to %s not written: %s", tp[0], tp[1], list(proposal.isr), exc)
            with leader.lock:
                leader.core.isr_write_failed()
                leader.isr_write_in_flight = False
            return
        with leader.lock:
            leader.core.isr_write_succeeded(new_version)
            leader.isr_write_in_flight = False
            new_hw = leader.core.recompute_high_watermark()
        log.info("%s-%d: ISR now %s", tp[0], tp[1], list(proposal.isr))
        with self._counts_lock:      # the ISR thread and follower fetches both write ISRs
            if isr_before - set(proposal.isr):
                self.isr_shrinks += 1
            if set(proposal.isr) - isr_before:
                self.isr_expands += 1
        partition_log = self._log_manager.get_log(*tp)
        if partition_log is not None:
            self._apply_high_watermark(tp, leader, partition_log, new_hw)

    def _isr_maintenance_loop(self) -> None:
        interval_s = max(ISR_CHECK_INTERVAL_MIN_MS, self.replica_lag_time_max_ms // 2) / 1000.0
        while not self._stopping.wait(interval_s):
            try:
                self.shrink_isrs()
            except Exception:
                log.exception("ISR maintenance failed; retrying at the next tick")

    def shrink_isrs(self) -> None:
        now_ms = self._now_ms()
        with self._lock:
            leaders = list(self._leaders.items())
        for tp, leader in leaders:
            with leader.lock:
                shrunk = leader.core.shrink_candidates(now_ms, self.replica_lag_time_max_ms)
            if shrunk is not None:
                self._write_isr(tp, leader, shrunk)

    # ---- views --------------------------------------------------------------------------------

    def leader_epoch_of(self, tp) -> int | None:
        """The leader epoch if this broker leads `tp` now, else None."""
        leader = self._leaders.get(tp)
        return None if leader is None else leader.assignment.leader_epoch

    def led_replication(self) -> list[tuple[tuple[str, int], tuple[int, ...], tuple[int, ...]]]:
        """(tp, replicas, isr) of every partition this broker leads, as its leader sees them."""
        with self._lock:
            leaders = list(self._leaders.items())
        return [(tp, leader.core.replicas, leader.core.isr) for tp, leader in leaders]

    def led_partitions(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._leaders)

    def followed_partitions(self) -> list[tuple[str, int]]:
        with self._lock:
            return sorted(self._followers)

    def follower_assignment(self, tp) -> PartitionAssignment | None:
        follower = self._followers.get(tp)
        return None if follower is None else follower.assignment

    def known_leader(self, topic: str, partition: int) -> tuple[int, int] | None:
        """(leader id, leader epoch) of a partition this broker has a replica of, as the
        controller's LeaderAndIsr last told it (this broker, or the leader it follows)."""
        leader = self._leaders.get((topic, partition))
        if leader is not None:
            return self.broker_id, leader.assignment.leader_epoch
        follower = self._followers.get((topic, partition))
        if follower is not None:
            return follower.assignment.leader, follower.assignment.leader_epoch
        return None


class ThrottleBucket:
    """A token bucket of bytes: `rate_bytes_per_s` refill, at most one second's worth saved.
    What was sent beyond the grant (a fetch always carries its first whole batch) is charged
    as a debt that later grants wait out, so the rate holds on average, as Kafka's
    replication quota records the bytes actually sent."""

    def __init__(self, rate_bytes_per_s: int):
        self.rate_bytes_per_s = rate_bytes_per_s
        self._tokens = float(rate_bytes_per_s)
        self._last_s: float | None = None
        self._lock = threading.Lock()

    def take(self, wanted_bytes: int, now_s: float) -> int:
        with self._lock:
            if self._last_s is not None:
                self._tokens = min(float(self.rate_bytes_per_s),
                                   self._tokens + (now_s - self._last_s) * self.rate_bytes_per_s)
            self._last_s = now_s
            granted = int(min(wanted_bytes, max(0.0, self._tokens)))
            self._tokens -= granted
            return granted

    def charge(self, sent_beyond_grant_bytes: int) -> None:
        """Bytes sent beyond what `take` granted: owed before the next grant."""
        if sent_beyond_grant_bytes > 0:
            with self._lock:
                self._tokens -= sent_beyond_grant_bytes


def _check_epoch(assignment: PartitionAssignment, current_leader_epoch: int | None) -> None:
    if current_leader_epoch is None or current_leader_epoch < 0:
        return
    if current_leader_epoch < assignment.leader_epoch:
        raise FencedLeaderEpochError(
            f"{assignment.topic}-{assignment.partition}: leader epoch {current_leader_epoch} is older than "
            f"{assignment.leader_epoch}")
    if current_leader_epoch > assignment.leader_epoch:
        raise UnknownLeaderEpochError(
            f"{assignment.topic}-{assignment.partition}: leader epoch {current_leader_epoch} is newer than "
            f"{assignment.leader_epoch} known here")
