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

def kafka_create_topic(bootstrap: str, name: str, partitions: int = 1,
                       config: dict[str, str] | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions,
                                            replication_factor=1, config=config or {})],
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

def eos_module(*needed: str):
    """The eos package, or NotAvailable naming which of its clients `needed` are missing."""
    try:
        import eos
    except ImportError as exc:
        raise NotAvailable(f"cannot import eos: {exc}") from exc
    missing = []
    for name in needed or ("Producer",):
        try:
            getattr(eos, name)
        except (ImportError, AttributeError) as exc:
            missing.append(f"eos.{name} ({exc})")
    if missing:
        raise NotAvailable("eos clients not available yet: " + "; ".join(missing))
    return eos


def require_client(ctx, *needed: str) -> None:
    """Raise NotAvailable at once when ctx.system's client is missing altogether."""
    if ctx.system == "eos":
        eos_module(*needed)


def _eos_broker_stub(bootstrap: str):
    from eos import net
    from eos.v1 import broker_pb2_grpc

    channel = net.open_channel(net.parse_bootstrap(bootstrap)[0])
    return channel, broker_pb2_grpc.BrokerStub(channel)


def eos_create_topic(bootstrap: str, name: str, partitions: int = 1,
                     config: dict[str, str] | None = None) -> None:
    """eos.Admin.create_topic, or the CreateTopics RPC itself while Admin is not written."""
    try:
        eos = eos_module("Admin")
    except NotAvailable:
        eos = None
    if eos is not None:
        admin = eos.Admin(bootstrap)
        try:
            admin.create_topic(name, partitions=partitions, config=config)
        finally:
            close = getattr(admin, "close", None)
            if close is not None:
                close()
        return
    from eos.v1 import broker_pb2

    channel, stub = _eos_broker_stub(bootstrap)
    try:
        response = stub.CreateTopics(broker_pb2.CreateTopicsRequest(
            topics=[broker_pb2.NewTopic(name=name, num_partitions=partitions,
                                        replication_factor=1, configs=config or {})],
            timeout_ms=int(TOPIC_READY_TIMEOUT_S * 1000)), timeout=TOPIC_READY_TIMEOUT_S)
    finally:
        channel.close()
    for result in response.topics:
        if result.error_code != 0:
            raise RuntimeError(f"eos CreateTopics {name}: error {result.error_code} "
                               f"{result.error_message}")


def eos_delete_topics(bootstrap: str, names: list[str]) -> None:
    """Delete topics (eos.Admin), e.g. so that a measurement's dirty pages do not linger."""
    eos = eos_module("Admin")
    admin = eos.Admin(bootstrap)
    try:
        admin.delete_topics(names)
    finally:
        close = getattr(admin, "close", None)
        if close is not None:
            close()


def eos_end_offset(bootstrap: str, topic: str, partitions: int = 1) -> int:
    """Sum of the log end offsets of `topic` (ListOffsets latest): the records it holds."""
    return sum(eos_end_offset_by_partition(bootstrap, topic, partitions).values())


def eos_end_offset_by_partition(bootstrap: str, topic: str, partitions: int = 1) -> dict[int, int]:
    """{partition: log end offset} of `topic` (ListOffsets latest)."""
    from eos.v1 import broker_pb2

    channel, stub = _eos_broker_stub(bootstrap)
    try:
        response = stub.ListOffsets(broker_pb2.ListOffsetsRequest(partitions=[
            broker_pb2.ListOffsetsPartition(topic=topic, partition=p, timestamp=-1)
            for p in range(partitions)]), timeout=TOPIC_READY_TIMEOUT_S)
    finally:
        channel.close()
    offsets: dict[int, int] = {}
    for listed in response.partitions:
        if listed.error_code != 0:
            raise RuntimeError(f"eos ListOffsets {topic}-{listed.partition}: error "
                               f"{listed.error_code} {listed.error_message}")
        offsets[listed.partition] = listed.offset
    return offsets
