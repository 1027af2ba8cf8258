"""Broker append over gRPC: two producer processes sending pre-built 1 MiB batches.

Theory of operation
-------------------
The broker's whole append path (gRPC receive, protobuf parse, Produce handler, log append,
response) without an eos client in front of it: `PRODUCER_PROCESSES` child processes each
build one ProduceRequest before the clock starts (one partition of its own, one batch of
about 1 MiB of 100-byte values, acks=1, no producer id), serialise it once, and send those
same bytes again and again as raw Produce RPCs (an identity request serialiser, so the
client does no per-request encoding), with `IN_FLIGHT` requests outstanding each. The
broker copies each request's batch before stamping offsets, so resending one buffer is
legal and each send appends new records.

The children warm up on a topic of their own, meet at a barrier, then each sends its share
of `Sizes.disk_mib` MiB (or stops after `Sizes.max_measure_s`). The clock runs from the
earliest child's first send to the latest child's last response (both children read the
same monotonic clock). Next to each run (before and after in turn, after an os.sync() and
an unmeasured write at the start) the buffered raw disk speed is measured again
(bench/disk.py `Alongside`) and the ratio is taken against the median of those, so both
sides of it saw the same machine load. MB/s counts the `.log` bytes the broker holds for
the topic afterwards; the run checks that each partition's end offset equals the records
the broker acknowledged to that child and that no request failed. Then both topics go, as
disk.py deletes its file: every run starts with the page cache in the same state, not
behind earlier runs' dirty pages (the kernel starts writing those back at
vm.dirty_background_ratio, which on 2 cores takes CPU from the broker).

Kafka: n/a. Sending pre-built batches needs a raw Kafka wire-protocol client; confluent-kafka
builds its own batches from per-record calls, so a Kafka figure here would measure
librdkafka's Python loop instead (the produce rows already do that).
"""
from __future__ import annotations

import multiprocessing
import statistics
import time
from dataclasses import dataclass

from bench.disk import Alongside
from bench.workloads import Metric, NotAvailable, RecordsLost, RunContext, Workload, register
from bench.workloads.append_storage import MIB, records_per_batch
from bench.workloads.clients import (eos_create_topic, eos_delete_topics,
                                     eos_end_offset_by_partition, require_client)

PRODUCER_PROCESSES = 2
IN_FLIGHT = 2                      # outstanding requests per producer process
BATCH_BYTES = MIB
WARMUP_REQUESTS = 20
BARRIER_TIMEOUT_S = 120.0
RPC_TIMEOUT_S = 60.0
PRODUCE_METHOD = "/eos.v1.Broker/Produce"


@dataclass(frozen=True)
class ChildResult:
    partition: int
    requests: int
    records: int
    request_bytes: int
    start: float             # time.monotonic() of the first measured send
    end: float               # time.monotonic() of the last response
    error: str = ""


def _send_all(call, request: bytes, records_each: int, count: int, deadline: float,
              in_flight: int) -> tuple[int, int, str]:
    """Send `request` up to `count` times with `in_flight` outstanding; (sent, records
    acknowledged, first error)."""
    from eos.v1 import broker_pb2  # noqa: F401  (response type loaded by the deserialiser)

    pending = []
    sent = acked = 0
    error = ""

    def settle(future) -> None:
        nonlocal acked, error
        try:
            response = future.result(timeout=RPC_TIMEOUT_S)
        except Exception as exc:  # a benchmark child reports, it does not crash
            error = error or f"{type(exc).__name__}: {exc}"
            return
        for result in response.partitions:
            if result.error_code != 0:
                error = error or f"Produce error {result.error_code}: {result.error_message}"
                return
        acked += records_each

    while sent < count and not error:
        if len(pending) >= in_flight:
            settle(pending.pop(0))
        pending.append(call.future(request, timeout=RPC_TIMEOUT_S))
        sent += 1
        if time.monotonic() > deadline:
            break
    for future in pending:
        settle(future)
    return sent, acked, error


