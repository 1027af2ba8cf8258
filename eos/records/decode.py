"""Bulk decoding of uniform runs of records, for `codec.decode_records`.

Theory of operation
-------------------
Producers mostly write batches whose records differ only in their offset delta, timestamp
delta and value bytes: null key, values of one length, no headers, offset deltas 0, 1, 2,
... Such a record is a fixed frame around three varying fields:

    length | attributes 0 | timestampDelta | offsetDelta | keyLength -1 | valueLength | value | 0

and while the widths of the varints stay the same, every record of the run has the same
size S. The bytes at frame position k of all the records are then `data[start+k:stop:S]`,
one C-level slice, so a whole run is checked with a few slices compared to what they must
hold (`bytes.lstrip`, a regex search, equality with tables of offset-delta bytes), and
built with one comprehension for the values and one `map` for the Records: no Python
bytecode per field per record.

`decode_runs` reads the first record's frame with ordinary code, takes the longest run
from there that every check accepts (each check gives how many leading records pass),
emits it and starts again after it. It stops, leaving the rest to the caller's general
loop, at the first record that is not of this shape (a key, a null value, headers, a
timestamp delta of more than two varint bytes or an offset delta of more than three, an
offset delta that is not the record's index) or that starts a run shorter than
RUN_RECORDS_MIN. Anything malformed is therefore never
accepted here: the general loop meets it and raises the error it always raised. The
Records are the general loop's: same fields, a fresh headers list each.

Speed (2026-11-22, shared 2-core VM under load, so +-20%): `bench.micro_records --codecs
none` decode, general loop alone -> with runs: 500-record batches 1.06M -> 1.52M
records/s; 9,520-record batches (1 MiB, the consume bench's) 536k -> 1.95M. The GC pause
around the build (see there) took the consume bench from ~390k to ~715k records/s.
"""
from __future__ import annotations

import re
import threading
from gc import disable as gc_disable
from gc import enable as gc_enable
from gc import isenabled as gc_isenabled
from itertools import repeat

from eos.records.varint import ZIGZAG_DECODE_1
from eos.types import Record

