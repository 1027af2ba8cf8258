"""Short transactions (issue 15): transactions of 1 to 5 records committed back to back by
1 and by 4 transactional producers, each in its own process.

Theory of operation
-------------------
A pipeline that commits often pays the transaction protocol's round trips on every commit;
this workload measures nothing else. Each producer process (spawned, so eos's producers do
not share one interpreter's lock, and Kafka's get the same treatment) builds a
transactional producer (acks=all, linger 0), runs init_transactions, reports ready and
waits for the common start. Then, for `Sizes.short_txn_duration_s`, it loops: begin, send
1 to 5 records of `Sizes.value_bytes` (the count drawn from a seeded RNG, so both systems
get the same sequence) to its own partition, commit_transaction. Each commit_transaction()
call is timed. The parent adds up transactions and records, computes transactions/s over
the common window and the p50/p99 of every commit, and reads the topic back read_committed:
every record sent must be there (else RecordsLost); a producer that fails fails the run.

Figures per producer count: transactions/s (all producers together), commit p50 and p99.
"""
from __future__ import annotations

import multiprocessing
import queue
import random
import time

from bench.workloads import Metric, RunContext, Workload, register, repeated
from bench.workloads.clients import eos_create_topic, eos_module, kafka_create_topic, kafka_producer_config
from bench.workloads.latency import _percentile
from bench.workloads.transactions import _check_count

PRODUCER_COUNTS = (1, 4)
RECORDS_PER_TXN = (1, 5)          # inclusive range
READY_TIMEOUT_S = 120.0
TIMEOUT_S = 60.0


def _producer_process(system: str, bootstrap: str, topic: str, partition: int, transactional_id: str,
                      value_bytes: int, duration_s: float, seed: int, ready, go, results) -> None:
    """One producer: the loop described in the module doc; puts (txns, records, commit
    durations in s, error or None) on `results`."""
    try:
        value = b"s" * value_bytes
        if system == "kafka":
            from confluent_kafka import Producer

            producer = Producer(kafka_producer_config(bootstrap, acks="all", idempotent=True, linger_ms=0,
                                                      **{"transactional.id": transactional_id}))
            errors: list = []

            def on_delivery(err, _msg) -> None:
                if err is not None:
                    errors.append(str(err))

            def send() -> None:
                producer.produce(topic, value, partition=partition, on_delivery=on_delivery)

            def close() -> None:
                producer.flush(TIMEOUT_S)
        else:
            import eos

            producer = eos.Producer(bootstrap, acks="all", enable_idempotence=True, linger_ms=0,
                                    transactional_id=transactional_id)
            errors = []
            futures: list = []

            def send() -> None:
                futures.append(producer.send(topic, value=value, partition=partition))

            def close() -> None:
                errors.extend(str(f.exception(timeout=TIMEOUT_S)) for f in futures
                              if f.exception(timeout=TIMEOUT_S) is not None)
                producer.close()
        producer.init_transactions(TIMEOUT_S)
        rng = random.Random(seed)
        ready.put(partition)
        if not go.wait(READY_TIMEOUT_S):
            raise RuntimeError("the start signal never came")
        commits: list[float] = []
        txns = records = 0
        end = time.perf_counter() + duration_s
        while time.perf_counter() < end:
            producer.begin_transaction()
            for _ in range(rng.randint(*RECORDS_PER_TXN)):
                send()
                records += 1
            began = time.perf_counter()
            producer.commit_transaction(TIMEOUT_S)
            commits.append(time.perf_counter() - began)
            txns += 1
        close()
        results.put((txns, records, commits, "; ".join(errors[:3]) or None))
    except BaseException as exc:  # reported to the parent, which fails the run
        results.put((0, 0, [], f"{type(exc).__name__}: {exc}"))


def _run(ctx: RunContext, producers: int) -> list[Metric]:
    topic = ctx.topic_name(f"short-txn-{producers}")
    (kafka_create_topic if ctx.system == "kafka" else eos_create_topic)(ctx.bootstrap, topic, partitions=producers)
    spawn = multiprocessing.get_context("spawn")
    ready, results, go = spawn.Queue(), spawn.Queue(), spawn.Event()
    duration_s = ctx.sizes.short_txn_duration_s
    processes = [spawn.Process(target=_producer_process, daemon=True, args=(
        ctx.system, ctx.bootstrap, topic, index, ctx.topic_name(f"short-txn-{producers}-{index}"),
        ctx.sizes.value_bytes, duration_s, 1000 + index, ready, go, results)) for index in range(producers)]
    for process in processes:
        process.start()
    outcomes = []
    try:
        for _ in processes:
            try:
                ready.get(timeout=READY_TIMEOUT_S)
            except queue.Empty:
                # A producer that failed to start put its error on `results` instead.
                raise RuntimeError(f"a producer did not start: {results.get(timeout=1) if not results.empty() else '?'}")
        go.set()
        for _ in processes:
            outcomes.append(results.get(timeout=duration_s + READY_TIMEOUT_S))
    finally:
        for process in processes:
            process.join(TIMEOUT_S)
            if process.is_alive():
                process.kill()
    failures = [error for *_, error in outcomes if error]
    txns = sum(o[0] for o in outcomes)
    records = sum(o[1] for o in outcomes)
    if failures:
        raise RuntimeError(f"{ctx.system} short transactions, {producers} producers: {failures[0]}")
    _check_count(ctx, f"short transactions, {producers} producers", topic, records, partitions=producers)
    commits = sorted(c for o in outcomes for c in o[2])
    rate = txns / duration_s
    p50, p99 = _percentile(commits, 0.50) * 1000, _percentile(commits, 0.99) * 1000
    ctx.progress(f"    {producers} producer(s): {rate:,.0f} transactions/s, commit p50 {p50:.2f} ms, "
                 f"p99 {p99:.2f} ms ({txns:,} transactions, {records:,} records)")
    what = f"{producers} producer{'s' if producers > 1 else ''}"
    note = (f"{what} in own processes, transactions of {RECORDS_PER_TXN[0]}-{RECORDS_PER_TXN[1]} records of "
            f"{ctx.sizes.value_bytes} B back to back for {duration_s:g} s, acks=all, linger 0: {txns:,} "
            f"transactions, {records:,} records, all read back read_committed")
    key = f"short_txn.{producers}"
    return [
        Metric(f"{key}.txns_per_s", f"{what}: transactions/s", round(rate, 1), "transactions/s", True, note),
        Metric(f"{key}.commit_p50_ms", f"{what}: commit p50", round(p50, 3), "ms", False, note),
        Metric(f"{key}.commit_p99_ms", f"{what}: commit p99", round(p99, 3), "ms", False, note),
    ]


def run_short_txn(ctx: RunContext) -> list[Metric]:
    if ctx.system == "eos":
        eos_module("Producer", "Consumer")
    metrics: list[Metric] = []
    for producers in PRODUCER_COUNTS:
        ctx.progress(f"  {producers} producer(s), {ctx.sizes.short_txn_duration_s:g} s")
        metrics += repeated(ctx, lambda: _run(ctx, producers))
    return metrics


register(Workload("short-txn", "Short transactions (1-5 records) back to back, 1 and 4 producers",
                  {"kafka": run_short_txn, "eos": run_short_txn}))
