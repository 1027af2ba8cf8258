"""Produce throughput: one producer, 100-byte values, one partition.

Each configuration is measured on a fresh topic after a warm-up on another topic with the
same producer. The clock runs from the first send until flush returns, i.e. until every
record is acknowledged. Throughput counts acknowledged records only, and the run fails
(RecordsLost) unless acknowledged == sent == the records the broker then holds.

Two paths per client, compared like with like:
- ``send``: one call per record (both: ``Producer.produce``, which returns nothing, with
  ``delivery.report.only.error``: failures reach the delivery callback, successes are
  counted as sent minus failures once flush returns);
- ``bulk``: one call per 10,000 records (Kafka: ``Producer.produce_batch``; eos:
  ``Producer.send_batch``).
Both clients batch up to the same 1,000,000 bytes (`BATCH_BYTES`): librdkafka's default
batch.size, which confluent-kafka's users get; eos keeps the Java client's default of
16,384, so it is set here on eos (and, for clarity, on Kafka). With 16 KiB batches a
per-record eos producer builds, sends and completes a batch every ~140 records, and the
sender's wake-ups on the shared GIL cost the producing thread about a third of its pace.
A slow client must still finish within the time budget: the measured run sends
`Sizes.records`, or fewer when the warm-up's rate says that many would take longer than
`Sizes.max_measure_s` (the note then says so); the send loop also stops at twice that.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from bench.workloads import (Metric, NotAvailable, RecordsLost, RunContext, Workload,
                             register, settle_writes)
from bench.workloads.clients import (eos_create_topic, eos_end_offset, eos_module,
                                     kafka_create_topic, kafka_end_offset,
                                     kafka_producer_config, require_client)

BULK_RECORDS = 10_000
LINGER_MS = 5            # Kafka 4.x's and librdkafka's default; set on both for clarity
BATCH_BYTES = 1_000_000  # librdkafka's default batch.size; set on both (see the module doc)
FLUSH_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ProduceConfig:
    key: str
    label: str
    path: str            # "send" or "bulk"
    acks: str            # "1" or "all"
    idempotent: bool


CONFIGS = {c.key: c for c in (
    ProduceConfig("send-acks1", "send, acks=1", "send", "1", False),
    ProduceConfig("send-all-idem", "send, acks=all, idempotent", "send", "all", True),
    ProduceConfig("bulk-acks1", "bulk, acks=1", "bulk", "1", False),
    ProduceConfig("bulk-all-idem", "bulk, acks=all, idempotent", "bulk", "all", True),
    ProduceConfig("bulk-all-plain", "bulk, acks=all, not idempotent", "bulk", "all", False),
    ProduceConfig("send-all-plain", "send, acks=all, not idempotent", "send", "all", False),
)}
DEFAULT_CONFIGS = ("send-acks1", "send-all-idem", "bulk-acks1", "bulk-all-idem")


@dataclass(frozen=True)
class ProduceRun:
    config: ProduceConfig
    topic: str
    sent: int
    acked: int
    elapsed_s: float
    value_bytes: int
    log_bytes: int       # .log bytes the broker wrote for the topic

    @property
    def records_per_s(self) -> float:
        return self.acked / self.elapsed_s

    @property
    def mb_per_s(self) -> float:
        return self.acked * self.value_bytes / self.elapsed_s / 1e6


def planned_records(ctx: RunContext, warmup_elapsed_s: float) -> int:
    """Records for the measured run: Sizes.records, or fewer if the warm-up's rate says
    that many would take longer than Sizes.max_measure_s (never fewer than the warm-up)."""
    rate = ctx.sizes.warmup_records / max(warmup_elapsed_s, 1e-6)
    fit = int(rate * ctx.sizes.max_measure_s)
    return max(min(ctx.sizes.records, fit), min(ctx.sizes.records, ctx.sizes.warmup_records))


# ---------------------------------------------------------------- Kafka

def _kafka_send_each(producer, topic: str, value: bytes, count: int, deadline: float) -> int:
    produce, poll = producer.produce, producer.poll
    sent = 0
    while sent < count:
        chunk = min(BULK_RECORDS, count - sent)
        for _ in range(chunk):
            try:
                produce(topic, value)
            except BufferError:
                while True:
                    poll(0.001)
                    try:
                        produce(topic, value)
                        break
                    except BufferError:
                        continue
        sent += chunk
        poll(0)
        if time.perf_counter() > deadline:
            break
    return sent


def kafka_queue_all(producer, topic: str, messages: list[dict]) -> None:
    """confluent-kafka's produce_batch until every message is queued."""
    while messages:
        queued = producer.produce_batch(topic, messages)
        if queued == len(messages):
            return
        # The rest were refused locally (queue full): serve delivery reports, retry them.
        messages = [m for m in messages if "_error" in m]
        for message in messages:
            del message["_error"]
        producer.poll(0.001)


