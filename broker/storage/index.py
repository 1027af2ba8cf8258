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

The entries live in memory (arrays) and the files are appended as entries are added; Kafka
preallocates and memory-maps instead, which changes nothing in the bytes a reader sees once
the segment is closed. Indexes are derived data: when a file is missing, torn (its size not
a whole number of entries) or inconsistent with the log, the segment rebuilds it from the
`.log` (see `LogSegment.recover`).
"""
from __future__ import annotations

import os
import struct
import sys
from array import array
from bisect import bisect_right

from eos.errors import InvariantError

OFFSET_ENTRY = struct.Struct(">II")
OFFSET_ENTRY_BYTES = OFFSET_ENTRY.size  # 8
TIME_ENTRY = struct.Struct(">qI")
TIME_ENTRY_BYTES = TIME_ENTRY.size  # 12
RELATIVE_OFFSET_MAX = 2**32 - 1  # Kafka keeps it below 2**31 (an int); so do we when rolling

_U32 = "I" if array("I").itemsize == 4 else "L"
_LITTLE_ENDIAN = sys.byteorder == "little"


class IndexCorruptError(Exception):
    """An index file cannot be trusted; the segment rebuilds it from the log."""


def _read_file(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


class _IndexFile:
    """Append-only file of fixed-size entries, written through one fd while the segment is active."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None

    def append(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def rewrite(self, data: bytes) -> None:
        """Replace the whole file (after a rebuild)."""
        self.close()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        finally:
            os.close(fd)

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


class OffsetIndex:
    """Sparse map from offset to byte position in one segment's `.log`."""

    def __init__(self, path: str, base_offset: int, max_index_bytes: int):
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // OFFSET_ENTRY_BYTES)
        self._relative_offsets = array(_U32)
        self._positions = array(_U32)
        self._file = _IndexFile(path)

    # -- loading -------------------------------------------------------------------------

    def load(self, log_size_bytes: int) -> None:
        """Read the file; raise IndexCorruptError when it is missing or inconsistent."""
        data = _read_file(self.path)
        if data is None:
            raise IndexCorruptError(f"{self.path}: missing")
        if len(data) % OFFSET_ENTRY_BYTES:
            raise IndexCorruptError(
                f"{self.path}: {len(data)} bytes is not a whole number of {OFFSET_ENTRY_BYTES}-byte entries")
        words = array(_U32)
        words.frombytes(data)
        if _LITTLE_ENDIAN:
            words.byteswap()
        relative_offsets, positions = words[0::2], words[1::2]
        previous_offset = previous_position = -1
        for relative_offset, position in zip(relative_offsets, positions):
            if relative_offset <= previous_offset or position <= previous_position:
                raise IndexCorruptError(f"{self.path}: entries not increasing at relative offset {relative_offset}")
            previous_offset, previous_position = relative_offset, position
        if positions and positions[-1] >= log_size_bytes:
            raise IndexCorruptError(
                f"{self.path}: last entry points at byte {positions[-1]}, the log has {log_size_bytes}")
        self._relative_offsets, self._positions = relative_offsets, positions

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry (absolute offset, position) and rewrite the file."""
        self._relative_offsets = array(_U32, (offset - self.base_offset for offset, _ in entries))
        self._positions = array(_U32, (position for _, position in entries))
        self._file.rewrite(b"".join(OFFSET_ENTRY.pack(offset - self.base_offset, position)
                                    for offset, position in entries))

    # -- queries -------------------------------------------------------------------------

    @property
    def entry_count(self) -> int:
        return len(self._positions)

    @property
    def is_full(self) -> bool:
        return len(self._positions) >= self.max_entries

    def entries(self) -> list[tuple[int, int]]:
        return [(self.base_offset + r, p) for r, p in zip(self._relative_offsets, self._positions)]

    def last_entry(self) -> tuple[int, int]:
        """(offset, position) of the last entry, or (base offset, 0) when empty."""
        count = len(self._positions)
        if count == 0:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[count - 1], self._positions[count - 1]

    def lookup(self, offset: int) -> tuple[int, int]:
        """The largest entry whose offset <= `offset`, or (base offset, 0)."""
        # Entries added concurrently by the appender have larger offsets than anything a
        # reader can ask for in its snapshot, so bisecting a growing array is safe.
        i = bisect_right(self._relative_offsets, offset - self.base_offset) - 1
        if i < 0:
            return self.base_offset, 0
        return self.base_offset + self._relative_offsets[i], self._positions[i]

    # -- mutation ------------------------------------------------------------------------

    def append(self, offset: int, position: int) -> None:
        relative_offset = offset - self.base_offset
        count = len(self._positions)
        if count and (relative_offset <= self._relative_offsets[-1] or position <= self._positions[-1]):
            raise InvariantError(
                f"{self.path}: index entry ({offset}, {position}) does not follow "
                f"({self.base_offset + self._relative_offsets[-1]}, {self._positions[-1]})")
        if not 0 <= relative_offset <= RELATIVE_OFFSET_MAX:
            raise InvariantError(f"{self.path}: offset {offset} out of range for base {self.base_offset}")
        if count >= self.max_entries:
            raise InvariantError(f"{self.path}: index full ({count} entries)")
        self._file.append(OFFSET_ENTRY.pack(relative_offset, position))
        self._relative_offsets.append(relative_offset)
        self._positions.append(position)

    def fsync(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        self._file.close()


class TimeIndex:
    """Sparse map from timestamp to offset in one segment; timestamps only increase."""

    def __init__(self, path: str, base_offset: int, max_index_bytes: int):
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // TIME_ENTRY_BYTES)
        self._timestamps = array("q")
        self._relative_offsets = array(_U32)
        self._file = _IndexFile(path)

    def load(self, next_offset: int | None = None) -> None:
        """Read the file; raise IndexCorruptError when it is missing or inconsistent.

        `next_offset` (when known) bounds the offsets the entries may name.
        """
        data = _read_file(self.path)
        if data is None:
            raise IndexCorruptError(f"{self.path}: missing")
        if len(data) % TIME_ENTRY_BYTES:
            raise IndexCorruptError(
                f"{self.path}: {len(data)} bytes is not a whole number of {TIME_ENTRY_BYTES}-byte entries")
        timestamps = array("q")
        relative_offsets = array(_U32)
        previous_timestamp = previous_offset = -1
        for timestamp, relative_offset in TIME_ENTRY.iter_unpack(data):
            if timestamp <= previous_timestamp or relative_offset < previous_offset:
                raise IndexCorruptError(f"{self.path}: entries not increasing at timestamp {timestamp}")
            previous_timestamp, previous_offset = timestamp, relative_offset
            timestamps.append(timestamp)
            relative_offsets.append(relative_offset)
        if next_offset is not None and relative_offsets and \
                self.base_offset + relative_offsets[-1] >= next_offset:
            raise IndexCorruptError(
                f"{self.path}: last entry names offset {self.base_offset + relative_offsets[-1]}, "
                f"the segment ends before {next_offset}")
        self._timestamps, self._relative_offsets = timestamps, relative_offsets

    def reset(self, entries: list[tuple[int, int]]) -> None:
        """Replace every entry (timestamp, absolute offset) and rewrite the file."""
        self._timestamps = array("q", (timestamp for timestamp, _ in entries))
        self._relative_offsets = array(_U32, (offset - self.base_offset for _, offset in entries))
        self._file.rewrite(b"".join(TIME_ENTRY.pack(timestamp, offset - self.base_offset)
                                    for timestamp, offset in entries))

    @property
    def entry_count(self) -> int:
        return len(self._timestamps)

    @property
    def is_full(self) -> bool:
        return len(self._timestamps) >= self.max_entries

    def entries(self) -> list[tuple[int, int]]:
        return [(t, self.base_offset + r) for t, r in zip(self._timestamps, self._relative_offsets)]

    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base offset) when empty."""
        if not self._timestamps:
            return -1, self.base_offset
        return self._timestamps[-1], self.base_offset + self._relative_offsets[-1]

    def lookup(self, timestamp_ms: int) -> tuple[int, int]:
        """The largest entry whose timestamp <= `timestamp_ms`, or (-1, base offset).

        Every batch before the entry's offset has a smaller maximum timestamp, so a search
        for the first record at or after `timestamp_ms` may start at that offset.
        """
        i = bisect_right(self._timestamps, timestamp_ms) - 1
        if i < 0:
            return -1, self.base_offset
        return self._timestamps[i], self.base_offset + self._relative_offsets[i]

    def maybe_append(self, timestamp_ms: int, offset: int, *, skip_full_check: bool = False) -> bool:
        """Add (timestamp, offset) if the timestamp is larger than the last entry's."""
        if self._timestamps and timestamp_ms <= self._timestamps[-1]:
            return False
        if timestamp_ms < 0:
            return False
        relative_offset = offset - self.base_offset
        if self._relative_offsets and relative_offset < self._relative_offsets[-1]:
            raise InvariantError(
                f"{self.path}: time index offset {offset} goes backwards "
                f"(last {self.base_offset + self._relative_offsets[-1]})")
        if not skip_full_check and len(self._timestamps) >= self.max_entries:
            raise InvariantError(f"{self.path}: time index full ({len(self._timestamps)} entries)")
        self._file.append(TIME_ENTRY.pack(timestamp_ms, relative_offset))
        self._timestamps.append(timestamp_ms)
        self._relative_offsets.append(relative_offset)
        return True

    def fsync(self) -> None:
        self._file.fsync()

    def close(self) -> None:
        self._file.close()
