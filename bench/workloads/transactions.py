"""Transactions (issue 4 and 7): transactional produce, commit latency at a fixed rate,
the read-process-write copier, and end-to-end latency through read_committed.

Theory of operation
-------------------
Every figure here is the median of `Sizes.repeats` runs (`repeated`), each on fresh topics
with a fresh producer; every run's figure is kept as a sample for the report's min-max.

``transactions``: one transactional producer sends as fast as its bulk path allows
(Kafka: ``produce_batch``; eos: ``send_batch``; 1,000 records a call) and commits every
100 ms, for `Sizes.txn_duration_s`, with 100-byte and 1 KB values. Each commit_transaction()
call is timed; flat out, it mostly flushes the 100 ms backlog the client has buffered, so
these commit figures measure buffer depth as much as the commit (the report says so; the
fair commit figure is ``commit-latency``). Right after, the same loop runs idempotent
without transactions (acks=all, no commits), and the ratio transactional/idempotent of the
pair is the overhead of transactions (Kafka reports about 3% at 1 KB). Before each half,
outside the clock, as much memory as the run may write is touched and freed (`back_memory`:
on this VM the host takes freed memory back, and writing into it runs at the host's pace).
Counts: every run's records are read back read_committed and must all be there.

``commit-latency``: a fixed offered load, `Sizes.commit_rate_per_s` (10,000) records/s of
`Sizes.value_bytes` (100 B), one send call each, paced by the clock in 1 ms ticks, in
transactions of 100 ms; each commit_transaction() after a `Sizes.latency_warmup_s` warm-up
is timed, for `Sizes.commit_duration_s`: p50/p99. At that rate a transaction holds about
1,000 records (100 KB), so the figure is the commit protocol, not a backlog. Records a slow
commit held back are sent right after it (the load follows the clock). Every record is read
back read_committed.

``copier``: `Sizes.copier_records` records (100 bytes) are put in an input topic first
(idempotent, not timed). A consumer in a group (assign(), read_committed) and a
transactional producer then copy them to an output topic, committing every 100 ms or
`COPIER_COMMIT_RECORDS` records, the consumed offsets inside each transaction
(send_offsets_to_transaction with the consumer's group metadata). The clock runs from the
first poll to the last commit. Checks: the output holds exactly the input's records
(read_committed), and the group's committed offset is the input's end.

``e2e-latency``: records at `Sizes.e2e_rate_per_s` for a warm-up then
`Sizes.latency_duration_s`, produced transactionally (commit every 100 ms) and, second,
idempotent (acks=all, linger 0, no transactions), while a read_committed consumer in
another thread polls. Latency = the time of receipt - the time of send, both read from
`time.perf_counter()` in the one process the producer and the consumer share: the first 8
bytes of each value carry its send time. (The record's timestamp is whole milliseconds: a
latency under a millisecond read against it gains the send's position within its
millisecond, which the fixed pacing holds nearly constant over a run, so the figure moved
by up to a millisecond with the phase at which the run started.) A transactional record
waits for its commit. Every record must arrive.
"""
from __future__ import annotations

import struct
import threading
import time
from typing import Callable, NamedTuple

from bench.workloads import (Metric, RecordsLost, RunContext, Workload, back_memory, register,
                             repeated, settle_writes)
from bench.workloads.clients import (eos_create_topic, eos_module, kafka_create_topic,
                                     kafka_producer_config)
from bench.workloads.latency import _percentile

COMMIT_INTERVAL_S = 0.100
CHUNK_RECORDS = 1_000            # records per bulk call
VALUE_SIZES = (100, 1024)
# What a flat-out run writes a second, at most, by value size (eos's bulk path from a clean
# start: about 3.5M records/s at 100 B, 1.2M at 1 KB, with batch and record overheads): that
# much memory a second of the run is backed before it (`back_memory`), on both systems.
RUN_WRITE_BYTES_PER_S = {100: 500_000_000, 1024: 1_300_000_000}
COPIER_COMMIT_RECORDS = 10_000   # the copier commits at this many records even within 100 ms
POLL_RECORDS = 10_000
TIMEOUT_S = 60.0
ISOLATION = "read_committed"
# The consumer of e2e-latency: how long a fetch may wait at the broker for data (both sides).
E2E_FETCH_WAIT_MS = 10
# e2e-latency: each value starts with its send time (time.perf_counter(), a big-endian double).
SENT_AT = struct.Struct(">d")
# commit-latency's pacing: at most one wake-up a millisecond, sending what is due.
COMMIT_RATE_TICK_S = 0.001


