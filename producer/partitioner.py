"""Which partition a record goes to: Kafka's default partitioner.

Theory of operation
-------------------
A record with an explicit partition goes there. A record with a key goes to
``murmur2(key) & 0x7fffffff % partition_count`` -- byte for byte the hash of Kafka's Java
client (``Utils.murmur2`` / ``Utils.toPositive``), so a key lands on the same partition
whether eos or Kafka's own client wrote it. A record without a key (or any record when
``partitioner.ignore.keys`` is set) goes to the topic's *sticky* partition.

Sticky partitioning (KIP-480, simplified from KIP-794): all keyless records of a topic go to
one partition until the accumulator has to open a new batch for it -- the current batch is
full or was handed to the sender -- and then the topic switches to another partition chosen
at random. That keeps batches large at low rates (one partition fills instead of many
half-empty ones) and spreads load over time. KIP-794 also weighs partitions by their
broker's queue depth; we do not: with the sticky switch on every new batch, partitions get
batches in turn, which is the property the KIP's adaptive mode protects.

`partitions_for_keys` is the same choice for a whole send_batch() call: with numpy it hashes
all keys of one length at once (their bytes as a matrix, murmur2's steps as column-wise
uint32 operations, which wrap modulo 2**32 exactly as the Java ints do), so a call costs a
few array operations per distinct key length instead of a Python loop per key (200,000
distinct keys: ~0.6 s of per-key hashing). Without numpy it falls back to the per-key hash.

`StickyPartitions` is a pure class: the accumulator calls it under its own lock, so it
needs none. `random` is passed in so tests are deterministic.
"""
from __future__ import annotations

import operator
import random as _random
import struct
from functools import lru_cache
from typing import Sequence

_NOT_LOADED = object()
_np = _NOT_LOADED     # numpy, imported on the first bulk call (its import takes ~0.2 s); None: not installed


def _numpy():
    """numpy, or None when it is not installed (the per-key hash does the same, slower)."""
    global _np
    if _np is _NOT_LOADED:
        try:
            import numpy
        except ImportError:
            numpy = None
        _np = numpy
    return _np

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK32 = 0xFFFFFFFF
_R = 24


def _murmur2_unsigned(data: bytes) -> int:
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    word_count = length >> 2
    if word_count:
        # All 4-byte words at once: one C call instead of a Python loop over bytes.
        for k in struct.unpack_from(f"<{word_count}I", data):
            k = (k * _M) & _MASK32
            k ^= k >> _R
            k = (k * _M) & _MASK32
            h = ((h * _M) & _MASK32) ^ k
    tail_start = word_count << 2
    remaining = length & 3
    if remaining:
        if remaining == 3:
            h ^= data[tail_start + 2] << 16
        if remaining >= 2:
            h ^= data[tail_start + 1] << 8
        h ^= data[tail_start]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def murmur2(data: bytes) -> int:
    """Kafka's `Utils.murmur2`: the 32-bit MurmurHash2 of `data` as a signed Java int."""
    h = _murmur2_unsigned(bytes(data))
    return h - (1 << 32) if h & 0x80000000 else h


@lru_cache(maxsize=65536)
def _positive_hash_cached(key: bytes) -> int:
    return _murmur2_unsigned(key) & 0x7FFFFFFF


def partition_for_key(key, partition_count: int) -> int:
    """Kafka's keyed choice: `toPositive(murmur2(key)) % partition_count`.

    Hashes are cached per key (bounded): keyed workloads usually repeat keys, and the pure
    Python hash costs a few microseconds.
    """
    if partition_count == 1:
        return 0        # whatever the hash: no murmur2 (and no cache entry) for one partition
    if type(key) is not bytes:
        key = bytes(key)
    return _positive_hash_cached(key) % partition_count


NO_KEY_PARTITION = -1   # partitions_for_keys' answer for a None key (the sticky partition's)
# Below this many keys the per-key hash (cached) beats numpy's per-call overhead.
BULK_HASH_MIN_KEYS = 64


def partitions_for_keys(keys: Sequence, partition_count: int):
    """`partition_for_key` of each key, NO_KEY_PARTITION for None: a numpy int64 array
    when numpy is there and the call is large, else a list of ints. `keys` holds bytes
    (or None)."""
    count = len(keys)
    if partition_count == 1:
        return [0 if key is not None else NO_KEY_PARTITION for key in keys]
    np = _numpy() if count >= BULK_HASH_MIN_KEYS else None
    if np is None:
        return [partition_for_key(key, partition_count) if key is not None else NO_KEY_PARTITION
                for key in keys]
    partitions = np.full(count, NO_KEY_PARTITION, dtype=np.int64)
    if None in keys:
        lengths = np.fromiter((len(key) if key is not None else -1 for key in keys),
                              dtype=np.int64, count=count)
    else:
        lengths = np.fromiter(map(len, keys), dtype=np.int64, count=count)
    multiplier = np.uint32(_M)
    for length in np.unique(lengths).tolist():
        if length < 0:
            continue   # None keys
        positions = np.flatnonzero(lengths == length)
        if len(positions) == 1:
            position = int(positions[0])
            partitions[position] = partition_for_key(keys[position], partition_count)
            continue
        hashes = np.full(len(positions), (_SEED ^ length) & _MASK32, dtype=np.uint32)
        if length:
            rows = np.frombuffer(b"".join(operator.itemgetter(*positions.tolist())(keys)),
                                 dtype=np.uint8).reshape(len(positions), length)
            word_count = length >> 2
            if word_count:
                words = np.ascontiguousarray(rows[:, :word_count << 2]).view("<u4")
                for column in range(word_count):
                    k = words[:, column] * multiplier
                    k ^= k >> np.uint32(_R)
                    k *= multiplier
                    hashes *= multiplier
                    hashes ^= k
            tail_start = word_count << 2
            remaining = length & 3
            if remaining:
                if remaining == 3:
                    hashes ^= rows[:, tail_start + 2].astype(np.uint32) << np.uint32(16)
                if remaining >= 2:
                    hashes ^= rows[:, tail_start + 1].astype(np.uint32) << np.uint32(8)
                hashes ^= rows[:, tail_start].astype(np.uint32)
                hashes *= multiplier
        hashes ^= hashes >> np.uint32(13)
        hashes *= multiplier
        hashes ^= hashes >> np.uint32(15)
        partitions[positions] = (hashes & np.uint32(0x7FFFFFFF)).astype(np.int64) % partition_count
    return partitions


class StickyPartitions:
    """The sticky partition of each topic for keyless records (KIP-480).

    `current(topic, partition_count)` is the partition to use now; the accumulator calls
    `switch(topic, partition_count)` when that partition needs a new batch, and uses the
    partition it returns.
    """

    def __init__(self, rng: _random.Random | None = None):
        self._rng = rng or _random.Random()
        self._sticky_by_topic: dict[str, int] = {}

    def current(self, topic: str, partition_count: int) -> int:
        partition = self._sticky_by_topic.get(topic)
        if partition is None or partition >= partition_count:
            partition = self._rng.randrange(partition_count)
            self._sticky_by_topic[topic] = partition
        return partition

    def switch(self, topic: str, partition_count: int) -> int:
        """Move the topic to another partition (a different one whenever there are two)."""
        old = self._sticky_by_topic.get(topic)
        if partition_count <= 1 or old is None or old >= partition_count:
            partition = self._rng.randrange(partition_count)
        else:
            # A uniform choice among the other partitions.
            partition = self._rng.randrange(partition_count - 1)
            if partition >= old:
                partition += 1
        self._sticky_by_topic[topic] = partition
        return partition
