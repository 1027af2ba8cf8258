"""The transaction index (`.txnindex`): the aborted transactions whose markers are in one segment.

Theory of operation
-------------------
A read_committed consumer must drop the data of aborted transactions. A fetch therefore
carries, next to the batches, the aborted transactions that overlap the fetched range; the
consumer skips a producer's batches from such a transaction's first offset up to its ABORT
marker. The broker finds them in one transaction index per segment, Kafka's layout and
rules (`TransactionIndex`, `AbortedTxn`, `Log.collectAbortedTransactions`):

    <base_offset:020d>.txnindex   entries of 34 bytes, big-endian:
        version i16 (= 0) | producer_id i64 | first_offset i64 | last_offset i64 |
        last_stable_offset i64

An entry is appended when an ABORT marker completes a transaction that had data in the
partition, into the segment that holds the marker (`last_offset` = the marker's offset), so
entries come in increasing `last_offset`. `last_stable_offset` is the partition's last
stable offset at that moment: the first offset of the earliest transaction still open, or
the marker's offset + 1 when none was (see producer_state.CompletedTxn).

Collecting for a fetch of [fetch_offset, upper_bound_offset) walks the segments from the
one holding fetch_offset: an entry is returned when its transaction overlaps the range
(last_offset >= fetch_offset and first_offset < upper_bound_offset), and the walk stops at
the first entry whose last_stable_offset >= upper_bound_offset. That entry proves no later
entry can overlap the range: when its marker was written, every open transaction began at
or after that last stable offset (so at or after the bound), and a transaction opened later
begins after the marker, which is at least the bound - 1.

The file is created with the first entry (most segments have none, as in Kafka). The
entries also live in memory, in columns (arrays), so a collect never touches the disk and
can bisect straight to the first entry with last_offset >= fetch_offset. Readers do not take
the log's lock: a writer appends to the columns and then publishes a new immutable view
with the longer count; truncation builds new columns. A torn entry at the end of the file
(a crash in mid-write) is cut on open with a warning; any other inconsistency raises
TxnIndexCorruptError, and the log rebuilds the index by replaying its segment's batches.

Plain files and bytes only. Not thread-safe for writers: the log serialises them.
"""
from __future__ import annotations

import logging
import os
import struct
from array import array
from bisect import bisect_left
from typing import NamedTuple

from broker.storage.index import IndexCorruptError
from eos.errors import InvariantError

log = logging.getLogger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
TXN_INDEX_VERSION = 0
ENTRY = struct.Struct(">hqqqq")
ENTRY_BYTES = ENTRY.size  # 34


class AbortedTxn(NamedTuple):
    """One aborted transaction of a partition (Kafka's AbortedTxn, without its version)."""

    producer_id: int
    first_offset: int
    last_offset: int          # offset of the ABORT marker
    last_stable_offset: int   # the partition's last stable offset when the marker was written


class TxnIndexCorruptError(IndexCorruptError):
    """A transaction index holds entries that cannot be right; rebuild it from the log."""


def txn_index_path(directory: str, base_offset: int) -> str:
    return os.path.join(directory, f"{base_offset:020d}{TXN_INDEX_SUFFIX}")


def encode_entry(aborted: AbortedTxn) -> bytes:
    return ENTRY.pack(TXN_INDEX_VERSION, aborted.producer_id, aborted.first_offset, aborted.last_offset,
                      aborted.last_stable_offset)


class _Columns(NamedTuple):
    """A published view of the entries: the first `count` items of each array are valid."""

    producer_ids: array
    first_offsets: array
    last_offsets: array
    last_stable_offsets: array
    max_last_stable_offsets: array   # running maximum of last_stable_offsets
    count: int


def _empty_columns() -> _Columns:
    return _Columns(array("q"), array("q"), array("q"), array("q"), array("q"), 0)


