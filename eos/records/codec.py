"""Kafka v2 records: encode them into whole batches, decode batches back into records.

Theory of operation
-------------------
A batch is the 61-byte header (`eos.records.header` owns its layout) followed by the
records section, compressed as one block when the attributes name a codec. Each record
(Kafka's DefaultRecord) is:

    length varint              bytes after this field
    attributes i8              unused, 0
    timestampDelta varlong     record timestamp - batch baseTimestamp (may be negative)
    offsetDelta varint         record offset - batch baseOffset
    keyLength varint, key      -1 and no bytes for a null key
    valueLength varint, value  -1 and no bytes for a null value
    headerCount varint, then per header:
        headerKeyLength varint, key (UTF-8)
        headerValueLength varint, value   (-1: null)

Writing (`BatchBuilder`). The producer's accumulator appends records one at a time (or in
bulk) and builds when the batch is sent. All per-record work happens at append time: each
record becomes a few `bytes` pieces pushed onto one flat list, with its length computed
arithmetically (no intermediate join). `build()` then only joins, compresses and CRCs. It
caches the joined-and-compressed section, because an idempotent producer that bumps its
epoch rebuilds the same records under a new producer id/epoch/sequence: a rebuild redoes
the 61-byte header and the CRC only. Appending after a build invalidates the cache.

Reading (`decode_records`). Decoding works on the bytes in place (no copy when the caller
holds `bytes` and the batch is uncompressed), and validates as it goes: every record's
declared length must match what its fields consume, the section must hold exactly
recordsCount records and nothing after them. Any mismatch, a truncated field or a varint
longer than 5 (10) bytes is CorruptRecordError saying what is wrong and where. The decoder
itself -- whole batches, batches in parts (`decode_records_part`) and the bulk runs -- lives
in eos/records/decode.py; this module re-exports it.

Speed (pure Python 3.11; bench/micro_records.py, 100k records of 100-byte values, null
keys, 500-record batches, uncompressed unless said; best of 5 on the shared 2-core dev
machine, so +-10%):

                         baseline        optimised
    append               390k rec/s      2.2M rec/s   varint tables, flat piece list, no per-record join
    append_many          410k rec/s      4.4M rec/s   + precomputed record heads, one join per call
      (16-byte keys)                     2.5M rec/s   (the general bulk path)
    rebuild, lz4         25k batch/s     390k batch/s cached compressed section: header + CRC only
    decode_records       450k rec/s      1.2M rec/s   in-place reads, inline 1-/2-byte varints,
      (16-byte keys)                     1.1M rec/s   tuple.__new__ for Record, try/except for bounds

Hot-loop choices, each measured: lists of precomputed varint `bytes` for values below 8192
(`VARINT_OF`); a one-byte zigzag decode table; inlined two-byte varint decoding (the record
length and value length of a 100-byte record are two-byte varints); names bound to locals;
`tuple.__new__(Record, ...)` rather than the NamedTuple's Python-level `__new__`.
Producer batches (null keys, no headers, values of one length, timestamps in runs of
equal milliseconds) skip the per-record loop altogether: each run is three slice
assignments of precomputed pieces and one join (`_encode_same_length`); append_many of
100-byte values went from 1.29M to 5.0M records/s with it (same machine, same load).
Keyed records (bytes keys and values, one timestamp or runs of one, no headers: what
send_batch with keys and send() with keys build) are encoded column by column
(`_encode_keyed`: map() over C callables, slice assignments, one join); 9,500 keyed
100-byte records went from 1.22-1.40M to 1.53-1.67M records/s.
"""
from __future__ import annotations

import struct
import time
from itertools import groupby
from operator import add as _add

from crc32c import crc32c

from eos.errors import CorruptRecordError, InvalidRecordError
from eos.records import compression as _compression
from eos.records.decode import (  # decoding lives in decode.py; codec is its public face
    CREATE_TIME, LOG_APPEND_TIME, PartialDecode, decode_records, decode_records_part)
from eos.records.header import (
    CONTROL_FLAG, HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE,
    TRANSACTIONAL_FLAG, BatchHeader, iter_headers, verify_crc)
from eos.records.varint import (
    INT32_MAX, INT64_MAX, INT64_MIN, VARINT_OF, VARINT_TABLE_SIZE, decode_unsigned_varint, decode_varint,
    decode_varlong, encode_unsigned_varint, encode_varint, encode_varlong, size_of_varint, size_of_varlong)

