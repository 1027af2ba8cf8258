"""Idempotent producers' state for one partition: epochs, sequences, retained batches, snapshots.

Theory of operation
-------------------
Every batch an idempotent producer sends carries (producer_id, producer_epoch, base_sequence);
the sequence counts records per partition and wraps to 0 after 2**31 - 1. The broker keeps,
per producer, the epoch and the metadata (sequence range, offsets, max timestamp) of the
last `RETAINED_BATCHES_MAX` (5) batches, the same number as the client's in-flight limit, so
any retry of a request the client may still have outstanding is recognised. The rules follow
Apache Kafka's broker (`ProducerStateEntry`, `ProducerAppendInfo`; KIP-98, KIP-360):

1. A batch with the current epoch and the exact first and last sequence of a retained batch
   is a duplicate: it gets the original offsets back (`DuplicateBatch`) and nothing is
   appended. This check comes first.
2. Older epoch than the current one: INVALID_PRODUCER_EPOCH (a zombie is fenced).
3. Same epoch: base_sequence must be last_sequence + 1 (0 after 2**31 - 1), otherwise
   OUT_OF_ORDER_SEQUENCE_NUMBER. That covers gaps, a batch overlapping a retained one
   without being identical, and a retry of a batch older than the retained ones. Modern
   Kafka brokers never answer DUPLICATE_SEQUENCE_NUMBER; neither do we.
4. Newer epoch: base_sequence must be 0 (a bumped epoch starts its sequences afresh, KIP-360);
   the retained batches of the old epoch are forgotten.
5. Unknown producer (never seen, expired, or its state lost): any epoch and any sequence is
   accepted, as in Kafka since 2.5 (KIP-360: the broker no longer answers
   UNKNOWN_PRODUCER_ID; "if there is no current producer epoch ... accept writes with any
   sequence number"). The reason: state legitimately disappears (producer.id.expiration.ms,
   retention, DeleteRecords), and a producer with requests in flight must be able to carry
   on rather than fail. The price is that a retry arriving after its producer's state
   expired is appended again; producer.id.expiration.ms (1 day) is far longer than any
   client's delivery timeout, which keeps that window theoretical.

Validation is staged apart from mutation, as in Kafka's storage layer: `prepare_append`
reads the state and returns a `ProducerAppend` (or a `DuplicateBatch`, or raises) and
changes nothing; the log writes the bytes; then `apply` records the batch with the offsets
the log gave it. A `ProducerAppend` remembers the state it was checked against, and
`apply` refuses it (InvariantError) if that state moved in between: a caller bug, never
bad input. Recovery feeds the log's batches to `update_from_replay`, which trusts them.

Durable form: snapshots `<end_offset:020d>.snapshot` in Kafka's producer snapshot layout
version 1 (big-endian)::

    version i16 (= 1) | crc u32 (CRC-32C of every byte after this field) |
    entries: count i32, then per producer
      producer_id i64, epoch i16, last_sequence i32, last_offset i64, offset_delta i32,
      timestamp i64, coordinator_epoch i32, current_txn_first_offset i64

As in Kafka only each producer's last batch is in a snapshot, so after a restart a retry of
an older batch than the last gets OUT_OF_ORDER_SEQUENCE_NUMBER (exactly what Kafka answers
there; the batch is in the log, the client just cannot learn its offset). `load` picks the newest readable
snapshot inside [log_start_offset, log_end_offset], deletes corrupt ones and ones past the
log end, and tells the log where to start replaying. Producers whose batches were all
removed by retention are kept until they expire (Kafka since KIP-360 / KAFKA-7190 keeps
producer state longer than the log data, because dropping it only turns retries into
"unknown producer" appends); so a restart neither adds nor removes producers compared with
a broker that stayed up.

Expiration (producer.id.expiration.ms, default 1 day) is measured, as in Kafka, from the
producer's last timestamp: the max timestamp of its last batch. A producer with an open
transaction never expires (transactions are issue 4; the fields coordinator_epoch and
current_txn_first_offset are carried and persisted, not yet interpreted).

Not thread-safe: one partition's log owns its manager and serialises calls to it.
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass

from crc32c import crc32c

from eos.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvariantError,
    OutOfOrderSequenceError,
)
from eos.records.header import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP, BatchHeader

RETAINED_BATCHES_MAX = 5
SEQUENCE_MAX = 0x7FFFFFFF             # 2**31 - 1; the next sequence is 0
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000

SNAPSHOT_VERSION = 1
SNAPSHOT_SUFFIX = ".snapshot"
_SNAPSHOT_TMP_SUFFIX = ".snapshot.tmp"
_SNAPSHOT_NAME = re.compile(r"^(\d{20})\.snapshot$")
_SNAPSHOT_TMP_NAME = re.compile(r"^(\d{20})\.snapshot\.tmp$")
_SNAPSHOT_HEAD = struct.Struct(">hI")          # version, crc
_SNAPSHOT_COUNT = struct.Struct(">i")
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")   # 46 bytes, no padding with '>'
_SNAPSHOT_CRC_START = _SNAPSHOT_HEAD.size      # the CRC covers everything after itself


def next_sequence(sequence: int) -> int:
    """The sequence after `sequence`, wrapping after 2**31 - 1 to 0."""
    return 0 if sequence == SEQUENCE_MAX else sequence + 1


def _sequence_minus(sequence: int, delta: int) -> int:
    """`sequence - delta` on the 31-bit sequence circle."""
    return (sequence - delta) & SEQUENCE_MAX


def snapshot_path(partition_dir: str, end_offset: int) -> str:
    return os.path.join(partition_dir, f"{end_offset:020d}{SNAPSHOT_SUFFIX}")


class CorruptSnapshotError(CorruptRecordError):
    """A snapshot file cannot be trusted (bad CRC, short, unknown version). `load` deletes it;
    `read_snapshot_file` raises it (the CLI reports it as any corrupt data)."""


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What the broker remembers of one appended batch."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp_ms: int

    @property
    def offset_delta(self) -> int:
        return self.last_offset - self.first_offset


@dataclass(frozen=True, slots=True)
class ProducerStateEntry:
    """One producer's state in one partition. Immutable: `apply` replaces it whole."""

    producer_id: int
    producer_epoch: int
    batches: tuple[BatchMetadata, ...]   # oldest first, at most RETAINED_BATCHES_MAX
    last_timestamp_ms: int
    coordinator_epoch: int = -1          # issue 4: epoch of the coordinator that wrote the last marker
    current_txn_first_offset: int = -1   # issue 4: first offset of the open transaction, -1 if none

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, producer_epoch: int, first_sequence: int, last_sequence: int) -> BatchMetadata | None:
        if producer_epoch != self.producer_epoch:
            return None
        for batch in self.batches:
            if batch.first_sequence == first_sequence and batch.last_sequence == last_sequence:
                return batch
        return None


