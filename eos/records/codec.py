"""Kafka v2 records: encode them into batches, decode batches back into records.

Theory of operation
-------------------
(baseline version: straightforward encoding, to be measured before optimisation)
"""
from __future__ import annotations

import struct
import time

from crc32c import crc32c

from eos.errors import CorruptRecordError, InvalidRecordError
from eos.records import compression as _compression
from eos.records.header import (
    COMPRESSION_CODEC_MASK, CONTROL_FLAG, HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2, TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG, BatchHeader, iter_headers, verify_crc)
from eos.records.varint import decode_varint, decode_varlong, encode_varint, encode_varlong
from eos.types import Record

_PREFIX = struct.Struct(">qiibI")
_TAIL = struct.Struct(">hiqqqhii")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _encode_record(offset_delta, timestamp_delta, key, value, headers) -> bytes:
    parts = [b"\x00", encode_varlong(timestamp_delta), encode_varint(offset_delta)]
    for blob in (key, value):
        if blob is None:
            parts.append(encode_varint(-1))
        else:
            parts.append(encode_varint(len(blob)))
            parts.append(bytes(blob))
    headers = headers or []
    parts.append(encode_varint(len(headers)))
    for hkey, hvalue in headers:
        kb = hkey.encode("utf-8")
        parts.append(encode_varint(len(kb)))
        parts.append(kb)
        if hvalue is None:
            parts.append(encode_varint(-1))
        else:
            parts.append(encode_varint(len(hvalue)))
            parts.append(bytes(hvalue))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


class BatchBuilder:
    def __init__(self, *, compression: int = 0, timestamp_type: int = 0):
        self._compression = compression
        self._timestamp_type = timestamp_type
        self._records: list[bytes] = []
        self._base_ts = None
        self._max_ts = -1
        self._size = HEADER_SIZE

    def append(self, value, key=None, timestamp_ms=None, headers=None) -> int:
        if timestamp_ms is None:
            timestamp_ms = _now_ms()
        if self._base_ts is None:
            self._base_ts = timestamp_ms
        delta = len(self._records)
        rec = _encode_record(delta, timestamp_ms - self._base_ts, key, value, headers)
        self._records.append(rec)
        self._size += len(rec)
        self._max_ts = max(self._max_ts, timestamp_ms)
        return delta

    def append_many(self, values, keys=None, timestamps_ms=None, headers=None) -> int:
        n = 0
        if timestamps_ms is None:
            timestamps_ms = _now_ms()
        for i, v in enumerate(values):
            ts = timestamps_ms if isinstance(timestamps_ms, int) else timestamps_ms[i]
            self.append(v, None if keys is None else keys[i], ts, None if headers is None else headers[i])
            n += 1
        return n

    @property
    def record_count(self) -> int:
        return len(self._records)

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def max_timestamp_ms(self) -> int:
        return self._max_ts

    def build(self, *, producer_id=-1, producer_epoch=-1, base_sequence=-1, transactional=False,
              partition_leader_epoch=-1, base_offset=0, _control=False) -> bytes:
        body = b"".join(self._records)
        if self._compression:
            body = _compression.compress(self._compression, body)
        attributes = self._compression | (self._timestamp_type << 3)
        if transactional:
            attributes |= TRANSACTIONAL_FLAG
        if _control:
            attributes |= CONTROL_FLAG
        count = len(self._records)
        tail = _TAIL.pack(attributes, count - 1, self._base_ts, self._max_ts, producer_id,
                          producer_epoch, base_sequence, count)
        crc = crc32c(tail + body)
        prefix = _PREFIX.pack(base_offset, HEADER_SIZE - LOG_OVERHEAD + len(body),
                              partition_leader_epoch, MAGIC_V2, crc)
        return prefix + tail + body


def encode_batch(values, keys=None, timestamps_ms=None, headers=None, *, compression=0, **build_kwargs):
    b = BatchBuilder(compression=compression)
    b.append_many(values, keys, timestamps_ms, headers)
    return b.build(**build_kwargs)


def decode_records(buf, header: BatchHeader, topic: str, partition: int) -> list[Record]:
    start = header.position + HEADER_SIZE
    end = header.position + header.size_bytes
    data = bytes(memoryview(buf)[start:end])
    codec = header.attributes & COMPRESSION_CODEC_MASK
    if codec:
        data = _compression.decompress(codec, data)
    log_append = bool(header.attributes & TIMESTAMP_TYPE_MASK)
    out = []
    pos = 0
    for _ in range(header.records_count):
        length, pos = decode_varint(data, pos)
        rec_end = pos + length
        pos += 1
        tsd, pos = decode_varlong(data, pos)
        od, pos = decode_varint(data, pos)
        klen, pos = decode_varint(data, pos)
        key = None
        if klen >= 0:
            key = data[pos:pos + klen]
            pos += klen
        vlen, pos = decode_varint(data, pos)
        value = None
        if vlen >= 0:
            value = data[pos:pos + vlen]
            pos += vlen
        hcount, pos = decode_varint(data, pos)
        hdrs = []
        for _ in range(hcount):
            hk, pos = decode_varint(data, pos)
            k = data[pos:pos + hk].decode()
            pos += hk
            hv, pos = decode_varint(data, pos)
            v = None
            if hv >= 0:
                v = data[pos:pos + hv]
                pos += hv
            hdrs.append((k, v))
        if pos != rec_end:
            raise CorruptRecordError("record size mismatch")
        ts = header.max_timestamp if log_append else header.base_timestamp + tsd
        out.append(Record(topic, partition, header.base_offset + od, key, value, ts, hdrs,
                          1 if log_append else 0))
    if pos != len(data):
        raise CorruptRecordError("trailing bytes")
    return out
