"""The group coordinator's I/O shell: the pure cores, their lock, parked requests, the timer
thread and the `__consumer_offsets` topic.

Theory of operation
-------------------
Two pure cores decide everything (`broker.group.state.GroupCoordinatorCore` for membership,
`broker.group.offsets.OffsetStore` for committed offsets); this shell carries out what they
ask for and owns nothing else:

- one lock (`_lock`) around both cores, the parked-request futures and every append to
  `__consumer_offsets`. Appending and reporting the append back to its core happen under
  the same hold of the lock, which is what OffsetStore requires: a transaction marker that
  the broker appends concurrently (outside this lock) is reported through
  `on_txn_marker`, which waits for the lock, so it always finds the TxnOffsetCommit records
  that precede it in the log already acknowledged.
- parked requests: JoinGroup and SyncGroup complete later (when every member has joined,
  when the leader's assignment is written). The calling gRPC thread registers a Future for
  the core's token before the lock is released and waits on it, bounded by the group's
  rebalance timeout plus a margin; when that runs out it answers REQUEST_TIMED_OUT
  (retriable: the client rejoins with its member id, which supersedes the parked request).
  At most `max_parked_requests` threads wait at once, because each holds a worker of the
  broker's thread-per-request gRPC server; past that a JoinGroup/SyncGroup is answered
  COORDINATOR_NOT_AVAILABLE, which clients retry after a backoff.
- the timer thread calls `core.tick(now)` at the core's next deadline, and at least every
  `tick_interval_ms`, so a clock that jumps (the fake clock of a test) is noticed promptly;
  `stop()` wakes it at once.
- writes: every `GroupWrite` and `OffsetWrite` is appended with origin COORDINATOR. Plain
  offset commits and group records are non-transactional batches; a TxnOffsetCommit is ONE
  transactional batch with the producer's id and epoch and base sequence -1, so the log's
  epoch rule fences a zombie producer and the batch joins the producer's transaction (its
  offsets become visible when the broker appends the COMMIT marker and calls
  `on_txn_marker`; ABORT drops them). With a `verify_txn` hook (KIP-890 part 1) a
  TxnOffsetCommit is first checked with the transaction coordinator: the group's
  `__consumer_offsets` partition must be in the producer's open transaction
  (AddOffsetsToTxn), so a late or stray commit cannot open a hanging transaction there.

`start()` makes sure `__consumer_offsets` exists (created through the TopicRegistry, logs
first, as the broker creates topics), then loads every partition in log order: offset
commit records, group metadata records and transaction markers are replayed into the cores.
Until `start()` has finished, requests are answered COORDINATOR_LOAD_IN_PROGRESS; after
`stop()`, NOT_COORDINATOR (and every parked request is answered NOT_COORDINATOR at once, so
no gRPC thread stays blocked during shutdown).

The topic is compacted (cleanup.policy=compact, 100 MiB segments, as Kafka's): the log
cleaner keeps the last record of each key, so a load replays about one record per group
and partition rather than every commit ever made. The replay is the same either way (the
last record per key wins in log order).

Single node: this broker coordinates every group and every transactional id, so
FindCoordinator answers the advertised address given to the constructor.

On a cluster (`replicated_append` given; Kafka's GroupMetadataManager) the coordinator is
partitioned: the group of a `__consumer_offsets` partition is served by that partition's
leader. `start()` only starts the timer; the broker calls `load_partition(p, epoch)` once it
leads p and the followers have confirmed its log (replay, then serve), and
`unload_partition(p)` when it stops leading (parked requests answered NOT_COORDINATOR, the
groups forgotten). A request for a group of a partition this broker does not own (yet) is
answered NOT_COORDINATOR and the client finds the coordinator again, with backoff; one that
arrives during the replay waits for the lock the replay holds. Every append goes through the replica manager as the partition's
leader, and the caller's answer waits, after the lock is released, until the in-sync
replicas have it (acks=all): a TxnOffsetCommit acknowledged but lost with its leader would
let the transaction commit without its offsets.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import logging
import threading
import time
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

from broker.group.offsets import NO_PRODUCER_ID, FetchedOffset, OffsetStore, OffsetWrite, OFFSET_METADATA_MAX_BYTES
from broker.group.records import (OFFSETS_TOPIC, OFFSETS_TOPIC_PARTITIONS, GroupMetadataKey, OffsetAndMetadata,
                                  OffsetCommitKey, RecordKey, decode_record, partition_for_group)
from broker.group.state import (GROUP_INITIAL_REBALANCE_DELAY_MS, GROUP_MAX_SESSION_TIMEOUT_MS, GROUP_MAX_SIZE,
                                GROUP_MIN_SESSION_TIMEOUT_MS, GroupCoordinatorCore, GroupDescription, GroupListing,
                                GroupState, GroupWrite, JoinResponse, Outcome, Reply, SyncResponse)
from broker.storage.log import AppendOrigin, Log
from eos.errors import CorruptRecordError, EosError, ErrorCode, InvariantError
from eos.records.codec import CONTROL_TYPE_COMMIT, decode_control_record, decode_records, encode_batch
from eos.records.header import NO_SEQUENCE, iter_headers
from eos.types import TopicPartition

log = logging.getLogger("eos.group_coordinator")

__all__ = ["GroupCoordinator", "CoordinatorType", "CoordinatorAddress", "PartitionResult", "OffsetFetchResult", "VerifyTxn",
           "OFFSETS_TOPIC_CONFIG", "REQUEST_WAIT_MARGIN_MS", "MAX_PARKED_REQUESTS", "TICK_INTERVAL_MS"]

MIB = 1024 * 1024
OFFSETS_TOPIC_SEGMENT_BYTES = 100 * MIB   # Kafka's offsets.topic.segment.bytes default
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "-1", "segment.bytes": str(OFFSETS_TOPIC_SEGMENT_BYTES)}


def offsets_topic_config(segment_bytes: int = OFFSETS_TOPIC_SEGMENT_BYTES) -> dict[str, str]:
    """The configs `__consumer_offsets` is created with (offsets.topic.segment.bytes given)."""
    return {**OFFSETS_TOPIC_CONFIG, "segment.bytes": str(segment_bytes)}
TICK_INTERVAL_MS = 100              # the timer thread looks at the clock at least this often
REQUEST_WAIT_MARGIN_MS = 5_000      # a parked request waits its rebalance timeout plus this
MAX_PARKED_REQUESTS = 32            # gRPC threads parked in JoinGroup/SyncGroup at once
LOAD_READ_BYTES = 4 * MIB           # one read of a partition while loading
STOP_JOIN_TIMEOUT_S = 10.0

# Kafka's GroupMetadataManager.storeOffsets: an append error as an OffsetCommit answer.
_APPEND_ERROR_TO_COMMIT_ERROR = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND: ErrorCode.COORDINATOR_NOT_AVAILABLE,
    ErrorCode.NOT_LEADER_OR_FOLLOWER: ErrorCode.NOT_COORDINATOR,
    ErrorCode.KAFKA_STORAGE_ERROR: ErrorCode.NOT_COORDINATOR,
    ErrorCode.MESSAGE_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.RECORD_LIST_TOO_LARGE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
    ErrorCode.INVALID_FETCH_SIZE: ErrorCode.INVALID_COMMIT_OFFSET_SIZE,
}


# replicated_append(partition, batch, now_ms) -> (first offset, wait): on a cluster, append one
# batch to __consumer_offsets-`partition` as its leader; wait() blocks until the in-sync
# replicas have it and returns (error code, message).
ReplicatedAppend = Callable[[int, bytes, int], tuple[int, Callable[[], tuple[ErrorCode, str]]]]

# verify_txn(transactional_id, producer_id, producer_epoch, partitions) -> {partition: (code, message)}:
# the Broker service's KIP-890 hook, asked whether partitions are in the producer's transaction.
VerifyTxn = Callable[[str, int, int, list[TopicPartition]], Mapping[TopicPartition, tuple[int, str]]]


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class CoordinatorType(enum.IntEnum):
    """FindCoordinator key types (the proto's CoordinatorType)."""

    GROUP = 0
    TRANSACTION = 1


class CoordinatorAddress(NamedTuple):
    key: str
    node_id: int
    host: str
    port: int
    error: ErrorCode = ErrorCode.NONE
    message: str = ""


class PartitionResult(NamedTuple):
    """The answer for one partition of an OffsetCommit or TxnOffsetCommit."""

    topic: str
    partition: int
    error: ErrorCode = ErrorCode.NONE
    message: str = ""


class OffsetFetchResult(NamedTuple):
    error: ErrorCode                  # a group-level error (then `partitions` is empty)
    message: str
    partitions: list[FetchedOffset]


class _Phase(enum.Enum):
    NEW = "new"               # constructed; start() not called
    LOADING = "loading"
    RUNNING = "running"
    STOPPED = "stopped"


_PHASE_ERRORS = {
    _Phase.NEW: (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "the group coordinator is starting"),
    _Phase.LOADING: (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "the group coordinator is loading __consumer_offsets"),
    _Phase.STOPPED: (ErrorCode.NOT_COORDINATOR, "the group coordinator has stopped"),
}


class GroupCoordinator:
    """Consumer groups and committed offsets of one broker, over its LogManager.

    Thread-safe: every public method may be called from any gRPC thread.
    """

    def __init__(self, log_manager, topic_registry, *, now_ms_fn: Callable[[], int] = _wall_clock_ms,
                 node_id: int = 0, host: str = "127.0.0.1", port: int = 9092,
                 initial_rebalance_delay_ms: int = GROUP_INITIAL_REBALANCE_DELAY_MS,
                 min_session_timeout_ms: int = GROUP_MIN_SESSION_TIMEOUT_MS,
                 max_session_timeout_ms: int = GROUP_MAX_SESSION_TIMEOUT_MS,
                 max_group_size: int = GROUP_MAX_SIZE,
                 offsets_partitions: int = OFFSETS_TOPIC_PARTITIONS,
                 offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES,
                 offsets_topic_segment_bytes: int = OFFSETS_TOPIC_SEGMENT_BYTES,
                 tick_interval_ms: int = TICK_INTERVAL_MS,
                 request_wait_margin_ms: int = REQUEST_WAIT_MARGIN_MS,
                 max_parked_requests: int = MAX_PARKED_REQUESTS,
                 run_timer_thread: bool = True,
                 verify_txn: VerifyTxn | None = None,
                 replicated_append: ReplicatedAppend | None = None):
        if offsets_partitions < 1:
            raise ValueError(f"offsets.topic.num.partitions {offsets_partitions} must be at least 1")
        if tick_interval_ms < 1 or request_wait_margin_ms < 0 or max_parked_requests < 1:
            raise ValueError(f"tick_interval_ms {tick_interval_ms} must be >= 1, request_wait_margin_ms "
                             f"{request_wait_margin_ms} >= 0 and max_parked_requests {max_parked_requests} >= 1")
        # Checked here (the cores are built in start(), once the topic's partition count is known).
        GroupCoordinatorCore(initial_rebalance_delay_ms=initial_rebalance_delay_ms,
                             min_session_timeout_ms=min_session_timeout_ms,
                             max_session_timeout_ms=max_session_timeout_ms, max_group_size=max_group_size)
        self._log_manager = log_manager
        self._registry = topic_registry
        self._now_ms = now_ms_fn
        self.node_id = node_id
        self.host = host
        self.port = port
        self._core_settings = dict(initial_rebalance_delay_ms=initial_rebalance_delay_ms,
                                   min_session_timeout_ms=min_session_timeout_ms,
                                   max_session_timeout_ms=max_session_timeout_ms, max_group_size=max_group_size)
        self._wanted_partitions = offsets_partitions
        self._offset_metadata_max_bytes = offset_metadata_max_bytes
        self._offsets_topic_segment_bytes = offsets_topic_segment_bytes
        self.loaded_records = 0    # records the last load replayed (a restart's cost)
        self._tick_interval_ms = tick_interval_ms
        self._request_wait_margin_ms = request_wait_margin_ms
        self._max_parked_requests = max_parked_requests
        self._run_timer_thread = run_timer_thread
        self._verify_txn = verify_txn
        self._replicated_append = replicated_append
        self.partitioned = replicated_append is not None

        self._lock = threading.Lock()
        self._phase = _Phase.NEW
        self.offsets_partitions = offsets_partitions
        self.groups: GroupCoordinatorCore | None = None
        self.offsets: OffsetStore | None = None
        self._futures: dict[int, concurrent.futures.Future] = {}   # core token -> the parked caller
        self._logs: list[Log] = []                                  # __consumer_offsets-<i> at index i
        self._owned: dict[int, int] = {}        # partitioned: partition -> coordinator epoch (its leader epoch)
        self._replication_waits: list[Callable[[], tuple[ErrorCode, str]]] = []   # appended under this hold
        self._stopping = threading.Event()
        self._timer_thread: threading.Thread | None = None

    # ---- life --------------------------------------------------------------------------------

    def start(self) -> None:
        """Create `__consumer_offsets` if missing, load it, start the timer thread. Call it
        before the broker's services open to calls (the topic is created without the broker's
        admin lock, which is safe only while nothing else can create topics). Partitioned
        (a cluster): only the timer starts; partitions load with their leadership."""
        with self._lock:
            if self._phase is not _Phase.NEW:
                raise EosError(f"GroupCoordinator.start() called in phase {self._phase.value}")
            if self.partitioned:
                # partitions load as this broker becomes their leader (load_partition)
                self.groups = GroupCoordinatorCore(offsets_partitions=self.offsets_partitions, **self._core_settings)
                self.offsets = OffsetStore(offsets_partitions=self.offsets_partitions,
                                           metadata_max_bytes=self._offset_metadata_max_bytes)
                self._phase = _Phase.RUNNING
            else:
                self._load_everything()
        if self._run_timer_thread:
            self._timer_thread = threading.Thread(target=self._timer_loop, name="eos-group-timer", daemon=True)
            self._timer_thread.start()

    def _load_everything(self) -> None:
        """Single node: this broker owns every partition of the offsets topic (lock held)."""
        self._phase = _Phase.LOADING
        started_ms = time.monotonic()
        info = self._ensure_offsets_topic()
        self.offsets_partitions = info.partition_count
        self.groups = GroupCoordinatorCore(offsets_partitions=self.offsets_partitions, **self._core_settings)
        self.offsets = OffsetStore(offsets_partitions=self.offsets_partitions,
                                   metadata_max_bytes=self._offset_metadata_max_bytes)
        self._logs = [self._log_manager.get_log(OFFSETS_TOPIC, p) for p in range(self.offsets_partitions)]
        records = sum(self._load_partition(p, partition_log) for p, partition_log in enumerate(self._logs))
        self.loaded_records = records
        self._phase = _Phase.RUNNING
        log.info("group coordinator loaded %d record(s) of %s (%d partitions) in %.0f ms: %d group(s), "
                 "%d with offsets", records, OFFSETS_TOPIC, self.offsets_partitions,
                 (time.monotonic() - started_ms) * 1000, len(self.groups.groups), len(self.offsets.groups()))

    # ---- partitions of a cluster -------------------------------------------------------------

    def load_partition(self, partition: int, coordinator_epoch: int, partition_log: Log) -> None:
        """This broker leads `__consumer_offsets`-`partition` and its log is confirmed by the
        followers: replay it and serve its groups. Already owned (the same broker elected
        again): the memory is at least as new as the log, so only the epoch changes."""
        with self._lock:
            if self._phase is not _Phase.RUNNING:
                return
            if partition in self._owned:
                self._owned[partition] = coordinator_epoch
                return
            started_ms = time.monotonic()
            try:
                records = self._load_partition(partition, partition_log)
            except BaseException:
                # a half-replayed partition must not stay: forget it, the caller retries
                self._forget_partition(partition)
                raise
            self._owned[partition] = coordinator_epoch
        log.info("group coordinator took %s-%d at epoch %d: %d record(s) in %.0f ms", OFFSETS_TOPIC, partition,
                 coordinator_epoch, records, (time.monotonic() - started_ms) * 1000)

    def unload_partition(self, partition: int) -> None:
        """This broker no longer leads `__consumer_offsets`-`partition`: answer its parked
        requests NOT_COORDINATOR and forget its groups and offsets."""
        with self._lock:
            if self._phase is not _Phase.RUNNING or partition not in self._owned:
                return
            del self._owned[partition]
            self._forget_partition(partition)
        log.info("group coordinator gave up %s-%d", OFFSETS_TOPIC, partition)

    def _forget_partition(self, partition: int) -> None:
        outcome = self.groups.unload_partition(partition, self._now_ms())
        if outcome.writes:
            raise InvariantError("unloading a partition asked for writes")
        self._resolve(outcome)
        self.offsets.unload_partition(partition)

    def owned_partitions(self) -> dict[int, int]:
        with self._lock:
            return dict(self._owned)

    def stop(self) -> None:
        """Answer every parked request NOT_COORDINATOR, stop the timer thread, refuse what
        follows. Idempotent. Leaves the logs open (the LogManager's owner closes them)."""
        self._stopping.set()
        if self._timer_thread is not None:
            self._timer_thread.join(STOP_JOIN_TIMEOUT_S)
            if self._timer_thread.is_alive():
                log.warning("the group timer thread is still running at stop")
        with self._lock:
            if self._phase is _Phase.STOPPED:
                return
            running = self._phase is _Phase.RUNNING
            self._phase = _Phase.STOPPED
            if running:
                now_ms = self._now_ms()
                for partition in range(self.offsets_partitions):
                    outcome = self.groups.unload_partition(partition, now_ms)
                    if outcome.writes:
                        raise InvariantError("unloading a partition asked for writes")
                    self._resolve(outcome)
            for token, future in list(self._futures.items()):
                # Unreachable while the core keeps its promise (every token answered once);
                # a thread must never stay blocked at shutdown, so answer it anyway.
                log.error("parked request %d was still open after unloading every group", token)
                future.set_result(None)
            self._futures.clear()

    @property
    def running(self) -> bool:
        return self._phase is _Phase.RUNNING

    def parked_request_count(self) -> int:
        """Requests waiting for the core right now (for tests and metrics). Read without the
        lock, which a load holds for its whole replay: one len() of a dict is atomic."""
        return len(self._futures)

    def metrics_snapshot(self, wait_s: float) -> tuple[list[GroupListing], dict[str, list[FetchedOffset]], int] | None:
        """(every group, each group's committed offsets, rebalances completed) for the broker's
        metrics, or None when the lock is not free within `wait_s` (a partition loading: a
        scrape must not wait out a replay) or the coordinator is not running."""
        if not self._lock.acquire(timeout=wait_s):
            return None
        try:
            if self._phase is not _Phase.RUNNING or self.groups is None:
                return None
            listed = self._listings()
            committed = {group_id: self.offsets.fetch(group_id, [], False) for group_id in listed}
            return [listed[g] for g in sorted(listed)], committed, self.groups.rebalances_completed
        finally:
            self._lock.release()

    # ---- the offsets topic -------------------------------------------------------------------

    def _ensure_offsets_topic(self):
        info = self._registry.get(OFFSETS_TOPIC)
        if info is None:
            info = self._registry.prepare_create(OFFSETS_TOPIC, self._wanted_partitions, 1,
                                                 offsets_topic_config(self._offsets_topic_segment_bytes))
            # Logs first, registry second, as the broker does: a crash in between leaves logs
            # that the broker's start-up sweep removes, and the next start creates the topic.
            for partition in range(info.partition_count):
                self._log_manager.create_log(OFFSETS_TOPIC, partition, info.config)
            self._registry.commit(info)
            log.info("created %s with %d partitions", OFFSETS_TOPIC, info.partition_count)
        elif info.partition_count != self._wanted_partitions:
            # The hash that places a group depends on the count the data was written with.
            log.warning("%s has %d partitions, not the configured %d; using %d", OFFSETS_TOPIC,
                        info.partition_count, self._wanted_partitions, info.partition_count)
        for partition in range(info.partition_count):
            if self._log_manager.get_log(OFFSETS_TOPIC, partition) is None:
                self._log_manager.create_log(OFFSETS_TOPIC, partition, info.config)
        return info

    def _load_partition(self, partition: int, partition_log: Log) -> int:
        """Replay `__consumer_offsets`-`partition` from its start to its current end."""
        now_ms = self._now_ms()
        start = offset = partition_log.log_start_offset
        end = partition_log.log_end_offset
        loaded = 0
        # Keys recur (one per group, one per group and partition), so each is decoded once;
        # the map holds one entry per distinct key of the partition's log, and lives as long
        # as this load.
        decoded_keys: dict[bytes, RecordKey] = {}
        while offset < end:
            data = partition_log.read(offset, LOAD_READ_BYTES, max_offset_exclusive=end)
            if not data.records:
                break   # the cleaner removed everything from here to the end (a tombstone, a marker)
            buf = data.records
            next_offset = offset
            for header in iter_headers(buf):
                next_offset = header.next_offset
                if header.is_control:
                    marker_type, _coordinator_epoch = decode_control_record(buf, header)
                    self.offsets.replay_marker(header.producer_id, marker_type == CONTROL_TYPE_COMMIT, partition)
                    continue
                producer_id = header.producer_id if header.is_transactional else NO_PRODUCER_ID
                for record in decode_records(buf, header, OFFSETS_TOPIC, partition):
                    if record.offset < start:
                        continue       # below the log start (a batch cut by DeleteRecords)
                    loaded += 1
                    self._replay_record(partition, record.offset, record.key, record.value, producer_id, now_ms,
                                        decoded_keys)
            if next_offset <= offset:
                raise InvariantError(f"{OFFSETS_TOPIC}-{partition}: loading made no progress at offset {offset}")
            offset = next_offset
        return loaded

    def _replay_record(self, partition: int, record_offset: int, key: bytes | None, value: bytes | None,
                       producer_id: int, now_ms: int, decoded_keys: dict[bytes, RecordKey]) -> None:
        try:
            decoded_key, decoded_value = decode_record(key, value, decoded_keys)
        except CorruptRecordError as e:
            # The batch passed its CRC, so this is a record we cannot read, not a torn write:
            # skip it rather than refuse to start every group of the broker.
            log.error("skipping unreadable record at %s-%d offset %d: %s", OFFSETS_TOPIC, partition,
                      record_offset, e)
            return
        if isinstance(decoded_key, OffsetCommitKey):
            self.offsets.replay(decoded_key, decoded_value, record_offset, producer_id)
        elif isinstance(decoded_key, GroupMetadataKey):
            self.groups.replay(decoded_key.group_id, decoded_value, now_ms)

    # ---- carrying out outcomes (lock held) ----------------------------------------------------

    def _refusal(self, group_id: str | None = None) -> tuple[ErrorCode, str] | None:
        """Why this coordinator cannot serve `group_id` now (None: it can)."""
        refusal = _PHASE_ERRORS.get(self._phase)
        if refusal is not None or not self.partitioned or group_id is None:
            return refusal
        partition = partition_for_group(group_id, self.offsets_partitions)
        if partition in self._owned:
            return None
        return (ErrorCode.NOT_COORDINATOR,
                f"this broker does not coordinate group {group_id!r} ({OFFSETS_TOPIC}-{partition})")

    def _take_replication_waits(self) -> list[Callable[[], tuple[ErrorCode, str]]]:
        """The waits of the appends made under this hold of the lock (lock held)."""
        waits, self._replication_waits = self._replication_waits, []
        return waits

    @staticmethod
    def _replicated(waits) -> tuple[ErrorCode, str]:
        """Wait (lock NOT held) for the in-sync replicas to have every append; the first error."""
        for wait in waits:
            error, message = wait()
            if error != ErrorCode.NONE:
                error = ErrorCode(error)
                return _APPEND_ERROR_TO_COMMIT_ERROR.get(error, error), message
        return ErrorCode.NONE, ""

    def _answer_when_replicated(self, waits, response):
        """`response`, or the same with the replication error once the appends behind it
        failed to reach the in-sync replicas (the client retries or finds the coordinator)."""
        error, message = self._replicated(waits)
        if error == ErrorCode.NONE or response is None or response.error != ErrorCode.NONE:
            return response
        return dataclasses.replace(response, error=error, message=message)

    def _register(self, outcome: Outcome) -> concurrent.futures.Future | None:
        if outcome.token is None:
            return None
        if outcome.token in self._futures:
            raise InvariantError(f"request token {outcome.token} parked twice")
        future = self._futures[outcome.token] = concurrent.futures.Future()
        return future

    def _resolve(self, outcome: Outcome) -> None:
        for done in outcome.completed:
            future = self._futures.pop(done.token, None)
            if future is None:
                raise InvariantError(f"the core completed request token {done.token}, which nobody parked")
            future.set_result(done.response)

    def _carry_out(self, outcome: Outcome) -> None:
        """Answer what the outcome completed and append what it asks to write, then the same
        for the outcomes those appends produce (each write is reported back before the next)."""
        pending = [outcome]
        while pending:
            current = pending.pop(0)
            self._resolve(current)
            for write in current.writes:
                error = self._append_group_write(write)
                pending.append(self.groups.write_completed(write.write_id, self._now_ms(), error))

    def _append(self, partition: int, keys: Sequence[bytes], values: Sequence[bytes | None], now_ms: int, *,
                producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1) -> int:
        """Append one batch to `__consumer_offsets`-`partition`; return its first offset."""
        transactional = producer_id != NO_PRODUCER_ID
        batch = encode_batch(list(values), keys=list(keys), timestamps_ms=now_ms, producer_id=producer_id,
                             producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE, transactional=transactional)
        if self._replicated_append is not None:
            first_offset, wait = self._replicated_append(partition, batch, now_ms)
            self._replication_waits.append(wait)
            return first_offset
        return self._logs[partition].append_as_leader(batch, now_ms, origin=AppendOrigin.COORDINATOR).first_offset

    def _append_group_write(self, write: GroupWrite) -> ErrorCode:
        key, value = write.record()
        try:
            self._append(write.partition, [key], [value], self._now_ms())
        except Exception as exc:
            error = _error_code_of(exc)
            log.warning("writing group %r to %s-%d failed: %s", write.group_id, OFFSETS_TOPIC, write.partition, exc)
            return error
        return ErrorCode.NONE

    def _append_offset_write(self, write: OffsetWrite, now_ms: int) -> tuple[ErrorCode, str]:
        keys, values = write.records()
        try:
            base_offset = self._append(write.partition, keys, values, now_ms,
                                       producer_id=write.producer_id, producer_epoch=write.producer_epoch)
        except Exception as exc:
            self.offsets.write_failed(write)
            error = _error_code_of(exc)
            log.info("offset commit of group %r to %s-%d failed: %s", write.group_id, OFFSETS_TOPIC,
                     write.partition, exc)
            return _APPEND_ERROR_TO_COMMIT_ERROR.get(error, error), str(exc)
        self.offsets.write_completed(write, base_offset)
        return ErrorCode.NONE, ""

    def _wait(self, future: concurrent.futures.Future | None, immediate, bound_ms: int, timed_out):
        if future is None:
            return immediate
        try:
            response = future.result(timeout=bound_ms / 1000)
        except concurrent.futures.TimeoutError:
            return timed_out
        return response if response is not None else timed_out

    def _wait_bound_ms(self, group_id: str, rebalance_timeout_ms: int = 0) -> int:
        group = self.groups.groups.get(group_id)
        longest_ms = max(rebalance_timeout_ms, group.rebalance_timeout_ms if group is not None else 0)
        return longest_ms + self._request_wait_margin_ms

    # ---- membership --------------------------------------------------------------------------

    def join(self, group_id: str, member_id: str, group_instance_id: str | None, protocol_type: str,
             protocols: Iterable[tuple[str, bytes]], session_timeout_ms: int, rebalance_timeout_ms: int, *,
             client_id: str = "", client_host: str = "") -> JoinResponse:
        """JoinGroup; blocks until the join phase completes (or the wait bound passes)."""
        with self._lock:
            refusal = self._refusal(group_id) or self._parking_refusal()
            if refusal is not None:
                return JoinResponse(error=refusal[0], message=refusal[1], member_id=member_id)
            outcome = self.groups.join(group_id, member_id, group_instance_id, protocol_type, protocols,
                                       session_timeout_ms, rebalance_timeout_ms, self._now_ms(),
                                       client_id=client_id, client_host=client_host)
            future = self._register(outcome)
            self._carry_out(outcome)
            bound_ms = self._wait_bound_ms(group_id, rebalance_timeout_ms)
            waits = self._take_replication_waits()
        immediate = self._answer_when_replicated(waits, outcome.response)
        return self._wait(future, immediate, bound_ms, JoinResponse(
            error=ErrorCode.REQUEST_TIMED_OUT, member_id=member_id,
            message=f"the join phase did not complete within {bound_ms} ms; rejoin"))

    def sync(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
             assignments: Mapping[str, bytes]) -> SyncResponse:
        """SyncGroup; a follower blocks until the leader's assignment is written."""
        with self._lock:
            refusal = self._refusal(group_id) or self._parking_refusal()
            if refusal is not None:
                return SyncResponse(error=refusal[0], message=refusal[1])
            outcome = self.groups.sync(group_id, generation_id, member_id, group_instance_id, assignments,
                                       self._now_ms())
            future = self._register(outcome)
            self._carry_out(outcome)
            bound_ms = self._wait_bound_ms(group_id)
            waits = self._take_replication_waits()
        immediate = self._answer_when_replicated(waits, outcome.response)
        return self._wait(future, immediate, bound_ms, SyncResponse(
            error=ErrorCode.REQUEST_TIMED_OUT,
            message=f"the group's assignment did not arrive within {bound_ms} ms; rejoin"))

    def _parking_refusal(self) -> tuple[ErrorCode, str] | None:
        if len(self._futures) >= self._max_parked_requests:
            return (ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"{len(self._futures)} JoinGroup/SyncGroup requests are waiting already (the limit); retry")
        return None

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> Reply:
        return self._reply_call(group_id, lambda now_ms: self.groups.heartbeat(group_id, generation_id, member_id,
                                                                               group_instance_id, now_ms))

    def leave(self, group_id: str, member_id: str, group_instance_id: str | None) -> Reply:
        return self._reply_call(group_id,
                                lambda now_ms: self.groups.leave(group_id, member_id, group_instance_id, now_ms))

    def _reply_call(self, group_id: str, call: Callable[[int], Outcome]) -> Reply:
        with self._lock:
            refusal = self._refusal(group_id)
            if refusal is not None:
                return Reply(*refusal)
            outcome = call(self._now_ms())
            if outcome.token is not None:
                raise InvariantError("Heartbeat/LeaveGroup was parked")
            self._carry_out(outcome)
            waits = self._take_replication_waits()
        return self._answer_when_replicated(waits, outcome.response)

    # ---- timers ------------------------------------------------------------------------------

    def tick(self) -> None:
        """Fire the core's timers due now (the timer thread calls this; tests may too)."""
        with self._lock:
            if self._phase is not _Phase.RUNNING:
                return
            self._carry_out(self.groups.tick(self._now_ms()))
            # nobody answers from a timer's writes: a write lost with its leader is replayed
            # away on the next coordinator, whose members rejoin
            self._take_replication_waits()

    def _timer_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self.tick()
                with self._lock:
                    deadline_ms = self.groups.next_deadline_ms() if self._phase is _Phase.RUNNING else None
                wait_ms = self._tick_interval_ms
                if deadline_ms is not None:
                    wait_ms = min(wait_ms, max(deadline_ms - self._now_ms(), 0))
            except Exception:   # one failed tick must not end every session timeout for good
                log.exception("group coordinator tick failed; retrying")
                wait_ms = self._tick_interval_ms
            self._stopping.wait(max(wait_ms, 1) / 1000)

    # ---- offsets -----------------------------------------------------------------------------

    def _unknown_partitions(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> dict[TopicPartition, str]:
        unknown = {}
        infos = {}       # one registry lookup per topic, not per partition
        for tp in offsets:
            info = infos[tp.topic] if tp.topic in infos else infos.setdefault(tp.topic, self._registry.get(tp.topic))
            if info is None:
                unknown[tp] = f"topic {tp.topic!r} does not exist"
            elif not 0 <= tp.partition < info.partition_count:
                unknown[tp] = f"topic {tp.topic!r} has no partition {tp.partition} ({info.partition_count} partitions)"
        return unknown

    def offset_commit(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                      offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> list[PartitionResult]:
        """OffsetCommit: validate membership, append, then make the offsets visible."""
        return self._commit(group_id, generation_id, member_id, group_instance_id, offsets, None)

    def txn_offset_commit(self, transactional_id: str, group_id: str, producer_id: int, producer_epoch: int,
                          generation_id: int, member_id: str, group_instance_id: str | None,
                          offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> list[PartitionResult]:
        """TxnOffsetCommit: fenced by the group's generation and member (KIP-447) and by the
        producer epoch (the log's epoch rule); visible when the COMMIT marker arrives."""
        if producer_id < 0 or producer_epoch < 0:
            message = (f"TxnOffsetCommit of {transactional_id!r} needs a producer id and epoch, got "
                       f"{producer_id} and {producer_epoch}")
            return [PartitionResult(tp.topic, tp.partition, ErrorCode.INVALID_REQUEST, message) for tp in offsets]
        if self._verify_txn is not None and group_id and self._phase is _Phase.RUNNING:
            # Outside the lock: the transaction coordinator has its own. If the transaction
            # ends between this check and the append, the marker's epoch bump fences the append.
            offsets_tp = TopicPartition(OFFSETS_TOPIC, partition_for_group(group_id, self.offsets_partitions))
            error, message = self._verify_txn(transactional_id, producer_id, producer_epoch,
                                              [offsets_tp]).get(offsets_tp, (ErrorCode.NONE, ""))
            if error != ErrorCode.NONE:
                message = (f"TxnOffsetCommit of {transactional_id!r} to {offsets_tp.topic}-{offsets_tp.partition} "
                           f"(group {group_id!r}) refused by the transaction coordinator: {message}")
                return [PartitionResult(tp.topic, tp.partition, ErrorCode(error), message) for tp in offsets]
        return self._commit(group_id, generation_id, member_id, group_instance_id, offsets,
                            (producer_id, producer_epoch))

    def _commit(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                offsets: Mapping[TopicPartition, OffsetAndMetadata],
                producer: tuple[int, int] | None) -> list[PartitionResult]:
        if not all(type(tp) is TopicPartition for tp in offsets):       # (the servicer's are already)
            offsets = {TopicPartition(tp.topic, tp.partition): value for tp, value in offsets.items()}

        def everyone(error: ErrorCode, message: str) -> list[PartitionResult]:
            return [PartitionResult(tp.topic, tp.partition, error, message) for tp in offsets]

        if not group_id:
            return everyone(ErrorCode.INVALID_GROUP_ID, "the group id is empty")
        with self._lock:
            refusal = self._refusal(group_id)
            if refusal is not None:
                return everyone(*refusal)
            reply = self.groups.validate_offset_commit(group_id, generation_id, member_id, group_instance_id,
                                                       transactional=producer is not None)
            if not reply.ok:
                return everyone(reply.error, reply.message)
            errors: dict[TopicPartition, tuple[ErrorCode, str]] = {
                tp: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, message)
                for tp, message in self._unknown_partitions(offsets).items()}
            wanted = {tp: value for tp, value in offsets.items() if tp not in errors}
            now_ms = self._now_ms()
            if wanted:
                if producer is None:
                    decision = self.offsets.commit(group_id, wanted, now_ms)
                else:
                    decision = self.offsets.txn_commit(group_id, producer[0], producer[1], wanted, now_ms)
                for tp, error in decision.partition_errors.items():
                    errors[tp] = (error, decision.messages.get(tp, ""))
                if decision.write is not None:
                    error, message = self._append_offset_write(decision.write, now_ms)
                    if error is not ErrorCode.NONE:
                        for tp, _ in decision.write.entries:
                            errors[tp] = (error, message)
            written = [tp for tp in wanted if tp not in errors]
            waits = self._take_replication_waits()
        error, message = self._replicated(waits)
        if error != ErrorCode.NONE:
            for tp in written:
                errors[tp] = (error, message)
        return [PartitionResult(tp.topic, tp.partition, *errors.get(tp, (ErrorCode.NONE, ""))) for tp in offsets]

    def on_txn_marker(self, partition: int, producer_id: int, committed: bool) -> None:
        """The broker appended a COMMIT (committed=True) or ABORT marker of `producer_id` to
        `__consumer_offsets`-`partition`: make its pending offsets there visible, or drop them.
        Before start() this does nothing (the load will replay the marker from the log)."""
        with self._lock:
            if self._phase is not _Phase.RUNNING or (self.partitioned and partition not in self._owned):
                return     # a partition loaded later replays the marker from its log
            settled = self.offsets.complete_txn(producer_id, committed, partition)
        if settled:
            log.debug("%s marker of producer %d settled the offsets of %s", "commit" if committed else "abort",
                      producer_id, settled)

    def offset_fetch(self, group_id: str, partitions: Iterable[TopicPartition] | None = None,
                     require_stable: bool = False) -> OffsetFetchResult:
        """OffsetFetch; `partitions` None or empty: every partition the group has committed
        (what `eos groups describe` uses, with ListOffsets, to compute lag)."""
        if not group_id:
            return OffsetFetchResult(ErrorCode.INVALID_GROUP_ID, "the group id is empty", [])
        with self._lock:
            refusal = self._refusal(group_id)
            if refusal is not None:
                return OffsetFetchResult(refusal[0], refusal[1], [])
            wanted = [TopicPartition(tp.topic, tp.partition) for tp in (partitions or ())]
            return OffsetFetchResult(ErrorCode.NONE, "", self.offsets.fetch(group_id, wanted, require_stable))

    # ---- reads -------------------------------------------------------------------------------

    def list_groups(self, states: Iterable[str] = ()) -> tuple[ErrorCode, list[GroupListing]]:
        """Every group, with groups that only have committed offsets shown as Empty (as Kafka
        does). Raises ValueError for an unknown state name."""
        wanted = {GroupState.from_name(s) for s in states}
        with self._lock:
            refusal = self._refusal()
            if refusal is not None:
                return refusal[0], []
            listed = self._listings()
        return ErrorCode.NONE, [listed[g] for g in sorted(listed)
                                if not wanted or GroupState.from_name(listed[g].state) in wanted]

    def _listings(self) -> dict[str, GroupListing]:
        """Every group by id, groups that only have committed offsets as Empty (lock held)."""
        listed = {g.group_id: g for g in self.groups.list()}
        for group_id in self.offsets.groups():
            listed.setdefault(group_id, GroupListing(group_id, "", GroupState.EMPTY.value))
        return listed

    def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        answers = []
        with self._lock:
            for group_id in group_ids:
                refusal = self._refusal(group_id)
                if refusal is not None:
                    answers.append(GroupDescription(group_id, refusal[0], GroupState.DEAD.value, "", "", -1, ()))
                    continue
                described = self.groups.describe(group_id)
                if described.error is ErrorCode.GROUP_ID_NOT_FOUND and group_id in self.offsets.groups():
                    described = GroupDescription(group_id, ErrorCode.NONE, GroupState.EMPTY.value, "", "", 0, ())
                answers.append(described)
        return answers

    def delete_groups(self, group_ids: Iterable[str]) -> list[tuple[str, ErrorCode, str]]:
        """DeleteGroups: [(group id, error, message)] in request order. A group is deleted
        only when Empty -- or when it exists only as committed offsets, which Kafka treats as
        an Empty group -- and its offsets go with it: the group's tombstone, then one of each
        committed offset, so a broker that replays the log finds neither. A group with
        members answers NON_EMPTY_GROUP, one that never existed GROUP_ID_NOT_FOUND."""
        return [(group_id, *self._delete_group(group_id)) for group_id in group_ids]

    def _delete_group(self, group_id: str) -> tuple[ErrorCode, str]:
        with self._lock:
            refusal = self._refusal(group_id)
            if refusal is not None:
                return refusal
            now_ms = self._now_ms()
            outcome = self.groups.delete_group(group_id, now_ms)
            reply = outcome.response
            only_offsets = reply.error is ErrorCode.GROUP_ID_NOT_FOUND and bool(self.offsets.committed(group_id))
            # The group's tombstone is appended here, not by _carry_out, whose failed group
            # writes change nothing for a deletion: a DeleteGroups whose tombstone did not
            # reach the log must say so (the group would come back with the next load).
            error, message = ErrorCode.NONE, ""
            self._resolve(outcome)
            for write in outcome.writes:
                write_error = self._append_group_write(write)
                if write_error is not ErrorCode.NONE and error is ErrorCode.NONE:
                    error = _APPEND_ERROR_TO_COMMIT_ERROR.get(write_error, write_error)
                    message = f"the tombstone of group {group_id!r} was not written ({write_error.name})"
                self._carry_out(self.groups.write_completed(write.write_id, self._now_ms(), write_error))
            if not reply.ok and not only_offsets:
                self._take_replication_waits()     # a timer's writes: nobody answers from them
                return reply.error, reply.message
            offsets_write = self.offsets.delete_group(group_id)
            if offsets_write is not None and error is ErrorCode.NONE:
                error, message = self._append_offset_write(offsets_write, now_ms)
            elif offsets_write is not None:
                self.offsets.write_failed(offsets_write)    # not attempted: the group's write failed
            waits = self._take_replication_waits()
        if error is not ErrorCode.NONE:
            return error, message
        return self._replicated(waits)

    # On a cluster the broker answers FindCoordinator from the leadership of the internal
    # topics' partitions (broker.cluster_node.ClusterNode.find_coordinator).
    find_override: Callable[[int, list[str]], list[CoordinatorAddress]] | None = None

    def find_coordinator(self, key_type: int, keys: Iterable[str]) -> list[CoordinatorAddress]:
        """Single node: this broker coordinates every group and every transactional id."""
        if self.find_override is not None:
            return self.find_override(key_type, list(keys))
        answers = []
        for key in keys:
            if key_type not in (CoordinatorType.GROUP, CoordinatorType.TRANSACTION):
                answers.append(CoordinatorAddress(key, -1, "", -1, ErrorCode.INVALID_REQUEST,
                                                  f"unknown coordinator key type {key_type}"))
            elif not key:
                answers.append(CoordinatorAddress(key, -1, "", -1, ErrorCode.INVALID_REQUEST,
                                                  "the coordinator key (group or transactional id) is empty"))
            elif key_type == CoordinatorType.GROUP and self._phase is not _Phase.RUNNING:
                _, message = _PHASE_ERRORS[self._phase]
                answers.append(CoordinatorAddress(key, -1, "", -1, ErrorCode.COORDINATOR_NOT_AVAILABLE, message))
            else:
                answers.append(CoordinatorAddress(key, self.node_id, self.host, self.port))
        return answers


def _error_code_of(exc: BaseException) -> ErrorCode:
    if isinstance(exc, EosError):
        return ErrorCode(exc.code)
    # Not an error the log reports by design: a bug or an OS failure; keep its traceback.
    log.error("unexpected failure appending to %s", OFFSETS_TOPIC, exc_info=exc)
    return ErrorCode.UNKNOWN_SERVER_ERROR