@dataclass(frozen=True, slots=True)
class DuplicateBatch:
    """A retry of a retained batch: answer with the original offsets, append nothing."""

    first_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class ProducerAppend:
    """A validated batch waiting for its offsets; produced by prepare_append, consumed by apply.

    expected_epoch / expected_last_sequence record the state the batch was validated
    against (NO_PRODUCER_EPOCH / NO_SEQUENCE for an unknown producer), so that `apply` can
    prove nothing moved in between.
    """

    producer_id: int
    producer_epoch: int
    first_sequence: int
    last_sequence: int
    offset_delta: int
    max_timestamp_ms: int
    is_transactional: bool
    expected_epoch: int
    expected_last_sequence: int


class ProducerStateManager:
    """All producers' state for one partition."""

    def __init__(self, partition_dir: str, *, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS):
        if producer_id_expiration_ms <= 0:
            raise ValueError(f"producer_id_expiration_ms must be positive, got {producer_id_expiration_ms}")
        self.partition_dir = partition_dir
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        # Set by truncate_to: the in-memory state no longer matches the log until load().
        self._needs_load = False

    # ---- validation (pure) ------------------------------------------------------------

    def prepare_append(self, header: BatchHeader, now_ms: int) -> ProducerAppend | DuplicateBatch:
        """Check one batch against the current state; return what to apply. Changes nothing.

        Raises OutOfOrderSequenceError, InvalidProducerEpochError (the rules in the module
        docstring) or InvalidRecordError (an idempotent batch without a sequence or epoch).
        `now_ms` stands in for the batch's timestamp when it carries none.
        """
        self._check_loaded()
        entry = self._producers.get(header.producer_id)
        return self._validate(header, entry, entry, now_ms)

    def prepare_appends(self, headers, now_ms: int) -> list[ProducerAppend | None] | DuplicateBatch:
        """Check every batch of one produce buffer, each against the state the earlier
        ones would leave (several batches of one producer in a buffer are legal). Changes
        nothing.

        Returns a list aligned with `headers` (None for a batch without producer id), to
        be applied in order, or, when any batch is a retry of a retained batch, that
        batch's DuplicateBatch for the whole buffer (Kafka answers the whole request as the
        duplicate). Raises as prepare_append does, for the first failing batch.
        """
        self._check_loaded()
        pending: dict[int, ProducerStateEntry | None] = {}
        appends: list[ProducerAppend | None] = []
        for header in headers:
            producer_id = header.producer_id
            if producer_id == NO_PRODUCER_ID:
                appends.append(None)
                continue
            committed = self._producers.get(producer_id)
            entry = pending[producer_id] if producer_id in pending else committed
            outcome = self._validate(header, entry, committed, now_ms)
            if isinstance(outcome, DuplicateBatch):
                return outcome
            appends.append(outcome)
            # The offsets are not known yet; a placeholder batch carries the sequences and
            # epoch that the next batch of this producer is checked against.
            pending[producer_id] = _entry_after(entry, outcome, -1, -1 + outcome.offset_delta)
        return appends

    def _validate(self, header: BatchHeader, entry: ProducerStateEntry | None,
                  committed: ProducerStateEntry | None, now_ms: int) -> ProducerAppend | DuplicateBatch:
        """Rules 1-5 for `header` against `entry`; duplicates are looked up only in the
        `committed` state (batches that have offsets), as Kafka does."""
        producer_id = header.producer_id
        if producer_id == NO_PRODUCER_ID:
            raise InvariantError("a batch without producer id reached the producer state; the log must filter it")
        if header.is_control:
            # Transaction markers come through WriteTxnMarkers (issue 4), never Produce.
            raise InvariantError(f"control batch of producer {producer_id} reached prepare_append")
        epoch = header.producer_epoch
        first_sequence = header.base_sequence
        if epoch < 0 or first_sequence < 0:
            raise InvalidRecordError(
                f"batch of producer {producer_id} has epoch {epoch} and base sequence {first_sequence}: "
                f"an idempotent batch needs both to be non-negative")
        last_sequence = header.last_sequence
        timestamp_ms = header.max_timestamp if header.max_timestamp != NO_TIMESTAMP else now_ms

        if entry is None or entry.producer_epoch == NO_PRODUCER_EPOCH:
            # Rule 5: unknown producer, any epoch and sequence (see the module docstring).
            return ProducerAppend(producer_id, epoch, first_sequence, last_sequence, header.last_offset_delta,
                                  timestamp_ms, header.is_transactional, NO_PRODUCER_EPOCH, NO_SEQUENCE)

        current_epoch = entry.producer_epoch
        current_last_sequence = entry.last_sequence
        if epoch == current_epoch:
            expected = 0 if current_last_sequence == NO_SEQUENCE else next_sequence(current_last_sequence)
            if first_sequence != expected:
                # Rule 1 before rule 3: only a batch out of sequence can be a retry (a batch
                # in sequence cannot equal a retained range: they are far from wrapping).
                duplicate = None if committed is None else committed.find_duplicate(
                    epoch, first_sequence, last_sequence)
                if duplicate is not None:
                    return DuplicateBatch(duplicate.first_offset, duplicate.last_offset, duplicate.max_timestamp_ms)
                raise OutOfOrderSequenceError(
                    f"out of order sequence for producer {producer_id} epoch {epoch}: expected sequence "
                    f"{expected}, got {first_sequence}..{last_sequence}{_retained_note(entry)}")
        elif epoch < current_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} sent epoch {epoch}, older than the current epoch {current_epoch}")
        elif first_sequence != 0:
            raise OutOfOrderSequenceError(
                f"producer {producer_id} bumped its epoch from {current_epoch} to {epoch}: a new epoch must "
                f"start at sequence 0, got {first_sequence}")
        return ProducerAppend(producer_id, epoch, first_sequence, last_sequence, header.last_offset_delta,
                              timestamp_ms, header.is_transactional, current_epoch, current_last_sequence)

    # ---- mutation ---------------------------------------------------------------------

    def apply(self, append: ProducerAppend, first_offset: int, last_offset: int) -> None:
        """Record a batch the log has written at [first_offset, last_offset]."""
        if last_offset - first_offset != append.offset_delta or first_offset < 0:
            raise InvariantError(
                f"producer {append.producer_id}: offsets {first_offset}..{last_offset} do not match the "
                f"batch's last offset delta {append.offset_delta}")
        entry = self._producers.get(append.producer_id)
        current_epoch = entry.producer_epoch if entry is not None else NO_PRODUCER_EPOCH
        current_last_sequence = entry.last_sequence if entry is not None else NO_SEQUENCE
        if (current_epoch, current_last_sequence) != (append.expected_epoch, append.expected_last_sequence):
            raise InvariantError(
                f"producer {append.producer_id} state moved between prepare and apply: validated against "
                f"epoch {append.expected_epoch} sequence {append.expected_last_sequence}, now epoch "
                f"{current_epoch} sequence {current_last_sequence}")
        if entry is not None and first_offset <= entry.last_offset:
            raise InvariantError(
                f"producer {append.producer_id}: batch at offset {first_offset} is not after its last "
                f"batch at {entry.last_offset}")
        self._producers[append.producer_id] = _entry_after(entry, append, first_offset, last_offset)

    def update_from_replay(self, header: BatchHeader) -> None:
        """Rebuild state from a batch already in the log (recovery). No validation: the log
        is the truth. Batches without producer id are ignored."""
        producer_id = header.producer_id
        if producer_id == NO_PRODUCER_ID:
            return
        if header.is_control:
            return  # issue 4: markers end transactions and may bump the epoch
        entry = self._producers.get(producer_id)
        batch = BatchMetadata(header.base_sequence, header.last_sequence, header.base_offset, header.last_offset,
                              header.max_timestamp)
        if entry is None or entry.producer_epoch != header.producer_epoch:
            batches: tuple[BatchMetadata, ...] = (batch,)
        else:
            batches = entry.batches[1 - RETAINED_BATCHES_MAX:] + (batch,)
        last_timestamp_ms = header.max_timestamp
        if last_timestamp_ms == NO_TIMESTAMP and entry is not None:
            last_timestamp_ms = entry.last_timestamp_ms
        self._producers[producer_id] = ProducerStateEntry(
            producer_id, header.producer_epoch, batches, last_timestamp_ms,
            entry.coordinator_epoch if entry is not None else -1,
            entry.current_txn_first_offset if entry is not None else -1)

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms; return their ids, sorted."""
        expired = sorted(pid for pid, entry in self._producers.items() if self._is_expired(entry, now_ms))
        for producer_id in expired:
            del self._producers[producer_id]
        return expired

    def _is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        return (entry.current_txn_first_offset < 0
                and now_ms - entry.last_timestamp_ms >= self.producer_id_expiration_ms)

    # ---- queries ----------------------------------------------------------------------

    def active_producers(self) -> list[ProducerStateEntry]:
        """Every known producer, by id (for DescribeProducers)."""
        return [self._producers[pid] for pid in sorted(self._producers)]

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def snapshot_offsets(self) -> list[int]:
        """End offsets of the snapshot files present, ascending."""
        return sorted(offset for offset, _ in self._list_snapshots())

    # ---- snapshots --------------------------------------------------------------------

    def take_snapshot(self, end_offset: int) -> None:
        """Write the state as of `end_offset` (exclusive: the next offset the log will give)
        to `<end_offset:020d>.snapshot`, atomically: temp file, fsync, rename, fsync dir."""
        if end_offset < 0:
            raise ValueError(f"snapshot end offset must be >= 0, got {end_offset}")
        data = encode_snapshot(self._producers.values())
        final_path = snapshot_path(self.partition_dir, end_offset)
        tmp_path = final_path + ".tmp"
        fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, final_path)
        _fsync_dir(self.partition_dir)

    def load(self, log_start_offset: int, log_end_offset: int, *, now_ms: int | None = None) -> int:
        """Replace the in-memory state with the newest valid snapshot inside
        [log_start_offset, log_end_offset] and return the offset the log must replay from
        (that snapshot's offset, or log_start_offset when there is none).

        Deletes snapshots past the log end (their state describes batches the log no longer
        has), snapshots before the log start (the log between them and the start is gone,
        so replay could not bring them up to date), corrupt ones, and leftover temp files.
        With `now_ms`, producers already expired are not loaded.
        """
        if not 0 <= log_start_offset <= log_end_offset:
            raise ValueError(f"bad log range: start {log_start_offset}, end {log_end_offset}")
        self._producers = {}
        self._needs_load = False
        for name in os.listdir(self.partition_dir):
            if _SNAPSHOT_TMP_NAME.match(name):
                _remove_if_exists(os.path.join(self.partition_dir, name))
        usable = []
        for offset, path in self._list_snapshots():
            if offset > log_end_offset or offset < log_start_offset:
                _remove_if_exists(path)
            else:
                usable.append((offset, path))
        for offset, path in sorted(usable, reverse=True):
            try:
                with open(path, "rb") as snapshot_file:
                    entries = decode_snapshot(snapshot_file.read())
            except (CorruptSnapshotError, OSError):
                _remove_if_exists(path)
                continue
            for entry in entries:
                if now_ms is None or not self._is_expired(entry, now_ms):
                    self._producers[entry.producer_id] = entry
            return offset
        return log_start_offset

    def truncate_to(self, offset: int) -> None:
        """The log was cut to end at `offset`: delete snapshots past it and drop the
        in-memory state, which may describe cut batches. The caller reloads with load()."""
        for snapshot_offset, path in self._list_snapshots():
            if snapshot_offset > offset:
                _remove_if_exists(path)
        self._producers = {}
        self._needs_load = True

    def delete_snapshots_before(self, offset: int) -> None:
        for snapshot_offset, path in self._list_snapshots():
            if snapshot_offset < offset:
                _remove_if_exists(path)

    def _list_snapshots(self) -> list[tuple[int, str]]:
        found = []
        for name in os.listdir(self.partition_dir):
            match = _SNAPSHOT_NAME.match(name)
            if match:
                found.append((int(match.group(1)), os.path.join(self.partition_dir, name)))
        return found

    def _check_loaded(self) -> None:
        if self._needs_load:
            raise InvariantError("producer state was truncated; call load() before appending")


# ---- helpers ------------------------------------------------------------------------------

def _entry_after(entry: ProducerStateEntry | None, append: ProducerAppend,
                 first_offset: int, last_offset: int) -> ProducerStateEntry:
    batch = BatchMetadata(append.first_sequence, append.last_sequence, first_offset, last_offset,
                          append.max_timestamp_ms)
    if entry is None or entry.producer_epoch != append.producer_epoch:
        # A new epoch forgets the old epoch's batches: retries of them are fenced anyway.
        batches: tuple[BatchMetadata, ...] = (batch,)
    else:
        batches = entry.batches[1 - RETAINED_BATCHES_MAX:] + (batch,)
    if entry is None:
        return ProducerStateEntry(append.producer_id, append.producer_epoch, batches, append.max_timestamp_ms)
    return ProducerStateEntry(append.producer_id, append.producer_epoch, batches, append.max_timestamp_ms,
                              entry.coordinator_epoch, entry.current_txn_first_offset)


def _retained_note(entry: ProducerStateEntry) -> str:
    if not entry.batches:
        return ""
    ranges = ", ".join(f"{b.first_sequence}..{b.last_sequence}" for b in entry.batches)
    return f" (retained batches: {ranges})"


def encode_snapshot(entries) -> bytes:
    """Kafka's producer snapshot, version 1 (layout in the module docstring)."""
    body = bytearray(_SNAPSHOT_COUNT.pack(len(entries)))
    for entry in sorted(entries, key=lambda e: e.producer_id):
        last = entry.batches[-1] if entry.batches else None
        body += _SNAPSHOT_ENTRY.pack(
            entry.producer_id, entry.producer_epoch,
            last.last_sequence if last else NO_SEQUENCE,
            last.last_offset if last else -1,
            last.offset_delta if last else 0,
            entry.last_timestamp_ms, entry.coordinator_epoch, entry.current_txn_first_offset)
    return _SNAPSHOT_HEAD.pack(SNAPSHOT_VERSION, crc32c(bytes(body))) + body


def decode_snapshot(data: bytes) -> list[ProducerStateEntry]:
    """Parse a snapshot; CorruptSnapshotError when it is short, long, of another version, or
    fails its CRC."""
    fixed_size = _SNAPSHOT_HEAD.size + _SNAPSHOT_COUNT.size
    if len(data) < fixed_size:
        raise CorruptSnapshotError(f"snapshot of {len(data)} bytes is shorter than its {fixed_size}-byte header")
    version, stored_crc = _SNAPSHOT_HEAD.unpack_from(data, 0)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"snapshot version {version}, only {SNAPSHOT_VERSION} is known")
    computed_crc = crc32c(memoryview(data)[_SNAPSHOT_CRC_START:])
    if computed_crc != stored_crc:
        raise CorruptSnapshotError(f"snapshot CRC mismatch: stored {stored_crc:#010x}, computed {computed_crc:#010x}")
    (count,) = _SNAPSHOT_COUNT.unpack_from(data, _SNAPSHOT_HEAD.size)
    if count < 0 or len(data) != fixed_size + count * _SNAPSHOT_ENTRY.size:
        raise CorruptSnapshotError(f"snapshot declares {count} entries but holds {len(data)} bytes")
    entries = []
    for (producer_id, epoch, last_sequence, last_offset, offset_delta, timestamp_ms, coordinator_epoch,
         txn_first_offset) in _SNAPSHOT_ENTRY.iter_unpack(memoryview(data)[fixed_size:]):
        if last_offset >= 0:
            batches: tuple[BatchMetadata, ...] = (BatchMetadata(
                _sequence_minus(last_sequence, offset_delta), last_sequence,
                last_offset - offset_delta, last_offset, timestamp_ms),)
        else:
            batches = ()
        entries.append(ProducerStateEntry(producer_id, epoch, batches, timestamp_ms, coordinator_epoch,
                                          txn_first_offset))
    return entries


def read_snapshot_file(path: str) -> list[dict[str, int]]:
    """A snapshot's entries as dicts named like Kafka's DumpLogSegments output (for
    `eos dump-log`). Raises CorruptSnapshotError when the file cannot be trusted."""
    with open(path, "rb") as snapshot_file:
        entries = decode_snapshot(snapshot_file.read())
    described = []
    for entry in entries:
        last = entry.batches[-1] if entry.batches else None
        described.append({
            "producerId": entry.producer_id,
            "producerEpoch": entry.producer_epoch,
            "coordinatorEpoch": entry.coordinator_epoch,
            "currentTxnFirstOffset": entry.current_txn_first_offset,
            "lastTimestamp": entry.last_timestamp_ms,
            "firstSequence": last.first_sequence if last else NO_SEQUENCE,
            "lastSequence": last.last_sequence if last else NO_SEQUENCE,
            "lastOffset": last.last_offset if last else -1,
            "offsetDelta": last.offset_delta if last else 0,
        })
    return described


def _remove_if_exists(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