class TransactionIndex:
    """The aborted transactions of one segment, in memory and in `<base>.txnindex`.

    `base_offset` is the segment's base offset: every entry's last_offset is at or above it.
    `cut_bytes` tells how many bytes of a torn last entry were cut when the file was opened.
    """

    def __init__(self, path: str, base_offset: int = 0):
        if base_offset < 0:
            raise ValueError(f"base offset must be >= 0, got {base_offset}")
        self.path = path
        self.base_offset = base_offset
        self.cut_bytes = 0
        self._fd: int | None = None
        self._dirty = False
        self._view = _empty_columns()
        self._load()

    @classmethod
    def for_segment(cls, directory: str, base_offset: int) -> "TransactionIndex":
        return cls(txn_index_path(directory, base_offset), base_offset)

    # ---- loading ----------------------------------------------------------------------

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as index_file:
                data = index_file.read()
        except FileNotFoundError:
            return
        whole_bytes = len(data) - len(data) % ENTRY_BYTES
        if whole_bytes != len(data):
            self.cut_bytes = len(data) - whole_bytes
            log.warning("%s: cutting a torn entry at the end (%d of %d bytes are whole %d-byte entries)",
                        self.path, whole_bytes, len(data), ENTRY_BYTES)
            os.truncate(self.path, whole_bytes)
            data = data[:whole_bytes]
        columns = _empty_columns()
        previous_last_offset = -1
        for number, (version, producer_id, first_offset, last_offset, last_stable_offset) in enumerate(
                ENTRY.iter_unpack(data)):
            problem = None
            if version != TXN_INDEX_VERSION:
                problem = f"version {version}, only {TXN_INDEX_VERSION} is known"
            elif producer_id < 0 or first_offset < 0 or last_stable_offset < 0:
                problem = (f"negative field (producer {producer_id}, first offset {first_offset}, "
                           f"last stable offset {last_stable_offset})")
            elif first_offset > last_offset:
                problem = f"first offset {first_offset} is after last offset {last_offset}"
            elif last_offset < self.base_offset:
                problem = f"last offset {last_offset} is below the segment's base offset {self.base_offset}"
            elif last_offset <= previous_last_offset:
                problem = f"last offset {last_offset} does not increase (previous entry {previous_last_offset})"
            if problem is not None:
                raise TxnIndexCorruptError(f"{self.path}: entry {number}: {problem}")
            previous_last_offset = last_offset
            _push(columns, AbortedTxn(producer_id, first_offset, last_offset, last_stable_offset))
        self._view = columns._replace(count=len(columns.last_offsets))

    # ---- writing (under the log's lock) ----------------------------------------------

    def append(self, aborted: AbortedTxn) -> None:
        """Add an aborted transaction; its last_offset must be above every entry's."""
        view = self._view
        if view.count and aborted.last_offset <= view.last_offsets[view.count - 1]:
            raise InvariantError(
                f"{self.path}: aborted transaction of producer {aborted.producer_id} ends at offset "
                f"{aborted.last_offset}, not after the last entry's {view.last_offsets[view.count - 1]}")
        if not 0 <= aborted.first_offset <= aborted.last_offset or aborted.last_offset < self.base_offset:
            raise InvariantError(
                f"{self.path}: aborted transaction {aborted} does not fit a segment based at {self.base_offset}")
        if aborted.producer_id < 0 or aborted.last_stable_offset < 0:
            raise InvariantError(f"{self.path}: aborted transaction {aborted} has a negative field")
        data = encode_entry(aborted)
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        view_bytes = memoryview(data)
        while view_bytes:
            written = os.write(self._fd, view_bytes)
            view_bytes = view_bytes[written:]
        self._dirty = True
        if len(view.last_offsets) != view.count:
            raise InvariantError(f"{self.path}: columns hold {len(view.last_offsets)} entries, view {view.count}")
        # Grow the shared columns first, then publish the longer count: a reader holding the
        # previous view never looks past its own count.
        _push(view, aborted)
        self._view = view._replace(count=view.count + 1)

    def truncate_to(self, offset: int) -> None:
        """Remove the entries of transactions whose marker is at or after `offset` (the log
        was cut there)."""
        view = self._view
        keep = bisect_left(view.last_offsets, offset, 0, view.count)
        if keep == view.count:
            return
        self._rewrite_length(keep * ENTRY_BYTES)
        self._view = _Columns(view.producer_ids[:keep], view.first_offsets[:keep], view.last_offsets[:keep],
                              view.last_stable_offsets[:keep], view.max_last_stable_offsets[:keep], keep)

    def reset(self) -> None:
        """Remove every entry (the file stays, empty, if it existed)."""
        self._rewrite_length(0)
        self._view = _empty_columns()

    def _rewrite_length(self, length: int) -> None:
        try:
            os.truncate(self.path, length)
        except FileNotFoundError:
            if length:
                raise InvariantError(f"{self.path}: missing, cannot keep {length} bytes of entries") from None
            return
        self._dirty = True

    def flush(self) -> None:
        """fsync the file if anything changed since the last flush."""
        if not self._dirty:
            return
        if self._fd is not None:
            os.fsync(self._fd)
        else:
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                self._dirty = False
                return
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty = False

    def close(self) -> None:
        """Close the file descriptor; the in-memory entries stay readable."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def delete(self) -> bool:
        """Close and remove the file; return whether it existed. The index is empty after."""
        self.close()
        self._view = _empty_columns()
        self._dirty = False
        try:
            os.remove(self.path)
        except FileNotFoundError:
            return False
        return True

    # ---- reading (lock-free) ----------------------------------------------------------

    def __len__(self) -> int:
        return self._view.count

    @property
    def last_offset(self) -> int | None:
        """The last entry's last_offset (marker offset), None when empty."""
        view = self._view
        return view.last_offsets[view.count - 1] if view.count else None

    def all_entries(self) -> list[AbortedTxn]:
        view = self._view
        return [_entry_at(view, i) for i in range(view.count)]

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int) -> tuple[list[AbortedTxn], bool]:
        """The aborted transactions overlapping [fetch_offset, upper_bound_offset), and
        whether the search is complete (no later segment can hold more), as Kafka's
        TransactionIndex.collectAbortedTxns answers."""
        view = self._view
        # Entries before `start` end before fetch_offset and are never returned; Kafka's
        # linear scan would still stop at one whose last stable offset reaches the bound.
        start = bisect_left(view.last_offsets, fetch_offset, 0, view.count)
        if start and view.max_last_stable_offsets[start - 1] >= upper_bound_offset:
            return [], True
        found: list[AbortedTxn] = []
        first_offsets, last_stable_offsets = view.first_offsets, view.last_stable_offsets
        for i in range(start, view.count):
            if first_offsets[i] < upper_bound_offset:
                found.append(_entry_at(view, i))
            if last_stable_offsets[i] >= upper_bound_offset:
                return found, True
        return found, False

    def __repr__(self) -> str:
        return f"TransactionIndex({self.path!r}, base_offset={self.base_offset}, entries={len(self)})"


