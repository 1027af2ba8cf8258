"""One log segment: a `.log` file of record batches with its `.index`, `.timeindex` and `.txnindex`.

Theory of operation
-------------------
A segment holds a contiguous run of offsets starting at `base_offset`; its files are named
`<base_offset:020d>.log` / `.index` / `.timeindex` as Kafka names them. Only the newest
segment of a partition (the active one) is appended to; the `Log` decides when to roll.

Appends arrive as whole, already validated batches with their offsets stamped. The segment
writes them with one `os.write` on an O_APPEND descriptor, then updates its indexes the way
Kafka's LogSegment does: when more than index.interval.bytes have gone by since the last
entry, the batch gets an offset-index entry (its last offset, its position) and the time
index gets (max timestamp so far, offset of that batch) if the maximum grew.

Reads use `os.pread` on the same descriptor, so they need no seek and may run in other
threads while an append is in progress: a reader only looks below an end position it took
from the log's published snapshot, and bytes below it are never rewritten.

Finding the batch that holds an offset starts at the sparse index entry below it and scans
headers forward (about index.interval.bytes of them). Readers at the tail, the common case
(consumers and copiers keeping up), ask for batches appended moments ago, so the segment
also remembers the (last offset, position) of at least the last RECENT_BATCHES_MAX batches
it appended (`_RecentBatches`): an offset from the first of them on is found by
bisection and one header read, with no scan.

`size_bytes`, `next_offset` and the maximum timestamp describe what is in the file and are
owned here; `recover()` rebuilds them, and both indexes, from the `.log` alone, cutting the
file at the first thing that is not a whole, valid batch.

Opening a sealed segment (`load` with the successor's base offset, Kafka's LazyIndex) reads
nothing of its indexes: they are mapped and checked at their first lookup (see `index.py`),
and the maximum timestamp, the time index's last entry, is read when first asked for. A
sealed index found corrupt then is rebuilt from the `.log` (`_rebuild_indexes`: the entries
`recover` would write, without cutting the log, which the segment's successors depend on).
Only the active segment's indexes are read and checked at open.

Legacy entries. A segment that an old Kafka wrote may hold v0/v1 message sets (see
`eos.records.legacy`), possibly followed by v2 batches. Their first 12 bytes frame them as
a v2 batch's do and byte 16 is their magic, so the one walk (`_scan`) tells them apart per
entry: a v2 batch costs its header as always; a v0/v1 entry is read whole, its CRCs checked
and a wrapper decompressed (its first offset is inside), and described by a `BatchHeader`
of magic 0/1 with its stored position and size, which recovery, the indexes and the reads
use like any other (index entries point at the entry's position, as Kafka's do).
`holds_legacy_entries` says that a read must up-convert what it returns (`Log.read`): it
is set when the first entry is v0/v1 (checked on open) or when a walk meets one; a v2-only
segment never pays for the conversion.

The segment also owns its transaction index (`txn_index.TransactionIndex`: the aborted
transactions whose ABORT marker lies in this segment). Its file is created with the first
entry, as Kafka does, so most segments have none. The entry of an ABORT marker is written
with the marker (`append(..., aborted_txn=...)`): index first, then the log, and a failed
log write takes the entry back out, so the two never disagree after an error. The index
cannot be rebuilt from this segment alone (a transaction's first offset and the partition's
last stable offset depend on earlier batches), so the log rebuilds it by replaying its
producer state; `txn_index_needs_rebuild` tells it that the file was torn or corrupt.
"""
from __future__ import annotations

import logging
import os
from bisect import bisect_left
from typing import Iterator, NamedTuple

from eos.errors import CorruptRecordError, InvariantError, StorageError
from eos.records import legacy
from eos.records.header import (
    HEADER_SIZE,
    HEADER_STRUCT,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchHeader,
    compute_crc,
)
from broker.storage.index import LAZY_LOAD_LOCK, OffsetIndex, TimeIndex
from broker.storage.txn_index import ENTRY_BYTES as TXN_INDEX_ENTRY_BYTES
from broker.storage.txn_index import AbortedTxn, TransactionIndex, TxnIndexCorruptError

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
DELETED_SUFFIX = ".deleted"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

