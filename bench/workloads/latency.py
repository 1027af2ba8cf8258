"""Produce latency at a moderate fixed rate: send call to delivery callback.

Each figure is the median of `Sizes.repeats` runs, each on a fresh topic with a fresh
producer (p50 and p99 of a run, then the median of those per figure).

One producer (acks=all, idempotent, linger 0 on both sides, so batching waits for nothing)
sends `Sizes.latency_rate_per_s` records a second in 1 ms ticks, first for a warm-up whose
samples are dropped, then for `Sizes.latency_duration_s`. Each record's latency is the time
from just before its send call to its delivery callback (Kafka: the on_delivery callback,
served by poll() while the loop waits for the next tick; eos: the future's done-callback on
the client's thread). Every record must be delivered, else RecordsLost.
"""
from __future__ import annotations

import threading
import time

from bench.workloads import Metric, RecordsLost, RunContext, Workload, register, repeated
from bench.workloads.clients import (eos_create_topic, eos_module, kafka_create_topic,
                                     kafka_producer_config)

TICK_S = 0.001
FLUSH_TIMEOUT_S = 60.0


def _schedule(ctx: RunContext) -> tuple[int, int]:
    """(warm-up records, measured records) at the configured rate."""
    rate = ctx.sizes.latency_rate_per_s
    return round(rate * ctx.sizes.latency_warmup_s), round(rate * ctx.sizes.latency_duration_s)


def _paced(total: int, rate_per_s: int, send, wait) -> float:
    """Call send(index) `total` times at `rate_per_s`; wait(seconds) between bursts.

    Wakes at most once a tick and sends what is due, never more than two ticks' worth at
    once: a client that falls behind shows a lower achieved rate (returned), not bursts.
    """
    burst_max = max(1, int(rate_per_s * TICK_S * 2))
    start = time.perf_counter()
    sent = 0
    while sent < total:
        due = min(total, int((time.perf_counter() - start) * rate_per_s) + 1, sent + burst_max)
        while sent < due:
            send(sent)
            sent += 1
        delay_s = start + sent / rate_per_s - time.perf_counter()
        if delay_s > 0:
            wait(max(delay_s, TICK_S))
    return total / (time.perf_counter() - start)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


def _metrics(ctx: RunContext, latencies_s: list[float], achieved_rate: float) -> list[Metric]:
    values = sorted(latencies_s)
    p50 = _percentile(values, 0.50) * 1000
    p99 = _percentile(values, 0.99) * 1000
    ctx.progress(f"    p50 {p50:.2f} ms, p99 {p99:.2f} ms over {len(values):,} records "
                 f"at {achieved_rate:,.0f}/s")
    note = (f"{len(values):,} records at {achieved_rate:,.0f}/s "
            f"(target {ctx.sizes.latency_rate_per_s:,}/s), acks=all idempotent, linger 0")
    return [
        Metric("latency.p50_ms", "produce latency p50", round(p50, 3), "ms", False, note),
        Metric("latency.p99_ms", "produce latency p99", round(p99, 3), "ms", False, note),
    ]


def kafka_latency(ctx: RunContext) -> list[Metric]:
    return repeated(ctx, lambda: _kafka_latency_once(ctx))


def _kafka_latency_once(ctx: RunContext) -> list[Metric]:
    from confluent_kafka import Producer

    warm, measured = _schedule(ctx)
    ctx.progress(f"  latency at {ctx.sizes.latency_rate_per_s:,}/s for "
                 f"{ctx.sizes.latency_duration_s:.0f} s")
    topic = ctx.topic_name("latency")
    kafka_create_topic(ctx.bootstrap, topic)
    producer = Producer(kafka_producer_config(ctx.bootstrap, acks="all", idempotent=True,
                                              linger_ms=0))
    value = b"v" * ctx.sizes.value_bytes
    latencies: list[float] = []
    errors: list = []
    delivered = 0

    def send(index: int) -> None:
        sent_at = time.perf_counter()

        def on_delivery(err, _msg) -> None:
            nonlocal delivered
            if err is not None:
                errors.append(err)
                return
            delivered += 1
            if index >= warm:
                latencies.append(time.perf_counter() - sent_at)

        producer.produce(topic, value, on_delivery=on_delivery)
        producer.poll(0)

    # One record first, waited for: connection, metadata and producer id are in place
    # before the clock matters (the paced warm-up then warms the steady state).
    producer.produce(topic, value)
    if producer.flush(FLUSH_TIMEOUT_S):
        raise RecordsLost("kafka latency run: first record", 1, 0)
    achieved = _paced(warm + measured, ctx.sizes.latency_rate_per_s, send,
                      lambda delay_s: producer.poll(delay_s))
    remaining = producer.flush(FLUSH_TIMEOUT_S)
    if delivered != warm + measured or remaining:
        raise RecordsLost(f"kafka latency run ({errors[:1]})", warm + measured, delivered)
    return _metrics(ctx, latencies, achieved)


def eos_latency(ctx: RunContext) -> list[Metric]:
    return repeated(ctx, lambda: _eos_latency_once(ctx))


def _eos_latency_once(ctx: RunContext) -> list[Metric]:
    eos = eos_module("Producer")
    warm, measured = _schedule(ctx)
    ctx.progress(f"  latency at {ctx.sizes.latency_rate_per_s:,}/s for "
                 f"{ctx.sizes.latency_duration_s:.0f} s")
    topic = ctx.topic_name("latency")
    eos_create_topic(ctx.bootstrap, topic)
    producer = eos.Producer(ctx.bootstrap, acks="all", enable_idempotence=True, linger_ms=0)
    value = b"v" * ctx.sizes.value_bytes
    latencies: list[float] = []
    errors: list[BaseException] = []
    delivered = 0
    lock = threading.Lock()

    def send(index: int) -> None:
        sent_at = time.perf_counter()

        def on_done(future) -> None:
            nonlocal delivered
            done_at = time.perf_counter()
            exc = future.exception()
            with lock:
                if exc is not None:
                    errors.append(exc)
                    return
                delivered += 1
                if index >= warm:
                    latencies.append(done_at - sent_at)

        producer.send(topic, value=value).add_done_callback(on_done)

    try:
        producer.send(topic, value=value).result(timeout=FLUSH_TIMEOUT_S)
        achieved = _paced(warm + measured, ctx.sizes.latency_rate_per_s, send, time.sleep)
        producer.flush()
    finally:
        producer.close()
    deadline = time.monotonic() + 5
    while delivered + len(errors) < warm + measured and time.monotonic() < deadline:
        time.sleep(0.01)
    if delivered != warm + measured:
        raise RecordsLost(f"eos latency run ({errors[:1]})", warm + measured, delivered)
    return _metrics(ctx, latencies, achieved)


register(Workload("latency", "Produce latency p50/p99 at a fixed moderate rate",
                  {"kafka": kafka_latency, "eos": eos_latency}))
