"""Sparse per-segment indexes: offset -> file position (`.index`) and time -> offset (`.timeindex`).

Theory of operation
-------------------
A segment's `.log` is a run of record batches. To find an offset without reading the whole
file, the segment keeps a sparse offset index: roughly one entry per index.interval.bytes of
log, each entry the last offset of a batch and that batch's byte position. A lookup takes the
largest entry at or below the target offset and the caller scans batch headers forward from
its position; the scan is short because entries are at most one interval apart.

The time index maps timestamps to offsets the same way: an entry (max timestamp so far,
offset of the batch that reached it) is added at index points when the maximum grows, so the
timestamps in the file only ever increase.

Both files are Kafka's layouts, so Kafka's tools can read them:

    .index      entries of 8 bytes:  relative offset u32 (offset - base offset), position u32
    .timeindex  entries of 12 bytes: timestamp i64, relative offset u32

Two ways to hold the entries, one per kind of segment (Kafka's LazyIndex, without its
preallocation):

- In memory (`_Columns`: two arrays, key and value), for the active segment, which appends
  to them and to the file, and for an index just rebuilt (`reset`). The file is written
  through one O_APPEND descriptor as entries come, so it is never longer than its entries:
  nothing to trim at roll or close, and Kafka's DumpLogSegments reads it as it is.
- Lazily, for a sealed segment opened from disk (`open_lazily`): nothing is read at open.
  The first lookup maps the file read-only (`_Mapped` over an mmap, or over the file's
  bytes when SEALED_INDEX_ACCESS is "read" or the mapping fails), checks it as a whole and
  publishes it; lookups then binary-search the bytes with `struct.unpack_from`. Two readers
  that arrive at once load it once (`LAZY_LOAD_LOCK`, double-checked).

Whichever way, an index is checked before it is used: a whole number of entries, keys
strictly increasing (and offset-index positions too, time-index offsets never going back),
the last entry inside the segment. The check runs in C (struct.unpack_from over chunks of
entries, then `all(map(operator.lt, ...))`), not a Python loop per entry. Indexes are
derived data: when a file is missing, torn or inconsistent, the segment rebuilds it from the
`.log` -- at open for the active segment (`LogSegment.recover`), at first use for a sealed
one (the `on_corrupt` callback, `LogSegment._rebuild_indexes`). A rebuilt file that a reader
may have mapped replaces the old one by rename, so that map stays valid (on Linux a mapped
file that is renamed or unlinked stays readable; only truncating it in place would fault).

Readers take no lock: `_entries` is replaced whole (one attribute store), and an appender
adds keys before values, so a reader that took `_entries` and then its count sees whole
entries only.
"""
from __future__ import annotations

import mmap
import os
import struct
import threading
from array import array
from bisect import bisect_right
from operator import le, lt
from typing import Callable

from eos.errors import InvariantError

OFFSET_ENTRY = struct.Struct(">II")
OFFSET_ENTRY_BYTES = OFFSET_ENTRY.size  # 8
TIME_ENTRY = struct.Struct(">qI")
TIME_ENTRY_BYTES = TIME_ENTRY.size  # 12
RELATIVE_OFFSET_MAX = 2**32 - 1  # Kafka keeps it below 2**31 (an int); so do we when rolling

_U32 = "I" if array("I").itemsize == 4 else "L"
# How a sealed index's bytes are held once used: "read" (a bytes object of the file) or
# "mmap" (Kafka's way: page cache, shared). Both open lazily and start equally fast
# (bench/startup.py); "read" is kept because CPython before 3.13 keeps a duplicate file
# descriptor open for every mmap (and each map is one of vm.max_map_count's areas): with
# 4,000 partitions of 4 segments, touching every index took this machine's whole
# RLIMIT_NOFILE (20,000), which a broker needs for its segments and sockets.
SEALED_INDEX_ACCESS = "read"
CHECK_CHUNK_ENTRIES = 4096      # entries unpacked at once by the order check (bounds its memory)
REWRITE_SUFFIX = ".swap"        # a rebuilt index before it replaces the file (a leftover at start)