__all__ = [
    "BatchBuilder", "encode_batch", "encode_control_batch", "decode_control_record", "decode_records",
    "decode_records_part", "PartialDecode", "iter_decoded", "encode_varint", "encode_varlong", "decode_varint",
    "decode_varlong",
    "encode_unsigned_varint", "decode_unsigned_varint", "size_of_varint", "size_of_varlong",
    "CREATE_TIME", "LOG_APPEND_TIME", "CONTROL_TYPE_ABORT", "CONTROL_TYPE_COMMIT",
]


# control records (transaction markers)
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VALUE_VERSION = 0
_CONTROL_KEY = struct.Struct(">hh")           # version, type
_END_TXN_MARKER_VALUE = struct.Struct(">hi")  # version, coordinator epoch

# the header split where build() needs it: the 21 bytes before the CRC'd range, and the
# 40 bytes from attributes on (the start of the CRC'd range)
_HEADER_PREFIX = struct.Struct(">qiibI")
_HEADER_TAIL = struct.Struct(">hiqqqhii")
_BATCH_LENGTH_EMPTY = HEADER_SIZE - LOG_OVERHEAD  # batchLength of a header with no records

# _encode_timestamp_runs gives up (general path) when there is more than one run of equal
# timestamps per this many records: a run costs a call, a slice and a table of heads.
RUNS_PER_RECORD_MAX = 8

_NULL = b"\x01"  # varint -1: a null key or value
_NO_HEADERS = b"\x00"
_ATTRIBUTES = b"\x00"
_BYTES_ONLY = {bytes}

# _HEAD0_NULL_KEY[d]: attributes, timestampDelta 0, offsetDelta d, keyLength -1 -- the
# leading bytes of every record that append_many writes with one timestamp and null keys.
_HEAD0_NULL_KEY = [b"\x00\x00" + v + _NULL for v in VARINT_OF]

# Records of one timestamp, null keys, no headers and values of one length (what a
# producer sending same-sized values writes) differ only in their offset delta and
# value. Such a record is three pieces: a head (the header count 0 of the record before
# it, the record length, attributes, timestamp delta), which only changes where the
# offset delta's varint gets longer; a tail (offset delta, null key, value length), from
# a table per value length; and the value. Encoding a run is three slice assignments and
# a join, no Python loop per record. Bounded: at most this many tables (value lengths),
# each for offset deltas below the second limit.
_SAME_LENGTH_TABLES_MAX = 64
_SAME_LENGTH_OFFSETS_MAX = 16384
_same_length_tails: dict[int, list[bytes]] = {}
# (first offset delta, end) of each varint width of an offset delta below the limit
_OFFSET_WIDTHS = ((0, 64, 1), (64, 8192, 2), (8192, _SAME_LENGTH_OFFSETS_MAX, 3))


def _same_length_tails_table(value_length: int, offsets_needed: int) -> list[bytes]:
    """tails[d]: offset delta d, null key length, value length -- for d below
    `offsets_needed` (<= _SAME_LENGTH_OFFSETS_MAX)."""
    table = _same_length_tails.get(value_length)
    if table is not None and len(table) >= offsets_needed:
        return table
    if table is None and len(_same_length_tails) >= _SAME_LENGTH_TABLES_MAX:
        _same_length_tails.clear()
    size = min(_SAME_LENGTH_OFFSETS_MAX, max(offsets_needed, 256, 2 * len(table or ())))
    suffix = _NULL + (VARINT_OF[value_length] if value_length < VARINT_TABLE_SIZE else encode_varint(value_length))
    table = ([varint + suffix for varint in VARINT_OF[:size]]
             + [encode_varint(d) + suffix for d in range(VARINT_TABLE_SIZE, size)])
    _same_length_tails[value_length] = table
    return table


def _encode_same_length(values: list, first_offset_delta: int, delta_bytes: bytes, value_length: int) -> bytes:
    """The records section of `values` (bytes, all `value_length` long, offset deltas
    below _SAME_LENGTH_OFFSETS_MAX) with one timestamp delta, null keys and no headers."""
    count = len(values)
    end = first_offset_delta + count
    tails = _same_length_tails_table(value_length, end)
    value_length_width = len(tails[0]) - 2
    # the record length without its offset delta: attributes, timestamp delta, null key,
    # value length, value, header count
    fixed = 1 + len(delta_bytes) + 1 + value_length_width + value_length + 1
    heads: list[bytes] = []
    for low, high, width in _OFFSET_WIDTHS:
        low, high = max(low, first_offset_delta), min(high, end)
        if low < high:
            body_length = fixed + width
            heads += [b"".join((_NO_HEADERS, VARINT_OF[body_length] if body_length < VARINT_TABLE_SIZE
                                else encode_varint(body_length), _ATTRIBUTES, delta_bytes))] * (high - low)
    pieces = [_NO_HEADERS] * (3 * count + 1)
    pieces[0:3 * count:3] = heads
    pieces[1:3 * count:3] = tails[first_offset_delta:end]
    pieces[2:3 * count:3] = values
    pieces[0] = pieces[0][1:]          # the first record has no record before it
    return b"".join(pieces)


