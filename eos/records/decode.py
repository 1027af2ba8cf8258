"""Decoding v2 record batches: whole (`decode_records`), in parts (`decode_records_part`),
and uniform runs in bulk; `eos.records.codec` re-exports the public names.

Theory of operation
-------------------
The general loop (`_decode_section`) reads records index first..stop-1 of a batch's
records section, checking each as it goes (see codec's module doc for the checks).
`decode_records` runs it over the whole batch and then requires the section to end there.
`decode_records_part` runs it over at most max_records records from the first whose offset
is at least first_offset: records before that are walked over (`_skip_records` reads only
their length and offset delta), and a `PartialDecode` -- the section, decompressed once,
and the next record's byte position and index -- lets the next part resume there. The
trailing-bytes check comes with the last part. A consumer that seeks into a big batch, or
stops before its end, so pays only for the records it takes.

Uniform runs:
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

from typing import NamedTuple

from eos.errors import CorruptRecordError
from eos.records import compression as _compression
from eos.records.header import COMPRESSION_CODEC_MASK, HEADER_SIZE, TIMESTAMP_TYPE_MASK, BatchHeader
from eos.records.varint import ZIGZAG_DECODE_1, decode_varint, decode_varlong
from eos.types import Record

CREATE_TIME = 0
LOG_APPEND_TIME = 1


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


# ---- the general loop, whole batches and parts (codec.decode_records, decode_records_part) ----

def _records_section(buf, header: BatchHeader):
    """(data, start, end): where this batch's records live, decompressed if needed.

    Uncompressed batches in a `bytes` buffer are read in place; bytes indexing and slicing
    are the fastest reads Python has, so other buffer types are copied to bytes once.
    """
    start = header.position + HEADER_SIZE
    end = header.position + header.size_bytes
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if codec:
        if codec not in _compression.CODECS:
            raise CorruptRecordError(
                f"batch at byte {header.position}: unknown compression codec id {codec} in attributes")
        data = _compression.decompress(codec, memoryview(buf)[start:end])
        return data, 0, len(data)
    if buf.__class__ is bytes:
        if end > len(buf):
            raise CorruptRecordError(
                f"truncated batch at byte {header.position}: needs {header.size_bytes} bytes")
        return buf, start, end
    data = bytes(memoryview(buf)[start:end])
    if len(data) != end - start:
        raise CorruptRecordError(
            f"truncated batch at byte {header.position}: needs {header.size_bytes} bytes")
    return data, 0, len(data)


def decode_records(buf, header: BatchHeader, topic: str, partition: int) -> list[Record]:
    """Every record of the batch `header` describes (parsed from the same `buf`).

    Offsets are base_offset + offsetDelta; timestamps baseTimestamp + delta, or the batch's
    maxTimestamp for every record under LogAppendTime. Headers are lists of
    (str, bytes | None). Raises CorruptRecordError unless the section holds exactly
    recordsCount well-formed records.
    """
    data, position, end = _records_section(buf, header)
    records, position = _decode_section(data, position, end, header, topic, partition, 0, header.records_count)
    if position != end:
        _raise_trailing_bytes(header, end - position)
    return records


class PartialDecode(NamedTuple):
    """Where a batch decoded in parts stands: its records section (decompressed, for a
    compressed batch, once) and the byte position and index of its next record."""

    data: bytes
    position: int
    end: int
    index: int


def decode_records_part(buf, header: BatchHeader, topic: str, partition: int, *, first_offset: int,
                        max_records: int, resume: PartialDecode | None = None
                        ) -> tuple[list[Record], PartialDecode | None]:
    """At most `max_records` records of the batch, from the first whose offset is at least
    `first_offset`, and where the next part starts (None: the batch is done). Pass the
    PartialDecode back as `resume` for the next part.

    For a reader that wants part of a batch -- a consumer that sought into it, or that
    stops before its end -- records before `first_offset` are walked over, not built, and
    records after the part are not touched until asked for. The records are those
    decode_records gives, with the same checks; the section's trailing bytes are checked
    when the last part is decoded.
    """
    if resume is None:
        data, position, end = _records_section(buf, header)
        index = 0
    else:
        data, position, end, index = resume
    count = header.records_count
    if first_offset > header.base_offset + index:
        position, index = _skip_records(data, position, end, header, index, first_offset)
    stop = min(count, index + max(1, max_records))
    records, position = _decode_section(data, position, end, header, topic, partition, index, stop)
    if stop < count:
        return records, PartialDecode(data, position, end, stop)
    if position != end:
        _raise_trailing_bytes(header, end - position)
    return records, None


def _raise_trailing_bytes(header: BatchHeader, extra: int):
    raise CorruptRecordError(
        f"batch at byte {header.position}: {extra} bytes follow the {header.records_count} records "
        f"recordsCount declares")


def _skip_records(data, position: int, end: int, header: BatchHeader, index: int,
                  first_offset: int) -> tuple[int, int]:
    """(position, index) of the first record from `index` on whose offset is at least
    `first_offset` (or of the section's end): each record before it is only measured."""
    count = header.records_count
    base_offset = header.base_offset
    try:
        while index < count:
            length, body = decode_varint(data, position)
            record_end = body + length
            if length <= 0 or record_end > end:
                _raise_bad_length(header, count, index, position, end, length, body)
            # attributes (i8), timestampDelta (varlong), then offsetDelta (varint)
            _, at = decode_varlong(data, body + 1)
            offset_delta, _ = decode_varint(data, at)
            if base_offset + offset_delta >= first_offset:
                break
            position = record_end
            index += 1
    except IndexError:
        raise CorruptRecordError(f"batch at byte {header.position}: record {index} is truncated") from None
    return position, index


def _decode_section(data, position: int, end: int, header: BatchHeader, topic: str, partition: int,
                    first_index: int, stop_index: int) -> tuple[list[Record], int]:
    """The records of index first_index .. stop_index - 1, the first at byte `position` of
    the records section `data[..end]`; and the byte position after them."""
    count = header.records_count
    attributes = header.attributes
    if attributes & TIMESTAMP_TYPE_MASK:
        # LogAppendTime: every record shows the broker's time, whatever its delta says
        base_timestamp, delta_scale, timestamp_type = header.max_timestamp, 0, LOG_APPEND_TIME
    else:
        base_timestamp, delta_scale, timestamp_type = header.base_timestamp, 1, CREATE_TIME
    base_offset = header.base_offset

    records: list[Record] = []
    if stop_index - first_index >= RUN_RECORDS_MIN and data.__class__ is bytes:
        # uniform runs (null keys, same-length values, no headers) in bulk; the loop below
        # takes whatever they leave (see eos/records/decode.py)
        position = decode_runs(data, position, end, first_index, stop_index, topic, partition, base_offset,
                               base_timestamp, delta_scale, timestamp_type, records)
    append = records.append
    new_record = tuple.__new__
    record_class = Record
    zigzag1 = ZIGZAG_DECODE_1
    record_start = position
    try:
        for _ in range(stop_index - first_index - len(records)):
            record_start = position
            # length (varint): 1 or 2 bytes inline
            byte = data[position]
            if byte < 0x80:
                length = zigzag1[byte]
                position += 1
            else:
                byte2 = data[position + 1]
                if byte2 < 0x80:
                    raw = (byte & 0x7F) | (byte2 << 7)
                    length = (raw >> 1) ^ -(raw & 1)
                    position += 2
                else:
                    length, position = decode_varint(data, position)
            record_end = position + length
            if length <= 0 or record_end > end:
                _raise_bad_length(header, count, first_index + len(records), record_start, end, length, position)
            # attributes (i8, unused) and timestampDelta (varlong)
            byte = data[position + 1]
            if byte < 0x80:
                timestamp_delta = zigzag1[byte]
                position += 2
            else:
                byte2 = data[position + 2]
                if byte2 < 0x80:
                    raw = (byte & 0x7F) | (byte2 << 7)
                    timestamp_delta = (raw >> 1) ^ -(raw & 1)
                    position += 3
                else:
                    timestamp_delta, position = decode_varlong(data, position + 1)
            # offsetDelta (varint)
            byte = data[position]
            if byte < 0x80:
                offset_delta = zigzag1[byte]
                position += 1
            else:
                byte2 = data[position + 1]
                if byte2 < 0x80:
                    raw = (byte & 0x7F) | (byte2 << 7)
                    offset_delta = (raw >> 1) ^ -(raw & 1)
                    position += 2
                else:
                    offset_delta, position = decode_varint(data, position)
            # key
            byte = data[position]
            if byte == 1:
                key = None
                position += 1
            else:
                if byte < 0x80:
                    key_length = zigzag1[byte]
                    position += 1
                else:
                    byte2 = data[position + 1]
                    if byte2 < 0x80:
                        raw = (byte & 0x7F) | (byte2 << 7)
                        key_length = (raw >> 1) ^ -(raw & 1)
                        position += 2
                    else:
                        key_length, position = decode_varint(data, position)
                if key_length < 0:
                    raise CorruptRecordError(
                        f"batch at byte {header.position}: record {first_index + len(records)} has key length "
                        f"{key_length}")
                key = data[position:position + key_length]
                position += key_length
            # value
            byte = data[position]
            if byte == 1:
                value = None
                position += 1
            else:
                if byte < 0x80:
                    value_length = zigzag1[byte]
                    position += 1
                else:
                    byte2 = data[position + 1]
                    if byte2 < 0x80:
                        raw = (byte & 0x7F) | (byte2 << 7)
                        value_length = (raw >> 1) ^ -(raw & 1)
                        position += 2
                    else:
                        value_length, position = decode_varint(data, position)
                if value_length < 0:
                    raise CorruptRecordError(
                        f"batch at byte {header.position}: record {first_index + len(records)} has value length "
                        f"{value_length}")
                value = data[position:position + value_length]
                position += value_length
            # headers
            if data[position] == 0:
                headers = []
                position += 1
            else:
                headers, position = _decode_headers(data, position, record_end, header, first_index + len(records))
            if position != record_end:
                raise CorruptRecordError(
                    f"batch at byte {header.position}: record {first_index + len(records)} declares {length} bytes "
                    f"but its fields take {length + position - record_end}")
            append(new_record(record_class, (
                topic, partition, base_offset + offset_delta, key, value,
                base_timestamp + timestamp_delta * delta_scale, headers, timestamp_type)))
    except IndexError:
        if record_start >= end:
            raise CorruptRecordError(
                f"batch at byte {header.position}: recordsCount is {count} but the records section "
                f"holds only {first_index + len(records)}") from None
        raise CorruptRecordError(
            f"batch at byte {header.position}: record {first_index + len(records)} is truncated") from None
    return records, position


def _raise_bad_length(header, count, index, record_start, end, length, position):
    if record_start >= end:
        raise CorruptRecordError(
            f"batch at byte {header.position}: recordsCount is {count} but the records section "
            f"holds only {index}")
    raise CorruptRecordError(
        f"batch at byte {header.position}: record {index} declares {length} bytes, "
        f"{end - position} remain in the batch")


def _decode_headers(data, position: int, record_end: int, header: BatchHeader, index: int):
    header_count, position = decode_varint(data, position)
    # each header takes at least two bytes: refuse absurd counts before looping on them
    if header_count < 0 or 2 * header_count > record_end - position:
        raise CorruptRecordError(
            f"batch at byte {header.position}: record {index} declares {header_count} headers")
    headers = []
    for _ in range(header_count):
        key_length, position = decode_varint(data, position)
        if key_length < 0:
            raise CorruptRecordError(
                f"batch at byte {header.position}: record {index} has a header key of length {key_length}")
        try:
            header_key = data[position:position + key_length].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptRecordError(
                f"batch at byte {header.position}: record {index} has a header key that is not "
                f"UTF-8: {exc}") from None
        position += key_length
        value_length, position = decode_varint(data, position)
        if value_length == -1:
            header_value = None
        elif value_length < 0:
            raise CorruptRecordError(
                f"batch at byte {header.position}: record {index} has a header value of length "
                f"{value_length}")
        else:
            header_value = data[position:position + value_length]
            position += value_length
        headers.append((header_key, header_value))
    return headers, position
