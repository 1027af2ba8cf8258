"""Configuration with Kafka's names and defaults.

Theory of operation
-------------------
Topic and broker settings are dicts of Kafka config names (`"retention.ms"`) to strings,
as they travel on the wire and sit in files. `TopicConfig.from_overrides` validates them
once and turns them into typed attributes whose names swap dots for underscores
(`retention_ms`); everything past this module reads the typed form. An unknown name or a
value out of range raises InvalidConfigError naming the key, and nothing is changed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from eos.errors import InvalidConfigError

LONG_MAX = 2**63 - 1
# Kafka's topic-level values (BrokerCompressionType): "none" is a producer spelling only.
COMPRESSION_TYPES = ("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd")


@dataclasses.dataclass(frozen=True)
class TopicConfig:
    """Per-topic settings (Kafka's topic-level configs that eos implements)."""

    segment_bytes: int = 1073741824           # roll a segment at this size
    segment_ms: int = 604800000               # ... or when its first record is this old
    segment_index_bytes: int = 10485760       # ... or when its offset index is full
    index_interval_bytes: int = 4096          # one sparse index entry per this many log bytes
    retention_ms: int = 604800000             # -1: keep forever
    retention_bytes: int = -1                 # -1: no size limit
    flush_messages: int = LONG_MAX            # fsync after this many unflushed records
    flush_ms: int = LONG_MAX                  # ... or when unflushed data is this old
    max_message_bytes: int = 1048588          # largest batch accepted (1 MiB + log overhead)
    message_timestamp_type: str = "CreateTime"
    compression_type: str = "producer"
    cleanup_policy: str = "delete"            # delete, compact, or compact,delete
    delete_retention_ms: int = 86400000       # a tombstone / marker outlives cleaning this long
    min_cleanable_dirty_ratio: float = 0.5    # clean once this share of the log is dirty
    min_compaction_lag_ms: int = 0            # a record stays uncompacted at least this long
    max_compaction_lag_ms: int = LONG_MAX     # ... and dirty at most this long
    min_insync_replicas: int = 1
    file_delete_delay_ms: int = 60000
    # Kafka's default: a partition whose in-sync replicas are all down stays offline rather
    # than elect a replica that may lack acknowledged records.
    unclean_leader_election_enable: bool = False

    # name -> (attribute, parser, check)
    @classmethod
    def from_overrides(cls, overrides: dict[str, str] | None, base: "TopicConfig | None" = None) -> "TopicConfig":
        base = base or cls()
        values: dict[str, Any] = {}
        for name, raw in (overrides or {}).items():
            spec = _TOPIC_SPECS.get(name)
            if spec is None:
                raise InvalidConfigError(f"unknown topic config {name!r}")
            attribute, parse, check = spec
            try:
                value = parse(str(raw))
            except ValueError:
                raise InvalidConfigError(f"invalid value {raw!r} for {name}") from None
            problem = check(value)
            if problem:
                raise InvalidConfigError(f"invalid value {raw!r} for {name}: {problem}")
            values[attribute] = value
        return dataclasses.replace(base, **values)

    @property
    def compact(self) -> bool:
        """The cleaner keeps the last record of each key (cleanup.policy has compact)."""
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        """Retention deletes old segments (cleanup.policy has delete)."""
        return "delete" in self.cleanup_policy.split(",")

    def to_kafka_names(self) -> dict[str, str]:
        return {name: _kafka_text(getattr(self, attr)) for name, (attr, _, _) in _TOPIC_SPECS.items()}


def _kafka_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered not in ("true", "false"):
        raise ValueError(raw)
    return lowered == "true"


def _at_least(minimum: int):
    return lambda v: None if v >= minimum else f"must be >= {minimum}"


def _one_of(*choices: str):
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _cleanup_policy(raw: str) -> str:
    """Kafka's list of policies, in a canonical order ("delete,compact" = "compact,delete")."""
    policies = sorted({part.strip() for part in raw.split(",") if part.strip()})
    return ",".join(policies)


def _ratio(v: float):
    return None if 0.0 <= v <= 1.0 else "must be between 0 and 1"


def _retention(v: int):
    return None if v >= -1 else "must be -1 (unlimited) or >= 0"


_TOPIC_SPECS = {
    "segment.bytes": ("segment_bytes", int, _at_least(14)),
    "segment.ms": ("segment_ms", int, _at_least(1)),
    "segment.index.bytes": ("segment_index_bytes", int, _at_least(8)),
    "index.interval.bytes": ("index_interval_bytes", int, _at_least(0)),
    "retention.ms": ("retention_ms", int, _retention),
    "retention.bytes": ("retention_bytes", int, _retention),
    "flush.messages": ("flush_messages", int, _at_least(1)),
    "flush.ms": ("flush_ms", int, _at_least(0)),
    "max.message.bytes": ("max_message_bytes", int, _at_least(0)),
    "message.timestamp.type": ("message_timestamp_type", str, _one_of("CreateTime", "LogAppendTime")),
    "compression.type": ("compression_type", str, _one_of(*COMPRESSION_TYPES)),
    "cleanup.policy": ("cleanup_policy", _cleanup_policy, _one_of("delete", "compact", "compact,delete")),
    "delete.retention.ms": ("delete_retention_ms", int, _at_least(0)),
    "min.cleanable.dirty.ratio": ("min_cleanable_dirty_ratio", float, _ratio),
    "min.compaction.lag.ms": ("min_compaction_lag_ms", int, _at_least(0)),
    "max.compaction.lag.ms": ("max_compaction_lag_ms", int, _at_least(1)),
    "min.insync.replicas": ("min_insync_replicas", int, _at_least(1)),
    "file.delete.delay.ms": ("file_delete_delay_ms", int, _at_least(0)),
    "unclean.leader.election.enable": ("unclean_leader_election_enable", _parse_bool, lambda v: None),
}


def kwargs_to_kafka(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`transaction_timeout_ms=60000` -> `{"transaction.timeout.ms": 60000}`."""
    return {key.replace("_", "."): value for key, value in kwargs.items()}