# _LENGTH_WITH_VARINT[n]: n plus the bytes of n's varint (a length and its length field)
_LENGTH_WITH_VARINT = [n + len(VARINT_OF[n]) for n in range(VARINT_TABLE_SIZE)]


def _encode_keyed(values, keys, first_offset_delta: int, timestamp_delta: int, timestamp_ms: int):
    """(records section, timestamp_ms) of records with one timestamp, no headers, and bytes
    keys and values (none null) whose lengths and record lengths are below
    VARINT_TABLE_SIZE; None (for the general path) otherwise.

    A keyed record is eight pieces -- record length, attributes + timestamp delta, offset
    delta, key length, key, value length, value, header count 0 -- each of which is a
    table lookup or the caller's bytes. Every column is computed for all records at once
    with map() over C callables (len, list.__getitem__, int.__add__, operator.add) and
    placed with one slice assignment, then one join: no Python frame per record."""
    count = len(values)
    end = first_offset_delta + count
    if count == 0 or end > INT32_MAX or not 0 <= timestamp_delta < VARINT_TABLE_SIZE:
        return None
    values = values if values.__class__ is list else list(values)
    keys = keys if keys.__class__ is list else list(keys)
    if set(map(type, values)) != _BYTES_ONLY or set(map(type, keys)) != _BYTES_ONLY:
        return None    # null keys or values, or other buffer types: the general path
    varint_at = VARINT_OF.__getitem__
    key_lengths = list(map(len, keys))
    value_lengths = list(map(len, values))
    if max(key_lengths) >= VARINT_TABLE_SIZE or max(value_lengths) >= VARINT_TABLE_SIZE:
        return None
    offset_delta_bytes = VARINT_OF[first_offset_delta:end]
    if end > VARINT_TABLE_SIZE:   # a 1 MiB bulk batch of small records goes past the table
        offset_delta_bytes += map(encode_varint, range(max(first_offset_delta, VARINT_TABLE_SIZE), end))
    attributes_and_delta = _ATTRIBUTES + VARINT_OF[timestamp_delta]
    # attributes, timestamp delta and the header count: the same for every record
    fixed = len(attributes_and_delta) + len(_NO_HEADERS)
    with_varint = _LENGTH_WITH_VARINT.__getitem__    # n + the width of n's varint
    one_value_length = value_lengths[0] if value_lengths.count(value_lengths[0]) == count else -1
    if one_value_length >= 0:     # values of one length (the usual producer): a constant
        fixed += with_varint(one_value_length)
        value_length_bytes = [VARINT_OF[one_value_length]] * count
        variable = map(with_varint, key_lengths)
    else:
        value_length_bytes = list(map(varint_at, value_lengths))
        variable = map(_add, map(with_varint, key_lengths), map(with_varint, value_lengths))
    body_lengths = list(map(fixed.__add__, map(_add, variable, map(len, offset_delta_bytes))))
    if max(body_lengths) >= VARINT_TABLE_SIZE:
        return None
    pieces = [_NO_HEADERS] * (8 * count)
    pieces[0::8] = map(varint_at, body_lengths)
    pieces[1::8] = [attributes_and_delta] * count
    pieces[2::8] = offset_delta_bytes
    pieces[3::8] = map(varint_at, key_lengths)
    pieces[4::8] = keys
    pieces[5::8] = value_length_bytes
    pieces[6::8] = values
    return b"".join(pieces), timestamp_ms


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _to_bytes(blob, what: str) -> bytes:
    """A bytes-like object as immutable bytes (a copy, so later mutation cannot leak in)."""
    if isinstance(blob, (bytearray, memoryview)):
        return bytes(blob)
    raise InvalidRecordError(f"{what} must be bytes or None, got {type(blob).__name__}")