# ---------------------------------------------------------------- shared helpers

def _count_committed(ctx: RunContext, topic: str, expected: int, partitions: int = 1) -> int:
    """Records of partitions 0..partitions-1 of `topic` a read_committed consumer sees
    (stops at expected or when nothing more arrives for a while)."""
    if ctx.system == "kafka":
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": ctx.bootstrap,
                             "group.id": ctx.topic_name("count"), "enable.auto.commit": False,
                             "isolation.level": ISOLATION})
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])

        def poll() -> int:
            return sum(1 for m in consumer.consume(num_messages=POLL_RECORDS, timeout=0.5)
                       if m.error() is None)
    else:
        eos = eos_module("Consumer")
        consumer = eos.Consumer(ctx.bootstrap, isolation_level=ISOLATION)
        tps = [eos.TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)

        def poll() -> int:
            return len(consumer.poll(timeout_ms=500, max_records=POLL_RECORDS))
    try:
        received, idle_since = 0, time.monotonic()
        deadline = time.monotonic() + ctx.sizes.consume_timeout_s
        while received < expected and time.monotonic() < deadline:
            got = poll()
            received += got
            if got:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > 5.0:
                break
        # A little longer: duplicates past `expected` must show up too.
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            received += poll()
        return received
    finally:
        consumer.close()


def _check_count(ctx: RunContext, what: str, topic: str, expected: int, partitions: int = 1) -> None:
    got = _count_committed(ctx, topic, expected, partitions)
    if got != expected:
        raise RecordsLost(f"{ctx.system} {what}: read_committed from {topic}", expected, got)


def _make_producer(ctx: RunContext, transactional_id: str | None, linger_ms: int = 5):
    """A started producer: transactional (init_transactions done) or idempotent."""
    if ctx.system == "kafka":
        from confluent_kafka import Producer

        extra = {"transactional.id": transactional_id} if transactional_id else {}
        producer = Producer(kafka_producer_config(ctx.bootstrap, acks="all", idempotent=True,
                                                  linger_ms=linger_ms, **extra))
        if transactional_id:
            producer.init_transactions(TIMEOUT_S)
        return producer
    eos = eos_module("Producer")
    extra = {"transactional_id": transactional_id} if transactional_id else {}
    producer = eos.Producer(ctx.bootstrap, acks="all", enable_idempotence=True,
                            linger_ms=linger_ms, **extra)
    if transactional_id:
        producer.init_transactions(TIMEOUT_S)
    return producer


def _create_topic(ctx: RunContext, prefix: str) -> str:
    topic = ctx.topic_name(prefix)
    (kafka_create_topic if ctx.system == "kafka" else eos_create_topic)(ctx.bootstrap, topic)
    return topic


class _Sender:
    """One bulk call of CHUNK_RECORDS on either client; remembers eos futures / Kafka
    errors so that the run can check that every record was acknowledged."""

    def __init__(self, ctx: RunContext, producer, topic: str, value: bytes):
        self.system, self.producer, self.topic = ctx.system, producer, topic
        self.errors: list = []
        self.futures: list = []
        self.sent = 0
        if self.system == "kafka":
            self.messages = [{"value": value} for _ in range(CHUNK_RECORDS)]
        else:
            self.values = [value] * CHUNK_RECORDS

    def chunk(self) -> None:
        if self.system == "kafka":
            messages = [dict(m) for m in self.messages]
            while messages:
                queued = self.producer.produce_batch(self.topic, messages)
                if queued == len(messages):
                    break
                messages = [m for m in messages if "_error" in m]
                for message in messages:
                    del message["_error"]
                self.producer.poll(0.001)
            self.producer.poll(0)
        else:
            self.futures.append(self.producer.send_batch(self.topic, self.values))
        self.sent += CHUNK_RECORDS

    def failures(self) -> list:
        if self.system == "kafka":
            return self.errors
        return [f.exception(timeout=TIMEOUT_S) for f in self.futures
                if f.exception(timeout=TIMEOUT_S) is not None][:3]


def _commit(ctx: RunContext, producer) -> float:
    """commit_transaction(); its duration in seconds."""
    started = time.perf_counter()
    if ctx.system == "kafka":
        producer.commit_transaction(TIMEOUT_S)
    else:
        producer.commit_transaction(TIMEOUT_S)
    return time.perf_counter() - started


