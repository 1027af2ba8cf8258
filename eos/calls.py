"""Blocking gRPC calls on one long-lived thread per destination, handed back as futures.

Theory of operation
-------------------
`stub.Method.future(request)` on a channel with no other call in flight starts a new
thread to drive that channel, every time (gRPC's channel "spin" thread exits when its last
call ends). A client that makes a call now and then on an otherwise idle channel pays a
thread start each time: the consumer's Fetch at the tail (once a record, when it keeps up
with its producer: about half of the application thread's CPU in the end-to-end latency
benchmark) and the producer's AddPartitionsToTxn (once a transaction, on the path of its
first records). A blocking call drives its own completion queue on the calling thread, so
`CallThreads` makes each call as a blocking call on a thread made once per destination and
completes a `concurrent.futures.Future` with the answer or the exception.

A destination's calls run one after the other, in submission order: it suits clients that
keep at most one call in flight per destination (one Fetch per broker; one
AddPartitionsToTxn to the coordinator). Threads are daemons, so a client never closed
cannot hold the interpreter's exit behind a call (or a long poll); an idle thread holds no
reference to its last call, so its owner can be collected and stop it from a finaliser.
close() stops each thread after the calls already submitted: they still run, and a call
on a channel closed meanwhile fails at once into its future; the owner cancels the futures
it no longer wants. A call submitted after close() gets a cancelled future.
"""
from __future__ import annotations

import queue
import threading
from concurrent import futures
from typing import Callable, Hashable

_STOP = None


class CallThreads:
    """submit(destination, fn, *args, **kwargs) -> Future, run on that destination's thread."""

    def __init__(self, thread_name_prefix: str):
        self._thread_name_prefix = thread_name_prefix
        self._queues: dict[Hashable, queue.SimpleQueue] = {}
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, destination: Hashable, fn: Callable, *args, **kwargs) -> futures.Future:
        future: futures.Future = futures.Future()
        with self._lock:
            if self._closed:
                future.cancel()
                future.set_running_or_notify_cancel()
                return future
            calls = self._queues.get(destination)
            if calls is None:
                calls = self._queues[destination] = queue.SimpleQueue()
                threading.Thread(target=self._run, args=(calls,), daemon=True,
                                 name=f"{self._thread_name_prefix}-{destination}").start()
            calls.put((future, fn, args, kwargs))
        return future

    @staticmethod
    def _run(calls: queue.SimpleQueue) -> None:
        while True:
            item = calls.get()
            if item is _STOP:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():       # False: cancelled while queued
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # handed to whoever reads the future
                    future.set_exception(exc)
                else:
                    future.set_result(result)
                    del result
            # An idle thread keeps nothing alive (the future's callbacks may reach the
            # owner, whose finaliser is what stops this thread).
            del item, future, fn, args, kwargs

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for calls in self._queues.values():
                calls.put(_STOP)
            self._queues.clear()