# Serialises first loads (and rebuilds) of lazily opened indexes. Held for a map and a check
# (microseconds) or, when an index is corrupt, a rebuild from one segment's log.
LAZY_LOAD_LOCK = threading.RLock()


class IndexCorruptError(Exception):
    """An index file cannot be trusted; the segment rebuilds it from the log."""


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class _IndexFile:
    """Append-only file of fixed-size entries, written through one fd while the segment is active."""

    __slots__ = ("path", "_fd")

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None

    def append(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _write_all(self._fd, data)

    def rewrite(self, data: bytes, *, mapped: bool) -> None:
        """Replace the whole file (after a rebuild). When a reader may hold a map of it
        (`mapped`), write a new file and rename it over the old one: truncating a mapped
        file in place would fault that reader."""
        self.close()
        path = self.path + REWRITE_SUFFIX if mapped else self.path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        if mapped:
            os.replace(path, self.path)

    def fsync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            return
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class _Columns:
    """Entries in memory: keys (relative offsets or timestamps) and values, in two arrays.
    The appender extends keys first, so `count` (the values) never names a half entry."""

    __slots__ = ("keys", "values")

    def __init__(self, keys: array, values: array):
        self.keys, self.values = keys, values

    @property
    def count(self) -> int:
        return len(self.values)

    def at(self, i: int) -> tuple[int, int]:
        return self.keys[i], self.values[i]

    def bisect_right(self, key: int, count: int) -> int:
        return bisect_right(self.keys, key, 0, count)

    def pairs(self, count: int) -> list[tuple[int, int]]:
        return list(zip(self.keys[:count], self.values[:count]))

    @property
    def is_mmap(self) -> bool:
        return False

    def release(self) -> None:
        pass


class _Mapped:
    """Entries read in place from a sealed index file's bytes (an mmap or a bytes object)."""

    __slots__ = ("buf", "layout", "count")

    def __init__(self, buf, layout: struct.Struct, count: int):
        self.buf, self.layout, self.count = buf, layout, count

    def at(self, i: int) -> tuple[int, int]:
        return self.layout.unpack_from(self.buf, i * self.layout.size)

    def bisect_right(self, key: int, count: int) -> int:
        """The number of entries whose key is <= `key` (keys strictly increase)."""
        unpack_from, size, buf = self.layout.unpack_from, self.layout.size, self.buf
        low, high = 0, count
        while low < high:           # the range halves each round: at most 33 rounds
            middle = (low + high) // 2
            if unpack_from(buf, middle * size)[0] <= key:
                low = middle + 1
            else:
                high = middle
        return low

    def pairs(self, count: int) -> list[tuple[int, int]]:
        return list(self.layout.iter_unpack(memoryview(self.buf)[:count * self.layout.size]))

    def columns(self, key_typecode: str) -> _Columns:
        """The same entries in memory (to append to them)."""
        keys, values = array(key_typecode), array(_U32)
        for flat in _chunks(self.buf, self.layout, self.count, overlap=False):
            keys.extend(flat[0::2])
            values.extend(flat[1::2])
        return _Columns(keys, values)

    @property
    def is_mmap(self) -> bool:
        return isinstance(self.buf, mmap.mmap)

    def release(self) -> None:
        if isinstance(self.buf, mmap.mmap):
            try:
                self.buf.close()
            except BufferError:
                pass        # a reader is unpacking from it right now; the collector unmaps it


def _chunks(buf, layout: struct.Struct, count: int, *, overlap: bool):
    """Flat tuples (key, value, key, value, ...) of up to CHECK_CHUNK_ENTRIES entries each;
    with `overlap`, each chunk after the first starts with the previous chunk's last entry,
    so that comparing neighbours within chunks compares every neighbour."""
    pair_format = layout.format.lstrip("<>!=@")
    for start in range(0, count, CHECK_CHUNK_ENTRIES):      # bounded by count / chunk
        first = start - 1 if overlap and start else start
        entries = min(count, start + CHECK_CHUNK_ENTRIES) - first
        yield struct.unpack_from(">" + pair_format * entries, buf, first * layout.size)


def _in_order(mapped: _Mapped, *, values_strict: bool) -> bool:
    """Keys strictly increasing, values increasing (strictly or not): checked in C."""
    value_order = lt if values_strict else le
    for flat in _chunks(mapped.buf, mapped.layout, mapped.count, overlap=True):
        keys, values = flat[0::2], flat[1::2]
        if not all(map(lt, keys, keys[1:])) or not all(map(value_order, values, values[1:])):
            return False
    return True


def _open_entries(path: str, layout: struct.Struct, access: str) -> _Mapped:
    """The file's entries, mapped (access "mmap") or read ("read"); a map that the system
    refuses (vm.max_map_count, descriptors) falls back to reading. Raises IndexCorruptError
    for a missing file or one that is not a whole number of entries."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise IndexCorruptError(f"{path}: missing") from None
    try:
        size = os.fstat(fd).st_size
        if size % layout.size:
            raise IndexCorruptError(
                f"{path}: {size} bytes is not a whole number of {layout.size}-byte entries")
        buf = None
        if access == "mmap" and size:
            try:
                buf = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            except OSError:
                buf = None
        if buf is None:
            buf = os.pread(fd, size, 0) if size else b""
            if len(buf) != size:
                raise IndexCorruptError(f"{path}: read {len(buf)} of {size} bytes")
    finally:
        os.close(fd)
    return _Mapped(buf, layout, size // layout.size)


class _SparseIndex:
    """What the offset and time indexes share: where the entries are and how they load."""

    # one object per index of every segment: no instance dict
    __slots__ = ("path", "base_offset", "max_entries", "_entries", "_bound", "_on_corrupt", "_file")
    _LAYOUT: struct.Struct
    _KEY_TYPECODE: str

    def __init__(self, path: str, base_offset: int, max_index_bytes: int):
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // self._LAYOUT.size)
        self._entries: _Columns | _Mapped | None = _Columns(array(self._KEY_TYPECODE), array(_U32))
        self._bound: int | None = None          # what the lazy check holds the last entry to
        self._on_corrupt: Callable[[str], None] | None = None
        self._file = _IndexFile(path)

    # -- loading -------------------------------------------------------------------------

    def _problem(self, mapped: _Mapped, bound: int | None) -> str | None:
        raise NotImplementedError

    def _checked(self, access: str, bound: int | None) -> _Mapped:
        mapped = _open_entries(self.path, self._LAYOUT, access)
        problem = self._problem(mapped, bound)
        if problem:
            mapped.release()
            raise IndexCorruptError(f"{self.path}: {problem}")
        return mapped

    def _load_now(self, bound: int | None) -> None:
        """Read and check the file into memory now (the active segment)."""
        self._entries = self._checked("read", bound).columns(self._KEY_TYPECODE)

    def open_lazily(self, bound: int | None, on_corrupt: Callable[[str], None]) -> None:
        """A sealed segment's index: map and check the file at first use, not now.
        `on_corrupt(reason)` must then rebuild it (`reset`) when the check fails."""
        self._bound, self._on_corrupt = bound, on_corrupt
        self._entries = None

    @property
    def is_lazy(self) -> bool:
        """Opened lazily and not used yet."""
        return self._entries is None

    @property
    def is_appendable(self) -> bool:
        """Held in memory (the active segment's, or rebuilt), not read from a sealed file."""
        return isinstance(self._entries, _Columns)

    def _loaded(self) -> _Columns | _Mapped:
        entries = self._entries
        if entries is not None:
            return entries
        with LAZY_LOAD_LOCK:
            if self._entries is None:
                try:
                    self._entries = self._checked(SEALED_INDEX_ACCESS, self._bound)
                except IndexCorruptError as e:
                    self._on_corrupt(str(e))       # rebuilds from the log: reset() sets _entries
                    if self._entries is None:
                        raise InvariantError(f"{self.path}: the rebuild after '{e}' left no index") from e
            return self._entries

    def reset_pairs(self, pairs: list[tuple[int, int]]) -> None:
        """Replace every entry by (key, relative value) pairs, in memory and in the file."""
        keys = array(self._KEY_TYPECODE, (key for key, _ in pairs))
        values = array(_U32, (value for _, value in pairs))
        previous = self._entries
        self._file.rewrite(b"".join(self._LAYOUT.pack(key, value) for key, value in pairs),
                           mapped=previous is not None and previous.is_mmap)
        # the previous entries are left to the collector: a reader may still be bisecting them
        self._entries = _Columns(keys, values)
        self._on_corrupt = None

    # -- queries -------------------------------------------------------------------------

    @property
    def entry_count(self) -> int:
        return self._loaded().count

    @property
    def is_full(self) -> bool:
        return self._loaded().count >= self.max_entries

    # -- lifecycle -----------------------------------------------------------------------

    def fsync(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        """Close the append descriptor; what readers hold stays readable."""
        self._file.close()

    def rename_to(self, path: str) -> None:
        """The file was renamed (a deleted segment's `.deleted`): load from there if need be."""
        self.path = path
        self._file.path = path

    def release(self) -> None:
        """Unmap (the segment's files are being removed). A later lookup finds no entries."""
        self._file.close()
        previous = self._entries
        self._entries = _Columns(array(self._KEY_TYPECODE), array(_U32))
        if previous is not None:
            previous.release()


class OffsetIndex(_SparseIndex):
    """Sparse map from offset to byte position in one segment's `.log`."""

    __slots__ = ()
    _LAYOUT = OFFSET_ENTRY
    _KEY_TYPECODE = _U32

    def _problem(self, mapped: _Mapped, log_size_bytes: int | None) -> str | None:
        if not _in_order(mapped, values_strict=True):
            return "entries not increasing"
        if mapped.count and log_size_bytes is not None:
            _, last_position = mapped.at(mapped.count - 1)
            if last_position >= log_size_bytes:
                return f"last entry points at byte {last_position}, the log has {log_size_bytes}"
        return None

    def load(self, log_size_bytes: int) -> None:
        """Read the file now; raise IndexCorruptError when it is missing or inconsistent."""
        self._load_now(log_size_bytes)

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry (absolute offset, position) and rewrite the file."""
        self.reset_pairs([(offset - self.base_offset, position) for offset, position in entries])

    def entries(self) -> list[tuple[int, int]]:
        loaded = self._loaded()
        return [(self.base_offset + r, p) for r, p in loaded.pairs(loaded.count)]

    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base offset, 0) when empty."""
        loaded = self._loaded()
        count = loaded.count
        if count == 0:
            return self.base_offset, 0
        relative_offset, position = loaded.at(count - 1)
        return self.base_offset + relative_offset, position

    def lookup(self, offset: int) -> tuple[int, int]:
        """The largest entry whose offset <= `offset`, or (base offset, 0)."""
        # Entries added concurrently by the appender have larger offsets than anything a
        # reader can ask for in its snapshot, so bisecting a growing index is safe.
        loaded = self._loaded()
        i = loaded.bisect_right(offset - self.base_offset, loaded.count) - 1
        if i < 0:
            return self.base_offset, 0
        relative_offset, position = loaded.at(i)
        return self.base_offset + relative_offset, position

    def append(self, offset: int, position: int) -> None:
        columns = self._loaded()
        if not isinstance(columns, _Columns):
            raise InvariantError(f"{self.path}: append to a sealed index")
        relative_offsets, positions = columns.keys, columns.values
        relative_offset = offset - self.base_offset
        count = len(positions)
        if count and (relative_offset <= relative_offsets[-1] or position <= positions[-1]):
            raise InvariantError(
                f"{self.path}: index entry ({offset}, {position}) does not follow "
                f"({self.base_offset + relative_offsets[-1]}, {positions[-1]})")
        if not 0 <= relative_offset <= RELATIVE_OFFSET_MAX:
            raise InvariantError(f"{self.path}: offset {offset} out of range for base {self.base_offset}")
        if count >= self.max_entries:
            raise InvariantError(f"{self.path}: index full ({count} entries)")
        self._file.append(OFFSET_ENTRY.pack(relative_offset, position))
        relative_offsets.append(relative_offset)
        positions.append(position)


class TimeIndex(_SparseIndex):
    """Sparse map from timestamp to offset in one segment; timestamps only increase."""

    __slots__ = ()
    _LAYOUT = TIME_ENTRY
    _KEY_TYPECODE = "q"

    def _problem(self, mapped: _Mapped, next_offset: int | None) -> str | None:
        if not _in_order(mapped, values_strict=False):
            return "entries not increasing"
        if mapped.count and mapped.at(0)[0] < 0:
            return f"negative timestamp {mapped.at(0)[0]}"      # maybe_append never writes one
        if mapped.count and next_offset is not None:
            _, relative_offset = mapped.at(mapped.count - 1)
            if self.base_offset + relative_offset >= next_offset:
                return (f"last entry names offset {self.base_offset + relative_offset}, "
                        f"the segment ends before {next_offset}")
        return None

    def load(self, next_offset: int | None = None) -> None:
        """Read the file now; raise IndexCorruptError when it is missing or inconsistent.

        `next_offset` (when known) bounds the offsets the entries may name.
        """
        self._load_now(next_offset)

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry (timestamp, absolute offset) and rewrite the file."""
        self.reset_pairs([(timestamp, offset - self.base_offset) for timestamp, offset in entries])

    def entries(self) -> list[tuple[int, int]]:
        loaded = self._loaded()
        return [(t, self.base_offset + r) for t, r in loaded.pairs(loaded.count)]

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset) when empty."""
        loaded = self._loaded()
        count = loaded.count
        if count == 0:
            return -1, self.base_offset
        timestamp, relative_offset = loaded.at(count - 1)
        return timestamp, self.base_offset + relative_offset

    def lookup(self, timestamp_ms: int) -> tuple[int, int]:
        """The largest entry whose timestamp <= `timestamp_ms`, or (-1, base offset).

        Every batch before the entry's offset has a smaller maximum timestamp, so a search
        for the first record at or after `timestamp_ms` may start at that offset.
        """
        loaded = self._loaded()
        i = loaded.bisect_right(timestamp_ms, loaded.count) - 1
        if i < 0:
            return -1, self.base_offset
        timestamp, relative_offset = loaded.at(i)
        return timestamp, self.base_offset + relative_offset

    def maybe_append(self, timestamp_ms: int, offset: int, *, skip_full_check: bool = False) -> bool:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's."""
        columns = self._loaded()
        if not isinstance(columns, _Columns):
            raise InvariantError(f"{self.path}: append to a sealed index")
        timestamps, relative_offsets = columns.keys, columns.values
        if timestamps and timestamp_ms <= timestamps[-1]:
            return False
        if timestamp_ms < 0:
            return False
        relative_offset = offset - self.base_offset
        if relative_offsets and relative_offset < relative_offsets[-1]:
            raise InvariantError(
                f"{self.path}: time index offset {offset} goes backwards "
                f"(last {self.base_offset + relative_offsets[-1]})")
        if not skip_full_check and len(timestamps) >= self.max_entries:
            raise InvariantError(f"{self.path}: time index full ({len(timestamps)} entries)")
        self._file.append(TIME_ENTRY.pack(timestamp_ms, relative_offset))
        timestamps.append(timestamp_ms)
        relative_offsets.append(relative_offset)
        return True
