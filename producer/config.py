"""The producer's settings by Kafka name: defaults, checks, and how idempotence resolves.

Theory of operation
-------------------
`PRODUCER_CONFIG` names every setting the producer takes (Kafka's names; a keyword
argument spells one with underscores) with its default and a converter that refuses a bad
value with a ValueError naming the setting. `resolve_producer_config` applies the config
dict and the keyword arguments over the defaults (`eos.client_config.resolve_config`), then Kafka's
rules between settings: delivery.timeout.ms covers linger.ms + request.timeout.ms;
partitioner.ignore.keys=true is refused beside a partitioner.class (Kafka ignores it there);
and idempotence needs acks=all, retries and at most 5 requests in flight -- asked for
explicitly (or by a transactional.id) it refuses a conflict, left to its default it yields.
"""
from __future__ import annotations

from eos.client_config import (CLIENT_SECURITY_CONFIG, ConfigSpec, as_bool, as_int, as_int32, as_optional_str,
                               as_str, resolve_config)
from eos.client_metrics import metrics_setting
from eos.errors import EosError
from eos.records.compression import codec_from_name
from producer.partitioner import partitioner_class_setting

INT_MAX = 2147483647
MAX_IN_FLIGHT_FOR_IDEMPOTENCE = 5


def _acks(name: str, value) -> int:
    text = str(value).strip().lower() if not isinstance(value, bool) else ""
    if text == "all" or text == "-1":
        return -1
    if text in ("0", "1"):
        return int(text)
    raise ValueError(f"{name} must be 0, 1, 'all' or -1, got {value!r}")


def _compression(name: str, value) -> int:
    try:
        return codec_from_name(value)
    except EosError as exc:
        raise ValueError(f"{name}: {exc}") from None


def _transaction_version(name: str, value) -> int:
    if isinstance(value, bool) or str(value).strip() not in ("1", "2"):
        raise ValueError(f"{name} must be 1 or 2, got {value!r}")
    return int(value)


PRODUCER_CONFIG: dict[str, ConfigSpec] = {
    "bootstrap.servers": ConfigSpec(None, as_optional_str),
    "client.id": ConfigSpec("", as_str),
    "acks": ConfigSpec(-1, _acks),
    "enable.idempotence": ConfigSpec(True, as_bool),
    "linger.ms": ConfigSpec(5, as_int(0)),
    "batch.size": ConfigSpec(16384, as_int32(0)),
    "buffer.memory": ConfigSpec(33554432, as_int(1)),
    "compression.type": ConfigSpec(0, _compression),
    "retries": ConfigSpec(INT_MAX, as_int32(0)),
    "retry.backoff.ms": ConfigSpec(100, as_int(0)),
    "retry.backoff.max.ms": ConfigSpec(1000, as_int(0)),
    "delivery.timeout.ms": ConfigSpec(120000, as_int32(1)),
    "request.timeout.ms": ConfigSpec(30000, as_int32(1)),
    "max.in.flight.requests.per.connection": ConfigSpec(5, as_int32(1)),
    "max.request.size": ConfigSpec(1048576, as_int32(1)),
    "max.block.ms": ConfigSpec(60000, as_int(0)),
    "metadata.max.age.ms": ConfigSpec(300000, as_int(1)),
    "partitioner.ignore.keys": ConfigSpec(False, as_bool),
    # None: the built-in partitioner; else the resolved Python partitioner (see
    # producer/partitioner.py: Kafka's RoundRobinPartitioner, a callable, a class, a dotted name).
    "partitioner.class": ConfigSpec(None, partitioner_class_setting),
    # librdkafka's (confluent-kafka's) setting: on_delivery is called for failed records only,
    # which spares a per-record callback when an application only needs to hear of failures.
    "delivery.report.only.error": ConfigSpec(False, as_bool),
    "transactional.id": ConfigSpec(None, as_optional_str),
    "transaction.timeout.ms": ConfigSpec(60000, as_int32(1)),
    # 2: partitions join a transaction with its produce requests (KIP-890 part 2, Kafka 4's
    # transaction.version 2); 1: an AddPartitionsToTxn round trip first (Kafka's older way).
    "transaction.version": ConfigSpec(2, _transaction_version),
    # eos's: report the client metrics (eos/client_metrics.py) through prometheus_client's
    # default REGISTRY (true) or the CollectorRegistry given; false, the default, costs nothing.
    "metrics": ConfigSpec(False, metrics_setting),
    # security.protocol, ssl.ca.location, ssl.certificate.location, ssl.key.location, ...
    **CLIENT_SECURITY_CONFIG,
}


def resolve_producer_config(config: dict | None, kwargs: dict) -> dict:
    """Checked producer settings by Kafka name, with idempotence resolved; ValueError
    (Kafka's ConfigException) names what is wrong."""
    values, explicit = resolve_config("producer", PRODUCER_CONFIG, config, kwargs)
    if values["delivery.timeout.ms"] < values["linger.ms"] + values["request.timeout.ms"]:
        raise ValueError(
            f"delivery.timeout.ms ({values['delivery.timeout.ms']}) should be equal to or larger "
            f"than linger.ms ({values['linger.ms']}) + request.timeout.ms "
            f"({values['request.timeout.ms']})")
    if values["partitioner.class"] is not None and values["partitioner.ignore.keys"]:
        # Kafka documents the pair as "no effect": the partitioner gets the key and decides.
        # Refused here, so that a setting never looks applied when it is not.
        raise ValueError("partitioner.ignore.keys=true has no effect with a partitioner.class (the "
                         "partitioner gets the key and decides): give one of them, not both")
    conflicts = []
    if values["acks"] != -1:
        conflicts.append(f"acks must be 'all' (got {values['acks']})")
    if values["retries"] == 0:
        conflicts.append("retries must be greater than 0")
    if values["max.in.flight.requests.per.connection"] > MAX_IN_FLIGHT_FOR_IDEMPOTENCE:
        conflicts.append(f"max.in.flight.requests.per.connection must be at most "
                         f"{MAX_IN_FLIGHT_FOR_IDEMPOTENCE} (got "
                         f"{values['max.in.flight.requests.per.connection']})")
    transactional = values["transactional.id"] is not None
    if transactional and "enable.idempotence" in explicit and not values["enable.idempotence"]:
        raise ValueError("transactional.id requires enable.idempotence=true")
    if values["enable.idempotence"]:
        if conflicts:
            if "enable.idempotence" in explicit or transactional:
                raise ValueError("enable.idempotence=true needs " + "; ".join(conflicts))
            values["enable.idempotence"] = False   # Kafka: implicit idempotence yields
    return values
