"""The broker side of ProduceStream: one session per open stream, and their bound.

Theory of operation
-------------------
A `ProduceStreamSession` is one open ProduceStream call. A reader thread takes the client's
requests off the gRPC iterator as they arrive (so one that gRPC cannot read ends the stream
at once), and the handler's thread takes them in arrival order with `next_request`, one at a
time; `push_back` returns a request taken too early. `ProduceStreams` counts the sessions
open (a stream holds a worker thread for its whole life, so their number is bounded) and
ends them all when the broker stops: each finishes the request it is answering, then ends.
The order and the answers themselves are the Broker servicer's (`broker/service.py`).
"""
from __future__ import annotations

import collections
import logging
import threading

import grpc

log = logging.getLogger("eos.broker")

# Requests of one stream read ahead of the one being handled (a client pipelines 5).
STREAM_REQUESTS_RECEIVED_MAX = 16
# What `next_request(wait=False)` answers when no request has arrived yet.
NOTHING_YET = object()


class ProduceStreamSession:
    """The requests of one ProduceStream, handed in arrival order from a reader thread to
    the handler. The reader exists so that the handler never blocks inside gRPC's request
    iterator: waiting here instead, it can be woken to end the stream when the broker
    stops, which a thread parked in the iterator cannot."""

    def __init__(self, request_iterator):
        self._request_iterator = request_iterator
        self._condition = threading.Condition()
        self._received: collections.deque = collections.deque()
        self._client_closed = False   # the client half-closed: no more requests will come
        self._broken = False          # the call is over (cancelled, failed, or finished here)
        self.stopping = False         # the broker is stopping: take no further request
        self._reader: threading.Thread | None = None

    def start_reading(self) -> None:
        self._reader = threading.Thread(target=self._read, name="eos-produce-stream-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for request in self._request_iterator:
                with self._condition:
                    # Bounded: a client that pipelines too deep is held back by gRPC's flow
                    # control instead of filling the broker's memory.
                    while (len(self._received) >= STREAM_REQUESTS_RECEIVED_MAX
                           and not (self._broken or self.stopping)):
                        self._condition.wait()
                    if self._broken or self.stopping:
                        return
                    self._received.append(request)
                    self._condition.notify_all()
        except grpc.RpcError:
            self.rpc_done()   # the client cancelled or the connection broke
            return
        except Exception:
            log.exception("reading a produce stream failed")
            self.rpc_done()
            return
        with self._condition:
            self._client_closed = True
            self._condition.notify_all()

    def next_request(self, wait: bool = True):
        """The next request in arrival order; None when the stream is to end (the client
        closed it and every request was taken, or the call is over, or the broker stops);
        with wait=False, NOTHING_YET when no request has arrived yet."""
        with self._condition:
            while True:
                if self._broken or self.stopping:
                    return None
                if self._received:
                    request = self._received.popleft()
                    self._condition.notify_all()   # room for the reader
                    return request
                if self._client_closed:
                    return None
                if not wait:
                    return NOTHING_YET
                self._condition.wait()

    def push_back(self, request) -> None:
        """Return a request taken too early; it is the next one again."""
        with self._condition:
            self._received.appendleft(request)
            self._condition.notify_all()

    def rpc_done(self) -> None:
        """The call ended (a gRPC callback, or the reader saw it fail): stop at once."""
        with self._condition:
            self._broken = True
            self._condition.notify_all()

    def stop(self) -> None:
        """The broker stops: the request being handled is answered, nothing after it."""
        with self._condition:
            self.stopping = True
            self._condition.notify_all()

    def finish(self) -> None:
        """The handler is done: the reader takes nothing more. It leaves gRPC's iterator
        when the call is over, which the handler's return brings about."""
        self.rpc_done()


class ProduceStreams:
    """The open produce streams: at most `max_streams`, and all stopped at shutdown."""

    def __init__(self, max_streams: int):
        if max_streams < 0:
            raise ValueError(f"max_streams must be >= 0, got {max_streams}")
        self.max_streams = max_streams
        self._lock = threading.Lock()
        self._open: set[ProduceStreamSession] = set()
        self._closed = False

    @property
    def count(self) -> int:
        return len(self._open)

    def register(self, session: ProduceStreamSession) -> tuple[grpc.StatusCode, str] | None:
        """None when the session may run; else the status that refuses the call."""
        with self._lock:
            if self._closed:
                return grpc.StatusCode.UNAVAILABLE, "the broker is shutting down"
            if len(self._open) >= self.max_streams:
                return grpc.StatusCode.RESOURCE_EXHAUSTED, (
                    f"too many produce streams: this broker serves at most {self.max_streams} at once; "
                    f"use unary Produce or retry later")
            self._open.add(session)
        return None

    def unregister(self, session: ProduceStreamSession) -> None:
        with self._lock:
            self._open.discard(session)

    def close(self) -> None:
        """Shutdown: refuse new streams; each open one ends after its request in flight."""
        with self._lock:
            self._closed = True
            sessions = list(self._open)
        for session in sessions:
            session.stop()
