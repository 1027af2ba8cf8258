"""How fast this host runs Python code right now: a probe a run reports at its start and end.

Theory of operation
-------------------
On this VM the same code runs at very different speeds on different days, and within an
hour: the eos producer's round trip (`python -m bench.transport_floor`) took 0.19-0.22 ms
in session 28 and 0.59-0.62 ms in session 29, the broker's side of a raw ProduceStream
request 3.5-4 times longer, while a bare TCP echo took about twice as long (bench/README.md).
eos's clients and broker are Python; Kafka's client is C and its broker a JVM. So the rows
where eos is near parity move with the host's speed for Python, and a run that does not say
how fast the host was cannot be compared with another.

`python_probe_ms` times a fixed piece of pure-Python work -- calls, dict reads and writes,
small allocations, the kind of steps a client's round trip is made of -- `repeats` times,
and returns the median in milliseconds. A run records it before its first workload and
after its last; the report prints both beside the load average. The figure is for
comparing runs on one machine: it is not a benchmark of either system.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

PROBE_ITERATIONS = 200_000
PROBE_REPEATS = 3


def _probe_work(iterations: int) -> int:
    counts: dict[int, int] = {}
    total = 0
    for index in range(iterations):
        key = index & 1023
        counts[key] = counts.get(key, 0) + 1
        total += len(str(key))
    return total + len(counts)


def python_probe_ms(repeats: int = PROBE_REPEATS, iterations: int = PROBE_ITERATIONS,
                    timer: Callable[[], float] = time.perf_counter) -> float:
    """The median time, in ms, of `repeats` runs of the fixed work (lower is faster)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    durations_ms = []
    for _ in range(repeats):
        started = timer()
        _probe_work(iterations)
        durations_ms.append((timer() - started) * 1000)
    return round(statistics.median(durations_ms), 1)
