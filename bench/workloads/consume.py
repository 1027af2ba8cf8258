"""Consume throughput: one consumer reads a whole one-partition topic from the start.

The topic is the one the produce workload filled on the same broker (or one filled here
when produce did not run). The consumer reads a short stretch to warm up, seeks back to
offset 0 and is timed from there to the last record. It touches every value (its length is
summed and checked), as an application would. The run fails (RecordsLost) unless every
record arrives within `Sizes.consume_timeout_s`. The read is repeated `Sizes.repeats` times
(seek to 0 each time) and the median reported. Isolation: read_committed on both sides
(no transactions here, so it reads up to the high watermark, but it is the mode the
exactly-once pipelines use).
"""
from __future__ import annotations

import time

from bench.workloads import Metric, NotAvailable, RecordsLost, RunContext, Workload, register
from bench.workloads import produce
from bench.workloads.clients import eos_module

ISOLATION = "read_committed"
# Records handed over per call on both sides: confluent-kafka's consume(num_messages=...)
# and eos's poll(max_records=...). (Kafka's Java default max.poll.records is 500.)
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


def _repeat(ctx: RunContext, timed_read, expected: int, size: int) -> list[Metric]:
    """`repeats` full reads from offset 0, each checked; metrics of the median one."""
    reads = []
    for _ in range(ctx.sizes.repeats):
        received, value_bytes, elapsed_s = timed_read()
        _check(ctx, received, value_bytes, expected, size)
        ctx.progress(f"    {received / elapsed_s:,.0f} records/s ({received:,} in "
                     f"{elapsed_s:.2f} s)")
        reads.append((received / elapsed_s, received, value_bytes, elapsed_s))
    rate, received, value_bytes, elapsed_s = sorted(reads)[(len(reads) - 1) // 2]
    note = f"median read: {received:,} records in {elapsed_s:.2f} s, {ISOLATION}"
    return [
        Metric("consume.records_per_s", "consume: records/s", round(rate), "records/s",
               True, note, samples=tuple(round(r[0]) for r in reads)),
        Metric("consume.mb_per_s", "consume: MB/s", round(value_bytes / elapsed_s / 1e6, 2),
               "MB/s", True, "values only, 10^6 bytes",
               samples=tuple(round(r[2] / r[3] / 1e6, 2) for r in reads),
               restates="consume.records_per_s"),
    ]


def kafka_consume(ctx: RunContext) -> list[Metric]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    topic, expected, size = _source_topic(ctx)
    ctx.progress(f"  consume {expected:,} records ({ISOLATION}) x {ctx.sizes.repeats}")
    consumer = Consumer({
        "bootstrap.servers": ctx.bootstrap,
        "group.id": ctx.topic_name("group"),     # required by librdkafka; never committed
        "enable.auto.commit": False,
        "isolation.level": ISOLATION,
    })
    errors: list = []

    def timed_read() -> tuple[int, int, float]:
        consumer.seek(TopicPartition(topic, 0, 0))
        received = value_bytes = 0
        start = time.perf_counter()
        deadline = start + ctx.sizes.consume_timeout_s
        while received < expected and time.perf_counter() < deadline:
            for message in consumer.consume(num_messages=MAX_POLL_RECORDS, timeout=1.0):
                if message.error() is not None:
                    errors.append(message.error())
                    continue
                received += 1
                value_bytes += len(message.value())
        return received, value_bytes, time.perf_counter() - start

    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        warm = 0
        warm_deadline = time.monotonic() + 30
        while warm < min(ctx.sizes.warmup_records, expected) and time.monotonic() < warm_deadline:
            warm += len(consumer.consume(num_messages=MAX_POLL_RECORDS, timeout=1.0))
        return _repeat(ctx, timed_read, expected, size)
    finally:
        consumer.close()
        if errors:
            ctx.progress(f"    consumer errors: {errors[:3]}")


def eos_consume(ctx: RunContext) -> list[Metric]:
    eos = eos_module("Consumer", "TopicPartition")
    topic, expected, size = _source_topic(ctx)
    ctx.progress(f"  consume {expected:,} records ({ISOLATION}) x {ctx.sizes.repeats}")
    consumer = eos.Consumer(ctx.bootstrap, group_id=None, isolation_level=ISOLATION)
    tp = eos.TopicPartition(topic, 0)

    def timed_read() -> tuple[int, int, float]:
        consumer.seek(tp, 0)
        received = value_bytes = 0
        start = time.perf_counter()
        deadline = start + ctx.sizes.consume_timeout_s
        while received < expected and time.perf_counter() < deadline:
            for record in consumer.poll(timeout_ms=1000, max_records=MAX_POLL_RECORDS):
                received += 1
                value_bytes += len(record.value)
        return received, value_bytes, time.perf_counter() - start

    try:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        warm = 0
        warm_deadline = time.monotonic() + 30
        while warm < min(ctx.sizes.warmup_records, expected) and time.monotonic() < warm_deadline:
            warm += len(consumer.poll(timeout_ms=1000, max_records=MAX_POLL_RECORDS))
        return _repeat(ctx, timed_read, expected, size)
    finally:
        consumer.close()


register(Workload("consume", "Consume throughput, one consumer, from the start",
                  {"kafka": kafka_consume, "eos": eos_consume}))
