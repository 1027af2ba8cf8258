"""`eos.Admin`: topics and offsets, after Kafka's Admin client.

Theory of operation
-------------------
Each method is one RPC with the same shape: build the request, send it to the bootstrap
broker (which answers for the cluster: in a single-node cluster it is the controller), and
turn each per-topic or per-partition error code into the eos exception for it
(`eos.errors.error_for`), naming the topic. A request that fails in transport (broker
restarting, deadline passed) is retried with backoff until default.api.timeout.ms; errors
in the answer are raised at once. The client keeps no state beyond its channels, so it is
safe to share between threads.
"""
from __future__ import annotations

import time
from typing import Callable

import grpc

from eos import net
from eos.errors import EosError, ErrorCode, error_for
from eos.types import TopicPartition
from eos.v1 import broker_pb2
from eos.v1.common_pb2 import IsolationLevel

ADMIN_CONFIG: dict[str, net.ConfigSpec] = {
    "bootstrap.servers": net.ConfigSpec(None, net.as_optional_str),
    "client.id": net.ConfigSpec("", net.as_str),
    "request.timeout.ms": net.ConfigSpec(30000, net.as_int(1)),
    "default.api.timeout.ms": net.ConfigSpec(60000, net.as_int(1)),
    "retry.backoff.ms": net.ConfigSpec(100, net.as_int(0)),
    "retry.backoff.max.ms": net.ConfigSpec(1000, net.as_int(0)),
}

_OFFSET_SPECS = {"earliest": -2, "latest": -1, "max_timestamp": -3}


def _topic_spec(item) -> tuple[str, int, int, dict]:
    """(name, partitions, replication factor, configs) from a name, a tuple or a dict."""
    if isinstance(item, str):
        return item, 1, 1, {}
    if isinstance(item, dict):
        unknown = set(item) - {"name", "partitions", "replication_factor", "config"}
        if unknown:
            raise ValueError(f"unknown topic spec keys {sorted(unknown)}: expected name, partitions, "
                             f"replication_factor, config")
        return (item["name"], item.get("partitions", 1), item.get("replication_factor", 1),
                item.get("config") or {})
    if isinstance(item, (tuple, list)) and 1 <= len(item) <= 4:
        name, partitions, replication_factor, config = (list(item) + [1, 1, {}][len(item) - 1:])[:4]
        return name, partitions, replication_factor, config or {}
    raise TypeError(f"a topic spec is a name, a dict or a (name, partitions, replication_factor, "
                    f"config) tuple; got {item!r}")


def _config_strings(config: dict | None) -> dict[str, str]:
    out = {}
    for key, value in (config or {}).items():
        if not isinstance(key, str):
            raise TypeError(f"topic config names are strings, got {key!r}")
        if isinstance(value, bool):
            value = "true" if value else "false"
        out[key] = str(value)
    return out


