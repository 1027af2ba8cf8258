"""Which partition a record goes to: Kafka's built-in partitioner, round-robin, or the user's.

Theory of operation
-------------------
The producer decides in this order, as Kafka's KafkaProducer.partition() does (KIP-794):

1. An explicit ``partition=`` wins.
2. A ``partitioner.class`` chooses for every other record, keyed or not.
3. A record with a key goes to ``murmur2(key) & 0x7fffffff % partition_count`` -- byte for
   byte the hash of Kafka's Java client (``Utils.murmur2`` / ``Utils.toPositive``), so a key
   lands on the same partition whether eos or Kafka's own client wrote it -- unless
   ``partitioner.ignore.keys`` is true.
4. Anything else (no key, or keys ignored) goes to the topic's *sticky* partition.

Sticky partitioning (KIP-480, simplified from KIP-794): all keyless records of a topic go to
one partition until the accumulator has to open a new batch for it -- the current batch is
full or was handed to the sender -- and then the topic switches to another partition chosen
at random. That keeps batches large at low rates (one partition fills instead of many
half-empty ones) and spreads load over time. KIP-794 also weighs partitions by their
broker's queue depth; we do not: with the sticky switch on every new batch, partitions get
batches in turn, which is the property the KIP's adaptive mode protects.

``partitioner.class`` takes
- Kafka's ``org.apache.kafka.clients.producer.RoundRobinPartitioner`` (or this module's
  `RoundRobinPartitioner`): record n of a topic goes to the n-th partition in turn, counted
  per topic, over the partitions that have a leader (all of them when none has), keys
  ignored. Kafka calls its partitioner a second time when a record needs a new batch, which
  made its round-robin skip partitions (KAFKA-9965, KAFKA-16283; fixed by KAFKA-17632,
  merged late 2024); eos calls a partitioner once per record, so the cycle is exact.
- a Python partitioner: a function ``partition(topic, key, value, partition_count) -> int``
  (key and value are the record's bytes, or None); or an object with such a ``partition``
  method; or a class of such objects, which the producer instantiates with no arguments
  and, if it has ``configure``, calls ``configure(settings)`` with the producer's settings
  by Kafka name (Kafka's Configurable). An object's ``close()``, if it has one, is called
  once when the producer closes (the producer owns the partitioner it was given, as
  Kafka's does). The answer must be an int in ``[0, partition_count)``; anything else
  raises ValueError from send(). It runs on the thread that calls send(), so a producer
  shared by threads calls it concurrently; whatever it raises, send() raises.
- the dotted name of any of these: ``"package.module:attr"`` or ``"package.module.attr"``
  (importlib), imported when the producer is built; a name that does not import is a
  ValueError naming partitioner.class then, not at the first send.
Kafka 4.0 removed ``org.apache.kafka.clients.producer.internals.DefaultPartitioner`` and
``org.apache.kafka.clients.producer.UniformStickyPartitioner`` (KAFKA-18262); as there,
naming them is an error, which says what replaces them. ``partitioner.ignore.keys=true``
with a partitioner.class is refused: Kafka documents it as having no effect there.

`partitions_for_keys` is the same choice for a whole send_batch() call: with numpy it hashes
all keys of one length at once (their bytes as a matrix, murmur2's steps as column-wise
uint32 operations, which wrap modulo 2**32 exactly as the Java ints do), so a call costs a
few array operations per distinct key length instead of a Python loop per key (200,000
distinct keys: ~0.6 s of per-key hashing). Without numpy it falls back to the per-key hash.

`StickyPartitions` is a pure class: the accumulator calls it under its own lock, so it
needs none. `random` is passed in so tests are deterministic. `RoundRobinPartitioner` is
called by application threads, so it locks its counters; the leaders it skips come from a
function passed in (the producer's metadata; a dict in tests).
"""
from __future__ import annotations

import importlib
import operator
import random as _random
import struct
import threading
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

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


# ---- partitioner.class ---------------------------------------------------------------------

