"""Consume throughput: one consumer reads a whole one-partition topic from the start.

The topic is the one the produce workload filled on the same broker (or one filled here
when produce did not run). The consumer reads a short stretch to warm up, seeks back to
offset 0 and is timed from there to the last record. It touches every value (its length is
summed and checked), as an application would. The run fails (RecordsLost) unless every
record arrives within `Sizes.consume_timeout_s`. Isolation: read_committed on both sides
(no transactions here, so it reads up to the high watermark, but it is the mode the
exactly-once pipelines use).
"""
from __future__ import annotations

import time

from bench.workloads import Metric, NotAvailable, RecordsLost, RunContext, Workload, register
from bench.workloads import produce
from bench.workloads.clients import eos_module

ISOLATION = "read_committed"
MAX_POLL_RECORDS = 10_000


def _source_topic(ctx: RunContext) -> tuple[str, int, int]:
    """(topic, records, value_bytes) of a topic this system's broker holds."""
    cache = ctx.shared.get("produce", {})
    for key in ("bulk-all-idem", "bulk-acks1", "send-all-idem", "send-acks1"):
        if key in cache:
            run = cache[key]
            return run.topic, run.acked, run.value_bytes
    for key in ("bulk-acks1", "send-acks1"):
        try:
            run = produce.measure(ctx, key)
            return run.topic, run.acked, run.value_bytes
        except NotAvailable:
            continue
    raise NotAvailable("no producer to fill a topic with")


def _check(ctx: RunContext, received: int, value_bytes: int, expected: int,
           expected_value_bytes: int) -> None:
    if received != expected:
        raise RecordsLost(f"{ctx.system} consume within {ctx.sizes.consume_timeout_s:.0f} s",
                          expected, received)
    if value_bytes != expected * expected_value_bytes:
        raise RecordsLost(f"{ctx.system} consume: value bytes {value_bytes:,} != "
                          f"{expected * expected_value_bytes:,}", expected, received)


def kafka_consume(ctx: RunContext) -> list[Metric]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topic, expected, size = _source_topic(ctx)
    ctx.progress(f"  consume {expected:,} records ({ISOLATION})")
    consumer = Consumer({
        "bootstrap.servers": ctx.bootstrap,
        "group.id": ctx.topic_name("group"),     # required by librdkafka; never committed
        "enable.auto.commit": False,
        "isolation.level": ISOLATION,
    })
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        warm = 0
        warm_deadline = time.monotonic() + 30
        while warm < min(ctx.sizes.warmup_records, expected) and time.monotonic() < warm_deadline:
            warm += len(consumer.consume(num_messages=MAX_POLL_RECORDS, timeout=1.0))
        consumer.seek(TopicPartition(topic, 0, 0))
        received = value_bytes = 0
        errors = []
        start = time.perf_counter()
        deadline = start + ctx.sizes.consume_timeout_s
        while received < expected and time.perf_counter() < deadline:
            for message in consumer.consume(num_messages=MAX_POLL_RECORDS, timeout=1.0):
                if message.error() is not None:
                    errors.append(message.error())
                    continue
                received += 1
                value_bytes += len(message.value())
        elapsed_s = time.perf_counter() - start
    finally:
        consumer.close()
    if errors:
        ctx.progress(f"    consumer errors: {errors[:3]}")
    _check(ctx, received, value_bytes, expected, size)
    return _metrics(ctx, received, value_bytes, elapsed_s)


def eos_consume(ctx: RunContext) -> list[Metric]:
    eos = eos_module()
    topic, expected, size = _source_topic(ctx)
    ctx.progress(f"  consume {expected:,} records ({ISOLATION})")
    consumer = eos.Consumer(ctx.bootstrap, group_id=None, isolation_level=ISOLATION)
    try:
        tp = eos.TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        warm = 0
        warm_deadline = time.monotonic() + 30
        while warm < min(ctx.sizes.warmup_records, expected) and time.monotonic() < warm_deadline:
            warm += len(consumer.poll(timeout_ms=1000))
        consumer.seek(tp, 0)
        received = value_bytes = 0
        start = time.perf_counter()
        deadline = start + ctx.sizes.consume_timeout_s
        while received < expected and time.perf_counter() < deadline:
            for record in consumer.poll(timeout_ms=1000):
                received += 1
                value_bytes += len(record.value)
        elapsed_s = time.perf_counter() - start
    finally:
        consumer.close()
    _check(ctx, received, value_bytes, expected, size)
    return _metrics(ctx, received, value_bytes, elapsed_s)


def _metrics(ctx: RunContext, received: int, value_bytes: int, elapsed_s: float) -> list[Metric]:
    rate = received / elapsed_s
    ctx.progress(f"    {rate:,.0f} records/s ({received:,} in {elapsed_s:.2f} s)")
    note = f"{received:,} records in {elapsed_s:.2f} s, {ISOLATION}"
    return [
        Metric("consume.records_per_s", "consume: records/s", round(rate), "records/s",
               True, note),
        Metric("consume.mb_per_s", "consume: MB/s", round(value_bytes / elapsed_s / 1e6, 2),
               "MB/s", True, "values only, 10^6 bytes"),
    ]


register(Workload("consume", "Consume throughput, one consumer, from the start",
                  {"kafka": kafka_consume, "eos": eos_consume}))
