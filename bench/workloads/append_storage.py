"""Storage append: eos's partition log appending pre-built batches in this process.

Theory of operation
-------------------
Issue 2 asks for the broker's append speed against the raw sequential write speed of the
same disk. A Python client in front of the broker measures mostly the client (see
append-client), so this workload takes the client and the network away: it opens a
`broker.storage.Log` (the broker's own partition log, default topic config) in a temp
directory on the filesystem bench/disk.py measured, and calls `Log.append_as_leader` with
batches built before the clock starts, as the broker's Produce handler does for each
partition of a request (parse and CRC-check the headers, producer-state check, copy and
stamp offsets, one write, index entries, publish).

Each variant appends `Sizes.disk_mib` MiB (the size the disk test wrote) in batches of one
size, 100-byte values, to a fresh log, `Sizes.repeats` times:
- plain batches (no producer id) and idempotent ones (one producer id, epoch 0, sequences
  0, n, 2n, ... so every batch passes the producer-state check and none is a duplicate);
- 1 MiB batches (under the default max.message.bytes) and 16 KiB ones (Kafka's default
  batch.size, the common case), the latter showing the per-batch cost.
Every batch is a distinct bytes object, so neither variant reads one cached buffer.

Two clocks in one run: appends alone (the log leaves flushing to the OS, as eos's and
Kafka's defaults do, so the ceiling is the buffered disk figure), and appends plus one
`Log.flush()` (fsync) at the end, against the disk's fsync figure. The run checks that the
log ends at the number of records appended and holds exactly the bytes appended.

The machine is shared, and its load can change several-fold within a minute, so the
buffered yardstick is measured again next to each append run (bench/disk.py `Alongside`:
the same MiB in 1 MiB writes, file removed; before and after the append run in turn; the
series starts after an os.sync() and an unmeasured write, so neither side meets earlier
dirty pages) and the ratio is median over median of these interleaved runs; the fsync
ratio uses the harness's fsync figure (a synced run writes the device for real, too costly
to repeat each time). Each variant runs
`Sizes.repeats` + 2 times.

eos only: Kafka's log lives in its JVM, so it has no in-process counterpart here.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass

from bench.disk import Alongside
from bench.workloads import Metric, NotAvailable, RecordsLost, RunContext, Workload, register

MIB = 1 << 20
IDEMPOTENT_PRODUCER_ID = 4242
IDEMPOTENT_PRODUCER_EPOCH = 0


@dataclass(frozen=True)
class StorageVariant:
    key: str
    label: str
    batch_bytes: int        # each batch is at most this many bytes
    idempotent: bool


VARIANTS = (
    StorageVariant("1mib", "1 MiB batches", MIB, False),
    StorageVariant("1mib-idem", "1 MiB idempotent batches", MIB, True),
    StorageVariant("16kib", "16 KiB batches", 16 * 1024, False),
    StorageVariant("16kib-idem", "16 KiB idempotent batches", 16 * 1024, True),
)


@dataclass(frozen=True)
class StorageRun:
    records: int
    log_bytes: int
    batches: int
    append_s: float          # all appends, no flush
    append_fsync_s: float    # all appends plus one final Log.flush()

    @property
    def mb_per_s(self) -> float:
        return self.log_bytes / self.append_s / 1e6

    @property
    def fsync_mb_per_s(self) -> float:
        return self.log_bytes / self.append_fsync_s / 1e6


def records_per_batch(value: bytes, batch_bytes: int) -> int:
    """The most records of `value` that one uncompressed v2 batch of <= batch_bytes holds."""
    from eos.records.codec import encode_batch

    per_record = len(encode_batch([value] * 2)) - len(encode_batch([value]))
    count = max(1, (batch_bytes - 61) // per_record)
    while count > 1 and len(encode_batch([value] * count)) > batch_bytes:
        count -= 1
    return count


def build_batches(value: bytes, variant: StorageVariant, total_bytes: int) -> tuple[list[bytes], int]:
    """Distinct batches adding up to about `total_bytes`; (batches, records per batch)."""
    from eos.records.codec import BatchBuilder

    count = records_per_batch(value, variant.batch_bytes)
    builder = BatchBuilder()
    builder.append_many([value] * count)
    first = builder.build()
    batch_count = max(1, total_bytes // len(first))
    if variant.idempotent:
        # Sequences 0, count, 2*count, ...: each batch is the next in order for the producer.
        batches = [builder.build(producer_id=IDEMPOTENT_PRODUCER_ID,
                                 producer_epoch=IDEMPOTENT_PRODUCER_EPOCH,
                                 base_sequence=i * count) for i in range(batch_count)]
    else:
        batches = [bytes(bytearray(first)) for _ in range(batch_count)]
    return batches, count


def append_once(directory: str, batches: list[bytes], records_per_batch_: int) -> StorageRun:
    from broker.storage.log import Log
    from eos.config import TopicConfig

    base = tempfile.mkdtemp(prefix="eos-bench-storage-", dir=directory)
    try:
        log = Log.open(os.path.join(base, "bench-storage-0"), TopicConfig(),
                       now_ms=int(time.time() * 1000))
        try:
            append = log.append_as_leader
            clock = time.time
            start = time.perf_counter()
            for batch in batches:
                append(batch, int(clock() * 1000))
            appended = time.perf_counter()
            log.flush()
            flushed = time.perf_counter()
            expected_records = len(batches) * records_per_batch_
            expected_bytes = sum(len(b) for b in batches)
            if log.log_end_offset != expected_records:
                raise RecordsLost("storage append: log end offset", expected_records,
                                  log.log_end_offset)
            if log.size_bytes != expected_bytes:
                raise RecordsLost(f"storage append: log holds {log.size_bytes:,} bytes, "
                                  f"{expected_bytes:,} appended; records",
                                  expected_records, log.log_end_offset)
        finally:
            log.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return StorageRun(expected_records, expected_bytes, len(batches), appended - start,
                      flushed - start)


def run_eos(ctx: RunContext) -> list[Metric]:
    try:
        import broker.storage.log  # noqa: F401
    except ImportError as exc:
        raise NotAvailable(f"broker.storage.log cannot be imported: {exc}") from exc
    disk = ctx.shared.get("disk")
    if disk is None:
        raise NotAvailable("the raw disk speed was not measured in this run")
    value = b"v" * ctx.sizes.value_bytes
    total_bytes = ctx.sizes.disk_mib * MIB
    metrics: list[Metric] = []
    for variant in VARIANTS:
        batches, per_batch = build_batches(value, variant, total_bytes)
        runs: list[StorageRun] = []
        alongside = Alongside(disk.directory, ctx.sizes.disk_mib)
        alongside.settle()
        for i in range(ctx.sizes.repeats + 2):
            # Alternate which goes first, so neither always follows the other's file removal.
            if i % 2 == 0:
                alongside.run()
            runs.append(append_once(disk.directory, batches, per_batch))
            if i % 2 == 1:
                alongside.run()
            ctx.progress(f"  storage append, {variant.label}: {runs[-1].mb_per_s:,.0f} MB/s, "
                         f"{runs[-1].fsync_mb_per_s:,.0f} MB/s with the final fsync "
                         f"({runs[-1].batches:,} batches of {per_batch:,} records); raw disk "
                         f"next to it: {alongside.buffered_runs_mb_s[-1]:,.0f} MB/s")
        del batches
        mb_s = statistics.median(r.mb_per_s for r in runs)
        fsync_mb_s = statistics.median(r.fsync_mb_per_s for r in runs)
        records_s = statistics.median(r.records / r.append_s for r in runs)
        first = runs[0]
        note = (f"{first.batches:,} batches x {per_batch:,} records ({first.log_bytes:,} .log "
                f"bytes) into a fresh broker.storage.Log, median of {len(runs)}: runs "
                + ", ".join(f"{r.mb_per_s:,.0f}" for r in runs) + f" MB/s; {records_s:,.0f} "
                f"records/s")
        buffered_note = ("raw disk measured next to each run: " + ", ".join(
            f"{x:,.0f}" for x in alongside.buffered_runs_mb_s) + f" MB/s buffered, median "
            f"{alongside.buffered_mb_s:,.0f} (the harness's: {disk.buffered_mb_s:,.0f})")
        fsync_note = (f"appends + one final fsync: {fsync_mb_s:,.0f} MB/s (runs "
                      + ", ".join(f"{r.fsync_mb_per_s:,.0f}" for r in runs)
                      + f"); raw disk {disk.fsync_mb_s:,.0f} MB/s with fsync")
        prefix = f"append_storage.{variant.key}"
        what = f"storage append, {variant.label}"
        metrics += [
            Metric(f"{prefix}.mb_per_s", f"{what}: MB/s (in-process, no client)",
                   round(mb_s, 1), "MB/s", True, note,
                   samples=tuple(round(r.mb_per_s, 1) for r in runs)),
            Metric(f"{prefix}.vs_disk_buffered", f"{what} / raw disk write (buffered)",
                   round(mb_s / alongside.buffered_mb_s, 4), "ratio", True, buffered_note),
            Metric(f"{prefix}.vs_disk_fsync", f"{what} + final fsync / raw disk write "
                   "(with fsync)", round(fsync_mb_s / disk.fsync_mb_s, 4), "ratio", True,
                   fsync_note),
        ]
    return metrics


def run_kafka(ctx: RunContext) -> list[Metric]:
    raise NotAvailable("in-process storage append is eos-only: Kafka's log lives in its JVM")


register(Workload("append-storage", "Storage append in-process (broker.storage.Log, "
                  "pre-built batches) against the raw disk",
                  {"kafka": run_kafka, "eos": run_eos}))
