"""Blocking gRPC calls on one long-lived thread per destination, handed back as futures.

Theory of operation
-------------------
`stub.Method.future(request)` on a channel with no other call in flight starts a new
thread to drive that channel, every time (gRPC's channel "spin" thread exits when its last
call ends). A call the sender makes now and then on an otherwise idle channel -- one
AddPartitionsToTxn per transaction to the coordinator -- pays a thread start each time, on
the path of the transaction's first records. A blocking call drives its own completion
queue on the calling thread, so `CallThreads` makes each call as a blocking call on a
thread made once per destination and completes a `concurrent.futures.Future` with the
answer or the exception.

A destination's calls run one after the other, in submission order: it suits calls of
which the sender keeps at most one in flight per destination. Threads are daemons, so a
producer never closed cannot hold the interpreter's exit behind a call. close() stops each
thread after the calls already submitted (a call on a closed channel fails at once, into
its future); a call submitted after close() gets a cancelled future.
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
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to whoever reads the future
                future.set_exception(exc)
            else:
                future.set_result(result)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for calls in self._queues.values():
                calls.put(_STOP)
            self._queues.clear()
