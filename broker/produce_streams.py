"""The broker side of ProduceStream: one session per open stream, and their bound.

Theory of operation
-------------------
A `ProduceStreamSession` is one open ProduceStream call. The handler's thread takes the
client's requests in arrival order with `next_request`, one at a time; `push_back` returns a
request taken too early. Who reads gRPC's request iterator depends on what the handler needs:

- While every answer can be sent as soon as its request is handled (one broker, or acks=0/1:
  nothing waits for replicas), the handler's thread reads the iterator itself. A request
  then costs no hand-off between threads (each one a wake-up and a GIL hand-over, which on
  this path cost about as much as the append).
- The first time the handler asks without waiting (it holds answers that wait for the
  in-sync replicas and wants to read the next requests meanwhile), a reader thread takes
  over the iterator for the rest of the stream and queues what arrives (bounded), so one
  that gRPC cannot read ends the stream at once.

`ProduceStreams` counts the sessions open (a stream holds a worker thread for its whole
life, so their number is bounded) and ends them all when the broker stops: each finishes the
request it is answering, then ends. A handler that waits inside gRPC's iterator cannot be
woken but by the call's end, so a stopping broker cancels such an idle stream (the client
sees CANCELLED, which it retries like a dropped connection); the others end with UNAVAILABLE.
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
    """The requests of one ProduceStream, in arrival order: read by the handler's thread
    itself, or, once the handler reads ahead of its answers, handed over by a reader thread
    (see the module doc)."""

    def __init__(self, request_iterator, cancel_call=None):
        self._request_iterator = request_iterator
        # Ends the call from another thread (gRPC's context.cancel): how stop() reaches a
        # handler that waits for a request inside gRPC's iterator (see next_request).
        self._cancel_call = cancel_call
        self._reading_here = False    # the handler's thread waits inside gRPC's iterator
        self._condition = threading.Condition()
        self._received: collections.deque = collections.deque()
        self._client_closed = False   # the client half-closed: no more requests will come
        self._broken = False          # the call is over (cancelled, failed, or finished here)
        self.stopping = False         # the broker is stopping: take no further request
        self._reader: threading.Thread | None = None

    def _take_from_grpc(self):
        """The next request off gRPC's iterator, or None once there is none: the client
        half-closed (`_client_closed`), or the call failed or was cancelled, by the client or
        by stop() (`rpc_done`). The one place where either reader (the handler's thread or
        the reader thread) touches the iterator."""
        try:
            return next(self._request_iterator)
        except StopIteration:
            with self._condition:
                self._client_closed = True
                self._condition.notify_all()
        except grpc.RpcError:
            self.rpc_done()
        except Exception:
            log.exception("reading a produce stream failed")
            self.rpc_done()
        return None

    def _start_reader(self) -> None:
        self._reader = threading.Thread(target=self._read, name="eos-produce-stream-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while (request := self._take_from_grpc()) is not None:
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

    def next_request(self, wait: bool = True):
        """The next request in arrival order; None when the stream is to end (the client
        closed it and every request was taken, or the call is over, or the broker stops);
        with wait=False, NOTHING_YET when no request has arrived yet.

        Until a caller first asks without waiting, the handler's own thread reads gRPC's
        iterator (`_next_here`): no reader thread, and no hand-off between two threads on
        every request. The first wait=False (the handler has answers to send once replicas
        catch up, and wants to read ahead meanwhile) starts the reader thread for the rest
        of the stream."""
        if self._reader is None:
            if wait:
                return self._next_here()
            self._start_reader()
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

    def _next_here(self):
        with self._condition:
            if self._broken or self.stopping:
                return None
            if self._received:
                return self._received.popleft()
            if self._client_closed:
                return None
            self._reading_here = True
        try:
            request = self._take_from_grpc()
        finally:
            with self._condition:
                self._reading_here = False
        with self._condition:
            if self._broken or self.stopping:
                return None   # the broker began to stop while it arrived: not handled (as queued ones)
        return request

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
            waiting_in_grpc = self._reading_here
        if waiting_in_grpc and self._cancel_call is not None:
            # An idle stream's handler waits inside gRPC's iterator, which nothing but the
            # call's end wakes: cancel it (the client sees CANCELLED, a retriable error).
            self._cancel_call()

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
