"""The registry of benchmark workloads.

Theory of operation
-------------------
A workload is one scenario measured on each system under the same conditions: a function
per system (``kafka``, ``eos``; a later peer adds a key) that takes a `RunContext` and returns
a list of `Metric`. The harness (bench/__main__.py) starts a system's broker once, runs every
selected workload against it in registry order, then moves on to the next system, so the two
systems never share the machine at the same time.

A workload that cannot run on a system (its client is not written yet) raises
`NotAvailable`; one that loses records raises `RecordsLost`: the harness reports the loss
instead of a speed and exits non-zero. Anything else that goes wrong is recorded as an
error with its message.

Adding a workload: write ``bench/workloads/<name>.py`` with a function per system and
register it at import time:

    register(Workload("txn", "Transactions, commit every 100 ms", kafka=run_kafka,
                      eos=run_eos, default_on=True))

then import the module at the bottom of this file. Order of import is the run order.
Workloads may leave results for later ones in `RunContext.shared` (consume reads the topic
that produce filled), but each must also work alone under ``--only``.
"""
from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable


class NotAvailable(Exception):
    """This system cannot run this workload yet; the message says what is missing."""


class RecordsLost(Exception):
    """The records acknowledged or received are not the records sent (missing or extra)."""

    def __init__(self, what: str, expected: int, actual: int):
        difference = (f"{expected - actual:,} missing" if actual < expected
                      else f"{actual - expected:,} extra: duplicates")
        super().__init__(f"{what}: expected {expected:,} records, got {actual:,} ({difference})")
        self.expected = expected
        self.actual = actual


@dataclass(frozen=True)
class Metric:
    """One figure of one workload on one system.

    `key` is stable across systems and runs (it pairs eos with kafka in the report);
    `higher_is_better` orients the eos/kafka ratio so that a ratio above 1 favours eos.
    `samples` holds every run's figure in run order when `value` is the median of several
    runs (the report shows their min-max, so a reader sees how noisy the row is).
    `restates` names the key of another metric of the same runs that this one only states
    in other units (MB/s next to records/s): the report leaves it out of its summary count
    and of the ratio plot so that one measurement is not counted twice.
    """
    key: str
    label: str
    value: float
    unit: str
    higher_is_better: bool = True
    note: str = ""
    samples: tuple[float, ...] = ()
    restates: str = ""

    def to_dict(self) -> dict:
        out = {"key": self.key, "label": self.label, "value": self.value, "unit": self.unit,
               "higher_is_better": self.higher_is_better, "note": self.note}
        if self.samples:
            out["samples"] = list(self.samples)
        if self.restates:
            out["restates"] = self.restates
        return out


