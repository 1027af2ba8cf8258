"""The shutdown gate of the broker's services: shutdown waits for the requests in flight.

gRPC's stop grace only cancels RPCs; the handler threads would run on after the logs are
closed. Every handler of the Broker service runs inside `gated`, which counts it in the
servicer's `_gate`; `close_and_drain` refuses new requests and waits for those in flight.
"""
from __future__ import annotations

import functools
import threading

import grpc


class RequestGate:
    """Counts requests in flight so shutdown can wait for them before closing the logs
    (gRPC's stop grace only cancels RPCs; the handler threads would run on)."""

    def __init__(self):
        self._condition = threading.Condition()
        self._in_flight = 0
        self._closed = False

    def enter(self) -> bool:
        with self._condition:
            if self._closed:
                return False
            self._in_flight += 1
            return True

    def exit(self) -> None:
        with self._condition:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._condition.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def close_and_drain(self, timeout_s: float) -> bool:
        """Refuse new requests; wait up to timeout_s for those in flight. True if drained."""
        with self._condition:
            self._closed = True
            return self._condition.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)


def gated(handler):
    @functools.wraps(handler)
    def wrapper(self, request, context):
        if not self._gate.enter():
            context.abort(grpc.StatusCode.UNAVAILABLE, "the broker is shutting down")
        try:
            return handler(self, request, context)
        finally:
            self._gate.exit()
    return wrapper
