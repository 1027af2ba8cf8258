"""The one bounded wait of the test suite: poll a condition until it holds or time runs out.

Tests wait on observable conditions, never on sleeps: `wait_for` returns the condition's
first truthy value and fails the test, naming what it waited for, when the bound passes.
The bound is only reached when the behaviour under test is broken.
"""
from __future__ import annotations

import time

WAIT_S = 60.0


def wait_for(condition, what: str, timeout_s: float = WAIT_S, poll_s: float = 0.01):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
