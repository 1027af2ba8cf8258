"""Incremental fetch sessions (KIP-227): what a leader remembers of each follower's fetches.

Theory of operation
-------------------
A follower fetches every partition it follows from one leader, in one Fetch, over and over.
Without a session each Fetch lists them all and the leader reads and answers them all, even
when one partition of a thousand moved: in Python that is about 13 us a partition on each
side, and with 1,000 idle partitions on three brokers an acks=all write waited 85-130 ms
for its followers instead of 4. A session makes the cost follow what changed:

- The follower's first Fetch (session_epoch 0) is full. The leader opens a session for it:
  every partition with the fetch offset, size limit and leader epoch the follower sent, and
  what the leader last answered for it (high watermark, log start offset). The answer
  carries the session's id.
- Each later Fetch carries the id and the next epoch (1, 2, ...) and lists only the
  partitions whose fetch offset or leader epoch changed, plus `forgotten` ones to drop. The
  leader answers only partitions with something new: records past the fetch offset, a high
  watermark or log start the follower has not been told, or an error.
- A Fetch with the wrong epoch (a retry after a lost answer, two fetchers at once) is
  INVALID_FETCH_SESSION_EPOCH, an id the leader does not know (it restarted, or the follower
  opened another session since) FETCH_SESSION_ID_NOT_FOUND; either way the follower starts
  over with a full fetch, which is always correct.

The leader still reports each partition's fetch offset to the replica manager (high
watermark, caught-up time, ISR expansion, leadership and epoch checks): those the Fetch
lists, any it is about to answer, and all of them once per `report_interval_s`. Which
partitions a read looks at is broker/reads.py's: those listed, those notified since the
session's last read (its purgatory waiter collects them), those left `pending`, and all of
them at that periodic report.

A leader keeps one session per follower broker (a follower has one fetcher thread per
leader): opening a new one replaces that broker's old one, so the cache is bounded by the
cluster's size and needs no eviction. The epoch is checked and advanced under the cache's
lock, so of two Fetches with the same epoch exactly one goes on. Sessions live in memory
only; consumers' fetches never open one.

This module is the bookkeeping only, no I/O: broker/reads.py reads the logs and decides what
is new, and broker/replica/fetcher.py is the follower's side.
"""
from __future__ import annotations

import random
import threading
from typing import Callable, Iterable

from eos.errors import EosError, ErrorCode

INITIAL_EPOCH = 0     # a full fetch that opens a session
FINAL_EPOCH = -1      # closes the session
EPOCH_MAX = (1 << 31) - 1
# How often an incremental Fetch reports the follower's offsets of all its partitions to the
# replica manager, not only of those it lists: what keeps an idle partition's follower caught
# up and lets it into the ISR once the high watermark reaches it. Between, only partitions
# that moved cost the leader anything. At most this, and at most a quarter of
# replica.lag.time.max.ms (`report_interval_s`): the check runs when a Fetch starts, so with
# the 500 ms long poll between two Fetches a caught-up time is refreshed within about twice
# the interval, well inside the lag a follower is allowed.
REPORT_ALL_INTERVAL_S = 1.0


