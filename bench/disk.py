"""Raw sequential write speed of a disk, the yardstick for broker append speed.

Theory of operation
-------------------
A broker's append path is, at best, a sequential write of the bytes it received. So the
ceiling for "broker append MB/s" is what a plain program gets writing the same number of
bytes in large blocks to a file on the same filesystem. We measure two figures:

- ``buffered``: 1 MiB ``write`` calls with no fsync: the page-cache speed, which is what a
  broker that leaves flushing to the OS (Kafka's and eos's default) is really up against;
- ``fsync``: the same writes plus one ``fsync`` at the end, timed until it returns: what
  the device sustains.

The file is removed afterwards. Blocks are random bytes made once, so neither a compressing
filesystem nor a zero-page shortcut flatters the figures. A series starts with `os.sync()`
and an unmeasured write: a writer that meets many dirty pages (the brokers' earlier topics,
other processes' files) is throttled by the kernel to the device's pace, which would
measure the backlog, not the disk. `Alongside` repeats the buffered run next to each run of
a workload that compares itself with it (alternating which goes first), so both see the
same machine load.
"""
from __future__ import annotations

import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

BLOCK_BYTES = 1 << 20


@dataclass(frozen=True)
class DiskSpeed:
    directory: str
    size_mib: int
    buffered_mb_s: float      # median of the runs; MB = 10**6 bytes everywhere in bench/
    fsync_mb_s: float
    buffered_runs_mb_s: tuple[float, ...]
    fsync_runs_mb_s: tuple[float, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def write_once(directory: str, size_mib: int, block: bytes, fsync: bool) -> float:
    """MB/s of one sequential write of `size_mib` MiB of `block`s (removed afterwards)."""
    fd, path = tempfile.mkstemp(prefix="eos-bench-disk-", dir=directory)
    try:
        start = time.perf_counter()
        for _ in range(size_mib):
            view = memoryview(block)
            while view:
                written = os.write(fd, view)
                view = view[written:]
        if fsync:
            os.fsync(fd)
        elapsed_s = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    return size_mib * BLOCK_BYTES / elapsed_s / 1e6


def measure(directory: str, size_mib: int = 512, repeats: int = 3) -> DiskSpeed:
    """Sequential write speed in `directory` (MB/s), buffered and with a final fsync.

    A shared virtual disk varies several-fold from one run to the next, so each figure is
    the median of `repeats` runs, alternating the two kinds.
    """
    if size_mib <= 0 or repeats <= 0:
        raise ValueError(f"size_mib and repeats must be positive, got {size_mib}, {repeats}")
    os.makedirs(directory, exist_ok=True)
    block = os.urandom(BLOCK_BYTES)
    # Dirty pages left by earlier work would have the kernel throttle our writer: flush
    # them first. Then warm the allocator and page-cache paths (and absorb the flush's
    # aftermath) with a small unmeasured write.
    os.sync()
    write_once(directory, min(16, size_mib), block, fsync=False)
    buffered: list[float] = []
    synced: list[float] = []
    for _ in range(repeats):
        buffered.append(round(write_once(directory, size_mib, block, fsync=False), 1))
        synced.append(round(write_once(directory, size_mib, block, fsync=True), 1))
    return DiskSpeed(directory, size_mib, statistics.median(buffered),
                     statistics.median(synced), tuple(buffered), tuple(synced))


class Alongside:
    """Raw disk runs interleaved with a workload's own runs, so that both see the same load
    on a shared machine: call `run()` before each workload run, then read the medians."""

    def __init__(self, directory: str, size_mib: int):
        self.directory = directory
        self.size_mib = size_mib
        self.block = os.urandom(BLOCK_BYTES)
        self.buffered_runs_mb_s: list[float] = []
        self.fsync_runs_mb_s: list[float] = []

    def settle(self) -> None:
        """Before a series: flush what earlier work left dirty (os.sync waits for it), then an
        unmeasured write, so that the kernel's and the journal's aftermath of the flush
        lands on neither side of the comparison."""
        os.sync()
        write_once(self.directory, min(64, self.size_mib), self.block, fsync=False)

    def run(self, *, fsync: bool = False) -> None:
        """One buffered run (page cache only: cheap, the file is gone before writeback), and
        with `fsync` one synced run too (real device writes: use sparingly)."""
        self.buffered_runs_mb_s.append(round(write_once(self.directory, self.size_mib,
                                                        self.block, fsync=False), 1))
        if fsync:
            self.fsync_runs_mb_s.append(round(write_once(self.directory, self.size_mib,
                                                         self.block, fsync=True), 1))

    @property
    def buffered_mb_s(self) -> float:
        return statistics.median(self.buffered_runs_mb_s)


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=tempfile.gettempdir())
    parser.add_argument("--mib", type=int, default=512)
    args = parser.parse_args()
    print(json.dumps(measure(args.dir, args.mib).to_dict(), indent=2))
