"""Test helper: valid v2 batches for the storage tests, built with eos.records.codec."""
from __future__ import annotations

from eos.records.codec import encode_batch


def make_batch(count: int = 1, *, value_bytes: int = 10, timestamp_ms: int | list[int] = 1_000,
               producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
               transactional: bool = False, tag: int = 0) -> bytes:
    """One batch of `count` records whose values are `value_bytes` long (filled with `tag`)."""
    values = [bytes([(tag + i) % 256]) * value_bytes for i in range(count)]
    timestamps = timestamp_ms if isinstance(timestamp_ms, list) else [timestamp_ms] * count
    return encode_batch(values, timestamps_ms=timestamps, producer_id=producer_id, producer_epoch=producer_epoch,
                        base_sequence=base_sequence, transactional=transactional)


def batch_of_size(size_bytes: int, *, timestamp_ms: int = 1_000, count: int = 1) -> bytes:
    """One batch of `count` records occupying exactly `size_bytes` bytes (within a few bytes of varints)."""
    low, high = 0, size_bytes
    while low < high:  # the value size that gives the largest batch <= size_bytes
        mid = (low + high + 1) // 2
        if len(make_batch(count, value_bytes=mid, timestamp_ms=timestamp_ms)) <= size_bytes:
            low = mid
        else:
            high = mid - 1
    return make_batch(count, value_bytes=low, timestamp_ms=timestamp_ms)