def median_low(values: list[float]) -> float:
    """The median that is one of the values (the lower middle one for an even count), so
    that a median figure is always a run that happened."""
    if not values:
        raise ValueError("median of no values")
    return sorted(values)[(len(values) - 1) // 2]


def median_of_runs(runs: list[list[Metric]]) -> list[Metric]:
    """Metrics of several runs of one scenario folded into one list: per key, the median
    value (`median_low`), every run's value in `samples`, and the note of the run whose
    value is that median. Keys keep the order of the first run; every run must report the
    same keys."""
    if not runs:
        raise ValueError("no runs to take the median of")
    keys = [m.key for m in runs[0]]
    for index, run in enumerate(runs[1:], start=2):
        if [m.key for m in run] != keys:
            raise ValueError(f"run {index} reported keys {[m.key for m in run]}, "
                             f"run 1 reported {keys}")
    folded = []
    for position, key in enumerate(keys):
        same = [run[position] for run in runs]
        median = median_low([m.value for m in same])
        chosen = next(m for m in same if m.value == median)
        folded.append(replace(chosen, samples=tuple(m.value for m in same)))
    return folded


@dataclass
class Sizes:
    """How much work each workload does; --quick shrinks all of it.

    Every throughput and latency figure is the median of `repeats` runs (each run's figure
    kept as a sample): on a shared machine three short runs say more than one long one.
    """
    records: int = 2_000_000          # records per throughput measurement
    value_bytes: int = 100
    repeats: int = 3                  # every figure is the median of this many runs
    max_measure_s: float = 10.0       # a throughput run stops sending after this long
    warmup_records: int = 50_000
    latency_rate_per_s: int = 5_000
    latency_duration_s: float = 3.0   # each run of latency and of e2e-latency (per mode)
    latency_warmup_s: float = 1.0
    consume_timeout_s: float = 120.0
    disk_mib: int = 512
    txn_duration_s: float = 2.0       # each transactional / idempotent run of `transactions`
    copier_records: int = 200_000     # input records the copier copies
    e2e_rate_per_s: int = 2_000       # end-to-end latency: records/s produced
    commit_rate_per_s: int = 10_000   # commit-latency: records/s offered, 100 ms transactions
    commit_duration_s: float = 5.0    # each run of commit-latency, after latency_warmup_s
    short_txn_duration_s: float = 3.0  # each run of short-txn (per producer count)

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(records=300_000, repeats=1, max_measure_s=6.0, warmup_records=10_000,
                   latency_duration_s=2.0, latency_warmup_s=0.5, consume_timeout_s=60.0,
                   disk_mib=128, txn_duration_s=1.5, copier_records=30_000,
                   commit_duration_s=1.5, short_txn_duration_s=1.5)


@dataclass
class RunContext:
    """What a workload gets: where the broker is, how much to do, how to report progress."""
    system: str                                   # "kafka" or "eos"
    bootstrap: str
    data_dir: Path                                # the broker's log dir, for on-disk bytes
    sizes: Sizes
    progress: Callable[[str], None] = print
    shared: dict = field(default_factory=dict)    # results one workload leaves for another
    topic_prefix: str = "bench"                   # another run on the same broker: another prefix
    broker_pid: int | None = None                 # the broker's process (the memory workload reads it)
    _names: itertools.count = field(default_factory=lambda: itertools.count(1))

    def topic_name(self, prefix: str) -> str:
        """A topic name not used before in this run."""
        return f"{self.topic_prefix}-{prefix}-{next(self._names)}"

    def log_bytes(self, topic: str) -> int:
        """Bytes in the `.log` segment files of `topic` on disk (all partitions)."""
        total = 0
        for partition_dir in self.data_dir.rglob(f"{topic}-*"):
            suffix = partition_dir.name[len(topic) + 1:]
            if partition_dir.is_dir() and suffix.isdigit():
                total += sum(f.stat().st_size for f in partition_dir.glob("*.log"))
        return total


def settle_writes() -> None:
    """Before a run, outside its clock: write the page cache's dirty pages back (os.sync()).

    A run that writes faster than the disk drains leaves its data dirty in memory, and once
    that passes the kernel's background threshold (vm.dirty_background_ratio) the next
    writer shares the machine with its write-back. Measured here, eos's bulk produce of
    1 KB values for 2 s: 1.1M records/s from a clean cache, 0.4M right after a run that
    left 2 GB dirty: a run's figure depended on the run before it. Called on both systems
    alike."""
    os.sync()


def back_memory(size_bytes: int) -> None:
    """Write every page of `size_bytes` of new memory, then free it.

    This machine is a VM whose host backs its memory lazily and takes freed memory back
    (virtio-balloon free page reporting, `page_reporting_order` on the kernel's command
    line): a page the guest freed is reported after about two seconds and dropped by the
    host, and the next write into it -- a page cache page a broker's write() fills --
    waits for the host to back it again. The host backs about 0.5-0.7 GB/s, so a run that
    writes faster than that into such pages runs at the host's rate: eos's bulk produce of
    1 KB values, 2 s runs, sync before each: 1.09M, 0.61M, 0.37M, 0.32M, 0.35M records/s,
    the broker in the kernel's copy into the page cache 76% of its time (perf); with 6 GB
    touched and freed just before each run, 0.72M-1.08M. Pages freed a moment ago are
    handed out first and are not reported yet, so the run's writes land in backed memory.
    On a machine that keeps its memory, this costs the time to touch it and changes nothing."""
    memory = bytearray(size_bytes)   # CPython writes its zeros (memset), every page
    del memory


def repeated(ctx: RunContext, run_once: Callable[[], list[Metric]]) -> list[Metric]:
    """`Sizes.repeats` runs of one scenario, folded by `median_of_runs`; each starts with
    `settle_writes`."""
    runs = []
    for index in range(ctx.sizes.repeats):
        if ctx.sizes.repeats > 1:
            ctx.progress(f"   run {index + 1} of {ctx.sizes.repeats}")
        settle_writes()
        runs.append(run_once())
    return median_of_runs(runs)


RunFn = Callable[[RunContext], list[Metric]]


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    runners: dict[str, RunFn]
    default_on: bool = True


REGISTRY: dict[str, Workload] = {}


def register(workload: Workload) -> Workload:
    if workload.name in REGISTRY:
        raise ValueError(f"workload {workload.name!r} registered twice")
    REGISTRY[workload.name] = workload
    return workload


# Run order = import order.
from bench.workloads import (produce, consume, latency, append, append_storage,  # noqa: E402,F401
                             append_broker, idempotence, transactions, short_txn, recompress,
                             rebalance, spark, memory)
