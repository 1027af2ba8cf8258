"""Kafka's DescribeConfigs and IncrementalAlterConfigs for topics: the rules (the I/O is the
broker's `TopicConfigStore`).

Theory of operation
-------------------
A topic's config is the broker's defaults (the `log.*` settings of server.properties, or
Kafka's defaults) with the topic's overrides on top; only the overrides are stored (the
registry's topic file on one broker, /config/topics/<name> on a ZooKeeper cluster). This
module holds what both kinds of broker share, so the two answer alike:

- `describe_topic(...)`: every config eos implements (or the names asked for, unknown names
  left out as Kafka leaves them), each with its value and where it comes from (Kafka's
  ConfigSource: an override of the topic, the broker's static setting, or the default).
- `altered_overrides(topic, current, alterations, defaults)`: the overrides after one resource's
  operations (Kafka's AlterConfigOp: SET, DELETE -- back to the default --, APPEND and
  SUBTRACT on list configs), checked whole before anything is written: a name given twice,
  an unknown name or operation, a value out of range, APPEND to a config that is not a list.
  The result is validated by `TopicConfig.from_overrides`, so an override that could not be
  loaded is never stored.
- `describe_configs` / `alter_configs`: a request answered resource by resource (one refused
  resource does not stop the others, as in Kafka), given the broker's three operations
  (`TopicConfigStore`): a topic's overrides, its effective config, and a read-modify-write
  of its overrides, which the store makes atomic (a lock on one broker, a compare-and-set
  of the znode on a cluster).

Authorization is the Broker service's: a resource the caller may not describe or alter never
reaches these functions.
"""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Mapping, Protocol

from broker.topics import INTERNAL_TOPIC_CONFIG, is_internal_topic
from eos.config import TopicConfig
from eos.config_resources import (OP_APPEND, OP_DELETE, OP_NAMES, OP_SET, RESOURCE_TOPIC, SOURCE_DEFAULT_CONFIG,
                                  SOURCE_DYNAMIC_TOPIC_CONFIG, SOURCE_STATIC_BROKER_CONFIG)
from eos.errors import (EosError, InvalidConfigError, InvalidRequestError,
                        UnknownTopicOrPartitionError, error_code_and_message)
from eos.v1 import broker_pb2

log = logging.getLogger("eos.broker.admin")

# Topic configs whose value is a comma-separated list (APPEND and SUBTRACT apply to them).
LIST_CONFIGS = frozenset({"cleanup.policy"})

_KAFKA_DEFAULTS = TopicConfig().to_kafka_names()


class TopicConfigStore(Protocol):
    """What a broker gives `describe_configs` and `alter_configs` (see the module doc)."""

    def topic_overrides(self, name: str) -> Mapping[str, str]:
        """The topic's overrides; raises UnknownTopicOrPartitionError."""

    def topic_config(self, name: str) -> TopicConfig:
        """The topic's effective config (defaults with overrides)."""

    @property
    def default_config(self) -> TopicConfig:
        """The broker's defaults for a topic without overrides."""

    def update_overrides(self, name: str, change: Callable[[Mapping[str, str]], dict[str, str]],
                         validate_only: bool) -> None:
        """Replace the overrides with `change(current)` atomically, unless validate_only
        (then `change` still runs, so its refusals are raised)."""


def describe_topic(overrides: Mapping[str, str], effective: TopicConfig, defaults: TopicConfig,
                   names: Iterable[str] = (), *, internal: bool = False) -> list[broker_pb2.ConfigEntry]:
    """The entries of one topic, sorted by name (`names`: only those; empty: all)."""
    values = effective.to_kafka_names()
    static = defaults.to_kafka_names()
    forced = INTERNAL_TOPIC_CONFIG if internal else {}
    wanted = set(names) if names else set(values)
    entries = []
    for name in sorted(wanted & set(values)):
        if name in overrides or name in forced:
            source = SOURCE_DYNAMIC_TOPIC_CONFIG
        elif static[name] != _KAFKA_DEFAULTS[name]:
            source = SOURCE_STATIC_BROKER_CONFIG
        else:
            source = SOURCE_DEFAULT_CONFIG
        entries.append(broker_pb2.ConfigEntry(name=name, value=values[name], read_only=False,
                                              config_source=source, is_sensitive=False))
    return entries


