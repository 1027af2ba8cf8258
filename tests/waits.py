"""The one bounded wait of the test suite: poll a condition until it holds or time runs out.

Tests wait on observable conditions, never on sleeps: `wait_for` returns the condition's
first truthy value and fails the test, naming what it waited for, when the bound passes.
The bound is only reached when the behaviour under test is broken.
"""
from __future__ import annotations

from bench.kafka import wait_until

WAIT_S = 60.0


def wait_for(condition, what: str, timeout_s: float = WAIT_S, poll_s: float = 0.01):
    """`bench.kafka.wait_until`, failing the test (AssertionError) when the bound passes."""
    try:
        return wait_until(condition, what, timeout_s, interval_s=poll_s)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from None