def _record_bytes(blob, what: str, index: int) -> bytes:
    """`_to_bytes` for the bulk paths, naming the record. A buffer's len() counts items,
    not bytes, for formats wider than a byte: copying to bytes makes the length right."""
    if isinstance(blob, (bytearray, memoryview)):
        return bytes(blob)
    raise InvalidRecordError(f"record {index}: {what} must be bytes or None, got {type(blob).__name__}")


def _encode_headers(headers) -> bytes:
    """headerCount and the headers of one record."""
    try:
        parts = [encode_varint(len(headers))]
        for header_key, header_value in headers:
            key_bytes = header_key.encode("utf-8")
            parts.append(encode_varint(len(key_bytes)))
            parts.append(key_bytes)
            if header_value is None:
                parts.append(_NULL)
            else:
                if header_value.__class__ is not bytes:
                    header_value = _to_bytes(header_value, f"header {header_key!r} value")
                parts.append(encode_varint(len(header_value)))
                parts.append(header_value)
    except (TypeError, ValueError, AttributeError) as exc:
        raise InvalidRecordError(
            f"headers must be a list of (str, bytes | None) pairs: {type(exc).__name__}: {exc}") from None
    return b"".join(parts)


class BatchBuilder:
    """Accumulates records for one batch; `build()` turns them into v2 batch bytes.

    Not thread-safe: the producer's accumulator owns each builder under its own lock.
    Values, keys and header values given as `bytes` are kept by reference until build.
    """

    __slots__ = ("_compression", "_timestamp_type", "_pieces", "_count", "_records_bytes",
                 "_base_timestamp_ms", "_max_timestamp_ms", "_section", "_section_count")

    def __init__(self, *, compression: int = 0, timestamp_type: int = CREATE_TIME):
        if compression not in _compression.CODECS:
            raise InvalidRecordError(f"unknown compression codec id {compression!r}: expected 0-4")
        if timestamp_type not in (CREATE_TIME, LOG_APPEND_TIME):
            raise InvalidRecordError(
                f"timestamp_type must be 0 (CreateTime) or 1 (LogAppendTime), got {timestamp_type!r}")
        self._compression = compression
        self._timestamp_type = timestamp_type
        self._pieces: list[bytes] = []   # the records section, uncompressed, as pieces to join
        self._count = 0
        self._records_bytes = 0          # total length of the pieces
        self._base_timestamp_ms: int | None = None
        self._max_timestamp_ms = -1
        self._section: bytes | None = None  # joined and compressed pieces, cached by build()
        self._section_count = -1            # the record count the cached section holds

    # --- appending --------------------------------------------------------------------

    def append(self, value, key=None, timestamp_ms: int | None = None, headers=None) -> int:
        """Add one record; return its offset delta. Nothing changes if the record is refused."""
        offset_delta = self._count
        if timestamp_ms is None:
            timestamp_ms = _now_ms()
        elif timestamp_ms.__class__ is not int:
            timestamp_ms = _as_timestamp(timestamp_ms)
        base_timestamp_ms = self._base_timestamp_ms
        if base_timestamp_ms is None:
            base_timestamp_ms = timestamp_ms
        timestamp_delta = timestamp_ms - base_timestamp_ms
        if 0 <= timestamp_delta < VARINT_TABLE_SIZE:
            timestamp_delta_bytes = VARINT_OF[timestamp_delta]
        else:
            timestamp_delta_bytes = _encode_timestamp_delta(timestamp_delta, timestamp_ms)
        if offset_delta < VARINT_TABLE_SIZE:
            offset_delta_bytes = VARINT_OF[offset_delta]
        elif offset_delta < INT32_MAX:
            offset_delta_bytes = encode_varint(offset_delta)
        else:
            raise InvalidRecordError(f"a batch holds at most {INT32_MAX} records")

        if key is None:
            key_length_bytes = _NULL
            key = b""
        else:
            if key.__class__ is not bytes:
                key = _to_bytes(key, "key")
            key_length = len(key)
            key_length_bytes = VARINT_OF[key_length] if key_length < VARINT_TABLE_SIZE else encode_varint(key_length)
        if value is None:
            value_length_bytes = _NULL
            value = b""
        else:
            if value.__class__ is not bytes:
                value = _to_bytes(value, "value")
            value_length = len(value)
            value_length_bytes = (VARINT_OF[value_length] if value_length < VARINT_TABLE_SIZE
                                  else encode_varint(value_length))
        headers_bytes = _encode_headers(headers) if headers else _NO_HEADERS

        body_length = (1 + len(timestamp_delta_bytes) + len(offset_delta_bytes) + len(key_length_bytes)
                       + len(key) + len(value_length_bytes) + len(value) + len(headers_bytes))
        length_bytes = VARINT_OF[body_length] if body_length < VARINT_TABLE_SIZE else encode_varint(body_length)

        # apply: nothing above touched self
        self._pieces += (length_bytes, _ATTRIBUTES, timestamp_delta_bytes, offset_delta_bytes,
                         key_length_bytes, key, value_length_bytes, value, headers_bytes)
        self._records_bytes += len(length_bytes) + body_length
        self._count = offset_delta + 1
        self._base_timestamp_ms = base_timestamp_ms
        if timestamp_ms > self._max_timestamp_ms:
            self._max_timestamp_ms = timestamp_ms
        return offset_delta

    def append_many(self, values, keys=None, timestamps_ms=None, headers=None) -> int:
        """Add many records in one call; return how many were added.

        `keys` and `headers` are None or sequences as long as `values`; `timestamps_ms` is
        None (now, one reading for all), one int for all, or a sequence. All-or-nothing: a
        refused record leaves the builder as it was.
        """
        count = len(values)
        if count == 0:
            return 0
        if keys is not None and len(keys) != count:
            raise InvalidRecordError(f"{len(keys)} keys for {count} values")
        if headers is not None and len(headers) != count:
            raise InvalidRecordError(f"{len(headers)} header lists for {count} values")
        first_offset_delta = self._count
        if first_offset_delta + count > INT32_MAX:
            raise InvalidRecordError(f"a batch holds at most {INT32_MAX} records")
        if timestamps_ms is None:
            timestamps_ms = _now_ms()
        scalar_timestamp = not hasattr(timestamps_ms, "__len__")
        if scalar_timestamp:
            timestamps_ms = _as_timestamp(timestamps_ms)
        elif len(timestamps_ms) != count:
            raise InvalidRecordError(f"{len(timestamps_ms)} timestamps for {count} values")

        base_timestamp_ms = self._base_timestamp_ms
        if base_timestamp_ms is None:
            base_timestamp_ms = timestamps_ms if scalar_timestamp else timestamps_ms[0]

        encoded = None
        # One record (a coordinator's state record, a lone record's batch): the per-record
        # path below; the bulk encoders' column work costs more than it saves for one.
        if headers is None and count > 1:
            if scalar_timestamp:
                if keys is None:
                    encoded = self._encode_uniform(
                        values, first_offset_delta, timestamps_ms - base_timestamp_ms, timestamps_ms)
                else:
                    encoded = _encode_keyed(values, keys, first_offset_delta,
                                            timestamps_ms - base_timestamp_ms, timestamps_ms)
            else:
                encoded = self._encode_timestamp_runs(values, first_offset_delta, timestamps_ms,
                                                      base_timestamp_ms, keys)
        if encoded is not None:
            section, max_timestamp_ms = encoded
        else:
            section, max_timestamp_ms = self._encode_general(
                values, keys, timestamps_ms, scalar_timestamp, headers, first_offset_delta,
                base_timestamp_ms)

        # apply
        self._pieces.append(section)
        self._records_bytes += len(section)
        self._count = first_offset_delta + count
        self._base_timestamp_ms = base_timestamp_ms
        if max_timestamp_ms > self._max_timestamp_ms:
            self._max_timestamp_ms = max_timestamp_ms
        return count

    @staticmethod
    def _encode_uniform(values, first_offset_delta: int, timestamp_delta: int, timestamp_ms: int):
        """One timestamp, null keys, no headers: the bulk fast path."""
        varint_of = VARINT_OF
        table_size = VARINT_TABLE_SIZE
        delta_bytes = (varint_of[timestamp_delta] if 0 <= timestamp_delta < table_size
                       else _encode_timestamp_delta(timestamp_delta, timestamp_ms))
        count = len(values)
        if count > 1 and first_offset_delta + count <= _SAME_LENGTH_OFFSETS_MAX:
            values = values if values.__class__ is list else list(values)
            if set(map(type, values)) == _BYTES_ONLY:
                lengths = set(map(len, values))
                if len(lengths) == 1:
                    return (_encode_same_length(values, first_offset_delta, delta_bytes, lengths.pop()),
                            timestamp_ms)
        prefix = _ATTRIBUTES + delta_bytes
        # heads[d - heads_base]: the bytes from attributes through the null key length
        if timestamp_delta == 0:
            heads, heads_base = _HEAD0_NULL_KEY, 0
        else:
            heads_base = first_offset_delta
            heads = [prefix + varint_of[d] + _NULL
                     for d in range(first_offset_delta, min(first_offset_delta + len(values), table_size))]
        pieces: list[bytes] = []
        extend = pieces.extend
        offset_delta = first_offset_delta
        try:
            for value in values:
                if offset_delta < table_size:
                    head = heads[offset_delta - heads_base]
                else:
                    head = prefix + encode_varint(offset_delta) + _NULL
                if value is None:
                    extend((varint_of[len(head) + 2], head, b"\x01\x00"))
                else:
                    if value.__class__ is not bytes:
                        value = _record_bytes(value, "value", offset_delta - first_offset_delta)
                    value_length = len(value)
                    if value_length < table_size:
                        value_length_bytes = varint_of[value_length]
                    else:
                        value_length_bytes = encode_varint(value_length)
                    body_length = len(head) + len(value_length_bytes) + value_length + 1
                    extend((varint_of[body_length] if body_length < table_size else encode_varint(body_length),
                            head, value_length_bytes, value, _NO_HEADERS))
                offset_delta += 1
            section = b"".join(pieces)
        except TypeError:
            _raise_bad_values(values, None)
            raise
        return section, timestamp_ms

    @staticmethod
    def _encode_timestamp_runs(values, first_offset_delta: int, timestamps_ms, base_timestamp_ms: int,
                               keys=None):
        """No headers, a timestamp per record: the producer's send() batches.

        Records stamped one by one mostly share their millisecond with their neighbours,
        so the batch is a few runs of equal timestamps, each encoded by the uniform path
        (null keys) or `_encode_keyed` (the same bytes record by record). Returns None, for
        the general path, when the runs are short (little to gain) or anything needs
        checking or naming there."""
        count = len(values)
        if count < RUNS_PER_RECORD_MAX:
            return None     # fewer records than one run needs to pay off (linger 0: often one)
        runs = [(timestamp_ms, len(list(run))) for timestamp_ms, run in groupby(timestamps_ms)]
        if len(runs) * RUNS_PER_RECORD_MAX > count:
            return None
        sections = []
        start = 0
        max_timestamp_ms = -1
        encode_uniform = BatchBuilder._encode_uniform
        try:
            for timestamp_ms, length in runs:
                if timestamp_ms.__class__ is not int:
                    return None
                if timestamp_ms > max_timestamp_ms:
                    max_timestamp_ms = timestamp_ms
                end = start + length
                if keys is None:
                    section = encode_uniform(values[start:end], first_offset_delta + start,
                                             timestamp_ms - base_timestamp_ms, timestamp_ms)
                else:
                    section = _encode_keyed(values[start:end], keys[start:end], first_offset_delta + start,
                                            timestamp_ms - base_timestamp_ms, timestamp_ms)
                    if section is None:
                        return None
                sections.append(section[0])
                start = end
        except (TypeError, InvalidRecordError):
            return None     # the general path names the record at fault
        return b"".join(sections), max_timestamp_ms

    @staticmethod
    def _encode_general(values, keys, timestamps_ms, scalar_timestamp: bool, headers,
                        first_offset_delta: int, base_timestamp_ms: int):
        varint_of = VARINT_OF
        table_size = VARINT_TABLE_SIZE
        pieces: list[bytes] = []
        extend = pieces.extend
        max_timestamp_ms = -1
        offset_delta = first_offset_delta
        try:
            for index, value in enumerate(values):
                timestamp_ms = timestamps_ms if scalar_timestamp else timestamps_ms[index]
                if timestamp_ms > max_timestamp_ms:
                    max_timestamp_ms = timestamp_ms
                timestamp_delta = timestamp_ms - base_timestamp_ms
                timestamp_delta_bytes = (varint_of[timestamp_delta] if 0 <= timestamp_delta < table_size
                                         else _encode_timestamp_delta(timestamp_delta, timestamp_ms))
                offset_delta_bytes = (varint_of[offset_delta] if offset_delta < table_size
                                      else encode_varint(offset_delta))
                key = None if keys is None else keys[index]
                if key is None:
                    key_length_bytes = _NULL
                    key = b""
                else:
                    if key.__class__ is not bytes:
                        key = _record_bytes(key, "key", index)
                    key_length = len(key)
                    key_length_bytes = (varint_of[key_length] if key_length < table_size
                                        else encode_varint(key_length))
                if value is None:
                    value_length_bytes = _NULL
                    value = b""
                else:
                    if value.__class__ is not bytes:
                        value = _record_bytes(value, "value", index)
                    value_length = len(value)
                    value_length_bytes = (varint_of[value_length] if value_length < table_size
                                          else encode_varint(value_length))
                record_headers = None if headers is None else headers[index]
                headers_bytes = _encode_headers(record_headers) if record_headers else _NO_HEADERS
                body_length = (1 + len(timestamp_delta_bytes) + len(offset_delta_bytes)
                               + len(key_length_bytes) + len(key) + len(value_length_bytes) + len(value)
                               + len(headers_bytes))
                extend((varint_of[body_length] if body_length < table_size else encode_varint(body_length),
                        _ATTRIBUTES, timestamp_delta_bytes, offset_delta_bytes, key_length_bytes, key,
                        value_length_bytes, value, headers_bytes))
                offset_delta += 1
            section = b"".join(pieces)
        except TypeError:
            _raise_bad_values(values, keys)
            if not scalar_timestamp:
                for index, timestamp_ms in enumerate(timestamps_ms):
                    if not isinstance(timestamp_ms, int):
                        raise InvalidRecordError(
                            f"record {index}: timestamp must be an int (ms), got "
                            f"{type(timestamp_ms).__name__}") from None
            raise
        return section, max_timestamp_ms

    # --- state ------------------------------------------------------------------------

    @property
    def record_count(self) -> int:
        return self._count

    @property
    def size_bytes(self) -> int:
        """Exact size of the batch if built now, uncompressed."""
        return HEADER_SIZE + self._records_bytes

    @property
    def max_timestamp_ms(self) -> int:
        """Largest record timestamp so far; -1 while empty."""
        return self._max_timestamp_ms

    @property
    def base_timestamp_ms(self) -> int | None:
        """The first record's timestamp; None while empty."""
        return self._base_timestamp_ms

    @property
    def compression(self) -> int:
        return self._compression

    # --- building ---------------------------------------------------------------------

    def build(self, *, producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH,
              base_sequence: int = NO_SEQUENCE, transactional: bool = False,
              partition_leader_epoch: int = -1, base_offset: int = 0) -> bytes:
        """The batch's bytes. May be called again (new producer id/epoch/sequence): the
        records section is joined and compressed once and reused."""
        return self._build(producer_id, producer_epoch, base_sequence,
                           TRANSACTIONAL_FLAG if transactional else 0, partition_leader_epoch, base_offset)

    def _build(self, producer_id, producer_epoch, base_sequence, flags, partition_leader_epoch,
               base_offset) -> bytes:
        count = self._count
        if count == 0:
            raise InvalidRecordError("cannot build a batch with no records")
        section = self._section
        if section is None or self._section_count != count:
            pieces = self._pieces
            if len(pieces) != 1:
                # collapse, so the next build (or a later append + build) joins less
                pieces[:] = [b"".join(pieces)]
            section = pieces[0]
            if self._compression:
                section = _compression.compress(self._compression, section)
            self._section = section
            self._section_count = count
        attributes = self._compression | (self._timestamp_type << 3) | flags
        try:
            tail = _HEADER_TAIL.pack(attributes, count - 1, self._base_timestamp_ms, self._max_timestamp_ms,
                                     producer_id, producer_epoch, base_sequence, count)
            crc = crc32c(section, crc32c(tail))
            prefix = _HEADER_PREFIX.pack(base_offset, _BATCH_LENGTH_EMPTY + len(section),
                                         partition_leader_epoch, MAGIC_V2, crc)
        except struct.error as exc:
            raise InvalidRecordError(
                f"batch header field out of range (producer_id {producer_id}, producer_epoch "
                f"{producer_epoch}, base_sequence {base_sequence}, partition_leader_epoch "
                f"{partition_leader_epoch}, base_offset {base_offset}): {exc}") from None
        return b"".join((prefix, tail, section))