class Admin:
    """``Admin(bootstrap="127.0.0.1:9092", *, config=None, **kwargs)``"""

    def __init__(self, bootstrap: str = net.DEFAULT_BOOTSTRAP, *, config: dict | None = None,
                 **kwargs):
        settings, _ = net.resolve_config("admin", ADMIN_CONFIG, config, kwargs)
        if settings["bootstrap.servers"]:
            bootstrap = settings["bootstrap.servers"]
        self.config = settings
        self._request_timeout_ms = settings["request.timeout.ms"]
        self._api_timeout_ms = settings["default.api.timeout.ms"]
        self._backoff = net.Backoff(settings["retry.backoff.ms"], settings["retry.backoff.max.ms"])
        self._metadata = net.ClusterMetadata(
            bootstrap, request_timeout_ms=self._request_timeout_ms,
            retry_backoff_ms=settings["retry.backoff.ms"],
            retry_backoff_max_ms=settings["retry.backoff.max.ms"])

    # ---- plumbing ------------------------------------------------------------------------

    def _call(self, what: str, rpc: Callable, request, timeout_ms: int | None = None):
        """One RPC to the bootstrap broker, retried on transport errors until the timeout."""
        deadline = time.monotonic() + (timeout_ms if timeout_ms is not None else self._api_timeout_ms) / 1000
        attempt = 0
        while True:
            remaining_s = deadline - time.monotonic()
            try:
                return rpc(self._metadata.bootstrap_stub())(
                    request, timeout=max(0.001, min(self._request_timeout_ms / 1000, remaining_s)))
            except grpc.RpcError as exc:
                error = net.error_from_rpc(exc, what)
                attempt += 1
                delay_s = self._backoff.delay_ms(attempt) / 1000
                if not error.retriable or time.monotonic() + delay_s >= deadline:
                    raise error from None
                time.sleep(delay_s)

    @staticmethod
    def _raise_topic_errors(results, what: str) -> None:
        errors = [(r.name, r.error_code, r.error_message) for r in results if r.error_code != ErrorCode.NONE]
        if not errors:
            return
        name, code, message = errors[0]
        text = f"{what} {name!r}: {message or ErrorCode(code).name}"
        if len(errors) > 1:
            text += "; also " + "; ".join(f"{n!r}: {m or ErrorCode(c).name}" for n, c, m in errors[1:])
        raise error_for(code, text)

    # ---- topics --------------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: dict | None = None, *, validate_only: bool = False,
                     timeout_ms: int | None = None) -> None:
        """Create one topic; `config` holds Kafka topic configs ({"retention.ms": "1000"})."""
        self.create_topics([{"name": name, "partitions": partitions,
                             "replication_factor": replication_factor, "config": config}],
                           validate_only=validate_only, timeout_ms=timeout_ms)

    def create_topics(self, topics, *, validate_only: bool = False, timeout_ms: int | None = None) -> None:
        """Create several topics in one request: each a name, a dict (name, partitions,
        replication_factor, config) or a tuple in that order. Raises the first failure's
        error, naming every topic that failed; the others are created."""
        new_topics = []
        for item in topics:
            name, partitions, replication_factor, config = _topic_spec(item)
            if not isinstance(name, str):
                raise TypeError(f"topic name must be a str, got {name!r}")
            for label, number in (("partitions", partitions), ("replication_factor", replication_factor)):
                if isinstance(number, bool) or not isinstance(number, int):
                    raise TypeError(f"{label} of topic {name!r} must be an int, got {number!r}")
            new_topics.append(broker_pb2.NewTopic(
                name=name, num_partitions=partitions, replication_factor=replication_factor,
                configs=_config_strings(config)))
        if not new_topics:
            return
        timeout = timeout_ms if timeout_ms is not None else self._api_timeout_ms
        response = self._call("CreateTopics", lambda s: s.CreateTopics, broker_pb2.CreateTopicsRequest(
            topics=new_topics, timeout_ms=timeout, validate_only=validate_only), timeout_ms)
        self._raise_topic_errors(response.topics, "cannot create topic")
        for topic in new_topics:
            self._metadata.mark_stale(topic.name)

    def delete_topic(self, name: str, *, timeout_ms: int | None = None) -> None:
        self.delete_topics([name], timeout_ms=timeout_ms)

    def delete_topics(self, names, *, timeout_ms: int | None = None) -> None:
        names = [names] if isinstance(names, str) else list(names)
        if not names:
            return
        timeout = timeout_ms if timeout_ms is not None else self._api_timeout_ms
        response = self._call("DeleteTopics", lambda s: s.DeleteTopics, broker_pb2.DeleteTopicsRequest(
            names=names, timeout_ms=timeout), timeout_ms)
        self._raise_topic_errors(response.topics, "cannot delete topic")

    def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        """Grow `name` to `total` partitions (partitions can only be added, as in Kafka)."""
        if isinstance(total, bool) or not isinstance(total, int):
            raise TypeError(f"total must be an int, got {total!r}")
        response = self._call("CreatePartitions", lambda s: s.CreatePartitions,
                              broker_pb2.CreatePartitionsRequest(
                                  topics=[broker_pb2.NewPartitions(name=name, count=total)],
                                  validate_only=validate_only))
        self._raise_topic_errors(response.topics, "cannot create partitions for topic")
        self._metadata.mark_stale(name)

    def list_topics(self, include_internal: bool = False) -> list[str]:
        """Topic names, sorted; internal ones (__consumer_offsets, ...) only when asked."""
        response = self._call("Metadata", lambda s: s.Metadata,
                              broker_pb2.MetadataRequest(include_internal=include_internal))
        return sorted(t.name for t in response.topics
                      if t.error_code == ErrorCode.NONE and (include_internal or not t.is_internal))

    def describe_topic(self, name: str) -> dict:
        """{"name", "internal", "partitions": [{"partition", "leader", "leader_epoch",
        "replicas", "isr"}], "configs": {per-topic overrides}}."""
        response = self._call("Metadata", lambda s: s.Metadata,
                              broker_pb2.MetadataRequest(topics=[name], include_internal=True))
        for topic in response.topics:
            if topic.name != name:
                continue
            if topic.error_code != ErrorCode.NONE:
                raise error_for(topic.error_code,
                                f"cannot describe topic {name!r}: {topic.error_message or ErrorCode(topic.error_code).name}")
            return {
                "name": topic.name,
                "internal": topic.is_internal,
                "partitions": [
                    {"partition": p.partition, "leader": p.leader_id, "leader_epoch": p.leader_epoch,
                     "replicas": list(p.replica_ids), "isr": list(p.isr_ids)}
                    for p in sorted(topic.partitions, key=lambda p: p.partition)],
                "configs": dict(topic.configs),
            }
        raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} is not in the answer")

    def describe_cluster(self) -> dict:
        """{"cluster_id", "controller_id", "brokers": {node_id: "host:port"}}."""
        response = self._call("Metadata", lambda s: s.Metadata, broker_pb2.MetadataRequest(topics=[]))
        return {"cluster_id": response.cluster_id, "controller_id": response.controller_id,
                "brokers": {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}}

    # ---- offsets -------------------------------------------------------------------------

    def list_offsets(self, specs: dict, *, isolation_level: str = "read_uncommitted") -> dict[TopicPartition, int]:
        """{tp: "earliest" | "latest" | "max_timestamp" | timestamp_ms} -> {tp: offset}.

        "latest" is the high watermark (the last stable offset under read_committed); a
        timestamp gives the earliest offset whose timestamp is >= it, or -1 if none is.
        """
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError(f"isolation_level must be read_uncommitted or read_committed, got {isolation_level!r}")
        partitions = []
        for tp, spec in specs.items():
            topic, partition = tp
            if isinstance(spec, str):
                if spec not in _OFFSET_SPECS:
                    raise ValueError(f"offset spec for {topic}-{partition} must be earliest, latest, "
                                     f"max_timestamp or a timestamp in ms, got {spec!r}")
                timestamp = _OFFSET_SPECS[spec]
            elif isinstance(spec, int) and not isinstance(spec, bool) and spec >= 0:
                timestamp = spec
            else:
                raise ValueError(f"offset spec for {topic}-{partition} must be earliest, latest, "
                                 f"max_timestamp or a timestamp in ms, got {spec!r}")
            partitions.append(broker_pb2.ListOffsetsPartition(topic=topic, partition=partition,
                                                              timestamp=timestamp))
        if not partitions:
            return {}
        level = (IsolationLevel.READ_COMMITTED if isolation_level == "read_committed"
                 else IsolationLevel.READ_UNCOMMITTED)
        response = self._call("ListOffsets", lambda s: s.ListOffsets, broker_pb2.ListOffsetsRequest(
            isolation_level=level, partitions=partitions))
        result = {}
        for listed in response.partitions:
            if listed.error_code != ErrorCode.NONE:
                raise error_for(listed.error_code, f"cannot list offsets of {listed.topic}-{listed.partition}: "
                                f"{listed.error_message or ErrorCode(listed.error_code).name}")
            result[TopicPartition(listed.topic, listed.partition)] = listed.offset
        return result

    # ---- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        self._metadata.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
