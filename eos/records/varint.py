"""Zigzag varints, as Kafka's ByteUtils writes and reads them.

Theory of operation
-------------------
A v2 record spells every integer except its attributes byte as a varint: seven bits per
byte, least significant group first, the high bit set on every byte but the last. Signed
values are zigzag-mapped first (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...) so that small
negative numbers stay short; -1 (a null key or value) is the single byte 0x01.

Kafka's semantics, which these functions follow exactly:

- `varint` is a 32-bit signed integer, at most 5 bytes; `varlong` is 64-bit, at most
  10 bytes. A reader that has consumed 5 (10) bytes and still sees the continuation bit
  fails ("varint is too long"); bits beyond 32 (64) in the last byte are dropped, as the
  Java shift drops them.
- Encoding a value outside the type's range is refused here (Java could not hold it).

The codec's hot loops do not call these functions for small values: they use the
precomputed tables below (`VARINT_OF`, `ZIGZAG_DECODE_1`) and inline one- and two-byte
fast paths, falling back here only for long varints.
"""
from __future__ import annotations

from eos.errors import CorruptRecordError, InvalidRecordError

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10


def zigzag(value: int) -> int:
    """Map a signed int to an unsigned one: 0, -1, 1, -2 -> 0, 1, 2, 3."""
    return (value << 1) if value >= 0 else ((-value) << 1) - 1


def unzigzag(raw: int) -> int:
    return (raw >> 1) ^ -(raw & 1)


def encode_unsigned_varint(raw: int) -> bytes:
    """Base-128 groups of a non-negative int, least significant first."""
    if raw < 0:
        raise InvalidRecordError(f"unsigned varint cannot hold negative value {raw}")
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zigzag varint of a 32-bit signed int (Kafka's ByteUtils.writeVarint)."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise InvalidRecordError(f"varint value {value} is outside the 32-bit signed range")
    return encode_unsigned_varint(zigzag(value))


def encode_varlong(value: int) -> bytes:
    """Zigzag varint of a 64-bit signed int (Kafka's ByteUtils.writeVarlong)."""
    if not INT64_MIN <= value <= INT64_MAX:
        raise InvalidRecordError(f"varlong value {value} is outside the 64-bit signed range")
    return encode_unsigned_varint(zigzag(value))


def size_of_varint(value: int) -> int:
    """Bytes `encode_varint(value)` / `encode_varlong(value)` would take."""
    raw = zigzag(value)
    size = 1
    while raw >= 0x80:
        raw >>= 7
        size += 1
    return size


size_of_varlong = size_of_varint


def _read_raw(buf, position: int, max_bytes: int, kind: str) -> tuple[int, int]:
    raw = 0
    shift = 0
    start = position
    try:
        while True:
            byte = buf[position]
            position += 1
            raw |= (byte & 0x7F) << shift
            if byte < 0x80:
                return raw, position
            shift += 7
            if position - start >= max_bytes:
                raise CorruptRecordError(
                    f"{kind} at byte {start} is too long: the continuation bit is still set "
                    f"after {max_bytes} bytes")
    except IndexError:
        raise CorruptRecordError(
            f"truncated {kind} at byte {start}: the buffer ends after {position - start} bytes"
        ) from None


def decode_unsigned_varint(buf, position: int = 0) -> tuple[int, int]:
    """(value, next position) of an unsigned 32-bit varint (Kafka's readUnsignedVarint)."""
    raw, position = _read_raw(buf, position, VARINT_MAX_BYTES, "varint")
    return raw & 0xFFFFFFFF, position


def decode_varint(buf, position: int = 0) -> tuple[int, int]:
    """(value, next position) of a zigzag varint; CorruptRecordError past 5 bytes."""
    raw, position = _read_raw(buf, position, VARINT_MAX_BYTES, "varint")
    raw &= 0xFFFFFFFF
    return (raw >> 1) ^ -(raw & 1), position


def decode_varlong(buf, position: int = 0) -> tuple[int, int]:
    """(value, next position) of a zigzag varlong; CorruptRecordError past 10 bytes."""
    raw, position = _read_raw(buf, position, VARLONG_MAX_BYTES, "varlong")
    raw &= 0xFFFFFFFFFFFFFFFF
    return (raw >> 1) ^ -(raw & 1), position


# --- tables for the hot loops -------------------------------------------------------------

# VARINT_OF[n] is encode_varint(n) for 0 <= n < VARINT_TABLE_SIZE: every value whose zigzag
# form fits in two varint bytes (offset deltas, key/value/record lengths of small records,
# timestamp deltas within ~8 s of the batch's first record).
VARINT_TABLE_SIZE = 8192
VARINT_OF: list[bytes] = [encode_varint(n) for n in range(VARINT_TABLE_SIZE)]

# ZIGZAG_DECODE_1[b] is the signed value of the one-byte varint b (b < 0x80).
ZIGZAG_DECODE_1: list[int] = [unzigzag(b) for b in range(0x80)]
