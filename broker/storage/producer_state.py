"""Producers' state for one partition: epochs, sequences, retained batches, open transactions,
snapshots.

Theory of operation
-------------------
Every batch an idempotent producer sends carries (producer_id, producer_epoch, base_sequence);
the sequence counts records per partition and wraps to 0 after 2**31 - 1. The broker keeps,
per producer, the epoch and the metadata (sequence range, offsets, max timestamp) of the
last `RETAINED_BATCHES_MAX` (5) batches, the same number as the client's in-flight limit, so
any retry of a request the client may still have outstanding is recognised. The rules follow
Apache Kafka's broker (`ProducerStateEntry`, `ProducerAppendInfo`; KIP-98, KIP-360, KIP-890):

1. A batch with the current epoch and the exact first and last sequence of a retained batch
   is a duplicate: it gets the original offsets back (`DuplicateBatch`) and nothing is
   appended. This check comes first.
2. Older epoch than the current one: INVALID_PRODUCER_EPOCH (a zombie is fenced).
3. Same epoch: base_sequence must be last_sequence + 1 (0 after 2**31 - 1; 0 when the epoch
   has no retained batch, e.g. right after a transaction marker), otherwise
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
   client's delivery timeout, which keeps that window theoretical. One exception, as in
   Kafka with transactions v2: a *transactional* batch of an unknown producer must start at
   sequence 0, because every transaction starts its sequences at 0 in each partition (the
   epoch is bumped at every commit and abort) and an open transaction never expires.

Transactions (KIP-98; KIP-890 "transactions v2", which our coordinator speaks):

6. The first transactional batch of a producer opens its transaction in this partition:
   `current_txn_first_offset` becomes the batch's first offset, and the transaction joins
   the open transactions, kept in first-offset order (an OrderedDict: transactions open in
   log order, so the earliest is always at the front). A non-transactional batch while the
   producer has a transaction open is INVALID_TXN_STATE.
7. A marker (COMMIT or ABORT, written by WriteTxnMarkers) ends the producer's transaction.
   Its epoch is the producer's *bumped* epoch, so it must be newer than the current epoch,
   else INVALID_PRODUCER_EPOCH. Exception (Kafka's KAFKA-19999): a marker with the current
   epoch while no transaction is open is a retry of a marker already written; it is
   appended again and changes nothing. Its coordinator epoch must not be older than the
   last one seen for the producer, else TRANSACTION_COORDINATOR_FENCED (a deposed
   coordinator). After the marker the producer is at the marker's epoch with no retained
   batch, so its next transaction must start at sequence 0 and a late write of the
   finished transaction (old epoch) is fenced by rule 2. A marker for a producer without
   an open transaction here (the partition got no data) is still appended, and still
   moves the epoch, but completes nothing.
8. Completing a transaction yields a `CompletedTxn`; an aborted one goes into the
   transaction index with the last stable offset Kafka defines for it: the first offset of
   the earliest transaction still open (of another producer), or the marker's offset + 1
   when none is. The completed transaction stays *unreplicated* until the high watermark
   passes its marker (`on_high_watermark_updated`), so `first_unstable_offset()` =
   the smallest first offset of an open or unreplicated transaction, and the log's
   last stable offset = min(first_unstable_offset, high watermark).
9. Coordinator appends (origin "coordinator": the group coordinator writing a
   TxnOffsetCommit to __consumer_offsets with the producer's id and epoch) skip the
   sequence rules but keep the epoch rule and open transactions like any other batch;
   their base sequence may be -1, and such batches are not retained (nothing can retry them).

Validation is staged apart from mutation, as in Kafka's storage layer: `prepare_append` /
`prepare_marker` read the state and return what to apply (or a `DuplicateBatch`, or raise)
and change nothing; the log writes the bytes; then `apply` / `apply_marker` record the
batch with the offsets the log gave it. A prepared append remembers the state it was
checked against, and applying it refuses (InvariantError) if that state moved in between:
a caller bug, never bad input. Recovery feeds the log's batches to `update_from_replay`,
which trusts them and returns the transactions their markers complete, so the log can
rebuild its transaction indexes.

Durable form: snapshots `<end_offset:020d>.snapshot` in Kafka's producer snapshot layout
version 1 (big-endian)::

    version i16 (= 1) | crc u32 (CRC-32C of every byte after this field) |
    entries: count i32, then per producer
      producer_id i64, epoch i16, last_sequence i32, last_offset i64, offset_delta i32,
      timestamp i64, coordinator_epoch i32, current_txn_first_offset i64

As in Kafka only each producer's last batch is in a snapshot, so after a restart a retry of
an older batch than the last gets OUT_OF_ORDER_SEQUENCE_NUMBER (exactly what Kafka answers
there; the batch is in the log, the client just cannot learn its offset). Open transactions
are rebuilt from current_txn_first_offset, so the last stable offset is the same after a
restart. `load` picks the newest readable snapshot inside [log_start_offset, log_end_offset],
deletes corrupt ones and ones past the log end, and tells the log where to start replaying.
Producers whose batches were all removed by retention are kept until they expire (Kafka
since KIP-360 / KAFKA-7190 keeps producer state longer than the log data, because dropping
it only turns retries into "unknown producer" appends); so a restart neither adds nor
removes producers compared with a broker that stayed up.

Expiration (producer.id.expiration.ms, default 1 day) is measured, as in Kafka, from the
producer's last timestamp: the max timestamp of its last batch, or its last marker's time.
A producer with an open transaction never expires (the coordinator's transaction timeout
aborts it instead).

Not thread-safe: one partition's log owns its manager and serialises calls to it.
"""
from __future__ import annotations