def _close(ctx: RunContext, producer) -> None:
    if ctx.system == "kafka":
        producer.flush(TIMEOUT_S)
    else:
        producer.close()


# ---------------------------------------------------------------- transactions

def _txn_run(ctx: RunContext, value_bytes: int, transactional: bool) -> tuple[float, list[float], int]:
    """(records/s, commit durations in s, records) of one timed run on a fresh topic."""
    topic = _create_topic(ctx, "txn" if transactional else "txn-idem")
    producer = _make_producer(ctx, ctx.topic_name("bench-tx") if transactional else None)
    sender = _Sender(ctx, producer, topic, b"t" * value_bytes)
    commits: list[float] = []
    try:
        # Warm-up: one small transaction (or flushed chunk), outside the clock and the count.
        if transactional:
            producer.begin_transaction()
        sender.chunk()
        if transactional:
            _commit(ctx, producer)
        else:
            producer.flush(TIMEOUT_S)
        warm = sender.sent
        start = time.perf_counter()
        end = start + ctx.sizes.txn_duration_s
        while time.perf_counter() < end:
            if transactional:
                producer.begin_transaction()
            txn_end = time.perf_counter() + COMMIT_INTERVAL_S
            while time.perf_counter() < txn_end:
                sender.chunk()
            if transactional:
                commits.append(_commit(ctx, producer))
        producer.flush(TIMEOUT_S)
        elapsed_s = time.perf_counter() - start
    finally:
        _close(ctx, producer)
    failures = sender.failures()
    if failures:
        raise RecordsLost(f"{ctx.system} transactions run ({failures[:1]})", sender.sent, 0)
    measured = sender.sent - warm
    _check_count(ctx, "transactions", topic, sender.sent)
    return measured / elapsed_s, commits, measured


def _txn_pair(ctx: RunContext, value_bytes: int) -> list[Metric]:
    """One transactional run and, right after, one idempotent run of the same loop."""
    label = "1 KB" if value_bytes == 1024 else f"{value_bytes} B"
    ctx.progress(f"  transactional, commit every 100 ms, {label} values, "
                 f"{ctx.sizes.txn_duration_s:.1f} s")
    fresh_memory_bytes = int(RUN_WRITE_BYTES_PER_S[value_bytes] * ctx.sizes.txn_duration_s)
    back_memory(fresh_memory_bytes)     # repeated() wrote the page cache back already
    tx_rate, commits, tx_records = _txn_run(ctx, value_bytes, transactional=True)
    ctx.progress(f"  idempotent, no transactions, {label} values")
    settle_writes()                     # what repeated() did for the transactional half
    back_memory(fresh_memory_bytes)
    idem_rate, _, _ = _txn_run(ctx, value_bytes, transactional=False)
    values = sorted(commits)
    p50 = _percentile(values, 0.50) * 1000
    p99 = _percentile(values, 0.99) * 1000
    ratio = tx_rate / idem_rate
    ctx.progress(f"    transactional {tx_rate:,.0f} records/s, idempotent {idem_rate:,.0f}: "
                 f"ratio {ratio:.3f}; commit p50 {p50:.1f} ms, p99 {p99:.1f} ms "
                 f"({len(values)} commits)")
    key = f"txn.{value_bytes}b"
    note = (f"{tx_records:,} records in {len(values)} transactions, acks=all, linger 5 ms, "
            f"bulk path {CHUNK_RECORDS:,} a call")
    flat_out = f"commit_transaction {label}, flat out (includes flushing the backlog)"
    return [
        Metric(f"{key}.records_per_s", f"transactional {label}: records/s",
               round(tx_rate), "records/s", True, note),
        Metric(f"{key}.mb_per_s", f"transactional {label}: MB/s",
               round(tx_rate * value_bytes / 1e6, 2), "MB/s", True, "values only",
               restates=f"{key}.records_per_s"),
        Metric(f"{key}.commit_p50_ms", f"{flat_out}: p50", round(p50, 2), "ms", False,
               "commit_transaction of a producer sending flat out: flushes the 100 ms "
               "backlog, then EndTxn (buffer depth as much as the commit; the fixed-rate "
               "figure is commit-latency)"),
        Metric(f"{key}.commit_p99_ms", f"{flat_out}: p99", round(p99, 2), "ms", False, ""),
        Metric(f"{key}.idem_records_per_s", f"idempotent {label}, no txn: records/s",
               round(idem_rate), "records/s", True, "same loop, no commits"),
        Metric(f"{key}.txn_over_idem", f"transactional / idempotent {label}",
               round(ratio, 4), "ratio", True, f"{(1 - ratio) * 100:.1f}% overhead "
               "(the pair ran back to back; median over the pairs)"),
    ]