def _as_timestamp(timestamp_ms) -> int:
    if isinstance(timestamp_ms, bool) or not hasattr(timestamp_ms, "__index__"):
        raise InvalidRecordError(
            f"timestamp must be an int of milliseconds, got {type(timestamp_ms).__name__}")
    return timestamp_ms.__index__()


def _encode_timestamp_delta(timestamp_delta: int, timestamp_ms) -> bytes:
    if not isinstance(timestamp_ms, int) or isinstance(timestamp_ms, bool):
        raise InvalidRecordError(
            f"timestamp must be an int of milliseconds, got {type(timestamp_ms).__name__}")
    if not INT64_MIN <= timestamp_delta <= INT64_MAX:
        raise InvalidRecordError(
            f"timestamp {timestamp_ms} is too far from the batch's first timestamp for a 64-bit delta")
    return encode_varlong(timestamp_delta)


def _raise_bad_values(values, keys) -> None:
    """After a TypeError in a bulk encode: name the first record that caused it."""
    for what, blobs in (("value", values), ("key", keys)):
        if blobs is None:
            continue
        for index, blob in enumerate(blobs):
            if blob is not None and not isinstance(blob, (bytes, bytearray, memoryview)):
                raise InvalidRecordError(
                    f"record {index}: {what} must be bytes or None, got {type(blob).__name__}") from None