def collect_aborted_transactions(indexes, fetch_offset: int, upper_bound_offset: int) -> list[AbortedTxn]:
    """Kafka's Log.collectAbortedTransactions: the aborted transactions overlapping
    [fetch_offset, upper_bound_offset), from `indexes` = the transaction indexes of the
    segment holding fetch_offset and of every later segment, in order. Stops at the first
    index that proves the search complete."""
    aborted: list[AbortedTxn] = []
    for index in indexes:
        found, complete = index.collect_aborted(fetch_offset, upper_bound_offset)
        aborted.extend(found)
        if complete:
            break
    return aborted


def read_txn_index_file(path: str) -> list[AbortedTxn]:
    """The entries of a `.txnindex` file, for `eos dump-log` (does not modify the file;
    a torn tail is ignored, other damage raises TxnIndexCorruptError)."""
    with open(path, "rb") as index_file:
        data = index_file.read()
    data = data[:len(data) - len(data) % ENTRY_BYTES]
    entries = []
    for number, (version, *fields) in enumerate(ENTRY.iter_unpack(data)):
        if version != TXN_INDEX_VERSION:
            raise TxnIndexCorruptError(f"{path}: entry {number}: version {version}, only {TXN_INDEX_VERSION} is known")
        entries.append(AbortedTxn(*fields))
    return entries


def _push(columns: _Columns, aborted: AbortedTxn) -> None:
    previous_max = columns.max_last_stable_offsets[-1] if columns.max_last_stable_offsets else -1
    columns.producer_ids.append(aborted.producer_id)
    columns.first_offsets.append(aborted.first_offset)
    columns.last_offsets.append(aborted.last_offset)
    columns.last_stable_offsets.append(aborted.last_stable_offset)
    columns.max_last_stable_offsets.append(max(previous_max, aborted.last_stable_offset))


def _entry_at(view: _Columns, i: int) -> AbortedTxn:
    return AbortedTxn(view.producer_ids[i], view.first_offsets[i], view.last_offsets[i],
                      view.last_stable_offsets[i])