import os
import re
import struct
from collections import OrderedDict
from dataclasses import dataclass

from crc32c import crc32c

from broker.storage.txn_index import AbortedTxn
from eos.errors import (
    CorruptRecordError,
    EosError,
    ErrorCode,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTxnStateError,
    InvariantError,
    OutOfOrderSequenceError,
)
from eos.files import write_file_atomically
from eos.records.codec import CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT
from eos.records.header import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE, NO_TIMESTAMP, BatchHeader

RETAINED_BATCHES_MAX = 5
SEQUENCE_MAX = 0x7FFFFFFF             # 2**31 - 1; the next sequence is 0
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
NO_OFFSET = -1                        # current_txn_first_offset / last_offset when there is none

ORIGIN_CLIENT = "client"              # Produce: every rule
ORIGIN_COORDINATOR = "coordinator"    # a coordinator's own append: epoch rule only (rule 9)
_ORIGINS = (ORIGIN_CLIENT, ORIGIN_COORDINATOR)

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


def _origin_name(origin) -> str:
    """Accept "client"/"coordinator" or an enum whose value is one of them (log.AppendOrigin)."""
    name = getattr(origin, "value", origin)
    if name not in _ORIGINS:
        raise InvariantError(f"unknown append origin {origin!r}; expected one of {_ORIGINS}")
    return name


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
    """One producer's state in one partition. Immutable: every change replaces it whole."""

    producer_id: int
    producer_epoch: int
    batches: tuple[BatchMetadata, ...]   # oldest first, at most RETAINED_BATCHES_MAX
    last_timestamp_ms: int
    coordinator_epoch: int = -1          # epoch of the coordinator that wrote the last marker
    current_txn_first_offset: int = NO_OFFSET   # first offset of the open transaction

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else NO_OFFSET

    @property
    def has_open_transaction(self) -> bool:
        return self.current_txn_first_offset >= 0

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

    expected_* record the state the batch was validated against (NO_PRODUCER_EPOCH /
    NO_SEQUENCE / NO_OFFSET for an unknown producer), so that `apply` can prove nothing
    moved in between. `starts_transaction`: the batch opens the producer's transaction.
    """

    producer_id: int
    producer_epoch: int
    first_sequence: int                  # NO_SEQUENCE for a coordinator batch without sequences
    last_sequence: int
    offset_delta: int
    max_timestamp_ms: int
    is_transactional: bool
    expected_epoch: int
    expected_last_sequence: int
    starts_transaction: bool = False
    expected_txn_first_offset: int = NO_OFFSET


@dataclass(frozen=True, slots=True)
class MarkerAppend:
    """A validated transaction marker waiting for its offset; produced by prepare_marker,
    consumed by apply_marker. expected_* as in ProducerAppend."""

    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    committed: bool
    timestamp_ms: int
    expected_epoch: int
    expected_coordinator_epoch: int
    expected_txn_first_offset: int

    @property
    def control_type(self) -> int:
        """The marker record's type: 1 COMMIT, 0 ABORT (what encode_control_batch writes)."""
        return CONTROL_TYPE_COMMIT if self.committed else CONTROL_TYPE_ABORT


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction ended by a marker in this partition (Kafka's CompletedTxn).

    `last_offset` is the marker's offset. `last_stable_offset` is what Kafka records for it
    in the transaction index: the first offset of the earliest transaction of another
    producer still open when the marker was written, else last_offset + 1.
    """

    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool
    last_stable_offset: int

    def to_aborted_txn(self) -> AbortedTxn:
        """The transaction index entry for this transaction (only aborted ones are indexed)."""
        if not self.is_aborted:
            raise InvariantError(f"transaction of producer {self.producer_id} at {self.first_offset} was "
                                 f"committed; only aborted transactions go into the transaction index")
        return AbortedTxn(self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


class ProducerStateManager:
    """All producers' state for one partition."""

    def __init__(self, partition_dir: str, *, producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS):
        if producer_id_expiration_ms <= 0:
            raise ValueError(f"producer_id_expiration_ms must be positive, got {producer_id_expiration_ms}")
        self.partition_dir = partition_dir
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        # Open transactions, first offset -> producer id, in increasing first offset: a
        # transaction opens at the offset the log is appending at, so it is always the
        # newest; completion removes from anywhere. The front is the first unstable offset.
        self._ongoing: OrderedDict[int, int] = OrderedDict()
        # Completed transactions whose marker is not yet below the high watermark (rule 8).
        # On one node the log clears them right after each append, so this stays tiny.
        self._unreplicated: list[CompletedTxn] = []
        # Set by truncate_to: the in-memory state no longer matches the log until load().
        self._needs_load = False

    # ---- validation (pure) ------------------------------------------------------------

    def prepare_append(self, header: BatchHeader, now_ms: int, *,
                       origin=ORIGIN_CLIENT) -> ProducerAppend | DuplicateBatch:
        """Check one data batch against the current state; return what to apply. Changes nothing.

        Raises OutOfOrderSequenceError, InvalidProducerEpochError, InvalidTxnStateError (the
        rules in the module docstring) or InvalidRecordError (a batch without a usable
        sequence or epoch). `origin` is "client" (Produce) or "coordinator" (a coordinator's
        own transactional append, rule 9); log.AppendOrigin members are accepted too.
        `now_ms` stands in for the batch's timestamp when it carries none.
        """
        self._check_loaded()
        entry = self._producers.get(header.producer_id)
        return self._validate(header, entry, entry, now_ms, _origin_name(origin))

    def prepare_appends(self, headers, now_ms: int, *,
                        origin=ORIGIN_CLIENT) -> list[ProducerAppend | None] | DuplicateBatch:
        """Check every batch of one produce buffer, each against the state the earlier
        ones would leave (several batches of one producer in a buffer are legal). Changes
        nothing.

        Returns a list aligned with `headers` (None for a batch without producer id), to
        be applied in order, or, when any batch is a retry of a retained batch, that
        batch's DuplicateBatch for the whole buffer (Kafka answers the whole request as the
        duplicate). Raises as prepare_append does, for the first failing batch.
        """
        self._check_loaded()
        origin_name = _origin_name(origin)
        pending: dict[int, ProducerStateEntry | None] = {}
        appends: list[ProducerAppend | None] = []
        for header in headers:
            producer_id = header.producer_id
            if producer_id == NO_PRODUCER_ID:
                appends.append(None)
                continue
            committed = self._producers.get(producer_id)
            entry = pending[producer_id] if producer_id in pending else committed
            outcome = self._validate(header, entry, committed, now_ms, origin_name)
            if isinstance(outcome, DuplicateBatch):
                return outcome
            appends.append(outcome)
            # The offsets are not known yet; a placeholder batch at offset 0 carries the
            # sequences, epoch and open transaction the next batch is checked against.
            pending[producer_id] = _entry_after(entry, outcome, 0, outcome.offset_delta)
        return appends

    def _validate(self, header: BatchHeader, entry: ProducerStateEntry | None,
                  committed: ProducerStateEntry | None, now_ms: int, origin: str) -> ProducerAppend | DuplicateBatch:
        """Rules 1-6 and 9 for `header` against `entry`; duplicates are looked up only in the
        `committed` state (batches that have offsets), as Kafka does."""
        producer_id = header.producer_id
        if producer_id == NO_PRODUCER_ID:
            raise InvariantError("a batch without producer id reached the producer state; the log must filter it")
        if header.is_control:
            # Markers come through prepare_marker (WriteTxnMarkers), never as data.
            raise InvariantError(f"control batch of producer {producer_id} reached prepare_append")
        check_sequences = origin == ORIGIN_CLIENT
        epoch = header.producer_epoch
        first_sequence = header.base_sequence
        if epoch < 0 or first_sequence < (0 if check_sequences else NO_SEQUENCE):
            raise InvalidRecordError(
                f"batch of producer {producer_id} has epoch {epoch} and base sequence {first_sequence}: "
                f"an idempotent batch needs both to be non-negative")
        last_sequence = header.last_sequence
        timestamp_ms = header.max_timestamp if header.max_timestamp != NO_TIMESTAMP else now_ms
        is_transactional = header.is_transactional

        if entry is None or entry.producer_epoch == NO_PRODUCER_EPOCH:
            # Rule 5: unknown producer, any epoch and sequence (see the module docstring),
            # except that a transaction starts at sequence 0.
            if check_sequences and is_transactional and first_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} is unknown in this partition and sent a transactional batch "
                    f"starting at sequence {first_sequence}: a transaction starts at sequence 0")
            return ProducerAppend(producer_id, epoch, first_sequence, last_sequence, header.last_offset_delta,
                                  timestamp_ms, is_transactional, NO_PRODUCER_EPOCH, NO_SEQUENCE,
                                  starts_transaction=is_transactional, expected_txn_first_offset=NO_OFFSET)

        current_epoch = entry.producer_epoch
        current_last_sequence = entry.last_sequence
        if epoch < current_epoch:
            raise InvalidProducerEpochError(
                f"producer {producer_id} sent epoch {epoch}, older than the current epoch {current_epoch}")
        if check_sequences:
            if epoch == current_epoch:
                expected = 0 if current_last_sequence == NO_SEQUENCE else next_sequence(current_last_sequence)
                if first_sequence != expected:
                    # Rule 1 before rule 3: only a batch out of sequence can be a retry (a batch
                    # in sequence cannot equal a retained range: they are far from wrapping).
                    duplicate = None if committed is None else committed.find_duplicate(
                        epoch, first_sequence, last_sequence)
                    if duplicate is not None:
                        return DuplicateBatch(duplicate.first_offset, duplicate.last_offset,
                                              duplicate.max_timestamp_ms)
                    raise OutOfOrderSequenceError(
                        f"out of order sequence for producer {producer_id} epoch {epoch}: expected sequence "
                        f"{expected}, got {first_sequence}..{last_sequence}{_retained_note(entry)}")
            elif first_sequence != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id} bumped its epoch from {current_epoch} to {epoch}: a new epoch must "
                    f"start at sequence 0, got {first_sequence}")
        txn_first_offset = entry.current_txn_first_offset
        if txn_first_offset >= 0 and not is_transactional:
            raise InvalidTxnStateError(
                f"producer {producer_id} has a transaction open in this partition since offset "
                f"{txn_first_offset} and sent a non-transactional batch; it must commit or abort first")
        return ProducerAppend(producer_id, epoch, first_sequence, last_sequence, header.last_offset_delta,
                              timestamp_ms, is_transactional, current_epoch, current_last_sequence,
                              starts_transaction=is_transactional and txn_first_offset < 0,
                              expected_txn_first_offset=txn_first_offset)

    def prepare_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int, committed: bool,
                       now_ms: int) -> MarkerAppend:
        """Check a COMMIT/ABORT marker (rule 7); return what to apply. Changes nothing.

        Raises InvalidRequestError (negative id or epochs), InvalidProducerEpochError (a
        marker not newer than the producer's epoch while its transaction is open, or older
        at all) or EosError with code TRANSACTION_COORDINATOR_FENCED (a coordinator epoch
        older than the last one that wrote a marker for this producer).
        """
        self._check_loaded()
        if producer_id < 0 or producer_epoch < 0 or coordinator_epoch < 0:
            raise InvalidRequestError(
                f"transaction marker for producer {producer_id} epoch {producer_epoch} from coordinator epoch "
                f"{coordinator_epoch}: all three must be non-negative")
        entry = self._producers.get(producer_id)
        current_epoch = entry.producer_epoch if entry is not None else NO_PRODUCER_EPOCH
        current_coordinator_epoch = entry.coordinator_epoch if entry is not None else -1
        txn_first_offset = entry.current_txn_first_offset if entry is not None else NO_OFFSET
        kind = "COMMIT" if committed else "ABORT"
        if producer_epoch < current_epoch or (producer_epoch == current_epoch and txn_first_offset >= 0):
            # Transactions v2: the marker carries the bumped epoch, so a marker whose epoch
            # is not newer than an open transaction's is a late marker of an earlier one.
            open_note = (f" with a transaction open since offset {txn_first_offset}"
                         if txn_first_offset >= 0 else "")
            raise InvalidProducerEpochError(
                f"{kind} marker for producer {producer_id} has epoch {producer_epoch}, but the producer is at "
                f"epoch {current_epoch}{open_note}: a marker must carry a newer epoch")
        if coordinator_epoch < current_coordinator_epoch:
            raise EosError(
                f"{kind} marker for producer {producer_id} comes from coordinator epoch {coordinator_epoch}, "
                f"older than coordinator epoch {current_coordinator_epoch} that already wrote one (a zombie "
                f"coordinator)", ErrorCode.TRANSACTION_COORDINATOR_FENCED)
        return MarkerAppend(producer_id, producer_epoch, coordinator_epoch, bool(committed), now_ms,
                            current_epoch, current_coordinator_epoch, txn_first_offset)

    # ---- mutation ---------------------------------------------------------------------

    def apply(self, append: ProducerAppend, first_offset: int, last_offset: int) -> None:
        """Record a batch the log has written at [first_offset, last_offset]."""
        if last_offset - first_offset != append.offset_delta or first_offset < 0:
            raise InvariantError(
                f"producer {append.producer_id}: offsets {first_offset}..{last_offset} do not match the "
                f"batch's last offset delta {append.offset_delta}")
        entry = self._producers.get(append.producer_id)
        current = _state_key(entry)
        expected = (append.expected_epoch, append.expected_last_sequence, append.expected_txn_first_offset)
        if current != expected:
            raise InvariantError(
                f"producer {append.producer_id} state moved between prepare and apply: validated against "
                f"(epoch, last sequence, transaction start) {expected}, now {current}")
        if entry is not None and first_offset <= max(entry.last_offset, entry.current_txn_first_offset):
            raise InvariantError(
                f"producer {append.producer_id}: batch at offset {first_offset} is not after its last "
                f"batch at {entry.last_offset} or its transaction start {entry.current_txn_first_offset}")
        if append.starts_transaction:
            self._open_transaction(append.producer_id, first_offset)
        self._producers[append.producer_id] = _entry_after(entry, append, first_offset, last_offset)

    def apply_marker(self, append: MarkerAppend, marker_offset: int) -> CompletedTxn | None:
        """Record a marker the log has written at `marker_offset`. Returns the transaction it
        completes (to index if aborted), or None when the producer had none open here."""
        entry = self._producers.get(append.producer_id)
        current = (entry.producer_epoch, entry.coordinator_epoch, entry.current_txn_first_offset) \
            if entry is not None else (NO_PRODUCER_EPOCH, -1, NO_OFFSET)
        expected = (append.expected_epoch, append.expected_coordinator_epoch, append.expected_txn_first_offset)
        if current != expected:
            raise InvariantError(
                f"producer {append.producer_id} state moved between prepare_marker and apply_marker: validated "
                f"against (epoch, coordinator epoch, transaction start) {expected}, now {current}")
        if entry is not None and marker_offset <= max(entry.last_offset, entry.current_txn_first_offset):
            raise InvariantError(
                f"producer {append.producer_id}: marker at offset {marker_offset} is not after its last batch "
                f"at {entry.last_offset} or its transaction start {entry.current_txn_first_offset}")
        return self._end_transaction(append.producer_id, entry, append.producer_epoch, append.coordinator_epoch,
                                     append.timestamp_ms, marker_offset, not append.committed)

    def update_from_replay(self, header: BatchHeader, *,
                           control_marker: tuple[int, int] | None = None) -> CompletedTxn | None:
        """Rebuild state from a batch already in the log (recovery). No validation: the log
        is the truth. Batches without producer id are ignored.

        For a control batch pass `control_marker` = (marker type, coordinator epoch) of its
        record (eos.records.codec.decode_control_record). Returns the transaction a marker
        completes, so the log can rebuild its transaction index, else None.
        """
        producer_id = header.producer_id
        if producer_id == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(producer_id)
        if header.is_control:
            if control_marker is None:
                raise InvariantError(f"control batch of producer {producer_id} at offset {header.base_offset} "
                                     f"replayed without its marker (type, coordinator epoch)")
            marker_type, coordinator_epoch = control_marker
            if marker_type not in (CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT):
                raise InvariantError(f"control batch at offset {header.base_offset}: marker type {marker_type}")
            timestamp_ms = header.max_timestamp
            if timestamp_ms == NO_TIMESTAMP and entry is not None:
                timestamp_ms = entry.last_timestamp_ms
            return self._end_transaction(producer_id, entry, header.producer_epoch, coordinator_epoch, timestamp_ms,
                                         header.base_offset, marker_type == CONTROL_TYPE_ABORT)
        append = ProducerAppend(
            producer_id, header.producer_epoch, header.base_sequence, header.last_sequence,
            header.last_offset_delta, header.max_timestamp, header.is_transactional,
            NO_PRODUCER_EPOCH, NO_SEQUENCE,
            starts_transaction=header.is_transactional and (entry is None or not entry.has_open_transaction))
        if append.starts_transaction:
            self._open_transaction(producer_id, header.base_offset)
        updated = _entry_after(entry, append, header.base_offset, header.last_offset)
        if header.max_timestamp == NO_TIMESTAMP and entry is not None:
            updated = _replace_timestamp(updated, entry.last_timestamp_ms)
        self._producers[producer_id] = updated
        return None

    def on_high_watermark_updated(self, high_watermark: int) -> None:
        """Transactions whose marker is below `high_watermark` are stable: forget them, so
        the first unstable offset can move past them (Kafka's onHighWatermarkUpdated)."""
        if self._unreplicated:
            self._unreplicated = [txn for txn in self._unreplicated if txn.last_offset >= high_watermark]

    def remove_expired(self, now_ms: int) -> list[int]:
        """Forget producers idle for producer.id.expiration.ms; return their ids, sorted.
        A producer with an open transaction never expires."""
        expired = sorted(pid for pid, entry in self._producers.items() if self._is_expired(entry, now_ms))
        for producer_id in expired:
            del self._producers[producer_id]
        return expired

    def _is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        return (entry.current_txn_first_offset < 0
                and now_ms - entry.last_timestamp_ms >= self.producer_id_expiration_ms)

    def _open_transaction(self, producer_id: int, first_offset: int) -> None:
        if self._ongoing:
            newest = next(reversed(self._ongoing))
            if first_offset <= newest:
                raise InvariantError(
                    f"producer {producer_id} opens a transaction at offset {first_offset}, not after the newest "
                    f"open transaction at {newest} (producer {self._ongoing[newest]}): appends out of log order")
        self._ongoing[first_offset] = producer_id

    def _end_transaction(self, producer_id: int, entry: ProducerStateEntry | None, producer_epoch: int,
                         coordinator_epoch: int, timestamp_ms: int, marker_offset: int,
                         aborted: bool) -> CompletedTxn | None:
        """Rule 7/8 mutation, shared by apply_marker and replay."""
        completed = None
        if entry is not None and entry.has_open_transaction:
            first_offset = entry.current_txn_first_offset
            owner = self._ongoing.pop(first_offset, None)
            if owner != producer_id:
                raise InvariantError(f"producer {producer_id}'s transaction at {first_offset} is not among the open "
                                     f"transactions (found producer {owner})")
            # Kafka's lastStableOffset(completedTxn): the earliest transaction still open.
            last_stable_offset = next(iter(self._ongoing), marker_offset + 1)
            completed = CompletedTxn(producer_id, first_offset, marker_offset, aborted, last_stable_offset)
            self._unreplicated.append(completed)
        if entry is None:
            batches: tuple[BatchMetadata, ...] = ()
        else:
            # A bumped epoch forgets the finished transaction's batches: the next one starts
            # at sequence 0, and retries of the old ones are fenced by their epoch.
            batches = entry.batches if entry.producer_epoch == producer_epoch else ()
        self._producers[producer_id] = ProducerStateEntry(producer_id, producer_epoch, batches, timestamp_ms,
                                                          coordinator_epoch, NO_OFFSET)
        return completed

    # ---- queries ----------------------------------------------------------------------

    def first_unstable_offset(self) -> int | None:
        """The smallest first offset of a transaction that is open, or completed with its
        marker not yet below the high watermark; None when there is none. The log's last
        stable offset is min(this, high watermark) (and never below the log start offset)."""
        first = next(iter(self._ongoing), None)
        for txn in self._unreplicated:
            if first is None or txn.first_offset < first:
                first = txn.first_offset
        return first

    def open_transactions(self) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of every open transaction, by first offset."""
        return [(producer_id, first_offset) for first_offset, producer_id in self._ongoing.items()]

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
        write_file_atomically(final_path, data)

    def load(self, log_start_offset: int, log_end_offset: int, *, now_ms: int | None = None,
             snapshot_at_most: int | None = None) -> int:
        """Replace the in-memory state with the newest valid snapshot inside
        [log_start_offset, log_end_offset] and return the offset the log must replay from
        (that snapshot's offset, or log_start_offset when there is none).

        Deletes snapshots past the log end (their state describes batches the log no longer
        has), snapshots before the log start (the log between them and the start is gone,
        so replay could not bring them up to date), corrupt ones, and leftover temp files.
        With `now_ms`, producers already expired are not loaded. With `snapshot_at_most`,
        newer snapshots are left on disk but not used: recovery passes the start of the
        unflushed range so that replay rebuilds the transaction indexes there too.
        """
        if not 0 <= log_start_offset <= log_end_offset:
            raise ValueError(f"bad log range: start {log_start_offset}, end {log_end_offset}")
        self._producers = {}
        self._ongoing = OrderedDict()
        self._unreplicated = []
        self._needs_load = False
        for name in os.listdir(self.partition_dir):
            if _SNAPSHOT_TMP_NAME.match(name):
                _remove_if_exists(os.path.join(self.partition_dir, name))
        usable = []
        for offset, path in self._list_snapshots():
            if offset > log_end_offset or offset < log_start_offset:
                _remove_if_exists(path)
            elif snapshot_at_most is None or offset <= snapshot_at_most:
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
            open_txns = sorted((e.current_txn_first_offset, e.producer_id)
                               for e in self._producers.values() if e.has_open_transaction)
            for first_offset, producer_id in open_txns:
                self._open_transaction(producer_id, first_offset)
            return offset
        return log_start_offset

    def truncate_to(self, offset: int) -> None:
        """The log was cut to end at `offset`: delete snapshots past it and drop the
        in-memory state, which may describe cut batches. The caller reloads with load()."""
        for snapshot_offset, path in self._list_snapshots():
            if snapshot_offset > offset:
                _remove_if_exists(path)
        self._producers = {}
        self._ongoing = OrderedDict()
        self._unreplicated = []
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

def _state_key(entry: ProducerStateEntry | None) -> tuple[int, int, int]:
    """What a prepared append was validated against: (epoch, last sequence, txn start)."""
    if entry is None or entry.producer_epoch == NO_PRODUCER_EPOCH:
        return (NO_PRODUCER_EPOCH, NO_SEQUENCE, NO_OFFSET)
    return (entry.producer_epoch, entry.last_sequence, entry.current_txn_first_offset)


def _entry_after(entry: ProducerStateEntry | None, append: ProducerAppend,
                 first_offset: int, last_offset: int) -> ProducerStateEntry:
    same_epoch = entry is not None and entry.producer_epoch == append.producer_epoch
    if append.first_sequence == NO_SEQUENCE:
        # A coordinator batch without sequences: nothing a client could retry, keep no metadata.
        batches: tuple[BatchMetadata, ...] = entry.batches if same_epoch else ()
    else:
        batch = BatchMetadata(append.first_sequence, append.last_sequence, first_offset, last_offset,
                              append.max_timestamp_ms)
        # A new epoch forgets the old epoch's batches: retries of them are fenced anyway.
        batches = entry.batches[1 - RETAINED_BATCHES_MAX:] + (batch,) if same_epoch else (batch,)
    if entry is None:
        coordinator_epoch, txn_first_offset = -1, NO_OFFSET
    else:
        coordinator_epoch, txn_first_offset = entry.coordinator_epoch, entry.current_txn_first_offset
    if append.starts_transaction:
        txn_first_offset = first_offset
    return ProducerStateEntry(append.producer_id, append.producer_epoch, batches, append.max_timestamp_ms,
                              coordinator_epoch, txn_first_offset)


def _replace_timestamp(entry: ProducerStateEntry, last_timestamp_ms: int) -> ProducerStateEntry:
    return ProducerStateEntry(entry.producer_id, entry.producer_epoch, entry.batches, last_timestamp_ms,
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
