"""One partition's log: an ordered list of segments, with appends, reads, retention and recovery.

Theory of operation
-------------------
A partition is a directory `<topic>-<partition>` of segments (see `segment.py`), the last
of which is active. The log owns the list of segments and the offsets that describe it:

    log_start_offset <= (segments' offsets) < log_end_offset
    high_watermark       the end of what readers may see (= log_end_offset on one node,
                         kept apart so replication can hold it back)
    recovery_point       everything below it is fsynced; recovery checks only what follows

Appending is staged, so bad input changes nothing:

1. prepare (pure, outside the lock; `validator.py`, Kafka's LogValidator): parse every
   batch header (or take the caller's, `headers=`, when it parsed them already), check
   sizes and CRCs, copy the request and stamp what does not depend on the log's state:
   the leader epoch and, if the topic uses LogAppendTime, the timestamp type and max
   timestamp (recomputing those CRCs). Then, under the lock, ask the producer state
   whether the batch is in sequence or a duplicate.
2. write: stamp base offsets (contiguous from log_end_offset; the CRC does not cover
   them), roll if the active segment is full or old, and write the batches with one
   `os.write`.
3. apply: move log_end_offset and the high watermark, record the batch in the producer
   state, publish a new snapshot for readers, count unflushed records.
The lock covers only steps 2 and 3 and the producer-state check: per-byte work (the copy,
the CRCs) stays outside it.

Readers never take the lock. After each change the log publishes an immutable `_LogView`
(segments, their base offsets, the active segment's end position, the offsets); a read
works from one view, locating the segment by bisection, then the batch through the sparse
index and a short header scan, and `os.pread`s whole batches below the view's end. Bytes
below a published end are never rewritten, and a deleted segment's descriptor stays open
for file.delete.delay.ms, so a read in flight never sees a torn or reused file.

Transactions: a transactional batch opens its producer's transaction here (producer state).
A marker (`append_txn_marker`, WriteTxnMarkers) is staged like any append: the producer
state checks its producer and coordinator epochs (prepare_marker), the log writes the
control batch and, for an ABORT that ends a transaction, first the transaction index entry
(`AbortedTxn` with Kafka's last stable offset) into the active segment, then the state
applies it. The last stable offset = min(first unstable offset, high watermark), kept in the
published view, bounds read_committed reads; those also get the aborted transactions that
overlap what they return, from the transaction indexes of the segment holding the first
returned batch onwards (Kafka's collectAbortedTransactions). read_uncommitted reads do no
transaction work at all.

Compaction (`cleaner.py` writes the cleaned segments; `swap_in_cleaned` puts them in):
the cleaned group goes `.cleaned` -> `.swap`, the segments it replaces `.log` -> `.deleted`,
then `.swap` -> `.log`, and one new view is published, so a reader sees the old segments or
the new. Offsets never change; a cleaned batch may hold fewer records than its offset range.

Recovery (`Log.open`, through `log_loader.py`, Kafka's LogLoader): a `.swap` left by a
crash is finished (the segments it covers go, it becomes the `.log`), then leftover
`.deleted`/`.cleaned` files are removed; files that are not ours are left alone with a
warning. Segments below the recovery point are trusted
(their indexes are rebuilt only if missing or inconsistent); after an unclean shutdown every
batch from the recovery point's segment on is checked (header, CRC, offsets) and the log is
cut after the last valid batch, later segments deleted. The producer state is loaded from
its newest usable snapshot and brought up to date by replaying the batch headers after it
(markers decoded). The transaction indexes of the checked segments, and of any segment
whose `.txnindex` is torn or corrupt, are emptied and refilled by that replay, which then
starts at a snapshot no later than the first such segment: the replay gives each aborted
transaction the same entry the original append wrote. A `.txnindex` missing below the
recovery point reads as "no aborted transactions", as in Kafka (the file is created only
with a segment's first abort, so a missing one cannot be told from an empty one).

Old message formats: the segments of a log an old Kafka wrote may hold v0/v1 message sets
(`eos.records.legacy`); the segment walks them like batches (see `segment.py`), so
recovery, indexes and producer-state replay (they carry no producer id) need nothing more.
Readers get v2 only: `read` up-converts the legacy entries of what it returns, per read,
as Kafka converts per fetch; `offset_for_timestamp` and the cleaner read them converted.
A produce of v0/v1 is refused with INVALID_RECORD before anything else (Kafka 4's rule).
"""
from __future__ import annotations

import logging
import os
import re
import struct
import threading
import time
from bisect import bisect_left, bisect_right
from typing import NamedTuple, Sequence

from eos.config import TopicConfig
from eos.files import fsync_directory
from eos.errors import (
    InvalidRecordError,
    InvalidRequestError,
    InvariantError,
    OffsetOutOfRangeError,
    StorageError,
)
from eos.records.codec import decode_control_record, encode_control_batch
from eos.records.compression import codec_from_name
from eos.records.legacy import up_convert
from eos.records.raw import recompress_batches
from eos.records.header import (
    BATCH_LENGTH_STRUCT,
    MAGIC_V2,
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    parse_header,
)
from broker.storage.leader_epoch import LeaderEpochCache
from broker.storage.producer_state import (
    CompletedTxn,
    DuplicateBatch,
    MarkerAppend,
    ProducerStateEntry,
    ProducerStateManager,
)
from broker.storage.segment import LOG_SUFFIX, LogSegment, segment_file_name
from broker.storage import log_loader
from broker.storage.log_loader import SWAP_SUFFIX, remove_file
from broker.storage.txn_index import AbortedTxn, collect_aborted_transactions
from broker.storage.validator import AppendOrigin, PreparedBatches, assign_offsets, copy_and_stamp, prepare_batches

log = logging.getLogger(__name__)

DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")

_BASE_OFFSET_STRUCT = struct.Struct(">q")    # baseOffset at byte 0
_LAST_OFFSET_DELTA_STRUCT = struct.Struct(">i")   # lastOffsetDelta at byte 23
_BATCH_LENGTH_AT = 8
_PRODUCER_EPOCH_MAX = 0x7FFF
_COORDINATOR_EPOCH_MAX = 0x7FFFFFFF


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """`orders-3` -> ("orders", 3); None for anything else (including `...-delete` dirs)."""
    match = _PARTITION_DIR.match(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2))


class LogAppendInfo(NamedTuple):
    first_offset: int
    last_offset: int
    max_timestamp_ms: int
    log_append_time_ms: int   # -1 under CreateTime
    record_count: int
    batch_count: int
    duplicate: bool = False   # a retained duplicate: the offsets are the original ones, nothing written
    # A transaction marker: the transaction it completed in this partition (None when the
    # producer had none open here, and for every data append). The broker tells the group
    # coordinator about completed transactions of __consumer_offsets partitions.
    completed_txn: CompletedTxn | None = None


