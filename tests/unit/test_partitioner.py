"""Kafka's default partitioner: murmur2 against Kafka's published values, sticky switching."""
from __future__ import annotations

import random

import pytest

from producer import partitioner
from producer.partitioner import (
    BULK_HASH_MIN_KEYS,
    NO_KEY_PARTITION,
    StickyPartitions,
    murmur2,
    partition_for_key,
    partitions_for_keys,
)

# From Apache Kafka's UtilsTest.testMurmur2 (clients/src/test/.../utils/UtilsTest.java).
KAFKA_UTILS_TEST_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]
# Values other ports check against Kafka's Java implementation (e.g. Akka's Murmur2Spec).
MORE_JAVA_VECTORS = [
    (b"1", -1993445489),
    (b"12", 126087238),
    (b"123", -267702483),
    (b"1234", -1614185708),
    (b"12345", -1188365604),
]


@pytest.mark.parametrize("key,expected", KAFKA_UTILS_TEST_VECTORS + MORE_JAVA_VECTORS)
def test_murmur2_matches_kafka(key, expected):
    assert murmur2(key) == expected


def test_murmur2_accepts_bytearray_and_memoryview():
    assert murmur2(bytearray(b"foobar")) == -790332482
    assert murmur2(memoryview(b"foobar")) == -790332482


def test_empty_key_hash_is_stable():
    assert murmur2(b"") == murmur2(bytearray())


@pytest.mark.parametrize("key,expected", KAFKA_UTILS_TEST_VECTORS + MORE_JAVA_VECTORS)
@pytest.mark.parametrize("partitions", [1, 3, 7, 100])
def test_partition_for_key_is_positive_hash_modulo(key, expected, partitions):
    # Kafka: Utils.toPositive(murmur2(key)) % numPartitions, toPositive = n & 0x7fffffff
    assert partition_for_key(key, partitions) == (expected & 0x7FFFFFFF) % partitions
    assert partition_for_key(bytearray(key), partitions) == (expected & 0x7FFFFFFF) % partitions


@pytest.mark.parametrize("partitions", [1, 3, 7, 100])
def test_partitions_for_keys_match_kafkas_vectors_in_bulk(partitions):
    # Enough copies for the bulk (numpy) path; every key length 1..49 of the vectors.
    vectors = (KAFKA_UTILS_TEST_VECTORS + MORE_JAVA_VECTORS) * BULK_HASH_MIN_KEYS
    got = partitions_for_keys([key for key, _ in vectors], partitions)
    assert [int(p) for p in got] == [(expected & 0x7FFFFFFF) % partitions for _, expected in vectors]


@pytest.mark.parametrize("count", [1, BULK_HASH_MIN_KEYS - 1, BULK_HASH_MIN_KEYS, 5000])
def test_partitions_for_keys_equal_the_per_key_choice_with_none_keys_apart(count):
    rng = random.Random(count)
    keys = [None if rng.random() < 0.05 else bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 40)))
            for _ in range(count)]
    got = [int(p) for p in partitions_for_keys(keys, 7)]
    assert got == [partition_for_key(k, 7) if k is not None else NO_KEY_PARTITION for k in keys]


def test_partitions_for_keys_without_numpy_are_the_same(monkeypatch):
    keys = [b"key-%d" % i for i in range(500)] + [None]
    with_numpy = [int(p) for p in partitions_for_keys(keys, 3)]
    monkeypatch.setattr(partitioner, "_np", None)
    assert partitions_for_keys(keys, 3) == with_numpy


def test_sticky_partition_stays_until_switched():
    sticky = StickyPartitions(random.Random(7))
    first = sticky.current("t", 5)
    assert all(sticky.current("t", 5) == first for _ in range(100))


def test_switch_always_moves_to_another_partition():
    sticky = StickyPartitions(random.Random(1))
    previous = sticky.current("t", 3)
    seen = set()
    for _ in range(200):
        now = sticky.switch("t", 3)
        assert now != previous
        assert 0 <= now < 3
        assert sticky.current("t", 3) == now
        seen.add(now)
        previous = now
    assert seen == {0, 1, 2}


def test_single_partition_topic_switches_to_itself():
    sticky = StickyPartitions(random.Random(1))
    assert sticky.current("t", 1) == 0
    assert sticky.switch("t", 1) == 0


def test_topics_are_independent():
    sticky = StickyPartitions(random.Random(3))
    a = sticky.current("a", 1000)
    sticky.switch("b", 1000)
    assert sticky.current("a", 1000) == a


def test_partition_count_shrink_in_metadata_picks_a_valid_partition():
    sticky = StickyPartitions(random.Random(3))
    sticky._sticky_by_topic["t"] = 9  # as if the topic had 10 partitions before
    assert 0 <= sticky.current("t", 4) < 4


def test_one_partition_takes_every_key_without_hashing(monkeypatch):
    monkeypatch.setattr(partitioner, "_positive_hash_cached", lambda key: pytest.fail("hashed"))
    keys = [b"key-%d" % i for i in range(200)] + [None]
    assert [partition_for_key(k, 1) for k in keys[:-1]] == [0] * 200
    assert list(partitions_for_keys(keys, 1)) == [0] * 200 + [NO_KEY_PARTITION]
