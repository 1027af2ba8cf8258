"""The console's live throughput: records per second per topic, from end offsets sampled over time.

Theory of operation
-------------------
A topic's end offsets only grow while records are appended, so the sum of its partitions'
high watermarks, read twice, gives what was written in between: (sum now - sum before) /
seconds between is its rate in records/s (transaction markers take an offset too, so they
count, as they do in Kafka's offsets). `ThroughputSampler` keeps the last `samples_max`
samples, (time, {topic: sum of end offsets}), and the rates between consecutive ones.

Sampling happens when someone asks (`sample()`, the JSON endpoint the chart polls), not on
a timer: a console nobody watches costs the brokers nothing. A sample younger than
`interval_ms_min` is not taken again, so any number of browsers polling costs at most one
Metadata and one ListOffsets per leader per interval. A lock makes concurrent polls share
one sample.

A topic missing from either sample (created or deleted in between), one whose end offsets
could not all be read, or one whose sum went down (deleted and created again, or truncated)
has no rate for that interval rather than a made-up one.

The clock is passed in (`now_ms_fn`, monotonic for intervals; `wall_ms_fn` for the times
shown), so tests drive it without sleeping.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable

from eos.types import TopicPartition

SAMPLES_MAX = 120               # two minutes at one sample a second: what the chart shows
INTERVAL_MS_MIN = 1000


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def end_offset_sums(admin) -> dict[str, int]:
    """{topic: sum of its partitions' high watermarks}, from one Metadata and one ListOffsets
    per leader; a topic with a partition that did not answer is left out (no partial sums)."""
    described = admin.describe_topics()
    ends = admin.end_offsets([TopicPartition(name, p["partition"])
                              for name, t in described.items() for p in t["partitions"]])
    sums: dict[str, int] = {}
    incomplete: set[str] = set()
    for tp, end in ends.items():
        if end is None:
            incomplete.add(tp.topic)
        else:
            sums[tp.topic] = sums.get(tp.topic, 0) + end
    return {topic: total for topic, total in sums.items() if topic not in incomplete}


class ThroughputSampler:
    """Samples of end offset sums and the rates between them (see the module doc)."""

    def __init__(self, read_sums: Callable[[], dict[str, int]], *, samples_max: int = SAMPLES_MAX,
                 interval_ms_min: int = INTERVAL_MS_MIN, now_ms_fn: Callable[[], int] = _monotonic_ms,
                 wall_ms_fn: Callable[[], int] = _wall_ms):
        if samples_max < 2:
            raise ValueError(f"samples_max must be at least 2 (a rate needs two samples), got {samples_max}")
        self._read_sums = read_sums
        self._interval_ms_min = interval_ms_min
        self._now_ms = now_ms_fn
        self._wall_ms = wall_ms_fn
        self._lock = threading.Lock()
        # (monotonic ms, wall ms, {topic: sum}); the oldest falls off past samples_max
        self._samples: collections.deque = collections.deque(maxlen=samples_max)

    def sample(self) -> dict:
        """Take a sample if the last is at least interval_ms_min old; the series so far."""
        with self._lock:
            now_ms = self._now_ms()
            if not self._samples or now_ms - self._samples[-1][0] >= self._interval_ms_min:
                sums = self._read_sums()      # may raise: no sample is kept then
                self._samples.append((now_ms, self._wall_ms(), sums))
            samples = list(self._samples)
        return {"interval_ms_min": self._interval_ms_min, "points": [
            _rates(before, after) for before, after in zip(samples, samples[1:])]}


def _rates(before: tuple, after: tuple) -> dict:
    """One chart point: the rates between two samples, at the later one's wall time."""
    seconds = (after[0] - before[0]) / 1000
    topics = {}
    for topic, end_sum in after[2].items():
        previous = before[2].get(topic)
        if previous is not None and end_sum >= previous and seconds > 0:
            rate = (end_sum - previous) / seconds
            if rate:
                topics[topic] = round(rate, 3)
    return {"time_ms": after[1], "records_per_s": round(sum(topics.values()), 3),
            "topics": dict(sorted(topics.items()))}