def kafka_send_bulk(producer, topic: str, value: bytes, count: int, deadline: float) -> int:
    sent = 0
    while sent < count:
        chunk = min(BULK_RECORDS, count - sent)
        kafka_queue_all(producer, topic, [{"value": value} for _ in range(chunk)])
        sent += chunk
        producer.poll(0)
        if time.perf_counter() > deadline:
            break
    return sent


def kafka_produce(ctx: RunContext, config: ProduceConfig) -> ProduceRun:
    from confluent_kafka import Producer

    errors: list = []

    def on_delivery(err, _msg) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer(kafka_producer_config(
        ctx.bootstrap, acks=config.acks, idempotent=config.idempotent, linger_ms=LINGER_MS,
        # Every message still gets exactly one report; only failures reach Python, so the
        # count of acknowledged records is sent - failures once flush() leaves 0 behind.
        **{"batch.size": BATCH_BYTES, "delivery.report.only.error": True, "on_delivery": on_delivery}))
    send = _kafka_send_each if config.path == "send" else kafka_send_bulk
    value = b"v" * ctx.sizes.value_bytes
    warmup = ctx.topic_name("warmup")
    kafka_create_topic(ctx.bootstrap, warmup)
    warm_start = time.perf_counter()
    send(producer, warmup, value, ctx.sizes.warmup_records, float("inf"))
    if producer.flush(FLUSH_TIMEOUT_S) or errors:
        raise RecordsLost(f"kafka warm-up {config.label} ({errors[:1]})",
                          ctx.sizes.warmup_records, ctx.sizes.warmup_records - len(errors))
    planned = planned_records(ctx, time.perf_counter() - warm_start)
    topic = ctx.topic_name(config.key)
    kafka_create_topic(ctx.bootstrap, topic)
    start = time.perf_counter()
    sent = send(producer, topic, value, planned, start + 2 * ctx.sizes.max_measure_s)
    unflushed = producer.flush(FLUSH_TIMEOUT_S)
    elapsed_s = time.perf_counter() - start
    acked = sent - len(errors) - unflushed
    if acked != sent:
        raise RecordsLost(f"kafka {config.label}: acknowledged ({errors[:1]})", sent, acked)
    stored = kafka_end_offset(ctx.bootstrap, topic)
    if stored != sent:
        raise RecordsLost(f"kafka {config.label}: held by the broker", sent, stored)
    return ProduceRun(config, topic, sent, acked, elapsed_s, ctx.sizes.value_bytes,
                      ctx.log_bytes(topic))


# ---------------------------------------------------------------- eos

class _EosOutcomes:
    """What a run's sends came to: send_batch futures (bulk) and the failures the delivery
    callback reported (per record, delivery.report.only.error)."""

    def __init__(self):
        self.futures: list = []
        self.failures: list[BaseException] = []

    def on_delivery(self, _metadata, exception) -> None:
        if exception is not None:
            self.failures.append(exception)

    def acked(self, sent: int, path: str) -> tuple[int, list[BaseException]]:
        """Records acknowledged (once flush returned), and the first failures."""
        if path == "send":
            return sent - len(self.failures), self.failures[:3]
        acked = 0
        failures: list[BaseException] = []
        for future in self.futures:
            exc = future.exception(timeout=0)
            if exc is not None:
                failures.append(exc)
            else:
                acked += len(future.result(timeout=0))    # a SendBatchResult of the call
        return acked, failures[:3]


def _eos_send_each(producer, topic: str, value: bytes, count: int, deadline: float,
                   outcomes: _EosOutcomes) -> int:
    # produce() as on Kafka: no future; failures reach the delivery callback
    # (delivery.report.only.error), counted after the clock stops.
    produce, on_delivery = producer.produce, outcomes.on_delivery
    sent = 0
    while sent < count:
        chunk = min(BULK_RECORDS, count - sent)
        for _ in range(chunk):
            produce(topic, value, on_delivery=on_delivery)
        sent += chunk
        if time.perf_counter() > deadline:
            break
    return sent


def _eos_send_bulk(producer, topic: str, value: bytes, count: int, deadline: float,
                   outcomes: _EosOutcomes) -> int:
    values = [value] * BULK_RECORDS
    sent = 0
    while sent < count:
        chunk = min(BULK_RECORDS, count - sent)
        outcomes.futures.append(producer.send_batch(topic, values if chunk == BULK_RECORDS
                                                    else values[:chunk]))
        sent += chunk
        if time.perf_counter() > deadline:
            break
    return sent


