"""Committed offsets of consumer groups, and transactional offsets pending their marker.

Theory of operation
-------------------
`OffsetStore` is pure: it never touches a log. Its durable state is what `__consumer_offsets`
says, and it keeps every committed offset with the log offset of the record that carried it
(`record_offset`), because that is how Kafka decides which of two commits of one partition
wins: the one written later in the log. A request never changes the committed map directly:

1. `commit(...)` / `txn_commit(...)` validate, stage the offsets as in flight, and return an
   `OffsetWrite`: records to append, as one batch, to the group's `__consumer_offsets`
   partition (transactional commits with the producer's id and epoch, so the broker fences a
   zombie producer and the batch belongs to its transaction).
2. The shell appends `write.records()` and calls `write_completed(write, base_offset)` (record
   i sits at base_offset + i) or `write_failed(write)`.
3. A plain commit becomes visible at once on completion. A transactional one is staged on
   completion, not before, and stays pending per (group, producer id) until the COMMIT or
   ABORT marker of that producer reaches the group's partition: `complete_txn(producer_id,
   committed, partition)` then makes it visible or drops it (KIP-98). Staging only what is
   in the log is what keeps a failed append harmless: a stale TxnOffsetCommit fenced by the
   log's epoch rule, or a retry that meets a stopping broker, fails without touching the
   offsets the producer already wrote, which its marker will commit.

The order rule (Kafka's CommitRecordMetadataAndOffset): when a transaction commits, each of
its offsets replaces the current one only if the current one's record is older in the log.
So a plain commit appended after a transactional one for the same partition, but before the
marker, wins, as it would after a reload from the compacted log.

`fetch(..., require_stable=True)` answers UNSTABLE_OFFSET_COMMIT for a partition while a
commit of it is in flight or a transactional commit of it is pending (KIP-447): a new member
of the group must not start from an offset that an open transaction may still move.
`replay` and `replay_marker` rebuild the same state from the log on start.

The shell must call `write_completed` for an append before it appends anything later to the
same `__consumer_offsets` partition (in practice: append and complete under one lock), so a
marker never finds a transactional commit whose place in the log is unknown; that case is a
bug and raises InvariantError, as Kafka raises IllegalStateException.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from typing import Iterable, Mapping, NamedTuple

from broker.group.records import (OFFSETS_TOPIC_PARTITIONS, OffsetAndMetadata, OffsetCommitKey,
                                  offset_commit_records, partition_for_group)
from eos.errors import ErrorCode, InvariantError
from eos.types import TopicPartition

__all__ = ["OffsetStore", "OffsetWrite", "CommitDecision", "FetchedOffset", "OffsetAndMetadata",
           "NO_PRODUCER_ID", "OFFSET_METADATA_MAX_BYTES"]

NO_PRODUCER_ID = -1
OFFSET_METADATA_MAX_BYTES = 4096        # offset.metadata.max.bytes
INVALID_OFFSET = -1


class _Entry(NamedTuple):
    value: OffsetAndMetadata
    record_offset: int | None           # where the record sits in __consumer_offsets; None until written


@dataclasses.dataclass(frozen=True)
class OffsetWrite:
    """Records to append to `__consumer_offsets`-`partition` as one batch (transactional when
    producer_id >= 0). entries: (partition, offset) pairs; an offset of None is a tombstone."""

    write_id: int
    group_id: str
    partition: int
    producer_id: int
    producer_epoch: int
    entries: tuple[tuple[TopicPartition, OffsetAndMetadata | None], ...]

    @property
    def transactional(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    def records(self) -> tuple[list[bytes], list[bytes | None]]:
        """(keys, values) of the batch, record i for entries[i]."""
        return offset_commit_records(self.group_id, self.entries)


@dataclasses.dataclass(frozen=True)
class CommitDecision:
    """`write` is None when nothing is left to write; partition_errors name refused partitions."""

    write: OffsetWrite | None
    partition_errors: dict[TopicPartition, ErrorCode] = dataclasses.field(default_factory=dict)
    messages: dict[TopicPartition, str] = dataclasses.field(default_factory=dict)


class FetchedOffset(NamedTuple):
    topic: str
    partition: int
    offset: int                          # -1: nothing committed
    leader_epoch: int
    metadata: str
    error: ErrorCode


def _newer(current: _Entry | None, candidate: _Entry) -> bool:
    """Kafka's rule: the commit whose record comes later in the log wins."""
    if candidate.record_offset is None:
        raise InvariantError("an offset without its place in the log cannot be compared")
    return current is None or current.record_offset < candidate.record_offset


