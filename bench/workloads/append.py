"""Append through one Python client (client-bound) against the raw disk.

This row measures the client more than the broker: one eos (or confluent-kafka) producer
cannot feed a broker at disk speed. The broker's own append speed is in append-storage
(in-process, no client) and append-broker (gRPC, two producers of pre-built batches).

Append MB/s is what the broker wrote into the topic's ``.log`` segment files during the
produce run (batch headers and record framing included, read from the data directory
afterwards) divided by that run's elapsed time; the yardstick is bench/disk.py on the same
filesystem, measured in the same harness run. The produce run is the acks=all idempotent
bulk one (or, if that path is missing, the per-record one), reused when produce already ran.

Both disk figures are reported: neither broker fsyncs each append by default, so the
buffered (page cache) speed is the ceiling that matters; the fsync figure is the device's.
"""
from __future__ import annotations

from bench.workloads import Metric, NotAvailable, RunContext, Workload, register
from bench.workloads import produce
from bench.workloads.clients import require_client

RUN_PREFERENCE = ("bulk-all-idem", "send-all-idem")


def run(ctx: RunContext) -> list[Metric]:
    require_client(ctx)
    disk = ctx.shared.get("disk")
    if disk is None:
        raise NotAvailable("the raw disk speed was not measured in this run")
    chosen = None
    for key in RUN_PREFERENCE:
        try:
            chosen = produce.measure(ctx, key)
            break
        except NotAvailable:
            continue
    if chosen is None:
        raise NotAvailable("no acks=all produce path to measure appends with")
    append_mb_s = chosen.log_bytes / chosen.elapsed_s / 1e6
    if chosen.log_bytes <= 0:
        raise NotAvailable(f"no .log files for topic {chosen.topic} under {ctx.data_dir}")
    ctx.progress(f"  append {append_mb_s:.1f} MB/s on disk ({chosen.log_bytes:,} log bytes "
                 f"in {chosen.elapsed_s:.2f} s); raw disk {disk.buffered_mb_s:.0f} MB/s "
                 f"buffered, {disk.fsync_mb_s:.0f} MB/s with fsync")
    note = (f"{chosen.config.label}; median produce run {chosen.log_bytes:,} .log bytes in "
            f"{chosen.elapsed_s:.2f} s")
    # The produce runs' own append speeds: the median run by records/s is not always the
    # median by .log bytes/s, but the bytes per record are the same in every run.
    samples = tuple(round(r.log_bytes / r.elapsed_s / 1e6, 2)
                    for r in produce.runs_of(ctx, chosen))
    return [
        Metric("append_client.mb_per_s", "append via one Python client (client-bound): MB/s "
               "on disk", round(append_mb_s, 2), "MB/s", True, note, samples=samples),
        Metric("append_client.vs_disk_buffered", "client-bound append / raw disk write (buffered)",
               round(append_mb_s / disk.buffered_mb_s, 4), "ratio", True,
               f"raw disk {disk.buffered_mb_s:.0f} MB/s, median of {len(disk.buffered_runs_mb_s)}",
               restates="append_client.mb_per_s"),
        Metric("append_client.vs_disk_fsync", "client-bound append / raw disk write (with fsync)",
               round(append_mb_s / disk.fsync_mb_s, 4), "ratio", True,
               f"raw disk {disk.fsync_mb_s:.0f} MB/s, median of {len(disk.fsync_runs_mb_s)}",
               restates="append_client.mb_per_s"),
    ]


register(Workload("append-client", "Append via one Python client (client-bound) against "
                  "the raw disk",
                  {"kafka": run, "eos": run}))
