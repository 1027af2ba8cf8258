"""Client plumbing shared by the workloads: Kafka via confluent-kafka, eos via its own SDK.

Both sides get the same knobs (acks, idempotence, linger) under their own names. Kafka's
producer is librdkafka with its defaults except where a workload sets something, and the
same goes for eos's producer: the figures are what a user of each client gets.
"""
from __future__ import annotations

import time
from typing import Any

from bench.workloads import NotAvailable

TOPIC_READY_TIMEOUT_S = 30.0
# librdkafka's local queue (default 100,000 messages) would make the per-record loop spend
# its time in BufferError retries; a bigger queue lets it run at the client's real speed.
KAFKA_QUEUE_MESSAGES = 1_000_000


# ---------------------------------------------------------------- Kafka (confluent-kafka)

def kafka_create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=1)],
                                  operation_timeout=TOPIC_READY_TIMEOUT_S)
    futures[name].result(timeout=TOPIC_READY_TIMEOUT_S)
    deadline = time.monotonic() + TOPIC_READY_TIMEOUT_S
    while time.monotonic() < deadline:
        topic = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if topic is not None and topic.error is None and len(topic.partitions) == partitions \
                and all(p.leader >= 0 for p in topic.partitions.values()):
            return
        time.sleep(0.1)
    raise TimeoutError(f"Kafka topic {name} has no leaders after {TOPIC_READY_TIMEOUT_S} s")


def kafka_producer_config(bootstrap: str, *, acks: str, idempotent: bool, linger_ms: int,
                          **extra: Any) -> dict:
    config = {
        "bootstrap.servers": bootstrap,
        "acks": acks,
        "enable.idempotence": idempotent,
        "linger.ms": linger_ms,
        "queue.buffering.max.messages": KAFKA_QUEUE_MESSAGES,
    }
    config.update(extra)
    return config


def kafka_end_offset(bootstrap: str, topic: str, partitions: int = 1) -> int:
    """Sum of the high watermarks of `topic`: the records the broker holds."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks",
                        "enable.auto.commit": False})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                   for p in range(partitions))
    finally:
        consumer.close()


# ---------------------------------------------------------------- eos

def eos_module():
    """The eos package with its clients, or NotAvailable naming what is missing."""
    try:
        import eos
    except ImportError as exc:
        raise NotAvailable(f"cannot import eos: {exc}") from exc
    missing = []
    for name in ("Producer", "Consumer", "Admin"):
        try:
            getattr(eos, name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"eos.{name} ({exc})")
    if missing:
        raise NotAvailable("eos clients not available yet: " + "; ".join(missing))
    return eos


def require_client(ctx) -> None:
    """Raise NotAvailable at once when ctx.system's client is missing altogether."""
    if ctx.system == "eos":
        eos_module()


def eos_create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    eos = eos_module()
    admin = eos.Admin(bootstrap)
    try:
        admin.create_topic(name, partitions=partitions)
    finally:
        close = getattr(admin, "close", None)
        if close is not None:
            close()