def run_transactions(ctx: RunContext) -> list[Metric]:
    if ctx.system == "eos":
        eos_module("Producer", "Consumer")
    metrics: list[Metric] = []
    for value_bytes in VALUE_SIZES:
        metrics += repeated(ctx, lambda: _txn_pair(ctx, value_bytes))
    return metrics


# ---------------------------------------------------------------- commit latency at a fixed rate

def _commit_rate_run(ctx: RunContext) -> list[Metric]:
    """One run: `Sizes.commit_rate_per_s` records/s offered one send call each, a
    transaction every 100 ms; the commit_transaction durations after the warm-up."""
    rate = ctx.sizes.commit_rate_per_s
    value = b"k" * ctx.sizes.value_bytes
    topic = _create_topic(ctx, "commit-rate")
    producer = _make_producer(ctx, ctx.topic_name("bench-commit-rate"))
    errors: list = []
    futures: list = []
    if ctx.system == "kafka":
        def on_delivery(err, _msg) -> None:
            if err is not None:
                errors.append(err)

        def send() -> None:
            producer.produce(topic, value, on_delivery=on_delivery)
            producer.poll(0)

        def wait(seconds: float) -> None:
            producer.poll(seconds)
    else:
        def send() -> None:
            futures.append(producer.send(topic, value=value))

        wait = time.sleep
    warmup_s, measure_s = ctx.sizes.latency_warmup_s, ctx.sizes.commit_duration_s
    commits: list[float] = []
    sent = 0
    try:
        start = time.perf_counter()
        end = start + warmup_s + measure_s
        while (txn_start := time.perf_counter()) < end:
            producer.begin_transaction()
            txn_end = txn_start + COMMIT_INTERVAL_S
            while (now := time.perf_counter()) < txn_end:
                # The offered load follows the clock: what a slow commit held back is sent
                # at once afterwards, as a source with a fixed rate would deliver it.
                due = int((now - start) * rate) + 1
                while sent < due:
                    send()
                    sent += 1
                next_due = min(start + sent / rate, txn_end)
                wait(max(next_due - time.perf_counter(), COMMIT_RATE_TICK_S))
            began = time.perf_counter()
            producer.commit_transaction(TIMEOUT_S)
            if began - start >= warmup_s:
                commits.append(time.perf_counter() - began)
        producer.flush(TIMEOUT_S)
        achieved = sent / (time.perf_counter() - start)
    finally:
        _close(ctx, producer)
    errors += [f.exception(timeout=TIMEOUT_S) for f in futures
               if f.exception(timeout=TIMEOUT_S) is not None]
    if errors:
        raise RecordsLost(f"{ctx.system} commit-latency run ({errors[:1]})", sent,
                          sent - len(errors))
    _check_count(ctx, "commit-latency", topic, sent)
    values = sorted(commits)
    p50 = _percentile(values, 0.50) * 1000
    p99 = _percentile(values, 0.99) * 1000
    ctx.progress(f"    commit p50 {p50:.2f} ms, p99 {p99:.2f} ms over {len(values)} commits; "
                 f"{achieved:,.0f} records/s offered")
    what = f"commit_transaction at {rate:,} records/s of {ctx.sizes.value_bytes} B, every 100 ms"
    note = (f"{len(values)} commits after a {warmup_s:g} s warm-up (p99 of so few is about "
            f"their maximum); {sent:,} records, one send call each, at {achieved:,.0f}/s "
            f"(target {rate:,}/s); acks=all, linger 5 ms; every record read back "
            f"read_committed")
    return [
        Metric("commit_latency.p50_ms", f"{what}: p50", round(p50, 3), "ms", False, note),
        Metric("commit_latency.p99_ms", f"{what}: p99", round(p99, 3), "ms", False, note),
    ]


def run_commit_latency(ctx: RunContext) -> list[Metric]:
    if ctx.system == "eos":
        eos_module("Producer", "Consumer")
    ctx.progress(f"  {ctx.sizes.commit_rate_per_s:,} records/s, commit every 100 ms, "
                 f"{ctx.sizes.latency_warmup_s:g} s warm-up + {ctx.sizes.commit_duration_s:g} s")
    return repeated(ctx, lambda: _commit_rate_run(ctx))


