"""Fetch purgatory: where long-poll fetches wait for data, without burning CPU.

Theory of operation
-------------------
A Fetch that found fewer than `min_bytes` may wait up to `max_wait_ms` for more (Kafka's
long poll). The waiting fetch registers a `FetchWaiter` under the topic-partitions it reads;
every append calls `notify(key)` for the partition it wrote, which sets the event of each
waiter registered under that key. The fetch then reads again. Nothing polls: a waiter
sleeps on a `threading.Event` until an append, its deadline, its RPC being cancelled, or
the broker shutting down.

No wake-up is lost: the fetch registers first and only then checks whether the partitions
moved since its last read (an append between the read and the registration is seen by
that check; one after the registration finds the waiter). The event is cleared before each
re-read for the same reason.

A follower's fetch session keeps one waiter registered under its partitions for as long
as the session lives (`rewatch` moves it when the session's partitions change): with a
thousand partitions a session, registering them afresh on every Fetch cost more than the
read itself. Its Fetches clear the event, read, and wait on it, one at a time. That waiter
also tracks which keys were notified (`take_touched`, swapped under the lock that notify
adds them under), so a Fetch woken by one partition's append reads that partition, not
the thousand.

The purgatory is bounded: a waiting fetch holds a worker thread, so at most `max_waiters`
are registered at once (a session's waiter stays registered between its Fetches too, and
there is at most one a follower broker); past that `watch()` returns None and the fetch
answers at once with what it has (the client polls again). The lock guards only the waiter
map and is never held while reading or writing the log.
"""
from __future__ import annotations

import threading
from typing import Hashable, Iterable


class FetchWaiter:
    """One waiting fetch. Woken by an append to any of its keys, cancel(), or close().
    A waiter watched `tracking` also collects the keys notified since `take_touched`."""

    __slots__ = ("keys", "_event", "cancelled", "touched")

    def __init__(self, keys: frozenset, tracking: bool = False):
        self.keys = keys
        self._event = threading.Event()
        self.cancelled = False
        self.touched: set | None = set() if tracking else None

    def wait(self, timeout_s: float) -> bool:
        """Sleep until woken or `timeout_s` passes; True when woken."""
        return self._event.wait(max(0.0, timeout_s))

    def clear(self) -> None:
        self._event.clear()

    def wake(self) -> None:
        self._event.set()

    def cancel(self) -> None:
        """The RPC is gone or the broker is stopping: stop waiting for good."""
        self.cancelled = True
        self._event.set()


class FetchPurgatory:
    """Waiters keyed by topic-partition; thread-safe; at most `max_waiters` at once."""

    def __init__(self, max_waiters: int):
        if max_waiters < 0:
            raise ValueError(f"max_waiters must be >= 0, got {max_waiters}")
        self.max_waiters = max_waiters
        self._lock = threading.Lock()
        self._waiters_by_key: dict[Hashable, set[FetchWaiter]] = {}
        self._waiter_count = 0
        self._closed = False

    @property
    def waiter_count(self) -> int:
        return self._waiter_count

    def watch(self, keys: Iterable[Hashable], *, tracking: bool = False) -> FetchWaiter | None:
        """Register a waiter on `keys`; None when full or closed (answer without waiting).
        `tracking`: it also collects the keys notified (`take_touched`)."""
        key_set = frozenset(keys)
        waiter = FetchWaiter(key_set, tracking)
        with self._lock:
            if self._closed or self._waiter_count >= self.max_waiters or not key_set:
                return None
            for key in key_set:
                self._waiters_by_key.setdefault(key, set()).add(waiter)
            self._waiter_count += 1
        return waiter

    def rewatch(self, waiter: FetchWaiter, keys: Iterable[Hashable]) -> bool:
        """Move a registered waiter to `keys`, touching only the keys that differ; False
        when the purgatory is closed (the waiter was cancelled), the waiter is not here, or
        `keys` is empty (the waiter is then unwatched)."""
        key_set = frozenset(keys)
        if not key_set:
            self.unwatch(waiter)
            return False
        with self._lock:
            if self._closed or not self._registered_locked(waiter):
                return False
            for key in waiter.keys - key_set:
                self._unregister_key_locked(key, waiter)
            for key in key_set - waiter.keys:
                self._waiters_by_key.setdefault(key, set()).add(waiter)
            waiter.keys = key_set
        return True

    def _registered_locked(self, waiter: FetchWaiter) -> bool:
        if not waiter.keys:
            return False
        some_key = next(iter(waiter.keys))
        return waiter in self._waiters_by_key.get(some_key, ())

    def _unregister_key_locked(self, key: Hashable, waiter: FetchWaiter) -> bool:
        waiters = self._waiters_by_key.get(key)
        if waiters is None or waiter not in waiters:
            return False
        waiters.discard(waiter)
        if not waiters:
            del self._waiters_by_key[key]
        return True

    def unwatch(self, waiter: FetchWaiter) -> None:
        with self._lock:
            removed = False
            for key in waiter.keys:
                removed = self._unregister_key_locked(key, waiter) or removed
            if removed:
                self._waiter_count -= 1

    def take_touched(self, waiter: FetchWaiter) -> set:
        """The keys notified to a tracking waiter since the last call (then none)."""
        with self._lock:
            touched, waiter.touched = waiter.touched, set()
        return touched

    def notify(self, key: Hashable) -> int:
        """Wake every waiter on `key` (called after an append); returns how many."""
        with self._lock:
            waiters = self._waiters_by_key.get(key)
            if not waiters:
                return 0
            woken = list(waiters)
            for waiter in woken:
                if waiter.touched is not None:
                    waiter.touched.add(key)
        for waiter in woken:
            waiter.wake()
        return len(woken)

    def close(self) -> None:
        """Shutdown: wake and cancel every waiter; later watch() calls return None."""
        with self._lock:
            self._closed = True
            everyone = {w for waiters in self._waiters_by_key.values() for w in waiters}
        for waiter in everyone:
            waiter.cancel()