def eos_produce(ctx: RunContext, config: ProduceConfig) -> ProduceRun:
    eos = eos_module("Producer")
    if config.path == "bulk" and not hasattr(eos.Producer, "send_batch"):
        raise NotAvailable("eos.Producer.send_batch does not exist yet")
    producer = eos.Producer(ctx.bootstrap, acks=config.acks, enable_idempotence=config.idempotent,
                            linger_ms=LINGER_MS, batch_size=BATCH_BYTES, delivery_report_only_error=True)
    try:
        send = _eos_send_each if config.path == "send" else _eos_send_bulk
        value = b"v" * ctx.sizes.value_bytes
        warmup = ctx.topic_name("warmup")
        eos_create_topic(ctx.bootstrap, warmup)
        outcomes = _EosOutcomes()
        warm_start = time.perf_counter()
        send(producer, warmup, value, ctx.sizes.warmup_records, float("inf"), outcomes)
        producer.flush(FLUSH_TIMEOUT_S)
        planned = planned_records(ctx, time.perf_counter() - warm_start)
        acked, failures = outcomes.acked(ctx.sizes.warmup_records, config.path)
        if acked != ctx.sizes.warmup_records:
            raise RecordsLost(f"eos warm-up {config.label} ({failures[:1]})",
                              ctx.sizes.warmup_records, acked)
        topic = ctx.topic_name(config.key)
        eos_create_topic(ctx.bootstrap, topic)
        outcomes = _EosOutcomes()
        start = time.perf_counter()
        sent = send(producer, topic, value, planned, start + 2 * ctx.sizes.max_measure_s,
                    outcomes)
        producer.flush(FLUSH_TIMEOUT_S)
        elapsed_s = time.perf_counter() - start
    finally:
        producer.close()
    acked, failures = outcomes.acked(sent, config.path)
    del outcomes
    if acked != sent:
        raise RecordsLost(f"eos {config.label}: acknowledged ({failures[:1]})", sent, acked)
    stored = eos_end_offset(ctx.bootstrap, topic)
    if stored != sent:
        raise RecordsLost(f"eos {config.label}: held by the broker", sent, stored)
    return ProduceRun(config, topic, sent, acked, elapsed_s, ctx.sizes.value_bytes,
                      ctx.log_bytes(topic))


RUNNERS = {"kafka": kafka_produce, "eos": eos_produce}


def measure_once(ctx: RunContext, config: ProduceConfig) -> ProduceRun:
    settle_writes()
    run = RUNNERS[ctx.system](ctx, config)
    ctx.progress(f"    {run.records_per_s:,.0f} records/s, {run.mb_per_s:.1f} MB/s "
                 f"({run.acked:,} acked in {run.elapsed_s:.2f} s)")
    return run


def median_run(runs: list[ProduceRun]) -> ProduceRun:
    return sorted(runs, key=lambda r: r.records_per_s)[(len(runs) - 1) // 2]


def measure(ctx: RunContext, config_key: str) -> ProduceRun:
    """The median of `repeats` runs of one configuration, or the one of this run."""
    cache = ctx.shared.setdefault("produce", {})
    if config_key not in cache:
        config = CONFIGS[config_key]
        ctx.progress(f"  produce {config.label}: {ctx.sizes.records:,} records"
                     f" x {ctx.sizes.repeats}")
        runs = [measure_once(ctx, config) for _ in range(ctx.sizes.repeats)]
        cache[config_key] = median_run(runs)
        ctx.shared.setdefault("produce_runs", {})[config_key] = runs
    return cache[config_key]


def runs_of(ctx: RunContext, run: ProduceRun) -> list[ProduceRun]:
    """Every run of the configuration whose median `run` is (just `run` if measured alone)."""
    return ctx.shared.get("produce_runs", {}).get(run.config.key, [run])


def throughput_metrics(ctx: RunContext, run: ProduceRun) -> list[Metric]:
    note = f"median run: {run.acked:,} records in {run.elapsed_s:.2f} s"
    if run.sent < ctx.sizes.records:
        note += (f" (fewer than {ctx.sizes.records:,}: sized from the warm-up rate to take "
                 f"about {ctx.sizes.max_measure_s:.0f} s)")
    runs = runs_of(ctx, run)
    key = run.config.key
    return [
        Metric(f"{key}.records_per_s", f"{run.config.label}: records/s",
               round(run.records_per_s), "records/s", True, note,
               samples=tuple(round(r.records_per_s) for r in runs)),
        Metric(f"{key}.mb_per_s", f"{run.config.label}: MB/s",
               round(run.mb_per_s, 2), "MB/s", True, "values only, 10^6 bytes",
               samples=tuple(round(r.mb_per_s, 2) for r in runs),
               restates=f"{key}.records_per_s"),
    ]


def run(ctx: RunContext) -> list[Metric]:
    require_client(ctx, "Producer")
    metrics: list[Metric] = []
    failures: list[Exception] = []
    for key in DEFAULT_CONFIGS:
        try:
            metrics += throughput_metrics(ctx, measure(ctx, key))
        except NotAvailable as exc:
            # One path missing (say, no bulk API yet) must not hide the others.
            ctx.progress(f"    not available: {exc}")
            failures.append(exc)
    if not metrics and failures:
        raise failures[0]
    return metrics


register(Workload("produce", "Produce throughput, one producer, 100-byte values",
                  {"kafka": run, "eos": run}))