# ---------------------------------------------------------------- copier

def _fill(ctx: RunContext, topic: str, count: int, value: bytes) -> None:
    producer = _make_producer(ctx, None)
    sender = _Sender(ctx, producer, topic, value)
    try:
        while sender.sent < count:
            sender.chunk()
        producer.flush(TIMEOUT_S)
    finally:
        _close(ctx, producer)
    failures = sender.failures()
    if failures or sender.sent != count:
        raise RecordsLost(f"{ctx.system} copier input ({failures[:1]})", count, sender.sent)


def run_copier(ctx: RunContext) -> list[Metric]:
    if ctx.system == "eos":
        eos_module("Producer", "Consumer")
    return repeated(ctx, lambda: _copier_once(ctx))


class _CopierEnds(NamedTuple):
    """The copier's consumer and what its loop does with it on one system."""
    consumer: object
    poll: Callable[[], list]          # records read, each batch also sent to the sink
    next_offset: Callable[[list], int]  # the input offset after a polled batch
    commit: Callable[[int], None]     # the consumed offset into the transaction, then commit
    committed: Callable[[], int]      # the group's committed offset of the input
    failures: Callable[[], list]      # errors of reads and sends, once the producer closed


def _copier_ends(ctx: RunContext, producer, source: str, sink: str, group: str) -> _CopierEnds:
    """The read_committed consumer of `source` (partition 0, from the start, in `group`)
    and the loop's steps on Kafka's or eos's clients."""
    if ctx.system == "kafka":
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": ctx.bootstrap, "group.id": group,
                             "enable.auto.commit": False, "isolation.level": ISOLATION,
                             "auto.offset.reset": "earliest"})
        consumer.assign([TopicPartition(source, 0, OFFSET_BEGINNING)])
        errors: list = []

        def poll() -> list:
            batch = []
            for m in consumer.consume(num_messages=POLL_RECORDS, timeout=0.1):
                if m.error() is not None:
                    errors.append(m.error())
                else:
                    batch.append(m)
            if batch:
                producer.produce_batch(sink, [{"key": m.key(), "value": m.value()}
                                              for m in batch])
                producer.poll(0)
            return batch

        def commit(offset: int) -> None:
            producer.send_offsets_to_transaction([TopicPartition(source, 0, offset)],
                                                 consumer.consumer_group_metadata(), TIMEOUT_S)
            producer.commit_transaction(TIMEOUT_S)

        return _CopierEnds(
            consumer, poll, lambda batch: batch[-1].offset() + 1, commit,
            lambda: consumer.committed([TopicPartition(source, 0)], timeout=10)[0].offset,
            lambda: errors)
    eos = eos_module("Producer", "Consumer")
    consumer = eos.Consumer(ctx.bootstrap, group_id=group, isolation_level=ISOLATION,
                            auto_offset_reset="earliest")
    tp = eos.TopicPartition(source, 0)
    consumer.assign([tp])
    futures: list = []

    def poll() -> list:
        batch = consumer.poll(timeout_ms=100, max_records=POLL_RECORDS)
        if batch:
            futures.append(producer.send_batch(sink, [r.value for r in batch],
                                               keys=[r.key for r in batch]))
        return batch

    def commit(offset: int) -> None:
        producer.send_offsets_to_transaction({tp: offset}, consumer.group_metadata(), TIMEOUT_S)
        producer.commit_transaction(TIMEOUT_S)

    def failures() -> list:
        return [f.exception(timeout=TIMEOUT_S) for f in futures
                if f.exception(timeout=TIMEOUT_S) is not None]

    return _CopierEnds(consumer, poll, lambda batch: batch[-1].offset + 1, commit,
                       lambda: consumer.committed([tp])[tp], failures)


