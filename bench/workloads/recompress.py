"""Recompression on append: what a topic's compression.type costs the broker.

One uncompressed producer (acks=1, bulk calls, linger 5 ms) writes the same records to a
topic per compression.type: `producer` (stored as sent: the baseline) and `gzip`,
`snappy`, `lz4`, `zstd` (the broker decompresses nothing here but compresses every batch
into the topic's codec, as Kafka's LogValidator does). Throughput is value MB/s from the
first send until flush returns; the run fails (RecordsLost) unless every record was
acknowledged and the broker holds exactly that many. The stored size (the topic's `.log`
bytes against the value bytes sent) shows the codec was applied on both systems.

Values are 100 bytes, half random and half a repeated phrase, from a pool of 1,000, so
each codec has work to do without the data being trivially compressible.
"""
from __future__ import annotations

import random
import time

from bench.workloads import Metric, RecordsLost, RunContext, Workload, register, repeated
from bench.workloads.clients import (eos_create_topic, eos_end_offset, eos_module, kafka_create_topic,
                                     kafka_end_offset, kafka_producer_config, require_client)
from bench.workloads.produce import kafka_queue_all

TOPIC_CODECS = ("producer", "gzip", "snappy", "lz4", "zstd")
BULK_RECORDS = 10_000
LINGER_MS = 5
FLUSH_TIMEOUT_S = 120.0
VALUE_POOL = 1_000


def _values(value_bytes: int) -> list[bytes]:
    rng = random.Random(7)
    half = value_bytes // 2
    phrase = (b"order shipped to warehouse " * (value_bytes // 27 + 1))[:value_bytes - half]
    return [rng.randbytes(half) + phrase for _ in range(VALUE_POOL)]


def _records(ctx: RunContext) -> int:
    return max(BULK_RECORDS, ctx.sizes.records // 10)


def _kafka_write(ctx: RunContext, topic: str, values: list[bytes], count: int) -> float:
    from confluent_kafka import Producer

    errors: list = []
    producer = Producer(kafka_producer_config(
        ctx.bootstrap, acks="1", idempotent=False, linger_ms=LINGER_MS,
        **{"compression.type": "none", "delivery.report.only.error": True,
           "on_delivery": lambda err, _msg: err is not None and errors.append(err)}))
    start = time.perf_counter()
    sent = 0
    while sent < count:
        chunk = min(BULK_RECORDS, count - sent)
        kafka_queue_all(producer, topic, [{"value": values[(sent + i) % VALUE_POOL]} for i in range(chunk)])
        sent += chunk
        producer.poll(0)
    unflushed = producer.flush(FLUSH_TIMEOUT_S)
    elapsed_s = time.perf_counter() - start
    if unflushed or errors:
        raise RecordsLost(f"kafka {topic}: acknowledged ({errors[:1]})", count, count - len(errors) - unflushed)
    return elapsed_s


def _eos_write(ctx: RunContext, topic: str, values: list[bytes], count: int) -> float:
    eos = eos_module("Producer")
    producer = eos.Producer(ctx.bootstrap, acks="1", enable_idempotence=False, linger_ms=LINGER_MS,
                            compression_type="none")
    futures = []
    try:
        start = time.perf_counter()
        sent = 0
        while sent < count:
            chunk = min(BULK_RECORDS, count - sent)
            futures.append(producer.send_batch(topic, [values[(sent + i) % VALUE_POOL] for i in range(chunk)]))
            sent += chunk
        producer.flush(FLUSH_TIMEOUT_S)
        elapsed_s = time.perf_counter() - start
    finally:
        producer.close()
    acked = sum(len(f.result(timeout=0)) for f in futures if f.exception(timeout=0) is None)
    if acked != count:
        raise RecordsLost(f"eos {topic}: acknowledged", count, acked)
    return elapsed_s


SYSTEMS = {"kafka": (kafka_create_topic, _kafka_write, kafka_end_offset),
           "eos": (eos_create_topic, _eos_write, eos_end_offset)}


def _run_once(ctx: RunContext) -> list[Metric]:
    create_topic, write, end_offset = SYSTEMS[ctx.system]
    values = _values(ctx.sizes.value_bytes)
    count = _records(ctx)
    value_mb = count * ctx.sizes.value_bytes / 1e6
    warmup = ctx.topic_name("recompress-warmup")      # JIT, connections, first segment
    create_topic(ctx.bootstrap, warmup)
    write(ctx, warmup, values, min(count, ctx.sizes.warmup_records))
    metrics = []
    for codec in TOPIC_CODECS:
        topic = ctx.topic_name(f"recompress-{codec}")
        create_topic(ctx.bootstrap, topic, config={"compression.type": codec})
        elapsed_s = write(ctx, topic, values, count)
        stored = end_offset(ctx.bootstrap, topic)
        if stored != count:
            raise RecordsLost(f"{ctx.system} {topic}: held by the broker", count, stored)
        stored_share = ctx.log_bytes(topic) / (count * ctx.sizes.value_bytes)
        ctx.progress(f"    compression.type={codec}: {value_mb / elapsed_s:.1f} MB/s, "
                     f"stored {stored_share:.2f}x the value bytes")
        metrics.append(Metric(f"{codec}.mb_per_s", f"uncompressed producer, topic compression.type={codec}: MB/s",
                              round(value_mb / elapsed_s, 2), "MB/s", True,
                              f"{count:,} records; .log bytes {stored_share:.2f}x the value bytes"))
    return metrics


def run_recompress(ctx: RunContext) -> list[Metric]:
    require_client(ctx, "Producer")
    return repeated(ctx, lambda: _run_once(ctx))


register(Workload("recompress", "Topic compression.type: the broker recompresses an uncompressed producer's batches",
                  {"kafka": run_recompress, "eos": run_recompress}))