def report_interval_s(replica_lag_time_max_ms: int) -> float:
    return min(REPORT_ALL_INTERVAL_S, replica_lag_time_max_ms / 4000.0)


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`: 1, 2, ..., wrapping past int32 to 1 (0 would open a session)."""
    return 1 if epoch >= EPOCH_MAX else epoch + 1


class SessionPartition:
    """One partition of a session: what the follower last said, and what it was last told."""

    __slots__ = ("fetch_offset", "partition_max_bytes", "has_leader_epoch", "current_leader_epoch",
                 "sent_high_watermark", "sent_log_start_offset", "log", "reported_at", "log_start_offset")

    def __init__(self, fetch_offset: int, partition_max_bytes: int, has_leader_epoch: bool,
                 current_leader_epoch: int, log_start_offset: int | None = None):
        self.fetch_offset = fetch_offset
        self.log_start_offset = log_start_offset     # the follower's own (None: never said)
        self.partition_max_bytes = partition_max_bytes
        self.has_leader_epoch = has_leader_epoch
        self.current_leader_epoch = current_leader_epoch
        self.sent_high_watermark = -1       # nothing told yet: the first look answers it
        self.sent_log_start_offset = -1
        # The leader's: the partition's log as its last report found it (None: report it
        # before reading), and the session epoch of the Fetch that last reported it.
        self.log = None
        self.reported_at = INITIAL_EPOCH

    def update(self, fetch_offset: int, partition_max_bytes: int, has_leader_epoch: bool,
               current_leader_epoch: int, log_start_offset: int | None = None) -> None:
        if current_leader_epoch != self.current_leader_epoch or has_leader_epoch != self.has_leader_epoch:
            # A new epoch of the partition on the follower (it was removed and added again,
            # and may have dropped an answer meanwhile): tell it everything again.
            self.forget_told()
        self.fetch_offset = fetch_offset
        self.partition_max_bytes = partition_max_bytes
        self.has_leader_epoch = has_leader_epoch
        self.current_leader_epoch = current_leader_epoch
        if log_start_offset is not None:
            self.log_start_offset = log_start_offset

    def told(self, high_watermark: int, log_start_offset: int) -> None:
        self.sent_high_watermark = high_watermark
        self.sent_log_start_offset = log_start_offset

    def forget_told(self) -> None:
        """Answer this partition again next time (its answer was an error)."""
        self.sent_high_watermark = -1
        self.sent_log_start_offset = -1


class FetchSession:
    """One follower's session. `epoch` is the epoch its next Fetch must carry.
    `keys_version` moves whenever a partition joins or leaves; the leader's read side keeps
    the session's purgatory waiter in `waiter`, registered at `watched_version`, under
    `waiter_lock`, and sets `dropped` (under it too) once the session is replaced or closed.
    `pending` holds the partitions a read must look at again though nothing notifies them
    (an answer cut short by the response's size, a refusal); its Fetches' thread owns it."""

    __slots__ = ("session_id", "replica_id", "epoch", "partitions", "_all_reported_s", "keys_version",
                 "waiter", "watched_version", "waiter_lock", "dropped", "pending")

    def __init__(self, session_id: int, replica_id: int):
        self.session_id = session_id
        self.replica_id = replica_id
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.partitions: dict[tuple[str, int], SessionPartition] = {}
        self._all_reported_s = float("-inf")
        self.keys_version = 0
        self.waiter = None
        self.watched_version = -1
        self.waiter_lock = threading.Lock()
        self.dropped = False
        self.pending: set[tuple[str, int]] = set()

    def report_all_due(self, now_s: float, interval_s: float) -> bool:
        """Whether this Fetch reports every partition, not only those it lists: once per
        `interval_s` (and on the first incremental Fetch). True marks it done."""
        if now_s - self._all_reported_s < interval_s:
            return False
        self._all_reported_s = now_s
        return True

    def apply(self, listed: Iterable, forgotten: Iterable) -> list[tuple[str, int]]:
        """Take an incremental Fetch's changes: `listed` FetchPartition entries (topic,
        partition, fetch_offset, partition_max_bytes, has_leader_epoch, current_leader_epoch,
        and the follower's log_start_offset when it set one) are added or updated,
        `forgotten` (topic, partition)-like entries leave. Returns the listed keys, in order."""
        for entry in forgotten:
            if self.partitions.pop((entry.topic, entry.partition), None) is not None:
                self.keys_version += 1
        keys = []
        for fp in listed:
            key = (fp.topic, fp.partition)
            known = self.partitions.get(key)
            log_start = fp.log_start_offset if fp.HasField("log_start_offset") else None
            if known is None:
                self.keys_version += 1
                self.partitions[key] = SessionPartition(fp.fetch_offset, fp.partition_max_bytes,
                                                        fp.has_leader_epoch, fp.current_leader_epoch, log_start)
            else:
                known.update(fp.fetch_offset, fp.partition_max_bytes, fp.has_leader_epoch, fp.current_leader_epoch,
                             log_start)
            keys.append(key)
        return keys


class FetchSessionCache:
    """The leader's sessions, one per follower broker; thread-safe. `on_drop(session)` is
    called, outside the lock, for each session replaced or closed."""

    def __init__(self, rng: random.Random | None = None,
                 on_drop: Callable[[FetchSession], None] | None = None):
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._random = rng or random.Random()
        self._by_id: dict[int, FetchSession] = {}
        self._id_by_replica: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def open(self, replica_id: int, listed: Iterable) -> FetchSession:
        """A new session for `replica_id` holding the `listed` partitions of its full Fetch;
        the replica's previous session, if any, is closed."""
        with self._lock:
            # Random, as Kafka's: a follower holding the id of a restarted leader's old
            # session is then told NOT_FOUND, not taken for another's session.
            session_id = self._random.randrange(1, EPOCH_MAX)
            while session_id in self._by_id:
                session_id = self._random.randrange(1, EPOCH_MAX)
            old_id = self._id_by_replica.pop(replica_id, None)
            dropped = self._by_id.pop(old_id, None) if old_id is not None else None
            session = FetchSession(session_id, replica_id)
            session.apply(listed, ())
            self._by_id[session_id] = session
            self._id_by_replica[replica_id] = session_id
        self._dropped(dropped)
        return session

    def _dropped(self, session: FetchSession | None) -> None:
        if session is not None and self._on_drop is not None:
            self._on_drop(session)

    def resume(self, session_id: int, epoch: int, replica_id: int) -> FetchSession:
        """The session for an incremental Fetch at `epoch`, whose epoch then moves on; raises
        EosError FETCH_SESSION_ID_NOT_FOUND or INVALID_FETCH_SESSION_EPOCH."""
        with self._lock:
            session = self._by_id.get(session_id)
            if session is None or session.replica_id != replica_id:
                raise EosError(f"fetch session {session_id} of broker {replica_id} is not known here "
                               f"(this leader restarted, or the follower opened another)",
                               ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
            if epoch != session.epoch:
                raise EosError(f"fetch session {session_id}: epoch {epoch}, expected {session.epoch}",
                               ErrorCode.INVALID_FETCH_SESSION_EPOCH)
            session.epoch = next_epoch(epoch)
        return session

    def is_current(self, session: FetchSession) -> bool:
        """False once `session` was replaced or closed: a Fetch still running on it (a late
        request, a fetcher thread being replaced) must report nothing more."""
        return self._by_id.get(session.session_id) is session

    def close(self, session_id: int) -> None:
        with self._lock:
            session = self._by_id.pop(session_id, None)
            if session is not None and self._id_by_replica.get(session.replica_id) == session_id:
                del self._id_by_replica[session.replica_id]
        self._dropped(session)
