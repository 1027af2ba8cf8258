"""bench/workloads/memory.py reads a real process's peak RSS from /proc."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.workloads import NotAvailable, RunContext, Sizes
from bench.workloads.memory import eos_memory, status_kib

ALLOCATED_MIB = 64


@pytest.fixture
def process_that_peaked():
    """A child that touched ALLOCATED_MIB MiB, freed it, and waits: its RSS fell back, its
    peak did not."""
    child = subprocess.Popen([sys.executable, "-c", (
        f"import sys; b = bytearray({ALLOCATED_MIB} * 1024 * 1024); del b; "
        "print('ready', flush=True); sys.stdin.read()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        yield child.pid
    finally:
        child.kill()
        child.wait()


def test_the_peak_rss_is_the_high_water_mark_not_the_rss_now(process_that_peaked, tmp_path: Path):
    ctx = RunContext(system="eos", bootstrap="-", data_dir=tmp_path, sizes=Sizes(), progress=lambda _m: None,
                     broker_pid=process_that_peaked)
    [metric] = eos_memory(ctx)
    assert metric.key == "memory.peak_rss_mb" and not metric.higher_is_better
    assert metric.value >= ALLOCATED_MIB
    assert status_kib(process_that_peaked, "VmRSS") / 1024 < metric.value - ALLOCATED_MIB / 2


def test_an_unknown_process_is_not_available(tmp_path: Path):
    ctx = RunContext(system="eos", bootstrap="-", data_dir=tmp_path, sizes=Sizes(), progress=lambda _m: None)
    with pytest.raises(NotAvailable):
        eos_memory(ctx)
