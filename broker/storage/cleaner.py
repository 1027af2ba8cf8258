"""Log compaction: Kafka's LogCleaner for topics with cleanup.policy=compact.

Theory of operation
-------------------
A compacted log keeps, for every key, at least its last record. Offsets never change: the
cleaner only removes records, so a reader from offset 0 sees a subsequence of what was
written, in the same order, with gaps.

The log is split at the cleaner checkpoint (`cleaner-offset-checkpoint` in the data
directory, Kafka's format: topic partition offset): below it is the *clean* section, which
an earlier pass left with one record per key; from it to the *first uncleanable offset* is
the *dirty* section. The first uncleanable offset is the smallest of the active segment's
base offset, the last stable offset (no open transaction, nothing above the high watermark
is touched) and the base of the first segment holding records younger than
min.compaction.lag.ms; it is rounded down to a segment boundary, as the cleaner works on
whole sealed segments.

Choosing (`plan_cleaning`, pure): every compacted log whose dirty share,
dirty bytes / (clean + dirty bytes), reaches min.cleanable.dirty.ratio, or whose oldest
dirty record is older than max.compaction.lag.ms, or which holds a tombstone or marker
whose delete.retention.ms has run out, is a candidate; the dirtiest goes first.

Cleaning one log (`Cleaner.clean`):

1. *Key map.* Scan the dirty segments in order and map each key to the offset of its last
   record (records of aborted transactions and control batches do not count). The map is
   bounded by log.cleaner.dedupe.buffer.size / threads at Kafka's 24 bytes an entry, loaded
   to log.cleaner.io.buffer.load.factor; when the next segment would not fit, the pass
   stops there and the rest waits for the next pass.
2. *Filter.* Walk every batch from the log start to the end of the mapped range. A record
   is kept unless a later record of its key is in the map, or it is a tombstone (null
   value) whose batch is older than delete.retention.ms. Transactions follow Kafka's rules
   (CleanedTransactionMetadata): the aborted transactions of the range come from the
   transaction indexes; a batch of an aborted transaction loses every record; an ABORT
   marker stays while any batch of its transaction was seen in this pass, a COMMIT marker
   while any of its transaction's batches was (so both go one pass after their data), and
   then only until delete.retention.ms has passed. A producer's last data batch is kept
   even when emptied (records count 0) so that its epoch and sequence survive a restart.
   Kept records are copied byte for byte into a rebuilt batch with the same header fields
   and codec (`eos.records.raw`).
3. *Group and swap.* Consecutive segments are grouped while their sum stays within
   segment.bytes (and the offset range within a segment's), so small cleaned segments
   merge. Each group's output is written to `<base>.log.cleaned`, fsynced, and handed to
   `Log.swap_in_cleaned`, which renames it `.swap` (the commit point: recovery finishes a
   swap it finds), renames the old segments `.deleted` and makes the new one live.
4. *Checkpoint.* The end of the mapped range becomes the log's first dirty offset.

The cleaner threads (`LogCleaner`) run this loop, sleeping log.cleaner.backoff.ms when no
log needs cleaning. One log is cleaned by at most one thread at a time; appends go on
meanwhile (the active segment is never touched) and readers keep the view they started
with. Departure from Kafka: a tombstone's and a marker's delete.retention.ms counts from
the batch's max timestamp (Kafka 3.1+ stamps a delete horizon into the batch when it first
cleans it); the effect for a reader is the same: a consumer that keeps up within
delete.retention.ms sees every delete. Second departure: the v0/v1 entries of a log an old
Kafka wrote are cleaned as the v2 batches a reader gets for them (`eos.records.legacy`:
same offsets, keys, values, timestamps) and written back as v2; Kafka's cleaner keeps
their format. The offsets and what a consumer reads are the same either way.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Callable, Iterable, NamedTuple

from eos.errors import CorruptRecordError, StorageError
from eos.records.codec import CONTROL_TYPE_COMMIT, decode_control_record
from eos.records.header import MAGIC_V2, NO_PRODUCER_ID, BatchHeader, parse_header
from eos.records.legacy import up_convert
from eos.records.raw import raw_records, rebuild_batch, records_section
from broker.storage.checkpoint import OffsetCheckpointFile
from broker.storage.log import Log
from broker.storage.log_loader import CLEANED_SUFFIX
from broker.storage.producer_state import NO_OFFSET
from broker.storage.segment import LOG_SUFFIX, RELATIVE_OFFSET_LIMIT, LogSegment, segment_file_name
from broker.storage.txn_index import AbortedTxn, collect_aborted_transactions

log = logging.getLogger(__name__)

CLEANER_CHECKPOINT = "cleaner-offset-checkpoint"
MAP_ENTRY_BYTES = 24        # Kafka's SkimpyOffsetMap: a 16-byte MD5 of the key + an 8-byte offset
READ_BLOCK_BYTES = 4 << 20  # bytes of a segment read at a time while cleaning


@dataclasses.dataclass(frozen=True)
class CleanerConfig:
    """Broker-level cleaner settings (Kafka's log.cleaner.* names and defaults)."""

    enable: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 134217728
    io_buffer_load_factor: float = 0.9
    backoff_ms: int = 15000

    @property
    def map_entries_max(self) -> int:
        """Keys one pass may map (each thread has its share of the buffer)."""
        per_thread = self.dedupe_buffer_size // max(1, self.threads)
        return max(1, int(per_thread // MAP_ENTRY_BYTES * self.io_buffer_load_factor))


class CleaningPlan(NamedTuple):
    """One log's cleanable state, taken from one snapshot of it."""

    first_dirty_offset: int
    first_uncleanable_offset: int     # a segment boundary
    clean_bytes: int
    dirty_bytes: int
    overdue: bool                     # max.compaction.lag.ms or delete.retention.ms ran out

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


class CleanerStats(NamedTuple):
    log_name: str
    bytes_read: int
    bytes_written: int
    records_read: int
    records_kept: int
    segments_replaced: int
    segments_written: int
    end_offset: int
    seconds: float


def plan_cleaning(log_: Log, checkpoint: int, now_ms: int, retained_horizon_ms: int | None = None) -> CleaningPlan:
    """What cleaning `log_` would cover now (pure apart from reading its snapshot).
    `retained_horizon_ms`: when the earliest tombstone or marker the last pass had to keep
    may go (the cleaner remembers it); past it the log is overdue."""
    config = log_.config
    view = log_.snapshot()
    segments = view.segments
    first_dirty = checkpoint if view.log_start_offset <= checkpoint <= view.log_end_offset else view.log_start_offset
    # the first uncleanable offset, rounded down to the base of the segment holding it
    limit = min(segments[-1].base_offset, view.last_stable_offset)
    lag_ms = config.min_compaction_lag_ms
    for segment in segments[:-1]:
        if segment.next_offset > limit:
            limit = segment.base_offset
            break
        if lag_ms > 0 and segment.largest_timestamp_ms > now_ms - lag_ms:
            limit = segment.base_offset
            break
    else:
        limit = segments[-1].base_offset
    clean_bytes = dirty_bytes = 0
    oldest_dirty_ms: int | None = None
    for segment in segments[:-1]:
        if segment.base_offset >= limit:
            break
        if segment.next_offset <= first_dirty:
            clean_bytes += segment.size_bytes
        else:
            dirty_bytes += segment.size_bytes
            if oldest_dirty_ms is None and segment.rolling_base_timestamp_ms is not None:
                oldest_dirty_ms = segment.rolling_base_timestamp_ms
    overdue = ((dirty_bytes > 0 and oldest_dirty_ms is not None
                and now_ms - oldest_dirty_ms > config.max_compaction_lag_ms)
               or (retained_horizon_ms is not None and now_ms >= retained_horizon_ms and limit > view.log_start_offset))
    return CleaningPlan(first_dirty, limit, clean_bytes, dirty_bytes, overdue)


def wants_cleaning(log_: Log, plan: CleaningPlan) -> bool:
    return plan.overdue or (plan.dirty_bytes > 0 and plan.dirty_ratio >= log_.config.min_cleanable_dirty_ratio)


def _iter_segment_batches(segment: LogSegment) -> Iterable[tuple[BatchHeader, bytes]]:
    """(header, the batch's bytes; the header's position is 0 in them) for every batch of
    a sealed segment, read in large blocks."""
    for header, block, relative in segment._scan(0, segment.size_bytes, READ_BLOCK_BYTES):
        size = header.size_bytes
        if relative + size <= len(block):
            batch = block[relative:relative + size]
        else:
            batch = segment.read_bytes(header.position, size)
            if len(batch) < size:
                raise CorruptRecordError(f"{segment.log_path}: the batch at byte {header.position} is torn")
        if header.magic != MAGIC_V2:
            # a v0/v1 entry (an old Kafka's): cleaned as, and written back as, its v2 batch
            batch = up_convert(batch)
            yield parse_header(batch, 0), batch
            continue
        yield header._replace(position=0), batch


class _TxnTracker:
    """Kafka's CleanedTransactionMetadata: which batches belong to aborted transactions,
    and whether a marker may go (see the module's step 2)."""

    def __init__(self, aborted: list[AbortedTxn], start_offset: int):
        # a transaction whose marker lies before the scan's start has nothing here to hold
        self._aborted = sorted((a for a in aborted if a.last_offset >= start_offset), key=lambda a: a.first_offset)
        self._next = 0
        self._ongoing_aborted: dict[int, list] = {}     # pid -> [AbortedTxn, batch observed]
        self._ongoing_committed: set[int] = set()
        self.kept_aborted: list[AbortedTxn] = []        # entries for the cleaned txn index

    def _start_aborted_up_to(self, offset: int) -> None:
        while self._next < len(self._aborted) and self._aborted[self._next].first_offset <= offset:
            entry = self._aborted[self._next]
            self._ongoing_aborted[entry.producer_id] = [entry, False]
            self._next += 1

    def is_aborted_batch(self, header: BatchHeader) -> bool:
        """A transactional data batch: True when its transaction was aborted."""
        self._start_aborted_up_to(header.last_offset)
        ongoing = self._ongoing_aborted.get(header.producer_id)
        if ongoing is not None:
            ongoing[1] = True
            return True
        self._ongoing_committed.add(header.producer_id)
        return False

    def marker_may_go(self, header: BatchHeader, committed: bool) -> bool:
        self._start_aborted_up_to(header.last_offset)
        if committed:
            if header.producer_id in self._ongoing_committed:
                self._ongoing_committed.discard(header.producer_id)
                return False
            return True
        ongoing = self._ongoing_aborted.pop(header.producer_id, None)
        if ongoing is not None and ongoing[1]:
            self.kept_aborted.append(ongoing[0])
            return False
        return True


class Cleaner:
    """Cleans one log at a time (one per cleaner thread; holds its key map)."""

    def __init__(self, config: CleanerConfig, now_ms_fn: Callable[[], int] | None = None):
        self.config = config
        self._now_ms = now_ms_fn or (lambda: int(time.time() * 1000))

    # -- step 1: the key map -----------------------------------------------------------

    def build_key_map(self, log_: Log, segments: list[LogSegment], aborted: list[AbortedTxn]) -> tuple[dict, int]:
        """key -> offset of its last record in the dirty `segments`, taken whole, in order,
        while the map has room; returns it and the end offset of what it covers."""
        key_map: dict[bytes, int] = {}
        entries_max = self.config.map_entries_max
        tracker = _TxnTracker(aborted, segments[0].base_offset)
        end_offset = segments[0].base_offset
        for segment in segments:
            segment_map: dict[bytes, int] = {}
            for header, batch in _iter_segment_batches(segment):
                if header.is_control:
                    tracker.marker_may_go(header, _marker_committed(batch, header))
                    continue
                if header.is_transactional and tracker.is_aborted_batch(header):
                    continue
                data, start, end = records_section(batch, header)
                for _, _, offset, key, _ in raw_records(data, start, end, header):
                    if key is not None:
                        segment_map[key] = offset
            new_keys = sum(1 for key in segment_map if key not in key_map)
            if key_map and len(key_map) + new_keys > entries_max:
                break   # the next pass goes on from here
            key_map.update(segment_map)
            end_offset = segment.next_offset
        return key_map, end_offset

    # -- steps 2-3 ---------------------------------------------------------------------

    def clean(self, log_: Log, plan: CleaningPlan, *, step: Callable[[str], None] | None = None
              ) -> tuple[CleanerStats, int | None]:
        """Clean `log_` as `plan` says. Returns the statistics and when the earliest
        tombstone or marker this pass kept becomes removable (None: none kept)."""
        started = time.monotonic()
        now_ms = self._now_ms()
        config = log_.config
        view = log_.snapshot()
        sealed = list(view.segments[:-1])
        dirty = [s for s in sealed if s.next_offset > plan.first_dirty_offset
                 and s.base_offset < plan.first_uncleanable_offset]
        if not dirty:
            return CleanerStats(log_.name, 0, 0, 0, 0, 0, 0, plan.first_dirty_offset, 0.0), None
        aborted = collect_aborted_transactions((s.txn_index for s in view.segments), view.log_start_offset,
                                               plan.first_uncleanable_offset)
        key_map, end_offset = self.build_key_map(log_, dirty, aborted)
        producers_last = log_.producer_last_offsets()
        horizon_ms = now_ms - config.delete_retention_ms
        tracker = _TxnTracker(aborted, view.log_start_offset)
        stats = dict(bytes_read=0, bytes_written=0, records_read=0, records_kept=0, replaced=0, written=0)
        earliest_kept_horizon: list[int] = []
        for group in _group_segments([s for s in sealed if s.base_offset < end_offset], config.segment_bytes):
            cleaned_path = os.path.join(log_.directory,
                                        segment_file_name(group[0].base_offset, LOG_SUFFIX + CLEANED_SUFFIX))
            fd = os.open(cleaned_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                pending: list[bytes] = []
                pending_bytes = 0
                for segment in group:
                    for header, batch in _iter_segment_batches(segment):
                        stats["bytes_read"] += header.size_bytes
                        kept = self._filter_batch(header, batch, key_map, end_offset, tracker, horizon_ms,
                                                  producers_last, stats, earliest_kept_horizon,
                                                  config.delete_retention_ms)
                        if kept is not None:
                            pending.append(kept)
                            pending_bytes += len(kept)
                            if pending_bytes >= READ_BLOCK_BYTES:
                                _write_all(fd, b"".join(pending))
                                stats["bytes_written"] += pending_bytes
                                pending, pending_bytes = [], 0
                _write_all(fd, b"".join(pending))
                stats["bytes_written"] += pending_bytes
                os.fsync(fd)
            finally:
                os.close(fd)
            if step:
                step("cleaned")
            group_end = group[-1].next_offset
            entries = [a for a in tracker.kept_aborted if group[0].base_offset <= a.last_offset < group_end]
            if not log_.swap_in_cleaned(group, cleaned_path, entries, now_ms, step=step):
                log.info("%s: the log changed while it was cleaned; the pass stops at offset %d",
                         log_.name, group[0].base_offset)
                end_offset = group[0].base_offset
                break
            stats["replaced"] += len(group)
            stats["written"] += 1
        result = CleanerStats(log_.name, stats["bytes_read"], stats["bytes_written"], stats["records_read"],
                              stats["records_kept"], stats["replaced"], stats["written"], end_offset,
                              time.monotonic() - started)
        return result, (min(earliest_kept_horizon) if earliest_kept_horizon else None)

    def _filter_batch(self, header: BatchHeader, batch: bytes, key_map: dict, end_offset: int,
                      tracker: _TxnTracker, horizon_ms: int, producers_last: dict, stats: dict,
                      kept_horizons: list, delete_retention_ms: int) -> bytes | None:
        """The batch as it stays in the cleaned log: unchanged, rebuilt with fewer records,
        emptied, or None (removed)."""
        last_offset, last_epoch = producers_last.get(header.producer_id, (NO_OFFSET, None))
        if header.is_control:
            if header.records_count == 0:
                return None     # emptied by an earlier pass
            may_go = tracker.marker_may_go(header, _marker_committed(batch, header))
            if last_offset == NO_OFFSET and header.producer_epoch == last_epoch:
                # the producer's state holds no data batch (its epoch was bumped by a
                # marker): its current epoch's markers are what recovery rebuilds it from
                return batch
            if may_go and header.max_timestamp <= horizon_ms:
                return None
            if may_go:
                # removable once delete.retention.ms has run (only then: a marker kept for
                # its transaction's batches waits for a pass that new data brings)
                kept_horizons.append(header.max_timestamp + delete_retention_ms)
            return batch
        has_producer = header.producer_id != NO_PRODUCER_ID
        aborted = header.is_transactional and tracker.is_aborted_batch(header)
        data, start, end = records_section(batch, header)
        records = raw_records(data, start, end, header)
        stats["records_read"] += len(records)
        kept = []
        if not aborted:
            get = key_map.get
            tombstones_expired = header.max_timestamp <= horizon_ms
            for record in records:
                _, _, offset, key, value_is_null = record
                if key is not None and offset < end_offset and get(key, -1) > offset:
                    continue    # a later record of this key is in the log
                if value_is_null:
                    if tombstones_expired:
                        continue   # a tombstone whose delete.retention.ms ran out
                    kept_horizons.append(header.max_timestamp + delete_retention_ms)
                kept.append(record)
        stats["records_kept"] += len(kept)
        if len(kept) == len(records):
            return batch
        if not kept and not (has_producer and header.last_offset == last_offset):
            return None
        return rebuild_batch(batch, header, data, kept)


def _marker_committed(batch: bytes, header: BatchHeader) -> bool:
    marker_type, _ = decode_control_record(batch, header)
    return marker_type == CONTROL_TYPE_COMMIT


def _group_segments(segments: list[LogSegment], max_bytes: int) -> list[list[LogSegment]]:
    """Consecutive segments merged while their bytes fit one segment and their offsets one
    segment's range (Kafka's groupSegmentsBySize)."""
    groups: list[list[LogSegment]] = []
    for segment in segments:
        if groups:
            group = groups[-1]
            size = sum(s.size_bytes for s in group) + segment.size_bytes
            if size <= max_bytes and segment.next_offset - 1 - group[0].base_offset <= RELATIVE_OFFSET_LIMIT:
                group.append(segment)
                continue
        groups.append([segment])
    return groups


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class LogCleaner:
    """The cleaner threads of a broker (Kafka's LogCleaner + LogCleanerManager): picks the
    dirtiest compacted log, cleans it, checkpoints where it stopped."""

    def __init__(self, data_dir: str, logs: Callable[[], list[Log]], config: CleanerConfig,
                 now_ms_fn: Callable[[], int] | None = None):
        self.config = config
        self._logs = logs
        self._now_ms = now_ms_fn or (lambda: int(time.time() * 1000))
        self._checkpoint_file = OffsetCheckpointFile(os.path.join(data_dir, CLEANER_CHECKPOINT))
        try:
            self._first_dirty: dict[tuple[str, int], int] = self._checkpoint_file.read()
        except StorageError as e:
            log.warning("ignoring an unreadable cleaner checkpoint (logs are cleaned from their start): %s", e)
            self._first_dirty = {}
        self._retained_horizon_ms: dict[tuple[str, int], int] = {}
        self._in_progress: set[tuple[str, int]] = set()
        self._lock = threading.Lock()       # owns the three dicts above and the checkpoint file
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.passes = 0
        self.last_stats: CleanerStats | None = None
        self.bytes_read_total = 0         # over every pass, for the broker's metrics
        self.bytes_written_total = 0

    def start(self) -> None:
        if not self.config.enable:
            return
        for number in range(self.config.threads):
            thread = threading.Thread(target=self._run, args=(Cleaner(self.config, self._now_ms),),
                                      name=f"eos-log-cleaner-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout_s)

    def wake(self) -> None:
        """Look for work now instead of after the backoff (tests, admin)."""
        self._wake.set()

    def first_dirty_offset(self, topic: str, partition: int) -> int | None:
        with self._lock:
            return self._first_dirty.get((topic, partition))

    def _choose(self) -> tuple[Log, CleaningPlan] | None:
        now_ms = self._now_ms()
        best = None
        with self._lock:
            for log_ in self._logs():
                key = (log_.topic, log_.partition)
                if not log_.config.compact or key in self._in_progress:
                    continue
                try:
                    plan = plan_cleaning(log_, self._first_dirty.get(key, 0), now_ms, self._retained_horizon_ms.get(key))
                except StorageError:
                    continue
                if wants_cleaning(log_, plan) and (best is None or plan.overdue > best[1].overdue or
                                                   plan.dirty_ratio > best[1].dirty_ratio):
                    best = (log_, plan)
            if best is not None:
                self._in_progress.add((best[0].topic, best[0].partition))
        return best

    def clean_once(self, cleaner: Cleaner | None = None) -> CleanerStats | None:
        """Clean the dirtiest log that needs it; None when none does."""
        chosen = self._choose()
        if chosen is None:
            return None
        log_, plan = chosen
        key = (log_.topic, log_.partition)
        try:
            stats, horizon_ms = (cleaner or Cleaner(self.config, self._now_ms)).clean(log_, plan)
        finally:
            with self._lock:
                self._in_progress.discard(key)
        with self._lock:
            self._first_dirty[key] = stats.end_offset
            if horizon_ms is None:
                self._retained_horizon_ms.pop(key, None)
            else:
                self._retained_horizon_ms[key] = horizon_ms
            live = {(l.topic, l.partition) for l in self._logs()}
            self._checkpoint_file.write({k: v for k, v in self._first_dirty.items() if k in live})
            self.passes += 1
            self.last_stats = stats
            self.bytes_read_total += stats.bytes_read
            self.bytes_written_total += stats.bytes_written
        mb = stats.bytes_read / 1e6
        log.info("%s: cleaned %.1f MB in %.2f s (%.1f MB/s): %d of %d records kept, %d segment(s) into %d; "
                 "clean up to offset %d", stats.log_name, mb, stats.seconds, mb / stats.seconds if stats.seconds else 0.0,
                 stats.records_kept, stats.records_read, stats.segments_replaced, stats.segments_written,
                 stats.end_offset)
        return stats

    def _run(self, cleaner: Cleaner) -> None:
        while not self._stop.is_set():
            try:
                stats = self.clean_once(cleaner)
            except (StorageError, CorruptRecordError, OSError) as e:
                log.error("log cleaning failed; retrying after the backoff: %s", e)
                stats = None
            except Exception:
                log.exception("log cleaning failed; retrying after the backoff")
                stats = None
            if stats is None:
                self._wake.wait(self.config.backoff_ms / 1000.0)
                self._wake.clear()