RELATIVE_OFFSET_LIMIT = 2**31 - 1  # Kafka keeps offset - base_offset within an int
SCAN_BLOCK_BYTES = 16 * 1024       # headers read per pread when scanning near an index entry
RECOVERY_BLOCK_BYTES = 1 << 20     # bytes read per pread when checking a whole segment
_MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD
RECENT_BATCHES_MAX = 64            # batches whose positions the segment remembers for tail reads
# Headers of v0/v1 entries built by reading them (a wrapper must be decompressed to learn
# its first offset), kept by file position so that repeated scans do not decompress again.
LEGACY_HEADERS_CACHED_MAX = 4096
_ENTRY_FRAME_BYTES = legacy.MAGIC_AT + 1   # offset, size, crc/epoch, magic: enough to tell the format


class _RecentBatches(NamedTuple):
    """The last batches appended, consecutive and in file order. The appender extends both
    lists in place (last_offsets first) and replaces the pair when it grows past
    2 x RECENT_BATCHES_MAX, so a reader in another thread, taking the pair once and then
    the length of `positions`, sees entries that never change: list.append is atomic in
    CPython. (Rebuilding tuples on each append cost ~13k instructions per append.)"""

    last_offsets: list[int]
    positions: list[int]


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def _open_txn_index(directory: str, base_offset: int) -> tuple[TransactionIndex, bool]:
    """The segment's transaction index and whether it must be rebuilt (its file was torn
    or held entries that cannot be right; a corrupt file is removed)."""
    try:
        index = TransactionIndex.for_segment(directory, base_offset)
    except TxnIndexCorruptError as e:
        log.warning("%s; it will be rebuilt from the log", e)
        try:
            os.unlink(os.path.join(directory, segment_file_name(base_offset, TXN_INDEX_SUFFIX)))
        except FileNotFoundError:
            pass
        return TransactionIndex.for_segment(directory, base_offset), True
    return index, index.cut_bytes > 0


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _IndexEntries:
    """The index entries of a segment's batches, added in file order: the entries the
    appender would have written (see the module doc), as `recover` and `_rebuild_indexes`
    rebuild them."""

    def __init__(self, base_offset: int, index_interval_bytes: int, offset_entries_max: int,
                 time_entries_max: int):
        self.index_interval_bytes = index_interval_bytes
        self.offset_entries_max = offset_entries_max
        self.time_entries_max = time_entries_max
        self.offset_entries: list[tuple[int, int]] = []
        self.time_entries: list[tuple[int, int]] = []
        self.max_timestamp_ms, self.offset_of_max_timestamp = -1, base_offset
        self.bytes_since_last_entry = 0

    def add(self, header: BatchHeader) -> None:
        if header.max_timestamp > self.max_timestamp_ms:
            self.max_timestamp_ms, self.offset_of_max_timestamp = header.max_timestamp, header.last_offset
        time_entries = self.time_entries
        if self.bytes_since_last_entry > self.index_interval_bytes and \
                len(self.offset_entries) < self.offset_entries_max:
            self.offset_entries.append((header.last_offset, header.position))
            if self.max_timestamp_ms > (time_entries[-1][0] if time_entries else -1) and \
                    len(time_entries) < self.time_entries_max:
                time_entries.append((self.max_timestamp_ms, self.offset_of_max_timestamp))
            self.bytes_since_last_entry = 0
        self.bytes_since_last_entry += header.size_bytes

    def finish(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """(offset entries, time entries); the time index ends with the segment's maximum,
        as Kafka leaves it at roll and close."""
        time_entries = self.time_entries
        if self.max_timestamp_ms > (time_entries[-1][0] if time_entries else -1):
            time_entries.append((self.max_timestamp_ms, self.offset_of_max_timestamp))
        return self.offset_entries, time_entries


class LogSegment:
    """The files of one segment and what is known about their contents."""

    def __init__(self, directory: str, base_offset: int, *, index_interval_bytes: int,
                 max_index_bytes: int, created_ms: int, truncate: bool = False):
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = os.path.join(directory, segment_file_name(base_offset, LOG_SUFFIX))
        self.offset_index = OffsetIndex(
            os.path.join(directory, segment_file_name(base_offset, INDEX_SUFFIX)), base_offset, max_index_bytes)
        self.time_index = TimeIndex(
            os.path.join(directory, segment_file_name(base_offset, TIME_INDEX_SUFFIX)), base_offset, max_index_bytes)
        self.txn_index, self.txn_index_needs_rebuild = _open_txn_index(directory, base_offset)
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if truncate else 0)
        self._fd = os.open(self.log_path, flags, 0o644)
        self.size_bytes = os.fstat(self._fd).st_size   # end of the valid bytes
        self.next_offset = base_offset                   # exclusive end offset
        # The largest timestamp and the offset of its batch; None until first asked for when
        # the segment was opened sealed (read from its time index then: `max_timestamp_ms`).
        self._max_timestamp_ms: int | None = -1
        self._offset_of_max_timestamp = base_offset
        # segment.ms counts from the largest timestamp of the first append (Kafka's rule),
        # or from creation when the segment is empty.
        self.rolling_base_timestamp_ms: int | None = None
        self.created_ms = created_ms
        self._bytes_since_last_index_entry = 0
        # Positions of the batches appended since this object was made (none for a loaded
        # or recovered segment until it is appended to): tail reads skip the header scan.
        self._recent_batches = _RecentBatches([], [])
        # Whether v0/v1 entries (an old Kafka's) may lie in the file: reads then up-convert
        # them (`Log.read`); a v2-only segment pays nothing for them.
        self._legacy_headers: dict[int, BatchHeader] = {}
        self.holds_legacy_entries = self.size_bytes > legacy.MAGIC_AT and \
            legacy.is_legacy_at(os.pread(self._fd, _ENTRY_FRAME_BYTES, 0), 0)
        self._closed = False

    # -- construction --------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base_offset: int, *, index_interval_bytes: int,
               max_index_bytes: int, now_ms: int) -> "LogSegment":
        """A new, empty segment (any file left at that name is emptied)."""
        segment = cls(directory, base_offset, index_interval_bytes=index_interval_bytes,
                      max_index_bytes=max_index_bytes, created_ms=now_ms, truncate=True)
        segment.offset_index.reset([])
        segment.time_index.reset([])
        segment.txn_index.delete()   # a leftover at this name describes some other log
        segment.txn_index_needs_rebuild = False
        return segment

    @classmethod
    def open_existing(cls, directory: str, base_offset: int, *, index_interval_bytes: int,
                      max_index_bytes: int, now_ms: int) -> "LogSegment":
        """Open the files of an existing segment; call `load` or `recover` next."""
        return cls(directory, base_offset, index_interval_bytes=index_interval_bytes,
                   max_index_bytes=max_index_bytes, created_ms=now_ms)

    def load(self, next_offset: int | None) -> None:
        """Trust the files: read both indexes and find where the segment ends.

        `next_offset` is known for a segment that has a successor (the successor's base
        offset): the segment is sealed and its indexes open lazily (checked, and rebuilt if
        need be, at first use). For the active segment pass None: its indexes are read and
        checked now, and the end is found by scanning the headers after the last index
        entry. Raises IndexCorruptError or CorruptRecordError when the files do not agree;
        the caller then runs `recover`.
        """
        if next_offset is not None:
            self.next_offset = next_offset
            self.offset_index.open_lazily(self.size_bytes, self._rebuild_indexes)
            self.time_index.open_lazily(next_offset if self.size_bytes else None, self._rebuild_indexes)
            self._max_timestamp_ms = None     # the time index's last entry, when first asked for
            # rolling_base_timestamp_ms stays None: only the active segment rolls, and a
            # sealed one becomes active again only through `truncate_at`, which recovers it.
            return
        self.offset_index.load(self.size_bytes)
        if next_offset is None:
            _, position = self.offset_index.last_entry()
            next_offset = self.base_offset
            for header in self.iter_batches(position, self.size_bytes):
                next_offset = header.next_offset
        self.next_offset = next_offset
        self.time_index.load(next_offset if self.size_bytes else None)
        self._max_timestamp_ms, self._offset_of_max_timestamp = self.time_index.last_entry()
        if self.size_bytes:
            first = next(self.iter_batches(0, self.size_bytes))
            self.rolling_base_timestamp_ms = first.max_timestamp

    def recover(self, *, verify_crc: bool = True) -> int:
        """Check every batch, cut the file after the last valid one, rebuild both indexes.

        Returns the number of bytes cut (0 when the whole file is valid).
        """
        if self.offset_index.is_lazy or self.time_index.is_lazy:
            # A reader may be loading (or rebuilding) them right now: not both at once.
            with LAZY_LOAD_LOCK:
                return self._recover_locked(verify_crc)
        return self._recover_locked(verify_crc)

    def _recover_locked(self, verify_crc: bool) -> int:
        file_size = os.fstat(self._fd).st_size
        entries = _IndexEntries(self.base_offset, self.index_interval_bytes, self.offset_index.max_entries,
                                self.time_index.max_entries)
        next_offset = self.base_offset
        rolling_base: int | None = None
        valid_end = 0                  # the end of the last batch that passed every check
        problem = None
        self._legacy_headers = {}      # positions may now hold other bytes (a cut, then appends)
        try:
            for header, block, relative in self._scan(0, file_size, RECOVERY_BLOCK_BYTES):
                problem = self._batch_problem(header, next_offset)
                if problem:
                    break
                if verify_crc and header.magic == MAGIC_V2:   # a v0/v1 entry's CRCs were checked to read it
                    if relative + header.size_bytes <= len(block):
                        crc = compute_crc(block, relative, header.size_bytes)
                    else:
                        crc = compute_crc(self.read_bytes(header.position, header.size_bytes), 0, header.size_bytes)
                    if crc != header.crc:
                        problem = f"CRC mismatch (stored {header.crc:#010x}, computed {crc:#010x})"
                        break
                if rolling_base is None:
                    rolling_base = header.max_timestamp
                entries.add(header)
                next_offset = header.next_offset
                valid_end = header.position + header.size_bytes
        except CorruptRecordError as e:
            problem = str(e)
        truncated = file_size - valid_end
        if truncated:
            log.warning("%s: cutting %d bytes at byte %d: %s", self.log_path, truncated, valid_end, problem)
            os.ftruncate(self._fd, valid_end)
        offset_entries, time_entries = entries.finish()
        self.offset_index.reset(offset_entries)
        self.time_index.reset(time_entries)
        self.size_bytes = valid_end
        self.next_offset = next_offset
        self._offset_of_max_timestamp = entries.offset_of_max_timestamp
        self._max_timestamp_ms = entries.max_timestamp_ms
        self.rolling_base_timestamp_ms = rolling_base
        self._bytes_since_last_index_entry = entries.bytes_since_last_entry
        self._recent_batches = _RecentBatches([], [])   # positions past the cut may be gone
        return truncated

    def _rebuild_indexes(self, reason: str) -> None:
        """Rebuild both indexes of this sealed segment from its `.log` (a lazily opened
        index failed its check at first use; called under `LAZY_LOAD_LOCK`). The log is
        not cut: entries stop at the first batch that cannot be read, where a read would
        stop too."""
        log.warning("%s; rebuilding the indexes of %s from the log", reason, self.log_path)
        entries = _IndexEntries(self.base_offset, self.index_interval_bytes, self.offset_index.max_entries,
                                self.time_index.max_entries)
        try:
            for header, _, _ in self._scan(0, self.size_bytes, RECOVERY_BLOCK_BYTES):
                entries.add(header)
        except CorruptRecordError as e:
            log.warning("%s: indexes rebuilt only up to the unreadable batch: %s", self.log_path, e)
        offset_entries, time_entries = entries.finish()
        self.offset_index.reset(offset_entries)
        self.time_index.reset(time_entries)
        if self._max_timestamp_ms is None:
            self._offset_of_max_timestamp = entries.offset_of_max_timestamp
            self._max_timestamp_ms = entries.max_timestamp_ms

    def _batch_problem(self, header: BatchHeader, expected_offset: int) -> str | None:
        """What recovery finds wrong with a batch whose header frame `_scan` accepted."""
        if header.records_count < 0 or header.last_offset_delta < 0:
            return f"recordsCount {header.records_count}, lastOffsetDelta {header.last_offset_delta}"
        if header.base_offset < expected_offset:
            return f"base offset {header.base_offset} below the expected {expected_offset}"
        if header.last_offset - self.base_offset > RELATIVE_OFFSET_LIMIT:
            return f"offset {header.last_offset} too far from the segment base {self.base_offset}"
        return None

    # -- queries -------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return self.size_bytes == 0

    @property
    def max_timestamp_ms(self) -> int:
        """The largest batch max timestamp in the segment (-1 when none has one)."""
        value = self._max_timestamp_ms
        if value is None:
            value = self._read_max_timestamp()[0]
        return value

    @property
    def offset_of_max_timestamp(self) -> int:
        """The last offset of the batch holding `max_timestamp_ms`."""
        if self._max_timestamp_ms is None:
            return self._read_max_timestamp()[1]
        return self._offset_of_max_timestamp

    def _read_max_timestamp(self) -> tuple[int, int]:
        """A sealed segment's maximum: its time index ends with it (seal writes it there).
        Racing readers compute the same pair; the timestamp is stored last, so a reader that
        finds it set finds the offset set too."""
        timestamp_ms, offset = self.time_index.last_entry()
        if self._max_timestamp_ms is None:       # a rebuild may have set it meanwhile
            self._offset_of_max_timestamp = offset
            self._max_timestamp_ms = timestamp_ms
        return self._max_timestamp_ms, self._offset_of_max_timestamp

    @property
    def largest_timestamp_ms(self) -> int:
        """The newest timestamp in the segment (file mtime when no batch has one)."""
        if self.max_timestamp_ms >= 0:
            return self.max_timestamp_ms
        try:
            return int(os.stat(self.log_path).st_mtime * 1000)
        except FileNotFoundError:
            return int(os.fstat(self._fd).st_mtime * 1000)

    def read_bytes(self, position: int, length: int) -> bytes:
        """`length` bytes at `position`; raise StorageError if the file is shorter."""
        data = os.pread(self._fd, length, position)
        if len(data) == length:
            return data
        parts = [data]
        got = len(data)
        while got < length:
            more = os.pread(self._fd, length - got, position + got)
            if not more:
                raise StorageError(f"{self.log_path}: wanted {length} bytes at {position}, file ends at {position + got}")
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def iter_batches(self, start_position: int, end_position: int) -> Iterator[BatchHeader]:
        """Headers of the batches in [start_position, end_position), read in blocks.

        Only header fields are checked, enough not to run off the end; positions are file
        positions. Raises CorruptRecordError at anything that is not a batch header.
        """
        for header, _, _ in self._scan(start_position, end_position, SCAN_BLOCK_BYTES):
            yield header

    def _scan(self, start_position: int, end_position: int,
              block_bytes: int) -> Iterator[tuple[BatchHeader, bytes, int]]:
        """The one walk over the file's batches (reads and recovery): each header in
        [start_position, end_position) with the block it was read from and its position in
        that block, reading `block_bytes` at a time. Checks the frame only (magic, length,
        end within `end_position`) of a v2 batch, and reads a v0/v1 entry whole (see
        `_legacy_header`); raises CorruptRecordError naming the first bad one."""
        position = start_position
        block, block_start = b"", start_position
        while position < end_position:
            relative = position - block_start
            if relative + HEADER_SIZE > len(block):
                block = self.read_bytes(position, min(block_bytes, end_position - position))
                block_start, relative = position, 0
                # (a v0/v1 message may be shorter than a v2 header, at the end of the file)
                if len(block) < HEADER_SIZE and not legacy.is_legacy_at(block, 0):
                    raise CorruptRecordError(f"{self.log_path}: {len(block)} bytes at byte {position}, "
                                             f"less than a batch header")
            header = self._checked_header(block, relative, position, end_position)
            yield header, block, relative
            position += header.size_bytes

    def _checked_header(self, block: bytes, relative: int, position: int, end_position: int) -> BatchHeader:
        """The header at `relative` in `block` (file position `position`), its frame checked:
        magic, length, and the batch ending within `end_position`."""
        if block[relative + legacy.MAGIC_AT] in legacy.LEGACY_MAGICS:
            return self._legacy_header(block, relative, position, end_position)
        header = BatchHeader(*HEADER_STRUCT.unpack_from(block, relative), position)
        if header.magic != MAGIC_V2 or header.batch_length < _MIN_BATCH_LENGTH or \
                position + header.size_bytes > end_position:
            raise CorruptRecordError(
                f"{self.log_path}: no valid batch header at byte {position} (magic {header.magic}, "
                f"length {header.batch_length}, {end_position - position} bytes left)")
        return header

    def _legacy_header(self, block: bytes, relative: int, position: int, end_position: int) -> BatchHeader:
        """The header describing the v0/v1 entry at file position `position` (its start is
        at `relative` in `block`): the entry is read whole, its CRCs verified and a
        wrapper decompressed, once per position (`_legacy_headers`). Raises
        CorruptRecordError for an entry that is torn, corrupt or runs past `end_position`."""
        header = self._legacy_headers.get(position)
        if header is not None and position + header.size_bytes <= end_position:
            return header
        size_bytes = legacy.entry_size(block, relative)
        if position + size_bytes > end_position:
            raise CorruptRecordError(
                f"{self.log_path}: the v{block[relative + legacy.MAGIC_AT]} message at byte {position} declares "
                f"{size_bytes} bytes, {end_position - position} left")
        if relative + size_bytes <= len(block):
            data, at = block, relative
        else:
            data, at = self.read_bytes(position, size_bytes), 0
        try:
            entry = legacy.read_entry(data, at, at + size_bytes)
        except CorruptRecordError as e:
            raise CorruptRecordError(f"{self.log_path}: byte {position}: {e}") from None
        header = legacy.batch_header(entry)._replace(position=position)
        self.holds_legacy_entries = True
        headers = self._legacy_headers
        if len(headers) >= LEGACY_HEADERS_CACHED_MAX:
            headers.clear()      # bounded; a rescan rebuilds what it needs
        headers[position] = header
        return header

    def find_batch(self, offset: int, end_position: int) -> BatchHeader | None:
        """The first batch below `end_position` whose last offset is >= `offset`."""
        last_offsets, positions = self._recent_batches
        count = len(positions)   # entries below it are complete in both lists
        if count and offset >= last_offsets[0]:
            # Not before the first remembered batch's last offset: every earlier batch ends
            # below `offset`, so the first remembered one ending at or after it is the
            # answer (or nothing is, yet).
            i = bisect_left(last_offsets, offset, 0, count)
            if i == count:
                return None   # past every batch whose write had finished (all the caller may see)
            position = positions[i]
            if position >= end_position:
                return None   # appended after the caller's snapshot
            if position + HEADER_SIZE > end_position:
                raise CorruptRecordError(f"{self.log_path}: a batch at byte {position} runs past the end "
                                         f"{end_position}")
            header = self._checked_header(self.read_bytes(position, HEADER_SIZE), 0, position, end_position)
            if header.last_offset != last_offsets[i]:
                raise InvariantError(f"{self.log_path}: the batch at byte {position} ends at offset "
                                     f"{header.last_offset}, the segment appended one ending at {last_offsets[i]}")
            return header
        _, start = self.offset_index.lookup(offset)
        for header in self.iter_batches(start, end_position):
            if header.last_offset >= offset:
                return header
        return None

    def find_batch_by_timestamp(self, timestamp_ms: int, min_offset: int,
                                end_position: int) -> BatchHeader | None:
        """The first batch at or after `min_offset` whose max timestamp is >= `timestamp_ms`."""
        _, indexed_offset = self.time_index.lookup(timestamp_ms)
        _, start = self.offset_index.lookup(max(indexed_offset, min_offset))
        if start >= end_position:
            start = 0  # the time index already names a batch appended after the caller's view
        for header in self.iter_batches(start, end_position):
            if header.last_offset >= min_offset and header.max_timestamp >= timestamp_ms:
                return header
        return None

    # -- rolling -------------------------------------------------------------------------

    def roll_reason(self, *, incoming_bytes: int, incoming_max_timestamp_ms: int,
                    incoming_last_offset: int, now_ms: int, segment_bytes: int,
                    segment_ms: int) -> str | None:
        """Why an append of this shape must go to a new segment, or None."""
        if self.size_bytes == 0:
            return None  # an empty segment takes anything the log accepted
        if self.size_bytes > segment_bytes - incoming_bytes:
            return f"segment.bytes ({self.size_bytes} + {incoming_bytes} > {segment_bytes})"
        if self.rolling_base_timestamp_ms is not None and self.rolling_base_timestamp_ms >= 0:
            waited_ms = incoming_max_timestamp_ms - self.rolling_base_timestamp_ms
        else:
            waited_ms = now_ms - self.created_ms
        if waited_ms > segment_ms:
            return f"segment.ms ({waited_ms} ms > {segment_ms})"
        if self.offset_index.is_full:
            return f"offset index full ({self.offset_index.entry_count} entries)"
        if self.time_index.is_full:
            return f"time index full ({self.time_index.entry_count} entries)"
        if incoming_last_offset - self.base_offset > RELATIVE_OFFSET_LIMIT:
            return f"offset {incoming_last_offset} too far from base {self.base_offset}"
        return None

    # -- mutation ------------------------------------------------------------------------

    def append(self, buf, headers: list[BatchHeader], largest_timestamp_ms: int, *,
               aborted_txn: AbortedTxn | None = None) -> None:
        """Write `buf` (exactly the batches in `headers`, offsets stamped) at the end.

        `headers[i].position` is the batch's position in `buf`. `aborted_txn`: the batch is
        the ABORT marker of that transaction; its transaction index entry is written first.
        On a failed write the files are cut back to their old sizes and StorageError is
        raised; nothing else changes.
        """
        if self._closed:
            raise InvariantError(f"{self.log_path}: append to a closed segment")
        if headers and headers[0].base_offset < self.next_offset:
            raise InvariantError(
                f"{self.log_path}: append at offset {headers[0].base_offset} below the end {self.next_offset}")
        if aborted_txn is not None:
            self._append_txn_index_entry(aborted_txn)
        physical_position = self.size_bytes
        try:
            _write_all(self._fd, buf)
        except OSError as e:
            try:
                os.ftruncate(self._fd, physical_position)
                if aborted_txn is not None:
                    self.txn_index.truncate_to(aborted_txn.last_offset)
            except OSError:
                log.exception("%s: could not cut a failed append back to %d bytes", self.log_path, physical_position)
            raise StorageError(f"{self.log_path}: append of {len(buf)} bytes failed: {e}") from e
        if physical_position == 0:
            self.rolling_base_timestamp_ms = largest_timestamp_ms
        for header in headers:
            if header.max_timestamp > self._max_timestamp_ms:
                self._max_timestamp_ms, self._offset_of_max_timestamp = header.max_timestamp, header.last_offset
            if self._bytes_since_last_index_entry > self.index_interval_bytes:
                self.offset_index.append(header.last_offset, physical_position + header.position)
                self.time_index.maybe_append(self._max_timestamp_ms, self._offset_of_max_timestamp)
                self._bytes_since_last_index_entry = 0
            self._bytes_since_last_index_entry += header.size_bytes
        self.size_bytes = physical_position + len(buf)
        self.next_offset = headers[-1].next_offset
        last_offsets, positions = self._recent_batches
        if len(headers) == 1 and len(positions) < 2 * RECENT_BATCHES_MAX:   # the common append, inline
            last_offsets.append(headers[0].last_offset)
            positions.append(physical_position + headers[0].position)
        else:
            self._remember_recent(physical_position, headers)

    def _remember_recent(self, physical_position: int, headers: list[BatchHeader]) -> None:
        """Add the batches just written to `_recent_batches` (see there for why readers in
        other threads may look at it without the lock)."""
        last_offsets, positions = self._recent_batches
        if len(headers) >= RECENT_BATCHES_MAX:
            headers = headers[-RECENT_BATCHES_MAX:]
            last_offsets, positions = [], []
            self._recent_batches = _RecentBatches(last_offsets, positions)
        elif len(positions) >= 2 * RECENT_BATCHES_MAX:
            last_offsets, positions = last_offsets[-RECENT_BATCHES_MAX:], positions[-RECENT_BATCHES_MAX:]
            self._recent_batches = _RecentBatches(last_offsets, positions)
        for header in headers:
            last_offsets.append(header.last_offset)
            positions.append(physical_position + header.position)

    def _append_txn_index_entry(self, aborted_txn: AbortedTxn) -> None:
        entries_before = len(self.txn_index)
        try:
            self.txn_index.append(aborted_txn)
        except OSError as e:
            # A partial entry may have reached the file; the index's memory never got it.
            try:
                os.truncate(self.txn_index.path, entries_before * TXN_INDEX_ENTRY_BYTES)
            except OSError:
                log.exception("%s: could not cut a failed entry back", self.txn_index.path)
            raise StorageError(f"{self.txn_index.path}: writing the aborted transaction {aborted_txn} failed: "
                               f"{e}") from e

    def truncate_at(self, position: int) -> None:
        """Cut the log file at `position` (a batch boundary) and rebuild both indexes from
        what is left (a follower truncating to its leader). Index files reopen on the next
        append, so a sealed segment may become the active one again."""
        if self._closed:
            raise InvariantError(f"{self.log_path}: truncate of a closed segment")
        if not 0 <= position <= self.size_bytes:
            raise InvariantError(f"{self.log_path}: cut at byte {position} outside 0..{self.size_bytes}")
        os.ftruncate(self._fd, position)
        self.recover(verify_crc=False)

    def reset_txn_index(self) -> None:
        """Forget every aborted transaction of this segment (before the log rebuilds them)."""
        self.txn_index.delete()
        self.txn_index_needs_rebuild = False

    def seal(self) -> None:
        """The segment stops being active: record its maximum in the time index, close index fds.
        (A segment opened sealed wrote its maximum when it was sealed before; its indexes
        may not even be loaded.)"""
        if self._max_timestamp_ms is not None and self.time_index.is_appendable:
            self.time_index.maybe_append(self._max_timestamp_ms, self._offset_of_max_timestamp,
                                         skip_full_check=True)
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()

    def flush(self) -> None:
        if self._closed:
            return
        os.fsync(self._fd)
        self.offset_index.fsync()
        self.time_index.fsync()
        self.txn_index.flush()

    def close(self) -> None:
        if self._closed:
            return
        self.seal()
        os.close(self._fd)
        self._closed = True
        # Index maps stay for a reader still in flight; they go with the segment object.

    def paths(self) -> list[str]:
        base = os.path.join(self.directory, f"{self.base_offset:020d}")
        return [base + suffix for suffix in SEGMENT_SUFFIXES]

    def mark_deleted(self) -> None:
        """Rename the files to `.deleted`; the descriptor stays open for readers in flight,
        and so do index maps; an index not used yet follows its file to the new name."""
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()
        with LAZY_LOAD_LOCK:      # no first load between a rename and the new name
            for path in self.paths():
                try:
                    os.rename(path, path + DELETED_SUFFIX)
                except FileNotFoundError:
                    pass
            self.offset_index.rename_to(self.offset_index.path + DELETED_SUFFIX)
            self.time_index.rename_to(self.time_index.path + DELETED_SUFFIX)

    def destroy(self) -> None:
        """Close the descriptor and remove the `.deleted` files (after `mark_deleted`)."""
        if not self._closed:
            os.close(self._fd)
            self._closed = True
        self.offset_index.release()
        self.time_index.release()
        for path in self.paths():
            try:
                os.unlink(path + DELETED_SUFFIX)
            except FileNotFoundError:
                pass

    def __repr__(self) -> str:
        return (f"LogSegment(base_offset={self.base_offset}, next_offset={self.next_offset}, "
                f"size_bytes={self.size_bytes})")