def altered_overrides(topic: str, current: Mapping[str, str], alterations: Iterable[broker_pb2.AlterableConfig],
                      defaults: TopicConfig) -> dict[str, str]:
    """The overrides after `alterations` (see the module doc); raises InvalidRequestError or
    InvalidConfigError and changes nothing."""
    alterations = list(alterations)
    seen: set[str] = set()
    for alteration in alterations:
        if alteration.name in seen:
            # Kafka's words for the same mistake
            raise InvalidRequestError(f"Error due to duplicate config keys: {alteration.name!r} appears twice")
        seen.add(alteration.name)
    known = defaults.to_kafka_names()
    wanted = dict(current)
    for alteration in alterations:
        name, op, value = alteration.name, alteration.config_operation, alteration.value
        if op not in OP_NAMES:
            raise InvalidRequestError(
                f"unknown config operation {op} for {name!r} (0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT)")
        if name not in known and not (op == OP_DELETE and name in wanted):
            # (an override eos does not know, written by another tool, may still be deleted)
            raise InvalidConfigError(f"unknown topic config {name!r}")
        if is_internal_topic(topic) and name in INTERNAL_TOPIC_CONFIG:
            raise InvalidConfigError(f"{name} of internal topic {topic!r} cannot change: "
                                     f"the coordinators' state needs {INTERNAL_TOPIC_CONFIG[name]}")
        if op == OP_SET:
            wanted[name] = value
        elif op == OP_DELETE:
            wanted.pop(name, None)
        else:
            if name not in LIST_CONFIGS:
                raise InvalidConfigError(f"Config value {OP_NAMES[op].lower()} is not allowed for config key {name!r}: "
                                         f"it is not a list")
            items = _list_items(wanted.get(name, known[name]))
            given = _list_items(value)
            if op == OP_APPEND:
                items += [item for item in given if item not in items]
            else:
                items = [item for item in items if item not in given]
            wanted[name] = ",".join(items)
    TopicConfig.from_overrides(wanted, base=defaults)    # raises InvalidConfigError naming the key
    return wanted


def _list_items(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


Refusals = Mapping[tuple[int, str], tuple[int, str]]     # (resource type, name) -> (code, message)


def describe_configs(request: broker_pb2.DescribeConfigsRequest, store: TopicConfigStore,
                     refused: Refusals | None = None) -> broker_pb2.DescribeConfigsResponse:
    """The answer to a DescribeConfigs, one result per resource in request order; `refused`
    ((type, name) -> (code, message)) are answered with their refusal."""
    results = []
    for resource in request.resources:
        result = broker_pb2.DescribeConfigsResult(resource_type=resource.resource_type,
                                                  resource_name=resource.resource_name)
        try:
            _check_resource(resource.resource_type, resource.resource_name, refused)
            overrides = store.topic_overrides(resource.resource_name)
            result.configs.extend(describe_topic(
                overrides, store.topic_config(resource.resource_name), store.default_config,
                resource.config_names, internal=is_internal_topic(resource.resource_name)))
        except Exception as exc:
            result.error_code, result.error_message = _code_and_message(exc)
        results.append(result)
    return broker_pb2.DescribeConfigsResponse(results=results)


def alter_configs(request: broker_pb2.IncrementalAlterConfigsRequest, store: TopicConfigStore,
                  refused: Refusals | None = None) -> broker_pb2.IncrementalAlterConfigsResponse:
    """The answer to an IncrementalAlterConfigs (see `describe_configs` for `refused`)."""
    counts: dict[tuple[int, str], int] = {}
    for resource in request.resources:
        key = (resource.resource_type, resource.resource_name)
        counts[key] = counts.get(key, 0) + 1
    results = []
    for resource in request.resources:
        result = broker_pb2.AlterConfigsResult(resource_type=resource.resource_type,
                                               resource_name=resource.resource_name)
        try:
            _check_resource(resource.resource_type, resource.resource_name, refused)
            if counts[(resource.resource_type, resource.resource_name)] > 1:
                raise InvalidRequestError(f"topic {resource.resource_name!r} appears more than once in one request")
            store.update_overrides(resource.resource_name, lambda current, r=resource: altered_overrides(
                r.resource_name, current, r.configs, store.default_config), request.validate_only)
        except Exception as exc:
            result.error_code, result.error_message = _code_and_message(exc)
        results.append(result)
    return broker_pb2.IncrementalAlterConfigsResponse(results=results)


def _check_resource(resource_type: int, name: str, refused) -> None:
    if refused and (resource_type, name) in refused:
        code, message = refused[(resource_type, name)]
        raise EosError(message, code)
    if resource_type != RESOURCE_TOPIC:
        raise InvalidRequestError(f"resource type {resource_type} has no configs to change here: eos describes and "
                                  f"alters topics' (type {RESOURCE_TOPIC}); a broker's settings are static, set "
                                  f"where it starts, and described by that broker")
    if not name:
        raise UnknownTopicOrPartitionError("no topic name given")


def _code_and_message(exc: BaseException) -> tuple[int, str]:
    if not isinstance(exc, EosError):
        log.exception("a topic config request failed unexpectedly", exc_info=exc)
    code, message = error_code_and_message(exc)
    return int(code), message


class TopicConfigRequests:
    """The two requests, for a topic admin that is its own `TopicConfigStore` (both the
    single broker's and the cluster's)."""

    def describe_configs(self, request: broker_pb2.DescribeConfigsRequest,
                         refused: Refusals | None = None) -> broker_pb2.DescribeConfigsResponse:
        return describe_configs(request, self, refused)

    def alter_configs(self, request: broker_pb2.IncrementalAlterConfigsRequest,
                      refused: Refusals | None = None) -> broker_pb2.IncrementalAlterConfigsResponse:
        return alter_configs(request, self, refused)