def _copier_once(ctx: RunContext) -> list[Metric]:
    count = (ctx.sizes.copier_records // CHUNK_RECORDS) * CHUNK_RECORDS
    source, sink = _create_topic(ctx, "copier-in"), _create_topic(ctx, "copier-out")
    ctx.progress(f"  filling {source} with {count:,} records")
    _fill(ctx, source, count, b"c" * 100)
    ctx.progress(f"  copying {count:,} records, commit every 100 ms or "
                 f"{COPIER_COMMIT_RECORDS:,} records, offsets in the transaction")
    producer = _make_producer(ctx, ctx.topic_name("bench-copier"))
    ends = _copier_ends(ctx, producer, source, sink, ctx.topic_name("copier-group"))
    commits = 0
    copied = 0
    try:
        start = time.perf_counter()
        deadline = start + ctx.sizes.consume_timeout_s
        while copied < count and time.perf_counter() < deadline:
            producer.begin_transaction()
            in_txn, offset = 0, None
            txn_end = time.perf_counter() + COMMIT_INTERVAL_S
            while (time.perf_counter() < txn_end and in_txn < COPIER_COMMIT_RECORDS
                   and copied + in_txn < count):
                batch = ends.poll()
                if batch:
                    in_txn += len(batch)
                    offset = ends.next_offset(batch)
            if offset is None:
                producer.abort_transaction(TIMEOUT_S)
                continue
            ends.commit(offset)
            commits += 1
            copied += in_txn
        elapsed_s = time.perf_counter() - start
        group_offset = ends.committed()
    finally:
        _close(ctx, producer)
        ends.consumer.close()
    errors = ends.failures()
    if errors or copied != count:
        raise RecordsLost(f"{ctx.system} copier ({errors[:1]})", count, copied)
    if group_offset != count:
        raise RecordsLost(f"{ctx.system} copier: group offset {group_offset} != input end",
                          count, group_offset or 0)
    _check_count(ctx, "copier output", sink, count)
    rate = count / elapsed_s
    ctx.progress(f"    {rate:,.0f} records/s ({count:,} in {elapsed_s:.2f} s, {commits} "
                 f"transactions); output == input, group offset == {count:,}")
    note = (f"{count:,} records of 100 B in {elapsed_s:.2f} s, {commits} transactions; "
            f"output count == input count checked read_committed")
    return [Metric("copier.records_per_s", "copier read-process-write: records/s",
                   round(rate), "records/s", True, note)]


# ---------------------------------------------------------------- end-to-end latency

def _sent_at(value: bytes) -> float:
    return SENT_AT.unpack_from(value)[0]


def _e2e_consumer(ctx: RunContext, topic: str):
    """(consumer, poll) of e2e-latency's read_committed reader of partition 0 from offset 0:
    poll() returns [(record index, latency in s)] of what has arrived, [] after a short wait."""
    if ctx.system == "kafka":
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": ctx.bootstrap,
                             "group.id": ctx.topic_name("e2e"),
                             "enable.auto.commit": False, "isolation.level": ISOLATION,
                             "fetch.wait.max.ms": E2E_FETCH_WAIT_MS})
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

        def poll():
            # consume(n, timeout) waits for n messages or the timeout, whichever comes
            # first: that wait would be measured. poll() returns the first message at
            # once; consume(timeout=0) then takes what else is ready.
            first = consumer.poll(0.05)
            if first is None:
                return []
            batch = [first] + consumer.consume(num_messages=POLL_RECORDS, timeout=0)
            received_at = time.perf_counter()   # after the wait: the time of receipt
            return [(int(m.key()), received_at - _sent_at(m.value()))
                    for m in batch if m.error() is None]
        return consumer, poll
    eos = eos_module("Consumer")
    consumer = eos.Consumer(ctx.bootstrap, isolation_level=ISOLATION,
                            fetch_max_wait_ms=E2E_FETCH_WAIT_MS)
    tp = eos.TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)

    def poll():
        batch = consumer.poll(timeout_ms=50, max_records=POLL_RECORDS)
        received_at = time.perf_counter()
        return [(int(r.key), received_at - _sent_at(r.value)) for r in batch]
    return consumer, poll


