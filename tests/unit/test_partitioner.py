"""Partitioners: murmur2 against Kafka's published values, sticky switching, round-robin,
and partitioner.class / partitioner.ignore.keys as settings (resolution, refusals, checks)."""
from __future__ import annotations

import random

import pytest

import eos
from producer import partitioner
from producer.config import resolve_producer_config
from producer.partitioner import (
    BULK_HASH_MIN_KEYS,
    KAFKA_ROUND_ROBIN_PARTITIONER,
    NO_KEY_PARTITION,
    RoundRobinPartitioner,
    StickyPartitions,
    checked_partition,
    make_partitioner,
    murmur2,
    partition_for_key,
    partitions_by_partitioner,
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


# ---- round-robin (Kafka's RoundRobinPartitioner) ----------------------------------------------

@pytest.mark.parametrize("partition_count", [1, 2, 3, 7])
def test_round_robin_cycles_over_every_partition_in_turn_ignoring_keys(partition_count):
    rr = RoundRobinPartitioner()
    keys = [b"same-key", None, b"other"] * (4 * partition_count)
    chosen = [rr.partition("t", key, b"v", partition_count) for key in keys]
    assert chosen == [i % partition_count for i in range(len(keys))]


def test_round_robin_counts_per_topic():
    rr = RoundRobinPartitioner()
    assert [rr.partition("a", None, None, 3) for _ in range(2)] == [0, 1]
    assert [rr.partition("b", None, None, 3) for _ in range(2)] == [0, 1]
    assert rr.partition("a", None, None, 3) == 2


def test_round_robin_skips_partitions_without_a_leader_and_uses_all_when_none_has_one():
    leaders = {"t": (1, -1, 2, -1), "down": (-1, -1, -1)}
    rr = RoundRobinPartitioner(leaders.get)
    assert [rr.partition("t", None, None, 4) for _ in range(6)] == [0, 2, 0, 2, 0, 2]
    assert [rr.partition("down", None, None, 3) for _ in range(4)] == [0, 1, 2, 0]
    assert [rr.partition("unknown", None, None, 2) for _ in range(3)] == [0, 1, 0]
    leaders["t"] = (1, 1, 1, -1)          # a new metadata answer: partition 1 is back
    assert {rr.partition("t", None, None, 4) for _ in range(6)} == {0, 1, 2}


def test_round_robin_stays_below_the_partition_count_it_is_given():
    rr = RoundRobinPartitioner({"t": (1, 1, 1, 1)}.get)     # leaders of 4, the caller knows 2
    assert {rr.partition("t", None, None, 2) for _ in range(10)} == {0, 1}


def test_round_robin_reads_and_advances_a_counter_under_its_lock():
    # send() runs on many threads: an unlocked read-and-increment would hand two records the
    # same turn. A race is not reproducible on demand, so this checks the rule itself:
    # every access to the counters happens with the lock held.
    rr = RoundRobinPartitioner()
    real_lock = rr._lock

    class WatchedLock:
        held = False

        def __enter__(self):
            real_lock.acquire()
            WatchedLock.held = True

        def __exit__(self, *exc_info):
            WatchedLock.held = False
            real_lock.release()

    class WatchedCounters(dict):
        def get(self, *args):
            assert WatchedLock.held, "counter read without the lock"
            return super().get(*args)

        def __setitem__(self, key, value):
            assert WatchedLock.held, "counter written without the lock"
            super().__setitem__(key, value)

    rr._lock = WatchedLock()
    rr._records_by_topic = WatchedCounters()
    assert [rr.partition("t", None, None, 2) for _ in range(3)] == [0, 1, 0]
    assert rr._records_by_topic == {"t": 3}


# ---- partitioner.class and partitioner.ignore.keys as settings --------------------------------

CALLS: list[tuple] = []


def value_length_partitioner(topic, key, value, partition_count):
    """A module-level function for the dotted-name tests."""
    CALLS.append((topic, key, value, partition_count))
    return len(value or b"") % partition_count


class ConfiguredPartitioner:
    """A Kafka-style class: built with no arguments, configure(settings), close()."""
    instances: list["ConfiguredPartitioner"] = []

    def __init__(self):
        self.settings = None
        self.closed = 0
        ConfiguredPartitioner.instances.append(self)

    def configure(self, settings):
        self.settings = settings

    def partition(self, topic, key, value, partition_count):
        return partition_count - 1

    def close(self):
        self.closed += 1

    class Nested:
        @staticmethod
        def partition(topic, key, value, partition_count):
            return 0


def resolved(**kwargs):
    return resolve_producer_config(None, kwargs)["partitioner.class"]


def test_no_partitioner_class_is_the_built_in_one():
    assert resolved() is None
    assert make_partitioner(None, {}, lambda topic: None) is None


def test_kafkas_round_robin_name_is_the_round_robin_partitioner():
    assert resolved(partitioner_class=KAFKA_ROUND_ROBIN_PARTITIONER) is RoundRobinPartitioner
    assert resolve_producer_config({"partitioner.class": KAFKA_ROUND_ROBIN_PARTITIONER}, {})[
        "partitioner.class"] is RoundRobinPartitioner
    chosen = make_partitioner(RoundRobinPartitioner, {}, {"t": (1, -1, 1)}.get)
    # built with the producer's leaders: the partition without a leader is skipped
    assert [chosen.partition("t", b"k", b"v", 3) for _ in range(4)] == [0, 2, 0, 2]


@pytest.mark.parametrize("removed,advice", [
    ("org.apache.kafka.clients.producer.internals.DefaultPartitioner", "remove partitioner.class"),
    ("org.apache.kafka.clients.producer.UniformStickyPartitioner", "partitioner.ignore.keys=true"),
])
def test_partitioners_kafka_4_removed_are_refused_with_their_replacement(removed, advice):
    with pytest.raises(ValueError, match="partitioner.class") as info:
        resolved(partitioner_class=removed)
    assert "removed in Kafka 4.0" in str(info.value) and advice in str(info.value)


@pytest.mark.parametrize("dotted", [
    "tests.unit.test_partitioner.value_length_partitioner",
    "tests.unit.test_partitioner:value_length_partitioner",
])
def test_dotted_names_of_a_function_resolve_to_it(dotted):
    assert resolved(partitioner_class=dotted) is value_length_partitioner


@pytest.mark.parametrize("dotted", [
    "tests.unit.test_partitioner.ConfiguredPartitioner.Nested",
    "tests.unit.test_partitioner:ConfiguredPartitioner.Nested",
])
def test_dotted_names_reach_nested_attributes(dotted):
    assert resolved(partitioner_class=dotted) is ConfiguredPartitioner.Nested


@pytest.mark.parametrize("bad,why", [
    ("no_such_module_for_eos.partitioner", "cannot import"),
    ("no_such_module_for_eos:partitioner", "cannot import"),
    ("tests.unit.test_partitioner.no_such_attribute", "has no 'no_such_attribute'"),
    ("tests.unit.test_partitioner:no_such_attribute", "has no 'no_such_attribute'"),
    ("com.example.MyJavaPartitioner", "cannot import"),
    ("round_robin", "neither a Kafka partitioner class"),
    ("", "neither a Kafka partitioner class"),
    (":attr", "is not 'package.module:attr'"),
    ("tests.unit.test_partitioner.CALLS", "must be a function"),      # a list
    ("tests.unit", "must be a function"),                             # a module
    (42, "must be a function"),
    (True, "must be a function"),
    (object(), "must be a function"),
    (dict, "must be a function"),                                     # a class without partition()
])
def test_bad_partitioner_class_is_refused_by_name(bad, why):
    with pytest.raises(ValueError, match="partitioner.class") as info:
        resolved(partitioner_class=bad)
    assert why in str(info.value)


def test_a_module_that_fails_to_import_is_reported_as_such(tmp_path, monkeypatch):
    (tmp_path / "eos_test_broken_partitioner.py").write_text("import no_such_dependency_for_eos\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="partitioner.class") as info:
        resolved(partitioner_class="eos_test_broken_partitioner.partition")
    assert "no_such_dependency_for_eos" in str(info.value)


@pytest.mark.parametrize("bad", ["yes", 1, None, "1"])
def test_bad_ignore_keys_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="partitioner.ignore.keys"):
        resolve_producer_config(None, {"partitioner_ignore_keys": bad})


@pytest.mark.parametrize("given,expected", [(True, True), ("true", True), ("FALSE", False), (False, False)])
def test_ignore_keys_spellings(given, expected):
    assert resolve_producer_config(None, {"partitioner_ignore_keys": given})["partitioner.ignore.keys"] is expected


def test_ignore_keys_beside_a_partitioner_class_is_refused_not_ignored():
    with pytest.raises(ValueError, match="partitioner.ignore.keys") as info:
        resolve_producer_config({"partitioner.ignore.keys": "true"},
                                {"partitioner_class": value_length_partitioner})
    assert "partitioner.class" in str(info.value)
    # false is what a partitioner.class does anyway (it gets the key): accepted
    assert resolve_producer_config(None, {"partitioner_class": value_length_partitioner,
                                          "partitioner_ignore_keys": False})["partitioner.class"] is not None


def test_a_class_is_built_with_no_arguments_configured_and_closed():
    ConfiguredPartitioner.instances.clear()
    settings = resolve_producer_config(None, {"partitioner_class": "tests.unit.test_partitioner.ConfiguredPartitioner",
                                              "client_id": "c-1"})
    chosen = make_partitioner(settings["partitioner.class"], settings, lambda topic: None)
    [instance] = ConfiguredPartitioner.instances
    assert instance.settings["client.id"] == "c-1" and instance.settings is not settings
    assert chosen.partition("t", b"k", b"v", 5) == 4
    assert chosen.name == "tests.unit.test_partitioner.ConfiguredPartitioner"
    chosen.close()
    assert instance.closed == 1


def test_an_object_is_used_as_given_and_a_function_has_nothing_to_close():
    instance = ConfiguredPartitioner()
    chosen = make_partitioner(resolved(partitioner_class=instance), {}, lambda topic: None)
    assert chosen.partition("t", None, None, 3) == 2 and instance.settings is None   # not configured again
    chosen.close()
    assert instance.closed == 1
    function = make_partitioner(resolved(partitioner_class=value_length_partitioner), {}, lambda topic: None)
    assert function.partition is value_length_partitioner and function.close is None


def test_a_class_that_cannot_be_built_is_an_error_naming_the_setting():
    class NeedsArguments:
        def __init__(self, shards):
            self.shards = shards

        def partition(self, topic, key, value, partition_count):
            return 0

    with pytest.raises(ValueError, match="partitioner.class.*NeedsArguments"):
        make_partitioner(resolved(partitioner_class=NeedsArguments), {}, lambda topic: None)


def test_producer_construction_refuses_bad_partitioner_settings_before_it_connects():
    # Nothing listens on port 1: the refusals come from the settings, before any connection.
    with pytest.raises(ValueError, match="partitioner.class"):
        eos.Producer("127.0.0.1:1", partitioner_class="no_such_module_for_eos.partition")
    with pytest.raises(ValueError, match="partitioner.class"):
        eos.Producer("127.0.0.1:1", config={"partitioner.class":
                                            "org.apache.kafka.clients.producer.internals.DefaultPartitioner"})
    with pytest.raises(ValueError, match="partitioner.ignore.keys"):
        eos.Producer("127.0.0.1:1", partitioner_ignore_keys="maybe")

    class Exploding:
        def configure(self, settings):
            raise RuntimeError("no shard map")

        def partition(self, topic, key, value, partition_count):
            return 0

    with pytest.raises(ValueError, match="partitioner.class.*no shard map"):
        eos.Producer("127.0.0.1:1", partitioner_class=Exploding)


@pytest.mark.parametrize("answer", [3, -1, 10, True, 1.0, "1", None])
def test_a_partition_out_of_range_or_not_an_int_is_refused(answer):
    with pytest.raises(ValueError, match="partitioner.class my.Partitioner chose partition"):
        checked_partition(answer, 3, "t", "my.Partitioner")


def test_any_integer_type_in_range_is_accepted():
    import numpy as np      # installed with pyspark; numpy ints come from pandas/Spark code
    assert checked_partition(np.int64(2), 3, "t", "p") == 2
    assert type(checked_partition(np.int64(2), 3, "t", "p")) is int


def test_bulk_asks_the_partitioner_per_record_in_order():
    CALLS.clear()
    chosen = make_partitioner(value_length_partitioner, {}, lambda topic: None)
    got = partitions_by_partitioner(chosen, "t", [b"k0", None, b"k2"], [b"a", b"bb", b"ccc"], 3)
    assert got == [1, 2, 0]
    assert CALLS == [("t", b"k0", b"a", 3), ("t", None, b"bb", 3), ("t", b"k2", b"ccc", 3)]
    CALLS.clear()
    assert partitions_by_partitioner(chosen, "t", None, [b"a", None], 2) == [1, 0]
    assert CALLS == [("t", None, b"a", 2), ("t", None, None, 2)]


def test_bulk_refuses_an_out_of_range_answer():
    chosen = make_partitioner(lambda topic, key, value, count: count, {}, lambda topic: None)
    with pytest.raises(ValueError, match="chose partition 3"):
        partitions_by_partitioner(chosen, "t", None, [b"a"], 3)
