"""What the admin's callers pass, turned into the pieces of its requests.

Topic specs (a name, a tuple or a dict) into (name, partitions, replication factor,
configs); config values into Kafka's strings; isolation levels, partitions and quota
entities into their protobuf forms, each refused with a ValueError/TypeError naming what is
wrong before any request is sent. Pure functions: the Admin's state is not touched here.
"""
from __future__ import annotations

from eos.v1 import common_pb2
from eos.v1.common_pb2 import IsolationLevel


def isolation_level_code(isolation_level: str) -> int:
    if isolation_level not in ("read_uncommitted", "read_committed"):
        raise ValueError(f"isolation_level must be read_uncommitted or read_committed, got {isolation_level!r}")
    return (IsolationLevel.READ_COMMITTED if isolation_level == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED)


def tps(partitions) -> list[common_pb2.TopicPartition]:
    return [common_pb2.TopicPartition(topic=tp[0], partition=tp[1]) for tp in partitions]


def topic_spec(item) -> tuple[str, int, int, dict]:
    """(name, partitions, replication factor, configs) from a name, a tuple or a dict."""
    if isinstance(item, str):
        return item, 1, 1, {}
    if isinstance(item, dict):
        unknown = set(item) - {"name", "partitions", "replication_factor", "config", "assignments"}
        if unknown:
            raise ValueError(f"unknown topic spec keys {sorted(unknown)}: expected name, partitions, "
                             f"replication_factor, config, assignments")
        if item.get("assignments"):
            # a manual assignment fixes both counts (kafka-topics --replica-assignment)
            assignments = item["assignments"]
            return item["name"], len(assignments), len(next(iter(assignments.values()))), item.get("config") or {}
        return (item["name"], item.get("partitions", 1), item.get("replication_factor", 1),
                item.get("config") or {})
    if isinstance(item, (tuple, list)) and 1 <= len(item) <= 4:
        name, partitions, replication_factor, config = (list(item) + [1, 1, {}][len(item) - 1:])[:4]
        return name, partitions, replication_factor, config or {}
    raise TypeError(f"a topic spec is a name, a dict or a (name, partitions, replication_factor, "
                    f"config) tuple; got {item!r}")


def config_strings(config: dict | None) -> dict[str, str]:
    out = {}
    for key, value in (config or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"topic config names are strings, got {key!r}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        out[key] = str(value)
    return out


def quota_entity_to_proto(entity: dict) -> list:
    from eos.v1 import security_pb2
    unknown = sorted(set(entity) - {"user", "client-id"})
    if unknown or not entity:
        raise ValueError(f"a quota entity is {{'user': ..., 'client-id': ...}} (None for the default), got {entity!r}")
    return [security_pb2.QuotaEntityComponent(entity_type=kind, name=name or "", is_default=name is None)
            for kind, name in entity.items()]


def quota_entity_text(components) -> str:
    return ", ".join(f"{c.entity_type}={'<default>' if c.is_default else c.name}" for c in components)


__all__ = ["config_strings", "isolation_level_code", "quota_entity_text", "quota_entity_to_proto", "topic_spec",
           "tps"]