def _e2e_run(ctx: RunContext, transactional: bool) -> tuple[list[float], float, int]:
    """(latencies in s of the measured records, achieved rate, records) of one run."""
    rate = ctx.sizes.e2e_rate_per_s
    warm = round(rate * ctx.sizes.latency_warmup_s)
    total = warm + round(rate * ctx.sizes.latency_duration_s)
    topic = _create_topic(ctx, "e2e-tx" if transactional else "e2e-idem")
    producer = _make_producer(ctx, ctx.topic_name("bench-e2e") if transactional else None,
                              linger_ms=0 if not transactional else 5)
    latencies: list[float] = []
    received = 0
    stop = threading.Event()
    ready = threading.Event()
    consumer_errors: list[BaseException] = []

    def consume() -> None:
        nonlocal received
        try:
            consumer, poll = _e2e_consumer(ctx, topic)
            try:
                poll()
                ready.set()
                while received < total and not stop.is_set():
                    for index, latency_s in poll():
                        received += 1
                        if index >= warm:
                            latencies.append(latency_s)
            finally:
                consumer.close()
        except BaseException as exc:  # reported by the main thread
            consumer_errors.append(exc)
            ready.set()

    thread = threading.Thread(target=consume, name="e2e-consumer", daemon=True)
    thread.start()
    ready.wait(TIMEOUT_S)
    filler = b"e" * (ctx.sizes.value_bytes - SENT_AT.size)
    futures: list = []
    try:
        if transactional:
            producer.begin_transaction()
        start = time.perf_counter()
        txn_start = start
        for index in range(total):
            delay_s = start + index / rate - time.perf_counter()
            if delay_s > 0:
                if ctx.system == "kafka":
                    producer.poll(delay_s)
                else:
                    time.sleep(delay_s)
            key = str(index).encode()
            value = SENT_AT.pack(time.perf_counter()) + filler
            if ctx.system == "kafka":
                producer.produce(topic, value, key=key)
                producer.poll(0)
            else:
                futures.append(producer.send(topic, value=value, key=key))
            if transactional and time.perf_counter() - txn_start >= COMMIT_INTERVAL_S:
                _commit(ctx, producer)
                producer.begin_transaction()
                txn_start = time.perf_counter()
        if transactional:
            _commit(ctx, producer)
        producer.flush(TIMEOUT_S)
        achieved = total / (time.perf_counter() - start)
    finally:
        _close(ctx, producer)
        thread.join(ctx.sizes.consume_timeout_s)
        stop.set()
        thread.join(5)
    if consumer_errors:
        raise consumer_errors[0]
    failed = [f for f in futures if f.exception(timeout=TIMEOUT_S) is not None]
    if failed or received != total:
        raise RecordsLost(f"{ctx.system} end-to-end run ({failed[:1]})", total, received)
    return latencies, achieved, total


def run_e2e(ctx: RunContext) -> list[Metric]:
    if ctx.system == "eos":
        eos_module("Producer", "Consumer")
    metrics: list[Metric] = []
    for transactional in (True, False):
        what = ("transactional, commit every 100 ms" if transactional
                else "idempotent acks=all, linger 0")
        ctx.progress(f"  end-to-end {what} at {ctx.sizes.e2e_rate_per_s:,}/s for "
                     f"{ctx.sizes.latency_duration_s:.1f} s, read_committed")
        metrics += repeated(ctx, lambda: _e2e_metrics(ctx, transactional))
    return metrics


def _e2e_metrics(ctx: RunContext, transactional: bool) -> list[Metric]:
    mode = "txn" if transactional else "idem"
    what = ("transactional, commit every 100 ms" if transactional
            else "idempotent acks=all, linger 0")
    latencies, achieved, total = _e2e_run(ctx, transactional)
    values = sorted(latencies)
    p50 = _percentile(values, 0.50) * 1000
    p99 = _percentile(values, 0.99) * 1000
    ctx.progress(f"    p50 {p50:.3f} ms, p99 {p99:.3f} ms over {len(values):,} records "
                 f"at {achieved:,.0f}/s")
    note = (f"{what}; {len(values):,} records at {achieved:,.0f}/s; receipt - send "
            f"(perf_counter, one process); all {total:,} received")
    return [
        Metric(f"e2e.{mode}.p50_ms", f"end-to-end {mode}: p50", round(p50, 3), "ms",
               False, note),
        Metric(f"e2e.{mode}.p99_ms", f"end-to-end {mode}: p99", round(p99, 3), "ms",
               False, note),
    ]


register(Workload("transactions", "Transactional produce, commit every 100 ms, vs idempotent",
                  {"kafka": run_transactions, "eos": run_transactions}))
register(Workload("commit-latency", "commit_transaction latency at a fixed rate: 10,000 "
                  "records/s of 100 B, commit every 100 ms",
                  {"kafka": run_commit_latency, "eos": run_commit_latency}))
register(Workload("copier", "Transactional copier: read_committed consume -> produce, offsets "
                  "in the transaction", {"kafka": run_copier, "eos": run_copier}))
register(Workload("e2e-latency", "End-to-end latency produce -> read_committed consume",
                  {"kafka": run_e2e, "eos": run_e2e}))