def encode_batch(values, keys=None, timestamps_ms=None, headers=None, *, compression: int = 0,
                 timestamp_type: int = CREATE_TIME, **build_kwargs) -> bytes:
    """One batch of `values` (see BatchBuilder.append_many and .build for the arguments)."""
    builder = BatchBuilder(compression=compression, timestamp_type=timestamp_type)
    builder.append_many(values, keys, timestamps_ms, headers)
    return builder.build(**build_kwargs)


def encode_control_batch(*, committed: bool, producer_id: int, producer_epoch: int,
                         coordinator_epoch: int, timestamp_ms: int, base_offset: int = 0,
                         partition_leader_epoch: int = -1) -> bytes:
    """A transaction marker: a control + transactional batch of one COMMIT or ABORT record."""
    marker_type = CONTROL_TYPE_COMMIT if committed else CONTROL_TYPE_ABORT
    try:
        value = _END_TXN_MARKER_VALUE.pack(END_TXN_MARKER_VALUE_VERSION, coordinator_epoch)
    except struct.error:
        raise InvalidRecordError(f"coordinator_epoch {coordinator_epoch} is not a 32-bit int") from None
    builder = BatchBuilder()
    builder.append(value, _CONTROL_KEY.pack(CONTROL_KEY_VERSION, marker_type), timestamp_ms)
    return builder._build(producer_id, producer_epoch, NO_SEQUENCE, TRANSACTIONAL_FLAG | CONTROL_FLAG,
                          partition_leader_epoch, base_offset)