PARTITIONER_CLASS = "partitioner.class"
KAFKA_ROUND_ROBIN_PARTITIONER = "org.apache.kafka.clients.producer.RoundRobinPartitioner"
# Removed in Kafka 4.0 (KAFKA-18262): Kafka 4 refuses these names, and so do we, saying what
# replaces each (their own deprecation notes, KIP-794).
KAFKA_4_REMOVED_PARTITIONERS = {
    "org.apache.kafka.clients.producer.internals.DefaultPartitioner":
        "remove partitioner.class: the built-in partitioning is what it did (murmur2 of the key, "
        "else sticky)",
    "org.apache.kafka.clients.producer.UniformStickyPartitioner":
        "remove partitioner.class and set partitioner.ignore.keys=true: the built-in sticky "
        "partitioning for every record is what it did",
}


class RoundRobinPartitioner:
    """Kafka's RoundRobinPartitioner: the n-th record of a topic goes to the n-th partition
    in turn (a counter per topic, from 0), over the partitions that have a leader, or over
    all of them when none has; keys are ignored.

    `leaders_of(topic)` gives the leader node id of each partition (negative: no leader),
    or None when unknown; without it every partition counts as available.
    """

    def __init__(self, leaders_of: Callable[[str], Sequence[int] | None] | None = None):
        self._leaders_of = leaders_of
        # send() runs on any application thread: the read-and-increment of a counter must
        # be one step, or two threads would take the same turn.
        self._lock = threading.Lock()
        self._records_by_topic: dict[str, int] = {}
        # topic -> (the leaders sequence it came from, partition_count, available partitions):
        # recomputed only when the metadata hands out a new leaders tuple.
        self._available_by_topic: dict[str, tuple] = {}

    def partition(self, topic: str, key, value, partition_count: int) -> int:
        with self._lock:
            turn = self._records_by_topic.get(topic, 0)
            self._records_by_topic[topic] = turn + 1
            available = self._available_locked(topic, partition_count)
        if available:
            return available[turn % len(available)]
        return turn % partition_count

    def _available_locked(self, topic: str, partition_count: int) -> tuple[int, ...]:
        leaders = self._leaders_of(topic) if self._leaders_of is not None else None
        if leaders is None:
            return ()
        cached = self._available_by_topic.get(topic)
        if cached is not None and cached[0] is leaders and cached[1] == partition_count:
            return cached[2]
        # Partitions beyond partition_count: the caller's count is older than the leaders'.
        available = tuple(p for p, leader in enumerate(leaders) if p < partition_count and leader >= 0)
        self._available_by_topic[topic] = (leaders, partition_count, available)
        return available


def _import_dotted(setting: str, name: str):
    """The object a dotted name names: "package.module:attr.sub" or "package.module.attr"
    (the longest prefix that is a module, then attributes)."""
    module_name, colon, attr_path = name.partition(":")
    if colon:
        if not module_name or not attr_path:
            raise ValueError(f"{setting}: {name!r} is not 'package.module:attr'")
        candidates = [(module_name, attr_path.split("."))]
    else:
        parts = name.split(".")
        if len(parts) < 2 or not all(parts):
            raise ValueError(f"{setting}: {name!r} is neither a Kafka partitioner class nor a dotted "
                             f"name 'package.module.attr' of a Python partitioner")
        candidates = [(".".join(parts[:split]), parts[split:]) for split in range(len(parts) - 1, 0, -1)]
    for module_name, attrs in candidates:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if not colon and (module_name == missing or module_name.startswith(missing + ".")):
                continue        # this prefix is not a module: the name goes on in attributes
            raise ValueError(f"{setting}: cannot import {module_name!r} for {name!r}: {exc}") from exc
        except Exception as exc:
            raise ValueError(f"{setting}: importing {module_name!r} for {name!r} failed: {exc!r}") from exc
        found = module
        for attr in attrs:
            try:
                found = getattr(found, attr)
            except AttributeError:
                raise ValueError(f"{setting}: {name!r}: {module_name!r} has no {'.'.join(attrs)!r}") from None
        return found
    raise ValueError(f"{setting}: cannot import {name!r}: no module of that name")


