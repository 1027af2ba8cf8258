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
from dataclasses import dataclass, field
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
    """
    key: str
    label: str
    value: float
    unit: str
    higher_is_better: bool = True
    note: str = ""

    def to_dict(self) -> dict:
        return {"key": self.key, "label": self.label, "value": self.value, "unit": self.unit,
                "higher_is_better": self.higher_is_better, "note": self.note}


@dataclass
class Sizes:
    """How much work each workload does; --quick shrinks all of it."""
    records: int = 2_000_000          # records per throughput measurement
    value_bytes: int = 100
    repeats: int = 3                  # throughput figures are the median of this many runs
    max_measure_s: float = 10.0       # a throughput run stops sending after this long
    warmup_records: int = 50_000
    latency_rate_per_s: int = 5_000
    latency_duration_s: float = 5.0
    latency_warmup_s: float = 1.0
    consume_timeout_s: float = 120.0
    disk_mib: int = 512
    txn_duration_s: float = 5.0       # each transactional / idempotent run of `transactions`
    copier_records: int = 200_000     # input records the copier copies
    e2e_rate_per_s: int = 2_000       # end-to-end latency: records/s produced

    @classmethod
    def quick(cls) -> "Sizes":
        return cls(records=300_000, repeats=1, max_measure_s=6.0, warmup_records=10_000,
                   latency_duration_s=2.0, latency_warmup_s=0.5, consume_timeout_s=60.0,
                   disk_mib=128, txn_duration_s=1.5, copier_records=30_000)


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


# Run order = import order. Later issues add: spark.
from bench.workloads import (produce, consume, latency, append, append_storage,  # noqa: E402,F401
                             append_broker, idempotence, transactions)