class FetchData(NamedTuple):
    records: bytes            # whole batches, as stored
    first_offset: int         # base offset of the first batch (the fetch offset when empty)
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int = -1   # from the same snapshot as the records (always set by Log.read)
    # read_committed only: the aborted transactions overlapping the returned batches,
    # ordered by their marker offset; always empty under read_uncommitted.
    aborted_transactions: list[AbortedTxn] | tuple = ()


class _LogView(NamedTuple):
    """What readers see; replaced, never mutated."""

    segments: tuple[LogSegment, ...]
    base_offsets: tuple[int, ...]
    active_end_position: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    last_stable_offset: int


class Log:
    """One partition: its segments, offsets, producer state and the lock that orders appends."""

    def __init__(self, directory: str, config: TopicConfig, *, recovery_point: int = 0,
                 log_start_offset: int = 0, clean_shutdown: bool = False, now_ms: int,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
                 high_watermark: int | None = None):
        self.directory = directory
        self.name = os.path.basename(os.path.normpath(directory))
        parsed = parse_partition_dir_name(self.name)
        if parsed is None:
            raise InvariantError(f"{directory}: a partition directory is named <topic>-<partition>")
        self.topic, self.partition = parsed
        self.config = config
        # Appends, rolls, retention and flush bookkeeping; never held during a read.
        self._lock = threading.Lock()
        self._segments: tuple[LogSegment, ...] = ()
        self._base_offsets: tuple[int, ...] = ()
        self._log_start_offset = 0
        self._log_end_offset = 0
        self._high_watermark = 0
        self.recovery_point = 0
        self._unflushed_records = 0
        self._last_flush_ms = now_ms
        self._pending_deletions: list[tuple[int, LogSegment]] = []   # (due ms, segment)
        self._closed = False
        # Replicated (a partition of a cluster): the high watermark is set by the replica
        # manager from the followers' positions instead of following the log end.
        self._replicated = False
        # The high watermark last checkpointed (replication-offset-checkpoint): where a
        # replica's HW starts when it becomes replicated again after a restart.
        self._checkpointed_high_watermark = high_watermark
        self.producer_state = ProducerStateManager(directory, producer_id_expiration_ms=producer_id_expiration_ms)
        os.makedirs(directory, exist_ok=True)
        self.leader_epoch_cache, epochs_ok = LeaderEpochCache.load(directory)
        self._load(recovery_point, log_start_offset, clean_shutdown, now_ms)
        log_loader.rebuild_leader_epochs(self.leader_epoch_cache, self._segments, file_ok=epochs_ok,
                                         log_start_offset=self._log_start_offset,
                                         log_end_offset=self._log_end_offset)

    @classmethod
    def open(cls, directory: str, config: TopicConfig, *, recovery_point: int = 0, log_start_offset: int = 0,
             clean_shutdown: bool = False, now_ms: int,
             producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
             high_watermark: int | None = None) -> "Log":
        """Open (creating if needed) and recover the partition at `directory`."""
        return cls(directory, config, recovery_point=recovery_point, log_start_offset=log_start_offset,
                   clean_shutdown=clean_shutdown, now_ms=now_ms,
                   producer_id_expiration_ms=producer_id_expiration_ms, high_watermark=high_watermark)

    # ---- public state ---------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._view.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._view.log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._view.high_watermark

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return self._view.segments

    @property
    def active_segment(self) -> LogSegment:
        return self._view.segments[-1]

    @property
    def size_bytes(self) -> int:
        view = self._view
        return sum(s.size_bytes for s in view.segments[:-1]) + view.active_end_position

    @property
    def last_stable_offset(self) -> int:
        """The end of what read_committed readers may see: the first offset of the earliest
        open transaction (never below the log start), or the high watermark when none is
        open, whichever is smaller."""
        return self._view.last_stable_offset

    def earliest_offset(self) -> int:
        return self._view.log_start_offset

    def latest_offset(self, isolation_committed: bool = False) -> int:
        """The offset a reader starts from to see only new records (ListOffsets latest):
        the high watermark, or the last stable offset for a read_committed reader."""
        view = self._view
        return view.last_stable_offset if isolation_committed else view.high_watermark

    # ---- producers and transactions (reads for the broker) ------------------------------

    def describe_producers(self) -> list[ProducerStateEntry]:
        """Every producer known in this partition, by id (DescribeProducers): epoch, last
        sequence, last timestamp, coordinator epoch, first offset of its open transaction."""
        with self._lock:
            return self.producer_state.active_producers()

    def open_transactions(self) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of every open transaction here, by first offset."""
        with self._lock:
            return self.producer_state.open_transactions()

    def has_ongoing_transaction(self, producer_id: int, producer_epoch: int) -> bool:
        """Whether `producer_id` at exactly `producer_epoch` has a transaction open in this
        partition (KIP-890 part 1: the leader skips asking the coordinator then). Lock-free
        and possibly stale by the time of the append, which is safe: the marker that closes
        the transaction bumps the epoch, so an append at `producer_epoch` is then fenced."""
        entry = self.producer_state.last_entry(producer_id)
        return entry is not None and entry.has_open_transaction and entry.producer_epoch == producer_epoch

    # ---- loading and recovery ----------------------------------------------------------

    def _new_segment(self, base_offset: int, now_ms: int) -> LogSegment:
        return log_loader.new_segment(self.directory, self.config, base_offset, now_ms)

    def _load(self, recovery_point: int, log_start_offset: int, clean_shutdown: bool, now_ms: int) -> None:
        """Recover the directory (`log_loader`), then take what it kept as this log's state."""
        loaded = log_loader.load_segments(self.directory, self.name, self.config, recovery_point=recovery_point,
                                          log_start_offset=log_start_offset, clean_shutdown=clean_shutdown,
                                          now_ms=now_ms)
        kept, txn_rebuild_from = loaded.segments, loaded.txn_rebuild_from
        for segment in kept[:-1]:
            segment.seal()
        self._segments = tuple(kept)
        self._base_offsets = tuple(s.base_offset for s in kept)
        self._log_start_offset = loaded.log_start_offset
        self._log_end_offset = loaded.log_end_offset
        self._high_watermark = loaded.log_end_offset
        if txn_rebuild_from is not None:
            for segment in kept:
                if segment.base_offset >= txn_rebuild_from:
                    segment.reset_txn_index()
        self._load_producer_state(now_ms, txn_rebuild_from)
        # What recovery just read or rebuilt may exist only in the page cache; make it
        # durable before claiming it as recovered.
        flush_from = loaded.first_unflushed
        if txn_rebuild_from is not None:
            flush_from = min(flush_from, bisect_left(self._base_offsets, txn_rebuild_from))
        for segment in kept[flush_from:]:
            if not segment.is_empty:     # a new, empty log has nothing to make durable
                segment.flush()
        for segment in kept[:-1]:
            segment.txn_index.close()   # a replay may have reopened a sealed segment's file
        self.recovery_point = loaded.log_end_offset
        self._publish()
        log.info("%s: loaded %d segment(s), offsets [%d, %d)%s", self.name, len(kept), loaded.log_start_offset,
                 loaded.log_end_offset, "" if clean_shutdown else " after recovery")

    def _load_producer_state(self, now_ms: int, txn_rebuild_from: int | None) -> None:
        log_loader.replay_producer_state(self.producer_state, self._segments, self._base_offsets,
                                         log_start_offset=self._log_start_offset,
                                         log_end_offset=self._log_end_offset, high_watermark=self._high_watermark,
                                         txn_rebuild_from=txn_rebuild_from, now_ms=now_ms, name=self.name)

    # ---- append -----------------------------------------------------------------------

    def append_as_leader(self, records, now_ms: int, *, origin: AppendOrigin = AppendOrigin.CLIENT,
                         leader_epoch: int = 0, headers: Sequence[BatchHeader] | None = None) -> LogAppendInfo:
        """Validate and append a request's batches; return where they landed.

        A coordinator's request may instead be one transaction marker (a control batch),
        which takes the path of `append_txn_marker`.

        `headers`: the caller's parse of `records` (every batch, in order, as
        `eos.records.header.iter_headers(records)` yields them), so that a caller that had
        to read them already does not pay for a second parse. They must tile `records`
        exactly (else InvalidRequestError); everything else is checked as for a parse here.

        Raises CorruptRecordError, InvalidRecordError, MessageTooLargeError,
        RecordListTooLargeError, OutOfOrderSequenceError, InvalidProducerEpochError,
        InvalidTxnStateError or StorageError; in every case the log is unchanged.
        """
        prepared = prepare_batches(records, origin, self.config, self.name, self.topic, headers)
        if prepared.marker is not None:
            committed, coordinator_epoch = prepared.marker
            header = prepared.headers[0]
            return self._append_marker(records, prepared, header.producer_id, header.producer_epoch,
                                       coordinator_epoch, committed, now_ms, leader_epoch)
        config = self.config
        if config.compression_type != "producer" and origin is not AppendOrigin.REPLICATION:
            # The topic's codec, not the producer's (Kafka's LogValidator). Done before the
            # lock. prepare_batches walked every record of a client's batch (a coordinator's
            # were built here), so they are not walked again; the new bytes meet the limits
            # again (max.message.bytes applies to what is stored, as in Kafka).
            recompressed = recompress_batches(records, prepared.headers, codec_from_name(config.compression_type))
            if recompressed is not None:
                records = recompressed
                prepared = prepare_batches(records, origin, self.config, self.name, self.topic, built_here=True)
        log_append_time = config.message_timestamp_type == "LogAppendTime"
        log_append_time_ms = now_ms if log_append_time else None
        buf, crcs, max_timestamp_ms = copy_and_stamp(records, prepared.headers, leader_epoch, log_append_time_ms)
        flush_now = False
        with self._lock:
            self._check_open()
            producer_append = None
            header = prepared.producer_header
            if header is not None:
                outcome = self.producer_state.prepare_append(header, now_ms, origin=origin.value)
                if isinstance(outcome, DuplicateBatch):
                    return LogAppendInfo(outcome.first_offset, outcome.last_offset, outcome.timestamp_ms,
                                         outcome.timestamp_ms if log_append_time else -1,
                                         header.records_count, 1, duplicate=True)
                producer_append = outcome
            # -- write: nothing above changed any state
            first_offset = self._log_end_offset
            if leader_epoch > self.leader_epoch_cache.latest_epoch:
                self.leader_epoch_cache.assign(leader_epoch, first_offset)
            headers = assign_offsets(buf, prepared.headers, first_offset, leader_epoch, log_append_time_ms, crcs)
            last_offset = headers[-1].last_offset
            if prepared.size_bytes <= config.segment_bytes:
                active = self._segment_for_append_locked(prepared.size_bytes, max_timestamp_ms, first_offset,
                                                         last_offset, now_ms)
                active.append(buf, headers, max_timestamp_ms)
                advanced_records = 0
            else:
                advanced_records = self._append_across_segments_locked(buf, headers, now_ms)
            # -- apply
            if producer_append is not None:
                self.producer_state.apply(producer_append, first_offset, last_offset)
            self._advance_locked(last_offset + 1, prepared.record_count - advanced_records)
            flush_now = self._unflushed_records >= config.flush_messages
        if flush_now:
            self.flush()
        return LogAppendInfo(first_offset, last_offset, max_timestamp_ms,
                             now_ms if log_append_time else -1, prepared.record_count, len(headers))

    def _append_across_segments_locked(self, buf: bytearray, headers: list[BatchHeader], now_ms: int) -> int:
        """A plain producer's request whose batches together exceed segment.bytes (each fits
        one): written a segment's worth at a time, rolling in between, so no segment grows
        past segment.bytes. (Kafka refuses such a list, but its producer never sends one: it
        sends one batch per partition per request, where eos's plain producer sends several.)
        A failed write leaves the chunks before it in the log, as separate appends would.
        Returns the records of the chunks it advanced the log over (all but the last)."""
        view = memoryview(buf)
        chunk: list[BatchHeader] = []
        chunk_bytes = 0
        advanced_records = 0
        for index, header in enumerate(headers):
            chunk.append(header)
            chunk_bytes += header.size_bytes
            following = headers[index + 1] if index + 1 < len(headers) else None
            if following is not None and chunk_bytes + following.size_bytes <= self.config.segment_bytes:
                continue
            start = chunk[0].position
            rebased = [h._replace(position=h.position - start) for h in chunk]
            chunk_max_timestamp_ms = max(h.max_timestamp for h in chunk)
            active = self._segment_for_append_locked(chunk_bytes, chunk_max_timestamp_ms, chunk[0].base_offset,
                                                     chunk[-1].last_offset, now_ms)
            active.append(view[start:start + chunk_bytes], rebased, chunk_max_timestamp_ms)
            if following is not None:
                chunk_records = sum(h.records_count for h in chunk)
                self._advance_locked(following.base_offset, chunk_records)
                advanced_records += chunk_records
            chunk, chunk_bytes = [], 0
        return advanced_records

    def append_txn_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, committed: bool,
                          now_ms: int, *, leader_epoch: int = 0) -> LogAppendInfo:
        """Write a COMMIT or ABORT marker for `producer_id` (WriteTxnMarkers) and end its
        transaction here. `producer_epoch` is the epoch the coordinator ended the
        transaction with (KIP-890: the bumped one); `now_ms` becomes the marker's timestamp.

        Returns where the marker landed; `completed_txn` is the transaction it ended (None
        when the producer had none open here). An ABORT that ended one is in the active
        segment's transaction index before this returns. Raises InvalidRequestError (ids or
        epochs out of range), InvalidProducerEpochError (a stale producer epoch),
        EosError(TRANSACTION_COORDINATOR_FENCED) (a stale coordinator epoch) or StorageError;
        in every case the log is unchanged.
        """
        if not (0 <= producer_id and 0 <= producer_epoch <= _PRODUCER_EPOCH_MAX
                and 0 <= coordinator_epoch <= _COORDINATOR_EPOCH_MAX):
            raise InvalidRequestError(
                f"{self.name}: transaction marker for producer {producer_id} epoch {producer_epoch} from "
                f"coordinator epoch {coordinator_epoch}: the producer id and coordinator epoch must be "
                f"non-negative 64/32-bit ints and the producer epoch within 0..{_PRODUCER_EPOCH_MAX}")
        marker = encode_control_batch(committed=committed, producer_id=producer_id, producer_epoch=producer_epoch,
                                      coordinator_epoch=coordinator_epoch, timestamp_ms=now_ms)
        header = parse_header(marker, 0)
        prepared = PreparedBatches([header], header.size_bytes, header.records_count, header.max_timestamp,
                                    None, (bool(committed), coordinator_epoch))
        return self._append_marker(marker, prepared, producer_id, producer_epoch, coordinator_epoch,
                                   bool(committed), now_ms, leader_epoch)

    def _append_marker(self, records, prepared: PreparedBatches, producer_id: int, producer_epoch: int,
                       coordinator_epoch: int, committed: bool, now_ms: int, leader_epoch: int) -> LogAppendInfo:
        """prepare (producer state) -> write (log + transaction index) -> apply, for one
        marker batch in `records`."""
        config = self.config
        log_append_time = config.message_timestamp_type == "LogAppendTime"
        log_append_time_ms = now_ms if log_append_time else None
        buf, crcs, max_timestamp_ms = copy_and_stamp(records, prepared.headers, leader_epoch, log_append_time_ms)
        flush_now = False
        with self._lock:
            self._check_open()
            marker = self.producer_state.prepare_marker(producer_id, producer_epoch, coordinator_epoch, committed,
                                                        now_ms)
            # -- write: nothing above changed any state
            marker_offset = self._log_end_offset
            if leader_epoch > self.leader_epoch_cache.latest_epoch:
                self.leader_epoch_cache.assign(leader_epoch, marker_offset)
            aborted_txn = self._aborted_txn_of(marker, marker_offset)
            headers = assign_offsets(buf, prepared.headers, marker_offset, leader_epoch, log_append_time_ms, crcs)
            active = self._segment_for_append_locked(prepared.size_bytes, max_timestamp_ms, marker_offset,
                                                     marker_offset, now_ms)
            active.append(buf, headers, max_timestamp_ms, aborted_txn=aborted_txn)
            # -- apply
            completed = self.producer_state.apply_marker(marker, marker_offset)
            indexed = completed.to_aborted_txn() if completed is not None and completed.is_aborted else None
            if indexed != aborted_txn:
                raise InvariantError(f"{self.name}: marker at offset {marker_offset} completed {completed}, but "
                                     f"the transaction index got {aborted_txn}")
            self._advance_locked(marker_offset + 1, 1)
            flush_now = self._unflushed_records >= config.flush_messages
        if flush_now:
            self.flush()
        return LogAppendInfo(marker_offset, marker_offset, max_timestamp_ms, now_ms if log_append_time else -1,
                             1, 1, completed_txn=completed)

    def _aborted_txn_of(self, marker: MarkerAppend, marker_offset: int) -> AbortedTxn | None:
        """The transaction index entry an ABORT marker at `marker_offset` will produce,
        known before anything is written (the producer state confirms it on apply): the
        transaction's first offset, and the first offset of the earliest transaction of
        another producer still open (else the marker's offset + 1) as its last stable offset."""
        if marker.committed or marker.expected_txn_first_offset < 0:
            return None
        last_stable_offset = next((first_offset for producer_id, first_offset in self.producer_state.open_transactions()
                                   if producer_id != marker.producer_id), marker_offset + 1)
        return AbortedTxn(marker.producer_id, marker.expected_txn_first_offset, marker_offset, last_stable_offset)

    def _advance_locked(self, log_end_offset: int, record_count: int) -> None:
        """After a write: move the log end (and, unreplicated, the high watermark), publish."""
        self._log_end_offset = log_end_offset
        if not self._replicated:
            self._high_watermark = log_end_offset   # one node: everything written is committed
            self.producer_state.on_high_watermark_updated(log_end_offset)
        self._unflushed_records += record_count
        self._publish()

    # ---- replication ----------------------------------------------------------------------

    @property
    def replicated(self) -> bool:
        return self._replicated

    def set_replicated(self, replicated: bool) -> None:
        """A partition of a cluster: from now on the high watermark moves only through
        `update_high_watermark` (the replica manager's, from the ISR's log ends)."""
        with self._lock:
            if replicated and not self._replicated and self._checkpointed_high_watermark is not None:
                # back from a restart: only what the ISR had confirmed counts as committed
                self._high_watermark = max(self._log_start_offset,
                                           min(self._checkpointed_high_watermark, self._log_end_offset))
                self._checkpointed_high_watermark = None
                self._publish()
            self._replicated = replicated
            if not replicated and self._high_watermark != self._log_end_offset:
                self._high_watermark = self._log_end_offset
                self.producer_state.on_high_watermark_updated(self._log_end_offset)
                self._publish()

    def update_high_watermark(self, offset: int) -> int:
        """Set the high watermark (clamped to [log start, log end]); returns it. A leader's
        only moves up (its core guarantees it); a follower takes the leader's."""
        with self._lock:
            self._check_open()
            offset = max(self._log_start_offset, min(offset, self._log_end_offset))
            if offset != self._high_watermark:
                self._high_watermark = offset
                self.producer_state.on_high_watermark_updated(offset)
                self._publish()
            return offset

    def append_as_follower(self, records, now_ms: int) -> LogAppendInfo:
        """Append batches a follower fetched from its leader, byte for byte as the leader
        wrote them (offsets and leader epochs included). The first batch must start at the
        log end and the batches must follow each other; their headers and CRCs are checked
        as for any append. Producer state, transaction indexes and the leader epoch cache
        are rebuilt from the batches as recovery rebuilds them (no sequence rules: the
        leader applied them). The high watermark does not move. Raises InvalidRecordError
        (changing nothing) for an overlap, and for a gap unless the topic is compacted (the
        leader's cleaner removed those offsets)."""
        prepared = prepare_batches(records, AppendOrigin.REPLICATION, self.config, self.name, self.topic)
        view = memoryview(records)
        with self._lock:
            self._check_open()
            expected = self._log_end_offset
            # the leader's cleaner leaves gaps in a compacted log; anywhere else a gap is a bug
            gaps_allowed = self.config.compact
            for header in prepared.headers:
                if header.base_offset != expected and not (gaps_allowed and header.base_offset > expected):
                    raise InvalidRecordError(
                        f"{self.name}: a follower append must continue at offset {expected}, but a batch "
                        f"starts at {header.base_offset}")
                expected = header.next_offset
            first_offset = self._log_end_offset
            for header in prepared.headers:
                data = bytes(view[header.position:header.position + header.size_bytes])
                local = header._replace(position=0)
                completed = None
                if header.is_control:
                    marker = decode_control_record(data, local) if header.producer_id != NO_PRODUCER_ID else None
                    if marker is not None:
                        completed = self.producer_state.update_from_replay(header, control_marker=marker)
                elif header.producer_id != NO_PRODUCER_ID:
                    self.producer_state.update_from_replay(header)
                aborted = completed.to_aborted_txn() if completed is not None and completed.is_aborted else None
                if header.partition_leader_epoch > self.leader_epoch_cache.latest_epoch:
                    self.leader_epoch_cache.assign(header.partition_leader_epoch, header.base_offset)
                active = self._segment_for_append_locked(header.size_bytes, header.max_timestamp,
                                                         header.base_offset, header.last_offset, now_ms)
                active.append(data, [local], header.max_timestamp, aborted_txn=aborted)
                self._advance_locked(header.next_offset, header.records_count)
            flush_now = self._unflushed_records >= self.config.flush_messages
        if flush_now:
            self.flush()
        return LogAppendInfo(first_offset, expected - 1, prepared.max_timestamp_ms, -1, prepared.record_count,
                             len(prepared.headers))

    def truncate_to(self, offset: int, now_ms: int | None = None) -> int:
        """Remove every batch at or after `offset` (Kafka's truncateTo): a follower cutting
        what its leader does not have. A batch that straddles `offset` goes whole, so the
        new log end may be below it; returns the new log end. Producer state is rebuilt
        from the newest snapshot below the cut, transaction-index entries and leader epochs
        past it go, the high watermark and recovery point come down with it. Segments above
        are renamed .deleted and removed after file.delete.delay.ms, like retention's, so a
        read in flight is not broken; the segment holding the cut is cut in place."""
        now_ms = _now_ms() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            if offset >= self._log_end_offset:
                return self._log_end_offset
            if offset <= self._log_start_offset:
                self._truncate_fully_locked(max(offset, 0) if offset < self._log_start_offset
                                            else self._log_start_offset, now_ms)
                return self._log_end_offset
            index = max(0, bisect_right(self._base_offsets, offset) - 1)
            doomed = self._segments[index + 1:]
            for segment in doomed:
                segment.mark_deleted()
                self._pending_deletions.append((now_ms + self.config.file_delete_delay_ms, segment))
            kept = self._segments[:index + 1]
            segment = kept[-1]
            cut_position = segment.size_bytes
            for header in segment.iter_batches(0, segment.size_bytes):
                if header.last_offset >= offset:
                    cut_position = header.position
                    break
            segment.truncate_at(cut_position)
            segment.txn_index.truncate_to(segment.next_offset)
            for earlier in kept[:-1]:
                earlier.txn_index.truncate_to(segment.next_offset)
            self._segments = kept
            self._base_offsets = tuple(s.base_offset for s in kept)
            new_end = segment.next_offset
            self._log_end_offset = new_end
            self._high_watermark = min(self._high_watermark, new_end)
            self.recovery_point = min(self.recovery_point, new_end)
            self.producer_state.truncate_to(new_end)
            self._load_producer_state(now_ms, None)
            self.leader_epoch_cache.truncate_from_end(new_end)
            self._publish()
            log.info("%s: truncated to offset %d (asked %d)", self.name, new_end, offset)
            return new_end

    def truncate_fully_and_start_at(self, offset: int, now_ms: int | None = None) -> None:
        """Empty the log and start it again at `offset` (a follower whose log end is below
        its leader's log start)."""
        now_ms = _now_ms() if now_ms is None else now_ms
        with self._lock:
            self._check_open()
            self._truncate_fully_locked(offset, now_ms)

    def _truncate_fully_locked(self, offset: int, now_ms: int) -> None:
        for segment in self._segments:
            segment.mark_deleted()
            self._pending_deletions.append((now_ms + self.config.file_delete_delay_ms, segment))
        fresh = self._new_segment(offset, now_ms)
        self._segments = (fresh,)
        self._base_offsets = (offset,)
        self._log_start_offset = offset
        self._log_end_offset = offset
        self._high_watermark = offset
        self.recovery_point = offset
        self.producer_state.truncate_to(0)
        self.producer_state.delete_snapshots_before(offset + 1)
        self.producer_state.load(offset, offset, now_ms=now_ms)
        self.leader_epoch_cache.clear()
        self._publish()
        log.info("%s: emptied and restarted at offset %d", self.name, offset)

    def roll(self, now_ms: int) -> LogSegment:
        """Start a new segment now (if the active one holds anything); return the active one."""
        with self._lock:
            self._check_open()
            if self._segments[-1].is_empty:
                return self._segments[-1]
            segment = self._roll_locked(now_ms, "requested")
            self._publish()
            return segment

    def _segment_for_append_locked(self, incoming_bytes: int, max_timestamp_ms: int, first_offset: int,
                                   last_offset: int, now_ms: int) -> LogSegment:
        """The segment the next batches go to: the active one, rolled first when they would
        not fit it (segment.bytes, segment.ms, a full index). Both append paths use it."""
        config = self.config
        active = self._segments[-1]
        reason = active.roll_reason(
            incoming_bytes=incoming_bytes, incoming_max_timestamp_ms=max_timestamp_ms,
            incoming_last_offset=last_offset, now_ms=now_ms,
            segment_bytes=config.segment_bytes, segment_ms=config.segment_ms)
        if reason is None:
            return active
        try:
            return self._roll_locked(now_ms, reason)
        except OSError as e:
            raise StorageError(f"{self.name}: could not roll a new segment at offset {first_offset}: {e}") from e

    def _roll_locked(self, now_ms: int, reason: str) -> LogSegment:
        new_base = self._log_end_offset
        old = self._segments[-1]
        segment = self._new_segment(new_base, now_ms)
        old.seal()
        self._segments += (segment,)
        self._base_offsets += (new_base,)
        # Kafka snapshots the producer state at every roll, so recovery replays at most one
        # segment's batches.
        self.producer_state.take_snapshot(new_base)
        log.info("%s: rolled segment %d at offset %d (%s)", self.name, old.base_offset, new_base, reason)
        return segment

    def _publish(self) -> None:
        high_watermark = self._high_watermark
        first_unstable_offset = self.producer_state.first_unstable_offset()
        if first_unstable_offset is None:
            last_stable_offset = high_watermark
        else:
            # an open transaction that began before the log start cannot hold readers
            # back below the start (Kafka's rule as well)
            last_stable_offset = min(high_watermark, max(first_unstable_offset, self._log_start_offset))
        self._view = _LogView(self._segments, self._base_offsets, self._segments[-1].size_bytes,
                              self._log_start_offset, self._log_end_offset, high_watermark, last_stable_offset)

    def _check_open(self) -> None:
        if self._closed:
            raise StorageError(f"{self.name}: the log is closed")

    # ---- read -------------------------------------------------------------------------

    def read(self, fetch_offset: int, max_bytes: int, *, max_offset_exclusive: int | None = None,
             min_one_batch: bool = True, isolation_committed: bool = False) -> FetchData:
        """Whole batches from the one holding `fetch_offset`, at most `max_bytes` of them
        (but at least one when `min_one_batch`), none reaching the limit: the snapshot's
        high watermark by default (what consumers may see; equal to the log end on one node,
        where every append moves both), or `max_offset_exclusive` capped at the log end (a
        reader allowed past the high watermark, such as a follower, passes its own bound).

        `isolation_committed` (read_committed): nothing at or past the last stable offset
        either, and `aborted_transactions` lists the aborted transactions overlapping the
        returned batches ([first_offset, end of the last batch)), found in the transaction
        indexes of the segment holding the first batch and the ones after it. The records,
        offsets and aborted transactions all come from one published snapshot.

        Raises OffsetOutOfRangeError outside [log_start_offset, log_end_offset]; at
        log_end_offset (or at/past the last stable offset under read_committed) the answer
        is empty.
        """
        view = self._view
        if fetch_offset < view.log_start_offset or fetch_offset > view.log_end_offset:
            raise OffsetOutOfRangeError(
                f"{self.name}: fetch offset {fetch_offset} is outside the log's range "
                f"[{view.log_start_offset}, {view.log_end_offset}]")
        limit = view.high_watermark if max_offset_exclusive is None else min(max_offset_exclusive,
                                                                             view.log_end_offset)
        if isolation_committed and view.last_stable_offset < limit:
            limit = view.last_stable_offset
        if fetch_offset < limit:
            last = len(view.segments) - 1
            for i in range(max(0, bisect_right(view.base_offsets, fetch_offset) - 1), last + 1):
                segment = view.segments[i]
                end_position = view.active_end_position if i == last else segment.size_bytes
                found = _read_from_segment(segment, fetch_offset, limit, end_position, max_bytes, min_one_batch,
                                           limit_is_log_end=limit == view.log_end_offset)
                if found is not None:
                    records, first_offset = found
                    aborted: list[AbortedTxn] | tuple = ()
                    if isolation_committed and records:
                        # empty indexes (most segments) can neither add an entry nor end the walk
                        aborted = collect_aborted_transactions(
                            (s.txn_index for s in view.segments[i:] if len(s.txn_index)), first_offset,
                            _end_offset_of(records))
                    return FetchData(records, first_offset, view.high_watermark, view.log_start_offset,
                                     view.last_stable_offset, aborted)
        return FetchData(b"", fetch_offset, view.high_watermark, view.log_start_offset, view.last_stable_offset)

    def offset_for_timestamp(self, timestamp_ms: int, *, max_offset_exclusive: int | None = None,
                             isolation_committed: bool = False) -> tuple[int, int] | None:
        """(offset, timestamp) of the earliest record whose timestamp is >= `timestamp_ms`,
        or None when there is none (below `max_offset_exclusive`, default the high watermark,
        and below the last stable offset for a read_committed reader)."""
        view = self._view
        limit = view.high_watermark if max_offset_exclusive is None else min(max_offset_exclusive,
                                                                             view.log_end_offset)
        if isolation_committed and view.last_stable_offset < limit:
            limit = view.last_stable_offset
        min_offset = view.log_start_offset
        last = len(view.segments) - 1
        for i, segment in enumerate(view.segments):
            if segment.max_timestamp_ms < timestamp_ms:
                continue  # every batch in it is older (the maximum covers at least the view)
            end_position = view.active_end_position if i == last else segment.size_bytes
            while True:
                header = segment.find_batch_by_timestamp(timestamp_ms, min_offset, end_position)
                if header is None:
                    break
                if header.base_offset >= limit:
                    return None
                found = _first_record_at_or_after(segment, header, timestamp_ms, min_offset)
                if found is not None:
                    return found if found[0] < limit else None
                # the batch's newer records all lie below the log start offset: go on
                min_offset = header.next_offset
        return None

    # ---- retention --------------------------------------------------------------------

    def delete_old_segments(self, now_ms: int) -> int:
        """Delete the oldest segments past retention.ms / retention.bytes or wholly below
        the log start offset; never the active segment. Returns how many were deleted."""
        config = self.config
        with self._lock:
            self._check_open()
            segments = self._segments
            deletable = len(segments) - 1   # never the active segment
            by_time = 0
            # a compact-only topic keeps every segment the cleaner leaves (Kafka's rule)
            if config.retention_ms >= 0 and config.delete:
                while by_time < deletable and now_ms - segments[by_time].largest_timestamp_ms > config.retention_ms:
                    by_time += 1
            by_size = 0
            if config.retention_bytes >= 0 and config.delete:
                excess = sum(s.size_bytes for s in segments) - config.retention_bytes
                while by_size < deletable and excess - segments[by_size].size_bytes >= 0:
                    excess -= segments[by_size].size_bytes
                    by_size += 1
            by_start = 0
            while by_start < deletable and segments[by_start + 1].base_offset <= self._log_start_offset:
                by_start += 1
            count = max(by_time, by_size, by_start)
            if count:
                reasons = [name for name, n in (("retention.ms", by_time), ("retention.bytes", by_size),
                                                ("log start offset", by_start)) if n == count]
                self._delete_segments_locked(count, now_ms, " and ".join(reasons))
        self._destroy_due(now_ms)
        return count

    def delete_records_before(self, offset: int, now_ms: int) -> int:
        """Move the log start offset to `offset` (DeleteRecords) and drop whole segments
        below it. `offset` may not pass the high watermark. Returns the log start offset."""
        with self._lock:
            self._check_open()
            if offset > self._high_watermark or offset < 0:
                raise OffsetOutOfRangeError(
                    f"{self.name}: cannot delete records before {offset}: the high watermark is "
                    f"{self._high_watermark}")
            if offset > self._log_start_offset:
                self._log_start_offset = offset
                # as Kafka's maybeIncrementLogStartOffset: the epoch covering the new start
                # starts there (OffsetsForLeaderEpoch never answers an offset below it)
                self.leader_epoch_cache.truncate_from_start(offset)
                count = 0
                while count < len(self._segments) - 1 and self._segments[count + 1].base_offset <= offset:
                    count += 1
                if count:
                    self._delete_segments_locked(count, now_ms, "delete records")
                self._publish()
            start = self._log_start_offset
        self._destroy_due(now_ms)
        return start

    def _delete_segments_locked(self, count: int, now_ms: int, reason: str) -> None:
        doomed, self._segments = self._segments[:count], self._segments[count:]
        self._base_offsets = self._base_offsets[count:]
        self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
        self.recovery_point = max(self.recovery_point, self._segments[0].base_offset)
        self._publish()
        due_ms = now_ms + self.config.file_delete_delay_ms
        for segment in doomed:
            segment.mark_deleted()
            self._pending_deletions.append((due_ms, segment))
        self.producer_state.delete_snapshots_before(self._segments[0].base_offset)
        log.info("%s: deleted %d segment(s) by %s; log start offset %d", self.name, count, reason,
                 self._log_start_offset)

    def _destroy_due(self, now_ms: int | None) -> None:
        """Close and unlink deleted segments whose delay passed (all of them when now_ms is None)."""
        with self._lock:
            due = [s for t, s in self._pending_deletions if now_ms is None or t <= now_ms]
            self._pending_deletions = [(t, s) for t, s in self._pending_deletions
                                       if not (now_ms is None or t <= now_ms)]
        for segment in due:
            segment.destroy()

    # ---- compaction (the log's side; the cleaner is broker/storage/cleaner.py) ---------

    def snapshot(self) -> _LogView:
        """What a reader sees now (segments, offsets); immutable."""
        return self._view

    def producer_last_offsets(self) -> dict[int, tuple[int, int]]:
        """producer id -> (the last offset of its last data batch here, or -1 when its state
        holds none, e.g. after a transactions-v2 marker bumped its epoch; its epoch). The
        cleaner keeps that batch, emptied if need be, or else the markers of that epoch, so
        the producer's sequence and epoch survive cleaning (Kafka's
        lastRecordsOfActiveProducers)."""
        with self._lock:
            return {entry.producer_id: (entry.last_offset, entry.producer_epoch)
                    for entry in self.producer_state.active_producers()}

    def swap_in_cleaned(self, replaced: Sequence[LogSegment], cleaned_path: str, aborted: Sequence[AbortedTxn],
                        now_ms: int, step=None) -> bool:
        """Replace the consecutive, sealed segments `replaced` by the cleaned segment at
        `cleaned_path` (a fsynced `<base>.log.cleaned`, base = the first replaced one's):

        1. rename it `<base>.log.swap` (fsync the directory): from here recovery finishes
           the swap (`log_loader.complete_swaps`);
        2. rename the replaced segments' files `.deleted` (their descriptors stay open for
           readers of the previous view until file.delete.delay.ms);
        3. rename the swap file `<base>.log`, rebuild its indexes, write the aborted
           transactions it still holds markers of into its `.txnindex`, publish.

        All under the log's lock, after checking that `replaced` are still this log's
        segments (retention or a truncation may have changed them since the cleaner read
        them): False, and the cleaned file removed, when they are not. `step(name)` is
        called after each step (tests kill the process there)."""
        base_offset = replaced[0].base_offset
        directory = self.directory
        swap_path = os.path.join(directory, segment_file_name(base_offset, LOG_SUFFIX + SWAP_SUFFIX))
        with self._lock:
            segments = self._segments
            first = next((i for i, s in enumerate(segments) if s is replaced[0]), None)
            if (self._closed or first is None or first + len(replaced) >= len(segments)
                    or any(segments[first + i] is not s for i, s in enumerate(replaced))):
                remove_file(cleaned_path)
                return False
            os.rename(cleaned_path, swap_path)
            fsync_directory(directory)
            if step:
                step("swap")
            for segment in replaced:
                segment.mark_deleted()
            fsync_directory(directory)
            if step:
                step("deleted")
            os.rename(swap_path, os.path.join(directory, segment_file_name(base_offset, LOG_SUFFIX)))
            cleaned = LogSegment.open_existing(directory, base_offset,
                                               index_interval_bytes=self.config.index_interval_bytes,
                                               max_index_bytes=self.config.segment_index_bytes, now_ms=now_ms)
            cleaned.recover(verify_crc=False)
            cleaned.reset_txn_index()
            for entry in aborted:
                cleaned.txn_index.append(entry)
            cleaned.flush()
            cleaned.seal()
            fsync_directory(directory)
            if step:
                step("live")
            last = first + len(replaced)
            self._segments = segments[:first] + (cleaned,) + segments[last:]
            self._base_offsets = tuple(s.base_offset for s in self._segments)
            self._publish()
            due_ms = now_ms + self.config.file_delete_delay_ms
            self._pending_deletions.extend((due_ms, segment) for segment in replaced)
        return True

    # ---- flush ------------------------------------------------------------------------

    def flush(self, offset: int | None = None, *, now_ms: int | None = None) -> None:
        """fsync every segment holding offsets below `offset` (default: the log end) and
        move the recovery point there."""
        with self._lock:
            self._check_open()
            target = self._log_end_offset if offset is None else min(offset, self._log_end_offset)
            if target <= self.recovery_point:
                return
            first = max(0, bisect_right(self._base_offsets, self.recovery_point) - 1)
            last = max(0, bisect_right(self._base_offsets, target - 1) - 1)
            segments = self._segments[first:last + 1]
            unflushed = self._unflushed_records
        # fsync outside the lock: appends continue meanwhile (the files only grow)
        try:
            for segment in segments:
                segment.flush()
        except (OSError, ValueError):
            with self._lock:
                closed = self._closed
            if closed:
                # Deleted meanwhile (delete_log closes and removes the files): not a disk
                # failure, which would take the whole log dir offline.
                raise StorageError(f"{self.name}: the log was closed while it was being flushed") from None
            raise
        with self._lock:
            if target > self.recovery_point:
                self.recovery_point = target
            if target >= self._log_end_offset:
                self._unflushed_records = 0
            else:
                self._unflushed_records = max(0, self._unflushed_records - unflushed)
            if now_ms is not None:
                self._last_flush_ms = now_ms

    def maybe_flush(self, now_ms: int) -> bool:
        """Flush by flush.messages / flush.ms; otherwise fsync segments already rolled
        (Kafka does so after each roll). Returns whether the whole log was flushed."""
        config = self.config
        with self._lock:
            if self._closed:
                return False
            pending = self._unflushed_records > 0
            flush_all = pending and (self._unflushed_records >= config.flush_messages
                                     or now_ms - self._last_flush_ms >= config.flush_ms)
            active_base = self._segments[-1].base_offset
            if not pending:
                self._last_flush_ms = now_ms
        if flush_all:
            self.flush(now_ms=now_ms)
            return True
        if active_base > self.recovery_point:
            self.flush(active_base)
        return False

    # ---- lifecycle --------------------------------------------------------------------

    def update_config(self, config: TopicConfig) -> None:
        with self._lock:
            self.config = config
            self._segments[-1].index_interval_bytes = config.index_interval_bytes

    def remove_expired_producers(self, now_ms: int) -> list[int]:
        with self._lock:
            return self.producer_state.remove_expired(now_ms)

    def close(self, *, clean: bool = True) -> None:
        """Close the files. `clean`: flush everything and snapshot the producer state first
        (a clean shutdown); without it nothing is written (a log being deleted)."""
        if self._closed:
            return
        if clean:
            self.flush()
            with self._lock:
                self.producer_state.take_snapshot(self._log_end_offset)
        with self._lock:
            self._closed = True
            for segment in self._segments:
                segment.close()
        self._destroy_due(None)

    def __repr__(self) -> str:
        view = self._view
        return (f"Log({self.name}, offsets [{view.log_start_offset}, {view.log_end_offset}), "
                f"{len(view.segments)} segment(s))")