# --- decoding -----------------------------------------------------------------------------

def decode_control_record(buf, header: BatchHeader) -> tuple[int, int]:
    """(marker type, coordinator epoch) of a transaction-marker batch.

    Type 0 is ABORT, 1 COMMIT. Like Kafka's reader, a key or value version newer than
    ours is read for the fields we know.
    """
    if not header.is_control:
        raise CorruptRecordError(f"batch at byte {header.position} is not a control batch")
    records = decode_records(buf, header, "", 0)
    if len(records) != 1:
        raise CorruptRecordError(
            f"control batch at byte {header.position} holds {len(records)} records, expected 1")
    key, value = records[0].key, records[0].value
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(f"control batch at byte {header.position}: key is too short for a control key")
    key_version, marker_type = _CONTROL_KEY.unpack_from(key)
    if key_version < 0:
        raise CorruptRecordError(f"control batch at byte {header.position}: key version {key_version}")
    if marker_type not in (CONTROL_TYPE_ABORT, CONTROL_TYPE_COMMIT):
        raise CorruptRecordError(
            f"control batch at byte {header.position}: control type {marker_type} is not a "
            f"transaction marker (0 abort, 1 commit)")
    if value is None or len(value) < _END_TXN_MARKER_VALUE.size:
        raise CorruptRecordError(
            f"control batch at byte {header.position}: value is too short for a transaction marker")
    value_version, coordinator_epoch = _END_TXN_MARKER_VALUE.unpack_from(value)
    if value_version < 0:
        raise CorruptRecordError(
            f"control batch at byte {header.position}: marker value version {value_version}")
    return marker_type, coordinator_epoch


def iter_decoded(buf, topic: str, partition: int, *, skip_control: bool = True):
    """Every record of every whole batch in `buf`, CRCs verified (for tools and tests)."""
    for header in iter_headers(buf):
        verify_crc(buf, header)
        if skip_control and header.attributes & CONTROL_FLAG:
            continue
        yield from decode_records(buf, header, topic, partition)
