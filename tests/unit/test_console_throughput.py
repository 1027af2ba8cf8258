"""eos.console.throughput's sampler, driven by a fake clock and scripted end offset sums."""
from __future__ import annotations

import pytest

from eos.console.throughput import ThroughputSampler


class Script:
    """Hands out the scripted sums in order, and the clocks the test sets."""

    def __init__(self, *sums):
        self.sums = list(sums)
        self.now_ms = 0
        self.reads = 0

    def read(self):
        self.reads += 1
        item = self.sums.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def sampler_for(script: Script, **kwargs) -> ThroughputSampler:
    return ThroughputSampler(script.read, now_ms_fn=lambda: script.now_ms, wall_ms_fn=lambda: 10**12 + script.now_ms,
                             **kwargs)


def test_rates_are_the_growth_of_each_topic_per_second():
    script = Script({"a": 100, "b": 5}, {"a": 300, "b": 5, "new": 50}, {"a": 250, "b": 15, "new": 60})
    sampler = sampler_for(script)
    assert sampler.sample()["points"] == []                 # one sample: no rate yet
    script.now_ms = 2000
    [point] = sampler.sample()["points"]
    # b did not grow; "new" has no earlier sum: neither is given a rate
    assert point == {"time_ms": 10**12 + 2000, "records_per_s": 100.0, "topics": {"a": 100.0}}
    script.now_ms = 3000
    last = sampler.sample()["points"][-1]
    # a went down (deleted and created again): no rate rather than a negative one
    assert last == {"time_ms": 10**12 + 3000, "records_per_s": 20.0, "topics": {"b": 10.0, "new": 10.0}}


def test_polls_within_the_interval_share_one_sample():
    script = Script({"a": 0}, {"a": 10})
    sampler = sampler_for(script, interval_ms_min=1000)
    sampler.sample()
    script.now_ms = 999
    assert sampler.sample()["points"] == [] and script.reads == 1
    script.now_ms = 1000
    assert sampler.sample()["points"][0]["topics"] == {"a": 10.0} and script.reads == 2


def test_samples_are_bounded_and_a_failed_read_keeps_none():
    script = Script(*[{"a": i * 10} for i in range(3)], ConnectionError("broker away"), {"a": 100})
    sampler = sampler_for(script, samples_max=2)
    for now_ms in (0, 1000, 2000):
        script.now_ms = now_ms
        sampler.sample()
    assert len(sampler.sample()["points"]) == 1             # 3 samples taken, 2 kept: one rate
    script.now_ms = 3000
    with pytest.raises(ConnectionError):
        sampler.sample()
    script.now_ms = 4000
    [point] = sampler.sample()["points"]                    # the two kept: 2000 and 4000
    assert point["topics"] == {"a": 40.0}


def test_a_rate_needs_two_samples():
    with pytest.raises(ValueError, match="at least 2"):
        ThroughputSampler(dict, samples_max=1)
