"""The topic registry: the one owner of topic metadata on a broker.

Theory of operation
-------------------
A topic is a name, a partition count, the per-topic config overrides a user gave, and a
topic id (a UUID fixed at creation, so a topic deleted and created again under the same
name is a different topic). The registry keeps these in memory and persists each topic as
one small JSON file, `<data_dir>/__topics/<name>.json`, written to a temp file, fsynced and
renamed over the old one, then the directory fsynced; a crash leaves either the old file or
the new one, never half of one. `load()` reads them back at start, so topics survive
restarts.

The partition logs themselves belong to the storage layer (`broker.storage`); the registry
only says which logs ought to exist. The broker writes the registry first and creates the
logs second, and at start it creates any log the registry names but the disk lacks and
deletes any log the registry does not name (the remains of a delete cut short by a crash).

Every change is staged: `prepare_create` / `prepare_grow` validate and build the new
`TopicInfo` without touching anything, `commit` persists it and only then swaps it into the
in-memory map. Readers take no lock: the map is replaced, never mutated, so a reader sees
one consistent snapshot (copy on write; topic changes are rare, lookups are on every
produce and fetch).

Names follow Kafka's rules: 1 to 249 characters of [a-zA-Z0-9._-], not "." or "..", and
not colliding with an existing name once '.' and '_' are treated alike (Kafka refuses
those because the two would share metric names). Names starting with "__" are internal
(`__consumer_offsets`, `__transaction_state`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import uuid
from pathlib import Path
from typing import Callable, Mapping

from eos.config import TopicConfig
from eos.files import fsync_directory, write_file_atomically
from eos.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidTopicError,
    EosError,
    ErrorCode,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)

log = logging.getLogger("eos.broker")

TOPICS_DIR_NAME = "__topics"
TOPIC_FILE_SUFFIX = ".json"
TOPIC_FILE_VERSION = 1
TOPIC_NAME_MAX_CHARS = 249
INTERNAL_TOPIC_PREFIX = "__"
INTERNAL_TOPIC_CONFIG = {"cleanup.policy": "compact"}
# Topics the coordinators keep their state in: no one deletes them.
PROTECTED_INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
# A bound on what one CreateTopics/CreatePartitions may ask for: every partition is a
# directory with open files, and a typo of 1000000 should be an error, not a full disk.
PARTITIONS_PER_TOPIC_MAX = 10000

_LEGAL_NAME = re.compile(r"[a-zA-Z0-9._-]+")


def validate_topic_name(name: str) -> None:
    """Raise InvalidTopicError naming the broken rule; return None for a legal name."""
    if not name:
        raise InvalidTopicError("topic name is empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if len(name) > TOPIC_NAME_MAX_CHARS:
        raise InvalidTopicError(
            f"topic name is {len(name)} characters long, the limit is {TOPIC_NAME_MAX_CHARS}")
    if not _LEGAL_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} has characters outside [a-zA-Z0-9._-]")


def is_internal_topic(name: str) -> bool:
    return name.startswith(INTERNAL_TOPIC_PREFIX)


def topic_config_of(name: str, overrides: Mapping[str, str], defaults: TopicConfig) -> TopicConfig:
    """The broker defaults with `overrides` (InvalidConfigError for a bad one); the internal
    topics are always compacted (as Kafka's are): their state is the last record of each key,
    and a broker start replays what compaction leaves, not every change ever made."""
    if is_internal_topic(name):
        overrides = {**overrides, **INTERNAL_TOPIC_CONFIG}
    return TopicConfig.from_overrides(overrides, base=defaults)


def check_growth(name: str, partition_count: int, new_partition_count: int) -> None:
    """CreatePartitions' rules, for one broker and a cluster alike: a topic grows, never
    shrinks, up to PARTITIONS_PER_TOPIC_MAX; the coordinators' internal topics never grow
    (a group's or transactional id's partition is its hash modulo their partition count, so
    new partitions would move every coordinator's state out from under it)."""
    if name in PROTECTED_INTERNAL_TOPICS:
        raise InvalidPartitionsError(
            f"topic {name!r} is internal: its partition count decides where the coordinators "
            f"keep each group's or transaction's state, and cannot change")
    if new_partition_count < partition_count:
        raise InvalidPartitionsError(
            f"topic {name!r} has {partition_count} partitions; a topic can grow "
            f"but never shrink, {new_partition_count} asked for")
    if new_partition_count == partition_count:
        raise InvalidPartitionsError(f"topic {name!r} already has {partition_count} partitions")
    if new_partition_count > PARTITIONS_PER_TOPIC_MAX:
        raise InvalidPartitionsError(
            f"{new_partition_count} partitions asked for, the limit per topic is {PARTITIONS_PER_TOPIC_MAX}")


def _collision_key(name: str) -> str:
    return name.replace(".", "_")


@dataclasses.dataclass(frozen=True)
class TopicInfo:
    """What the broker knows about one topic. Immutable: a change makes a new one."""

    name: str
    topic_id: str
    partition_count: int
    config_overrides: Mapping[str, str]
    config: TopicConfig  # the broker defaults with `config_overrides` applied

    @property
    def is_internal(self) -> bool:
        return is_internal_topic(self.name)

    def to_json(self) -> dict:
        return {
            "version": TOPIC_FILE_VERSION,
            "name": self.name,
            "topic_id": self.topic_id,
            "partition_count": self.partition_count,
            "config_overrides": dict(self.config_overrides),
        }


class TopicRegistry:
    """Topic metadata of one broker, persisted under `<data_dir>/__topics/`.

    Thread-safe: changes serialise on an internal lock; lookups take no lock.
    """

    def __init__(self, data_dir: str | os.PathLike, *, default_config: TopicConfig | None = None,
                 default_num_partitions: int = 1):
        if default_num_partitions < 1:
            raise InvalidConfigError(f"num.partitions must be >= 1, got {default_num_partitions}")
        self._dir = Path(data_dir) / TOPICS_DIR_NAME
        self._default_config = default_config or TopicConfig()
        self._default_num_partitions = default_num_partitions
        self._topics: dict[str, TopicInfo] = {}  # replaced whole on change, never mutated
        self._lock = threading.Lock()
        self._push_lock = threading.Lock()       # orders push_config's reads and pushes

    # ---- reading -------------------------------------------------------------------------

    @property
    def default_config(self) -> TopicConfig:
        return self._default_config

    def get(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def topics(self) -> list[TopicInfo]:
        """All topics, sorted by name."""
        snapshot = self._topics
        return [snapshot[name] for name in sorted(snapshot)]

    def __contains__(self, name: str) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        return len(self._topics)

    def _config_of(self, name: str, overrides: Mapping[str, str]) -> TopicConfig:
        return topic_config_of(name, overrides, self._default_config)

    def set_default_config(self, default_config: TopicConfig) -> list[TopicInfo]:
        """New broker defaults (dynamic broker configs: broker/dynamic_config.py): every
        topic's config is computed again from them and its own overrides. Nothing is written
        (a topic file holds only its overrides). Returns the topics whose config changed, for
        their open logs."""
        with self._lock:
            self._default_config = default_config
            changed = {}
            for name, info in self._topics.items():
                config = self._config_of(name, info.config_overrides)
                if config != info.config:
                    changed[name] = dataclasses.replace(info, config=config)
            if changed:
                self._topics = {**self._topics, **changed}
            return [changed[name] for name in sorted(changed)]

    def push_config(self, name: str, apply: Callable[[TopicConfig], None]) -> None:
        """Hand `name`'s config as stored now (nothing if the topic is gone) to `apply`, the
        open logs' update, under one lock for every push. Each writer of a config (a topic's
        alteration, the dynamic broker defaults, a cluster's metadata) pushes after its
        write, so whichever push runs last reads, and leaves in the logs, the newest config:
        a config computed before a concurrent change never lands after it."""
        with self._push_lock:
            info = self._topics.get(name)
            if info is not None:
                apply(info.config)

    # ---- start -----------------------------------------------------------------------------

    def load(self) -> list[TopicInfo]:
        """Read every topic file; return the topics. A file that cannot be read stops the
        start with an error naming it: guessing a topic's partition count could hide data."""
        self._dir.mkdir(parents=True, exist_ok=True)
        loaded: dict[str, TopicInfo] = {}
        for path in sorted(self._dir.iterdir()):
            if path.name.endswith(".tmp"):
                # a write cut short by a crash; the rename never happened, so the old file
                # (if any) is the truth
                path.unlink(missing_ok=True)
                continue
            if not path.name.endswith(TOPIC_FILE_SUFFIX):
                log.warning("ignoring stray file %s in the topic registry", path)
                continue
            info = self._read_topic_file(path)
            loaded[info.name] = info
        with self._lock:
            # configs from the defaults in force now: set_default_config may have run meanwhile
            self._topics = {name: dataclasses.replace(info, config=self._config_of(name, info.config_overrides))
                            for name, info in loaded.items()}
        return self.topics()

    def _read_topic_file(self, path: Path) -> TopicInfo:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("version") != TOPIC_FILE_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            name = data["name"]
            partition_count = int(data["partition_count"])
            overrides = {str(k): str(v) for k, v in data["config_overrides"].items()}
            topic_id = str(data["topic_id"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise EosError(f"topic registry file {path} is unreadable: {exc}") from exc
        if path.name != name + TOPIC_FILE_SUFFIX or partition_count < 1:
            raise EosError(f"topic registry file {path} is inconsistent: name {name!r}, "
                           f"{partition_count} partitions")
        config = self._config_of(name, overrides)
        return TopicInfo(name, topic_id, partition_count, overrides, config)

    # ---- staged changes: prepare (validate, change nothing), then commit -----------------

    def prepare_create(self, name: str, num_partitions: int, replication_factor: int,
                       config_overrides: Mapping[str, str] | None) -> TopicInfo:
        """Validate a new topic and build its TopicInfo; nothing changes."""
        validate_topic_name(name)
        # Kafka's rule (KIP-464): -1 means the broker's num.partitions. 0 means the same
        # here, because it is what a proto3 message carries when the field is unset; other
        # negatives are refused as in Kafka. (eos.Admin and the CLI refuse 0 themselves.)
        if num_partitions in (-1, 0):
            num_partitions = self._default_num_partitions
        elif num_partitions < 0:
            raise InvalidPartitionsError(
                f"number of partitions must be at least 1 (or -1 for the broker default), got {num_partitions}")
        if num_partitions > PARTITIONS_PER_TOPIC_MAX:
            raise InvalidPartitionsError(
                f"{num_partitions} partitions asked for, the limit per topic is "
                f"{PARTITIONS_PER_TOPIC_MAX}")
        # One node holds one copy: 1 is the only factor there is. -1 means the broker's
        # default.replication.factor (1 here), and so does 0, the proto3 unset value; other
        # negatives are refused as in Kafka.
        if replication_factor > 1 or replication_factor < -1:
            raise EosError(
                f"replication factor {replication_factor} is not possible: this cluster has "
                f"1 broker (use 1, or -1 for the default)", ErrorCode.INVALID_REPLICATION_FACTOR)
        overrides = {str(k): str(v) for k, v in (config_overrides or {}).items()}
        config = self._config_of(name, overrides)
        snapshot = self._topics
        if name in snapshot:
            raise TopicAlreadyExistsError(f"topic {name!r} already exists")
        key = _collision_key(name)
        for existing in snapshot:
            if _collision_key(existing) == key:
                raise InvalidTopicError(
                    f"topic {name!r} collides with existing topic {existing!r} "
                    f"('.' and '_' count as the same character)")
        return TopicInfo(name, str(uuid.uuid4()), num_partitions, overrides, config)

    def prepare_grow(self, name: str, new_partition_count: int) -> TopicInfo:
        """Validate growing a topic to `new_partition_count` partitions; nothing changes."""
        current = self._topics.get(name)
        if current is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        check_growth(name, current.partition_count, new_partition_count)
        return dataclasses.replace(current, partition_count=new_partition_count)

    def prepare_reconfigure(self, name: str, config_overrides: Mapping[str, str]) -> TopicInfo:
        """Validate new overrides for an existing topic (they replace the old ones whole);
        nothing changes."""
        current = self._topics.get(name)
        if current is None:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        overrides = {str(k): str(v) for k, v in config_overrides.items()}
        return dataclasses.replace(current, config_overrides=overrides, config=self._config_of(name, overrides))

    def learn(self, name: str, partition_count: int, config_overrides: Mapping[str, str]) -> TopicInfo:
        """Cluster mode: the registry is this broker's copy of what ZooKeeper holds, and
        the controller tells it about topics. Record `name` with at least `partition_count`
        partitions and these overrides (a topic never shrinks here: a partition this broker
        learned of stays until the topic is deleted). Returns the topic as now recorded;
        writes only when something changed."""
        overrides = {str(k): str(v) for k, v in config_overrides.items()}
        current = self._topics.get(name)
        if (current is not None and current.partition_count >= partition_count
                and dict(current.config_overrides) == overrides):
            return current
        config = self._config_of(name, overrides)
        if current is None:
            info = TopicInfo(name, str(uuid.uuid4()), partition_count, overrides, config)
        else:
            info = dataclasses.replace(current, partition_count=max(partition_count, current.partition_count),
                                       config_overrides=overrides, config=config)
        return self.commit(info)

    def commit(self, info: TopicInfo) -> TopicInfo:
        """Persist `info` (new or changed topic), then make it visible; returns it as stored:
        its config computed again from the defaults in force (a prepared one may predate a
        change of the dynamic broker configs)."""
        with self._lock:
            current = self._topics.get(info.name)
            if current is not None and current.topic_id != info.topic_id:
                raise TopicAlreadyExistsError(f"topic {info.name!r} already exists")
            info = dataclasses.replace(info, config=self._config_of(info.name, info.config_overrides))
            self._write_topic_file(info)
            topics = dict(self._topics)
            topics[info.name] = info
            self._topics = topics
        return info

    def remove(self, name: str) -> TopicInfo:
        """Forget a topic: delete its file, then drop it from memory. Returns what it was."""
        with self._lock:
            current = self._topics.get(name)
            if current is None:
                raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
            (self._dir / (name + TOPIC_FILE_SUFFIX)).unlink(missing_ok=True)
            fsync_directory(self._dir)
            topics = dict(self._topics)
            del topics[name]
            self._topics = topics
            return current

    def _write_topic_file(self, info: TopicInfo) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        final = self._dir / (info.name + TOPIC_FILE_SUFFIX)
        write_file_atomically(final, json.dumps(info.to_json(), sort_keys=True).encode("utf-8"))
