"""bench/workloads back_memory: every page of the memory is written (the host must back
it), and all of it is freed again before the run it prepares."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOUCHED_MIB = 64
REPO_ROOT = Path(__file__).resolve().parents[2]


def _rss_after_back_memory(size_bytes: int) -> tuple[int, int, int]:
    """(VmRSS before, VmHWM after, VmRSS after) in KiB of a child that ran back_memory."""
    script = (
        "from bench.workloads import back_memory\n"
        "from bench.workloads.memory import status_kib\n"
        "import os\n"
        "before = status_kib(os.getpid(), 'VmRSS')\n"
        f"back_memory({size_bytes})\n"
        "print(before, status_kib(os.getpid(), 'VmHWM'), status_kib(os.getpid(), 'VmRSS'))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         timeout=60, cwd=REPO_ROOT).stdout
    before, peak, after = map(int, out.split())
    return before, peak, after


def test_every_page_is_written_and_freed():
    # Memory mapped but never written (calloc's zero pages) leaves the peak where it was: it
    # rises by about the whole size only if each page was written (less what the
    # interpreter freed meanwhile).
    # One byte past a page boundary: a partial last page.
    size_bytes = TOUCHED_MIB * 1024 * 1024 + 1
    before, peak, after = _rss_after_back_memory(size_bytes)
    assert peak - before >= TOUCHED_MIB * 1024 * 9 // 10
    assert after - before < TOUCHED_MIB * 1024 // 4


def test_nothing_to_back():
    before, peak, after = _rss_after_back_memory(0)
    assert peak - before < 8 * 1024 and after - before < 8 * 1024