# ---- helpers ------------------------------------------------------------------------------

def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _read_from_segment(segment: LogSegment, fetch_offset: int, limit: int, end_position: int, max_bytes: int,
                       min_one_batch: bool, *, limit_is_log_end: bool) -> tuple[bytes, int] | None:
    """(whole batches, base offset of the first) from `segment`; None when the segment has
    nothing at or after `fetch_offset` below `end_position` (try the next one).

    Readers get v2 batches only: the v0/v1 entries of a segment an old Kafka wrote are
    up-converted here, per read, as Kafka converts per fetch (same offsets; `max_bytes`
    bounds the converted bytes too, but the first batch is always whole)."""
    found = _read_stored(segment, fetch_offset, limit, end_position, max_bytes, min_one_batch,
                         limit_is_log_end=limit_is_log_end)
    # (checked after the read: the walk that found the batches marks a segment holding them)
    if found is not None and found[0] and segment.holds_legacy_entries:
        return up_convert(found[0], max_bytes), found[1]
    return found


def _read_stored(segment: LogSegment, fetch_offset: int, limit: int, end_position: int, max_bytes: int,
                 min_one_batch: bool, *, limit_is_log_end: bool) -> tuple[bytes, int] | None:
    """`_read_from_segment`'s bytes as stored."""
    first = segment.find_batch(fetch_offset, end_position)
    if first is None:
        return None
    if first.last_offset >= limit:
        return b"", fetch_offset
    if not limit_is_log_end:
        # Batches are whole units: stop before the one that holds `limit`.
        stop = segment.find_batch(limit, end_position)
        if stop is not None:
            end_position = stop.position
    start = first.position
    available = end_position - start
    if available <= max_bytes:
        return segment.read_bytes(start, available), first.base_offset
    if first.size_bytes > max_bytes:
        if not min_one_batch:
            return b"", fetch_offset
        return segment.read_bytes(start, first.size_bytes), first.base_offset
    data = segment.read_bytes(start, max_bytes)
    # Keep whole batches only: walk the lengths and cut after the last complete one.
    position = 0
    unpack_length = BATCH_LENGTH_STRUCT.unpack_from
    while position + 12 <= max_bytes:
        size = unpack_length(data, position + _BATCH_LENGTH_AT)[0] + 12
        if position + size > max_bytes:
            break
        position += size
    return data[:position], first.base_offset


