"""`Wakeup`: a threading.Event whose waiter can also wake for a socket that became readable.

Theory of operation
-------------------
A client thread that reads its own connections (the producer's sender on its produce
streams, the consumer's poll() on its Fetch calls: eos/socket_rpc.py) must sleep until
either an answer arrives on a socket or another thread gives it work (a new batch, a
rebalance step). A Condition cannot wait on a socket, and poll() cannot wait on a
Condition; so while the waiter sleeps on sockets it sleeps in poll() on them and on the
read end of a pipe, and `set()` writes one byte to the pipe.

The pipe is *armed* only while a waiter is inside poll(): `set()` writes only then, and only
once (it disarms it under the lock). The waiter reads that byte back when it wakes, so the
pipe never fills and the next sleep sleeps. Without sockets, `wait` is a Condition wait, as
threading.Event's. The flag semantics are Event's: set() stays set until clear(), and a
wait() on a set flag returns at once.

One thread at a time may wait with sockets (the one byte is for one waiter); any number may
wait without. The waiter disarms the pipe and reads its byte back however poll() ends, an
exception from a signal handler included. `close()` releases the pipe once no thread will
wait again; an owner dropped without closing releases it with `weakref.finalize`.
"""
from __future__ import annotations

import os
import select
import threading
from typing import Sequence


class Wakeup:
    """threading.Event's face (set, clear, is_set, wait), plus `wait(..., readable_fds)`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._condition = threading.Condition(self._lock)
        self._flag = False
        self._pipe: tuple[int, int] | None = None     # (read end, write end), made at first need
        self._armed = False      # a waiter is in poll(): set() writes one byte and disarms
        self._close_requested = False   # close() came while a waiter was in poll(): it frees the pipe

    def set(self) -> None:
        with self._lock:
            if self._flag:
                return
            self._flag = True
            self._condition.notify_all()
            if self._armed:
                self._armed = False
                os.write(self._pipe[1], b"\0")

    def clear(self) -> None:
        with self._lock:
            self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout_s: float | None = None, readable_fds: Sequence[int] = ()) -> bool:
        """Until set(), `timeout_s` (None: no limit) or, when given, until one of
        `readable_fds` can be read (or is closed). Returns the flag."""
        with self._lock:
            if self._flag:
                return True
            if not readable_fds:
                self._condition.wait(timeout_s)
                return self._flag
            if self._pipe is None:
                self._pipe = os.pipe()
                for fd in self._pipe:
                    os.set_blocking(fd, False)
            self._armed = True
            wake_fd = self._pipe[0]
        try:
            poller = select.poll()
            poller.register(wake_fd, select.POLLIN)
            for fd in readable_fds:
                poller.register(fd, select.POLLIN)
            poller.poll(None if timeout_s is None else max(0.0, timeout_s) * 1000)
        finally:
            # Also when poll() raised (a signal handler's exception, KeyboardInterrupt): left
            # armed, a later set() would write a byte nobody reads, and every later sleep on
            # sockets would return at once. Under the lock, so close() cannot free the pipe
            # between the check and the read.
            with self._lock:
                written = not self._armed      # set() disarmed it and wrote its byte
                self._armed = False
                if written and self._pipe is not None:
                    os.read(self._pipe[0], 1)
                if self._close_requested:
                    self._close_pipe_locked()
        return self._flag

    def close(self) -> None:
        """Release the pipe: for when no thread will wait with sockets again (a waiter still
        in poll() releases it as it leaves)."""
        with self._lock:
            if self._armed:
                self._close_requested = True
            else:
                self._close_pipe_locked()

    def _close_pipe_locked(self) -> None:
        if self._pipe is not None:
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