def _is_partitioner_object(value) -> bool:
    return callable(getattr(value, "partition", None)) or callable(value)


def partitioner_class_setting(name: str, value):
    """ConfigSpec converter of partitioner.class: None (the built-in partitioner) or the
    Python object that will partition -- a function, an object with partition(), or a class
    of such objects -- with Kafka's class names and dotted names resolved; ValueError
    naming the setting for anything else."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        if text in KAFKA_4_REMOVED_PARTITIONERS:
            raise ValueError(f"{name}: {text} was removed in Kafka 4.0; "
                             f"{KAFKA_4_REMOVED_PARTITIONERS[text]}")
        if text == KAFKA_ROUND_ROBIN_PARTITIONER:
            return RoundRobinPartitioner
        value = _import_dotted(name, text)
    if isinstance(value, type):
        if callable(getattr(value, "partition", None)):
            return value
    elif _is_partitioner_object(value):
        return value
    raise ValueError(f"{name} must be a function partition(topic, key, value, partition_count), an object "
                     f"with such a partition() method, a class of such objects, Kafka's "
                     f"{KAFKA_ROUND_ROBIN_PARTITIONER}, or the dotted name of one, got {value!r}")


def _describe(partitioner) -> str:
    named = partitioner if hasattr(partitioner, "__qualname__") else type(partitioner)
    return f"{getattr(named, '__module__', '?')}.{named.__qualname__}"


class ChosenPartitioner(NamedTuple):
    """A producer's partitioner.class, ready to call."""
    partition: Callable[[str, bytes | None, bytes | None, int], int]
    close: Callable[[], None] | None     # called once when the producer closes
    name: str                            # for errors: module.qualname


def make_partitioner(spec, settings: dict,
                     leaders_of: Callable[[str], Sequence[int] | None]) -> ChosenPartitioner | None:
    """The partitioner of a producer from its (converted) partitioner.class: None for the
    built-in one; a class is instantiated (RoundRobinPartitioner with `leaders_of`, others
    with no arguments, then configure(settings) if they have it)."""
    if spec is None:
        return None
    name = _describe(spec)
    if spec is RoundRobinPartitioner:
        partitioner = RoundRobinPartitioner(leaders_of)
    elif isinstance(spec, type):
        try:
            partitioner = spec()
            configure = getattr(partitioner, "configure", None)
            if callable(configure):
                configure(dict(settings))
        except Exception as exc:
            raise ValueError(f"{PARTITIONER_CLASS}: building {name} failed: {exc!r}") from exc
    else:
        partitioner = spec
    method = getattr(partitioner, "partition", None)
    close = getattr(partitioner, "close", None)
    return ChosenPartitioner(method if callable(method) else partitioner,
                             close if callable(close) else None, name)


def checked_partition(chosen, partition_count: int, topic: str, partitioner_name: str) -> int:
    """What a partitioner.class answered, as an int in [0, partition_count) -- any integer
    type (numpy's too), never a bool -- or a ValueError naming the setting (Kafka: an
    IllegalArgumentException from send())."""
    if not isinstance(chosen, bool):
        try:
            partition = operator.index(chosen)
        except TypeError:
            partition = None
        if partition is not None and 0 <= partition < partition_count:
            return partition
    raise ValueError(f"{PARTITIONER_CLASS} {partitioner_name} chose partition {chosen!r} for topic {topic!r}, "
                     f"not an int in the range [0...{partition_count - 1}]")


def partitions_by_partitioner(partitioner: ChosenPartitioner, topic: str, keys: Sequence | None,
                              values: Sequence, partition_count: int) -> list[int]:
    """The partition of each record of a send_batch() call, asked one record at a time, in
    order (so a stateful partitioner such as round-robin sees the same sequence as from
    send())."""
    partition = partitioner.partition
    chosen = []
    for position, value in enumerate(values):
        p = partition(topic, keys[position] if keys is not None else None, value, partition_count)
        if p.__class__ is not int or not 0 <= p < partition_count:
            p = checked_partition(p, partition_count, topic, partitioner.name)
        chosen.append(p)
    return chosen