def producer_process(bootstrap: str, warmup_topic: str, topic: str, partition: int,
                     value_bytes: int, total_bytes: int, max_seconds: float, in_flight: int,
                     barrier, results) -> None:
    """One child: build the request once, warm up, wait for the others, send, report."""
    try:
        from eos import net
        from eos.records.codec import encode_batch
        from eos.v1 import broker_pb2

        value = b"v" * value_bytes
        count = records_per_batch(value, BATCH_BYTES)
        batch = encode_batch([value] * count)

        def request_for(name: str) -> bytes:
            return broker_pb2.ProduceRequest(acks=1, timeout_ms=int(RPC_TIMEOUT_S * 1000),
                                             partitions=[broker_pb2.PartitionRecords(
                                                 topic=name, partition=partition,
                                                 records=batch)]).SerializeToString()

        channel = net.open_channel(net.parse_bootstrap(bootstrap)[0])
        try:
            call = channel.unary_unary(PRODUCE_METHOD, request_serializer=None,
                                       response_deserializer=broker_pb2.ProduceResponse.FromString)
            _, _, error = _send_all(call, request_for(warmup_topic), count, WARMUP_REQUESTS,
                                    float("inf"), in_flight)
            if error:
                raise RuntimeError(f"warm-up: {error}")
            request = request_for(topic)
            requests = max(1, total_bytes // len(batch))
            barrier.wait(BARRIER_TIMEOUT_S)
            start = time.monotonic()
            sent, acked, error = _send_all(call, request, count, requests,
                                           start + max_seconds, in_flight)
            end = time.monotonic()
        finally:
            channel.close()
        results.put(ChildResult(partition, sent, acked, sent * len(request), start, end, error))
    except BaseException as exc:  # report every failure to the parent, which waits on it
        try:
            barrier.abort()
        except Exception:
            pass
        results.put(ChildResult(partition, 0, 0, 0, 0.0, 0.0, f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True)
class BrokerRun:
    records: int
    log_bytes: int
    elapsed_s: float
    requests: int

    @property
    def mb_per_s(self) -> float:
        return self.log_bytes / self.elapsed_s / 1e6

    @property
    def records_per_s(self) -> float:
        return self.records / self.elapsed_s


def measure_once(ctx: RunContext) -> BrokerRun:
    warmup = ctx.topic_name("append-warmup")
    topic = ctx.topic_name("append-broker")
    eos_create_topic(ctx.bootstrap, warmup, partitions=PRODUCER_PROCESSES)
    eos_create_topic(ctx.bootstrap, topic, partitions=PRODUCER_PROCESSES)
    mp = multiprocessing.get_context("spawn")
    barrier = mp.Barrier(PRODUCER_PROCESSES)
    results = mp.Queue()
    share = ctx.sizes.disk_mib * MIB // PRODUCER_PROCESSES
    children = [mp.Process(target=producer_process, name=f"eos-bench-append-{p}",
                           args=(ctx.bootstrap, warmup, topic, p, ctx.sizes.value_bytes,
                                 share, ctx.sizes.max_measure_s, IN_FLIGHT, barrier,
                                 results), daemon=True)
                for p in range(PRODUCER_PROCESSES)]
    for child in children:
        child.start()
    outcomes: list[ChildResult] = []
    try:
        deadline = time.monotonic() + BARRIER_TIMEOUT_S + 2 * ctx.sizes.max_measure_s + 60
        while len(outcomes) < PRODUCER_PROCESSES:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("append-broker producer processes did not report in time")
            try:
                outcomes.append(results.get(timeout=min(remaining, 1.0)))
            except Exception:  # queue.Empty: check that the children are still alive
                dead = [c for c in children if c.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(f"producer process {dead[0].name} exited with code "
                                       f"{dead[0].exitcode} without reporting") from None
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
                child.join(timeout=5)
    errors = [o.error for o in outcomes if o.error]
    if errors:
        raise RuntimeError(f"append-broker producer failed: {errors[0]}")
    stored = eos_end_offset_by_partition(ctx.bootstrap, topic, PRODUCER_PROCESSES)
    for outcome in outcomes:
        held = stored.get(outcome.partition, 0)
        if held != outcome.records:
            raise RecordsLost(f"append-broker partition {outcome.partition}: held by the broker "
                              f"vs acknowledged", outcome.records, held)
    elapsed_s = max(o.end for o in outcomes) - min(o.start for o in outcomes)
    log_bytes = ctx.log_bytes(topic)
    # Like disk.py's file, the data goes once measured: each run starts with the page cache
    # in the same state instead of behind the previous runs' dirty pages.
    eos_delete_topics(ctx.bootstrap, [warmup, topic])
    return BrokerRun(sum(o.records for o in outcomes), log_bytes, elapsed_s,
                     sum(o.requests for o in outcomes))


def run_eos(ctx: RunContext) -> list[Metric]:
    require_client(ctx, "Admin")
    disk = ctx.shared.get("disk")
    if disk is None:
        raise NotAvailable("the raw disk speed was not measured in this run")
    runs: list[BrokerRun] = []
    alongside = Alongside(disk.directory, ctx.sizes.disk_mib)
    alongside.settle()
    for i in range(ctx.sizes.repeats):
        if i % 2 == 0:
            alongside.run()
        runs.append(measure_once(ctx))
        if i % 2 == 1:
            alongside.run()
        ctx.progress(f"  broker append over gRPC: {runs[-1].mb_per_s:,.0f} MB/s on disk, "
                     f"{runs[-1].records_per_s:,.0f} records/s ({runs[-1].requests:,} requests, "
                     f"{runs[-1].log_bytes:,} .log bytes in {runs[-1].elapsed_s:.2f} s)")
    median = sorted(runs, key=lambda r: r.mb_per_s)[(len(runs) - 1) // 2]
    note = (f"{PRODUCER_PROCESSES} processes x {IN_FLIGHT} in flight, raw Produce RPCs of one "
            f"pre-built ~1 MiB batch (acks=1), a partition each; median run {median.log_bytes:,} "
            f".log bytes in {median.elapsed_s:.2f} s; runs "
            + ", ".join(f"{r.mb_per_s:,.0f}" for r in runs) + " MB/s")
    return [
        Metric("append_broker.mb_per_s", "broker append over gRPC, 2 raw producers: MB/s on disk",
               round(median.mb_per_s, 1), "MB/s", True, note,
               samples=tuple(round(r.mb_per_s, 1) for r in runs)),
        Metric("append_broker.records_per_s", "broker append over gRPC, 2 raw producers: "
               "records/s", round(median.records_per_s), "records/s", True, "",
               samples=tuple(round(r.records_per_s) for r in runs),
               restates="append_broker.mb_per_s"),
        Metric("append_broker.vs_disk_buffered", "broker append over gRPC / raw disk write "
               "(buffered)", round(median.mb_per_s / alongside.buffered_mb_s, 4), "ratio", True,
               "raw disk measured next to each run: " + ", ".join(
                   f"{x:,.0f}" for x in alongside.buffered_runs_mb_s) + f" MB/s buffered, "
               f"median {alongside.buffered_mb_s:,.0f} (the harness's: "
               f"{disk.buffered_mb_s:,.0f})"),
        Metric("append_broker.vs_disk_fsync", "broker append over gRPC / raw disk write "
               "(with fsync)", round(median.mb_per_s / disk.fsync_mb_s, 4), "ratio", True,
               f"raw disk {disk.fsync_mb_s:,.0f} MB/s with fsync; the broker does not fsync "
               "each append (flush left to the OS, as Kafka's default)"),
    ]


def run_kafka(ctx: RunContext) -> list[Metric]:
    raise NotAvailable("raw produce of pre-built batches needs a Kafka wire-protocol client; "
                       "confluent-kafka builds its own batches, so its figure would measure "
                       "its Python loop (see the produce rows)")


register(Workload("append-broker", "Broker append over gRPC, 2 producer processes with "
                  "pre-built 1 MiB batches",
                  {"kafka": run_kafka, "eos": run_eos}))