class _GcPause:
    """Automatic garbage collection paused while any thread is inside a bulk build.

    The collector's switch is process-wide, so a per-call save/restore would let two
    decoding threads (or a thread switch between the save and the restore) leave it off for
    good or turn it back on under another builder. Instead the first thread in turns it off
    -- only if it was on -- and the last one out turns it back on. `exit` is called from a
    `finally` that also covers `enter`, so it tolerates an `enter` that never counted (an
    interrupt inside it): the count never goes below zero, and the worst case of a
    mismatch is the collector coming back early, which costs speed, never memory.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._turned_off = False       # whether we, not the application, switched it off

    def enter(self) -> None:
        with self._lock:
            if self._inside == 0 and gc_isenabled():
                gc_disable()
                self._turned_off = True
            self._inside += 1

    def exit(self) -> None:
        with self._lock:
            if self._inside > 0:
                self._inside -= 1
            if self._inside == 0 and self._turned_off:
                self._turned_off = False
                gc_enable()


_GC_PAUSE = _GcPause()

RUN_RECORDS_MIN = 8          # shorter runs cost more in set-up than the general loop
# Offset deltas below these take 1, 2 and 3 varint bytes (zigzag doubles them). A 1 MiB
# batch holds at most ~130k records, so wider ones are left to the general loop.
_OFFSET_WIDTH_END = (0, 64, 8192, 1 << 20)

# Per varint width, its bytes for offset delta i (the record's index), one bytes object
# per byte of the varint, indexed by i; grown on demand up to the width's end.
_offset_delta_columns_by_width: dict[int, list[bytes]] = {}


def _offset_delta_columns(width: int, last: int) -> list[bytes]:
    """The byte columns of offset deltas of `width` varint bytes, covering deltas below
    `last` (entries below the width's range are unused)."""
    columns = _offset_delta_columns_by_width.get(width)
    if columns is None or len(columns[0]) < last:
        size = min(_OFFSET_WIDTH_END[width], max(last, 2 * len(columns[0]) if columns else 0))
        zigzag = range(0, 2 * size, 2)
        columns = [bytes(((value >> (7 * j)) & 0x7F) | (0x80 if j < width - 1 else 0) for value in zigzag)
                   for j in range(width)]
        _offset_delta_columns_by_width[width] = columns   # a race builds it twice, no harm
    return columns


_CONTINUED = re.compile(rb"[\x80-\xff]")       # a varint byte with the continuation bit
_LAST = re.compile(rb"[\x00-\x7f]")            # a varint's last byte

_NULL_KEY = 0x01            # varint -1
_NO_HEADERS = 0x00


def _small_varint(data: bytes, position: int, max_width: int = 2) -> tuple[int, int] | None:
    """(value, width) of the zigzag varint at `position` when it is at most `max_width`
    (2 or 3) bytes, else None."""
    byte = data[position]
    if byte < 0x80:
        return ZIGZAG_DECODE_1[byte], 1
    byte2 = data[position + 1]
    if byte2 < 0x80:
        raw = (byte & 0x7F) | (byte2 << 7)
        return (raw >> 1) ^ -(raw & 1), 2
    if max_width < 3:
        return None
    byte3 = data[position + 2]
    if byte3 >= 0x80:
        return None
    raw = (byte & 0x7F) | ((byte2 & 0x7F) << 7) | (byte3 << 14)
    return (raw >> 1) ^ -(raw & 1), 3


def _frame(data: bytes, start: int, end: int):
    """(size, length width, timestamp-delta width, offset-delta width, value-length width,
    value length) of the record at `start` if it has the run shape, else None."""
    try:
        found = _small_varint(data, start)
        if found is None:
            return None
        length, length_width = found
        position = start + length_width
        if data[position] != 0:                       # attributes
            return None
        found = _small_varint(data, position + 1)
        if found is None:
            return None
        timestamp_width = found[1]
        position += 1 + timestamp_width
        found = _small_varint(data, position, 3)
        if found is None:
            return None
        offset_width = found[1]
        position += offset_width
        if data[position] != _NULL_KEY:
            return None
        found = _small_varint(data, position + 1)
        if found is None or found[0] < 0:             # a null value: the general loop
            return None
        value_length, value_length_width = found
        position += 1 + value_length_width + value_length
        if position >= end or data[position] != _NO_HEADERS:
            return None
    except IndexError:
        return None
    size = position + 1 - start
    if length != size - length_width:
        return None
    return size, length_width, timestamp_width, offset_width, value_length_width, value_length


def _same_byte_prefix(column: bytes, byte: int) -> int:
    """How many leading bytes of `column` equal `byte`."""
    return len(column) - len(column.lstrip(bytes((byte,))))


def _equal_prefix(column: bytes, expected: bytes) -> int:
    """How many leading bytes of `column` equal those of `expected` (same length)."""
    if column == expected:
        return len(column)
    low, high = 0, len(column) - 1      # a prefix of `low` bytes matches; `high + 1` does not
    while low < high:
        middle = (low + high + 1) // 2
        if column[:middle] == expected[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _search_prefix(pattern: re.Pattern, column: bytes) -> int:
    """How many leading bytes of `column` do not match `pattern` (a one-byte class)."""
    found = pattern.search(column)
    return len(column) if found is None else found.start()


def decode_runs(data: bytes, position: int, end: int, index: int, count: int, topic: str, partition: int,
                base_offset: int, base_timestamp: int, delta_scale: int, timestamp_type: int,
                records: list) -> int:
    """Append to `records` the uniform runs from record `index` (at byte `position`) up to
    record `count` at most (see the module doc); return the position of the first record
    not decoded (the general loop's)."""
    new_record = tuple.__new__
    zigzag1 = ZIGZAG_DECODE_1
    while count - index >= RUN_RECORDS_MIN:
        frame = _frame(data, position, end)
        if frame is None:
            break
        size, length_width, timestamp_width, offset_width, value_length_width, value_length = frame
        if index < _OFFSET_WIDTH_END[offset_width - 1]:
            break   # a varint wider than the record's index needs: not an offset delta of ours
        last = min(count, _OFFSET_WIDTH_END[offset_width], index + (end - position) // size)
        run = last - index
        if run < RUN_RECORDS_MIN:
            break
        stop = position + run * size
        # the fixed frame bytes: length, attributes, null key, value length, header count
        fixed_at = [*range(length_width), length_width, length_width + 1 + timestamp_width + offset_width,
                    *range(length_width + 2 + timestamp_width + offset_width,
                           length_width + 2 + timestamp_width + offset_width + value_length_width),
                    size - 1]
        for k in fixed_at:
            run = min(run, _same_byte_prefix(data[position + k:stop:size], data[position + k]))
        # offset deltas: the record's index
        offset_at = position + length_width + 1 + timestamp_width
        for j, column in enumerate(_offset_delta_columns(offset_width, last)):
            run = min(run, _equal_prefix(data[offset_at + j:stop:size], column[index:last]))
        # timestamp deltas: varints of the first record's width
        timestamp_at = position + length_width + 1
        if timestamp_width == 1:
            run = min(run, _search_prefix(_CONTINUED, data[timestamp_at:stop:size]))
        else:
            run = min(run, _search_prefix(_LAST, data[timestamp_at:stop:size]),
                      _search_prefix(_CONTINUED, data[timestamp_at + 1:stop:size]))
        if run < RUN_RECORDS_MIN:
            break
        stop = position + run * size
        # the run is checked: build its records
        if delta_scale == 0:
            timestamps = repeat(base_timestamp, run)
        elif timestamp_width == 1:
            column = data[timestamp_at:stop:size]
            if _same_byte_prefix(column, column[0]) == run:
                timestamps = repeat(base_timestamp + zigzag1[column[0]], run)
            else:
                timestamps = [base_timestamp + zigzag1[byte] for byte in column]
        else:
            timestamps = [base_timestamp + ((raw >> 1) ^ -(raw & 1))
                          for raw in map(int.__or__, map((0x7F).__and__, data[timestamp_at:stop:size]),
                                         map((7).__rlshift__, data[timestamp_at + 1:stop:size]))]
        value_at = position + size - 1 - value_length
        values = [data[at:at + value_length] for at in range(value_at, stop, size)]
        # Each record is two objects the cyclic GC tracks (the Record and its headers
        # list), and they all survive: with automatic collection on, a 10k-record run
        # set off ~28 young collections, and the old-generation ones they feed, and the GC
        # cost more than building the records. One C-level call builds the run with
        # automatic collection paused (see _GcPause for how threads share the pause).
        try:
            _GC_PAUSE.enter()
            records += map(new_record, repeat(Record, run), zip(
                repeat(topic, run), repeat(partition, run), range(base_offset + index, base_offset + index + run),
                repeat(None, run), values, timestamps, map(list, repeat((), run)), repeat(timestamp_type, run)))
        finally:
            _GC_PAUSE.exit()
        index += run
        position = stop
    return position