def _end_offset_of(records: bytes) -> int:
    """The offset after the last batch of `records` (whole batches, as read): a walk over
    the batch lengths, then the last header's base offset and last offset delta."""
    unpack_length = BATCH_LENGTH_STRUCT.unpack_from
    position = last_position = 0
    size = len(records)
    while position < size:
        last_position = position
        position += unpack_length(records, position + _BATCH_LENGTH_AT)[0] + 12
    return (_BASE_OFFSET_STRUCT.unpack_from(records, last_position)[0]
            + _LAST_OFFSET_DELTA_STRUCT.unpack_from(records, last_position + 23)[0] + 1)


def _first_record_at_or_after(segment: LogSegment, header: BatchHeader, timestamp_ms: int,
                              min_offset: int) -> tuple[int, int] | None:
    """Within one batch, the first record at or after `min_offset` with a timestamp >=
    `timestamp_ms`. The one place storage reads records: ListOffsets by time needs it."""
    if header.attributes & TIMESTAMP_TYPE_MASK:
        # LogAppendTime: every record carries the batch's max timestamp
        return max(header.base_offset, min_offset), header.max_timestamp
    from eos.records.codec import decode_records  # only this rare path decodes records

    data = segment.read_bytes(header.position, header.size_bytes)
    if header.magic != MAGIC_V2:     # a v0/v1 entry: its records as a reader gets them
        data = up_convert(data)
        header = parse_header(data, 0)
    for record in decode_records(data, header._replace(position=0), "", 0):
        if record.offset >= min_offset and record.timestamp >= timestamp_ms:
            return record.offset, record.timestamp
    return None