class OffsetStore:
    def __init__(self, *, offsets_partitions: int = OFFSETS_TOPIC_PARTITIONS,
                 metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES):
        self.offsets_partitions = offsets_partitions
        self.metadata_max_bytes = metadata_max_bytes
        self._committed: dict[str, dict[TopicPartition, _Entry]] = defaultdict(dict)
        # group -> producer id -> partition -> transactional offset written, awaiting its marker
        self._pending_txn: dict[str, dict[int, dict[TopicPartition, _Entry]]] = defaultdict(dict)
        # commits being written (plain and transactional), for require_stable
        self._in_flight: dict[tuple[str, TopicPartition], int] = defaultdict(int)
        # transactional writes being appended, per (group, producer id): a marker must not find one
        self._txn_in_flight: dict[tuple[str, int], int] = defaultdict(int)
        self._writes: dict[int, OffsetWrite] = {}
        self._write_ids = itertools.count(1)

    # ---- requests --------------------------------------------------------------------------

    def _validate(self, offsets: Mapping[TopicPartition, OffsetAndMetadata], now_ms: int):
        good: list[tuple[TopicPartition, OffsetAndMetadata]] = []
        errors: dict[TopicPartition, ErrorCode] = {}
        messages: dict[TopicPartition, str] = {}
        for tp, value in offsets.items():
            if value.metadata:
                size = len(value.metadata.encode())
                if size > self.metadata_max_bytes:
                    errors[tp] = ErrorCode.OFFSET_METADATA_TOO_LARGE
                    messages[tp] = (f"offset metadata of {tp.topic}-{tp.partition} is {size} bytes, over "
                                    f"offset.metadata.max.bytes {self.metadata_max_bytes}")
                    continue
            if value.commit_timestamp_ms < 0:
                # (the constructor, not dataclasses.replace: this runs for every partition of a commit)
                value = OffsetAndMetadata(value.offset, value.leader_epoch, value.metadata, now_ms)
            good.append((tp, value))
        return good, errors, messages

    def commit(self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata],
               now_ms: int) -> CommitDecision:
        """A plain OffsetCommit (membership already checked by the group core)."""
        good, errors, messages = self._validate(offsets, now_ms)
        if not good:
            return CommitDecision(None, errors, messages)
        return CommitDecision(self._new_write(group_id, NO_PRODUCER_ID, -1, tuple(good)), errors, messages)

    def txn_commit(self, group_id: str, producer_id: int, producer_epoch: int,
                   offsets: Mapping[TopicPartition, OffsetAndMetadata], now_ms: int) -> CommitDecision:
        """A TxnOffsetCommit: staged under the producer until its transaction ends."""
        if producer_id < 0:
            raise ValueError(f"a transactional offset commit needs a producer id, not {producer_id}")
        good, errors, messages = self._validate(offsets, now_ms)
        if not good:
            return CommitDecision(None, errors, messages)
        return CommitDecision(self._new_write(group_id, producer_id, producer_epoch, tuple(good)), errors, messages)

    def delete_group(self, group_id: str) -> OffsetWrite | None:
        """Tombstones for every committed offset of the group (DeleteGroups). Applied when written."""
        partitions = sorted(self._committed.get(group_id, {}))
        if not partitions:
            return None
        return self._new_write(group_id, NO_PRODUCER_ID, -1, tuple((tp, None) for tp in partitions))

    def _new_write(self, group_id: str, producer_id: int, producer_epoch: int,
                   entries: tuple[tuple[TopicPartition, OffsetAndMetadata | None], ...]) -> OffsetWrite:
        write = OffsetWrite(next(self._write_ids), group_id, partition_for_group(group_id, self.offsets_partitions),
                            producer_id, producer_epoch, entries)
        self._writes[write.write_id] = write
        for tp, value in entries:
            if value is not None:
                self._in_flight[(group_id, tp)] += 1
        if write.transactional:
            self._txn_in_flight[(group_id, producer_id)] += 1
        return write

    # ---- the write protocol ----------------------------------------------------------------

    def _take(self, write: OffsetWrite) -> None:
        if self._writes.pop(write.write_id, None) != write:
            raise InvariantError(f"offset write {write.write_id} of {write.group_id!r} is not pending")
        for tp, value in write.entries:
            if value is not None:
                self._end_in_flight(write.group_id, tp)
        if write.transactional:
            key = (write.group_id, write.producer_id)
            self._txn_in_flight[key] -= 1
            if self._txn_in_flight[key] <= 0:
                del self._txn_in_flight[key]

    def write_completed(self, write: OffsetWrite, base_offset: int) -> None:
        """The batch is in the log, its first record at `base_offset`."""
        self._take(write)
        for record_offset, (tp, value) in enumerate(write.entries, base_offset):
            if write.transactional:
                # the producer's later commit of tp, in the same transaction, replaces it
                self._pending_txn[write.group_id].setdefault(write.producer_id, {})[tp] = _Entry(value, record_offset)
            elif value is None:
                self._apply_tombstone(write.group_id, tp, record_offset)
            else:
                self._apply(write.group_id, tp, _Entry(value, record_offset))

    def write_failed(self, write: OffsetWrite) -> None:
        """The append failed: nothing changes but the write's end (nothing was staged)."""
        self._take(write)

    def _end_in_flight(self, group_id: str, tp: TopicPartition) -> None:
        key = (group_id, tp)
        self._in_flight[key] -= 1
        if self._in_flight[key] <= 0:
            del self._in_flight[key]

    def _apply(self, group_id: str, tp: TopicPartition, entry: _Entry) -> None:
        current = self._committed[group_id].get(tp)
        if _newer(current, entry):
            self._committed[group_id][tp] = entry

    def _apply_tombstone(self, group_id: str, tp: TopicPartition, record_offset: int) -> None:
        current = self._committed.get(group_id, {}).get(tp)
        if current is not None and current.record_offset < record_offset:
            del self._committed[group_id][tp]
        # A deleted partition takes its pending transactional offsets with it (Kafka's removeOffsets).
        for staged in self._pending_txn.get(group_id, {}).values():
            staged.pop(tp, None)
        self._forget_if_empty(group_id)

    def _forget_if_empty(self, group_id: str) -> None:
        by_producer = self._pending_txn.get(group_id)
        if by_producer is not None:
            for producer_id in [p for p, staged in by_producer.items() if not staged]:
                del by_producer[producer_id]
            if not by_producer:
                del self._pending_txn[group_id]
        if group_id in self._committed and not self._committed[group_id]:
            del self._committed[group_id]

    # ---- transaction markers ---------------------------------------------------------------

    def complete_txn(self, producer_id: int, committed: bool, partition: int | None = None) -> list[str]:
        """The COMMIT (committed=True) or ABORT marker of `producer_id` is in `__consumer_offsets`
        -`partition` (None: every partition). Returns the groups whose offsets it settled."""
        for group_id, writer in self._txn_in_flight:
            if writer == producer_id and (partition is None or
                                          partition_for_group(group_id, self.offsets_partitions) == partition):
                raise InvariantError(
                    f"the {'commit' if committed else 'abort'} marker of producer {producer_id} reached group "
                    f"{group_id!r} before its offset record was acknowledged")
        settled = []
        for group_id in list(self._pending_txn):
            if partition is not None and partition_for_group(group_id, self.offsets_partitions) != partition:
                continue
            staged = self._pending_txn[group_id].pop(producer_id, None)
            if staged is None:
                continue
            settled.append(group_id)
            if committed:
                for tp, entry in staged.items():
                    self._apply(group_id, tp, entry)
            self._forget_if_empty(group_id)
        return settled

    # ---- loading ---------------------------------------------------------------------------

    def replay(self, key: OffsetCommitKey, value: OffsetAndMetadata | None, record_offset: int,
               producer_id: int = NO_PRODUCER_ID) -> None:
        """Apply one offset commit record read from the log at `record_offset`; records of a
        transactional batch carry its producer id and wait for `replay_marker`."""
        tp = key.topic_partition
        if producer_id != NO_PRODUCER_ID:
            staged = self._pending_txn[key.group_id].setdefault(producer_id, {})
            if value is None:
                staged.pop(tp, None)
            else:
                staged[tp] = _Entry(value, record_offset)
            self._forget_if_empty(key.group_id)
        elif value is None:
            self._apply_tombstone(key.group_id, tp, record_offset)
        else:
            self._apply(key.group_id, tp, _Entry(value, record_offset))

    def replay_marker(self, producer_id: int, committed: bool, partition: int) -> None:
        """A control record (COMMIT/ABORT) of `producer_id` read from `__consumer_offsets`-`partition`."""
        self.complete_txn(producer_id, committed, partition)

    def unload_partition(self, partition: int) -> None:
        """Forget every group of `__consumer_offsets`-`partition` (this coordinator no longer owns it)."""
        for table in (self._committed, self._pending_txn):
            for group_id in [g for g in table if partition_for_group(g, self.offsets_partitions) == partition]:
                del table[group_id]

    # ---- reads -----------------------------------------------------------------------------

    def _unstable(self, group_id: str, tp: TopicPartition) -> bool:
        if self._in_flight.get((group_id, tp), 0) > 0:
            return True
        return any(tp in staged for staged in self._pending_txn.get(group_id, {}).values())

    def fetch(self, group_id: str, partitions: Iterable[TopicPartition] | None = None,
              require_stable: bool = False) -> list[FetchedOffset]:
        """Committed offsets of `partitions` (None or empty: every partition the group has).
        A partition without a commit answers offset -1 and no error."""
        committed = self._committed.get(group_id, {})
        wanted = list(partitions or ())
        if not wanted:
            pending = {tp for staged in self._pending_txn.get(group_id, {}).values() for tp in staged}
            wanted = sorted(set(committed) | (pending if require_stable else set()))
        answer = []
        for tp in wanted:
            if require_stable and self._unstable(group_id, tp):
                answer.append(FetchedOffset(tp.topic, tp.partition, INVALID_OFFSET, -1, "",
                                            ErrorCode.UNSTABLE_OFFSET_COMMIT))
                continue
            entry = committed.get(tp)
            if entry is None:
                answer.append(FetchedOffset(tp.topic, tp.partition, INVALID_OFFSET, -1, "", ErrorCode.NONE))
            else:
                v = entry.value
                answer.append(FetchedOffset(tp.topic, tp.partition, v.offset, v.leader_epoch, v.metadata, ErrorCode.NONE))
        return answer

    def committed(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        return {tp: e.value for tp, e in sorted(self._committed.get(group_id, {}).items())}

    def pending_producers(self, group_id: str) -> set[int]:
        """Producer ids with transactional offsets of the group awaiting their marker."""
        return set(self._pending_txn.get(group_id, {}))

    def has_pending(self, producer_id: int) -> bool:
        return any(producer_id in by_producer for by_producer in self._pending_txn.values())

    def groups(self) -> set[str]:
        """Every group with committed or pending offsets (also groups that never joined)."""
        return set(self._committed) | set(self._pending_txn)
