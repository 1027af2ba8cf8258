"""Where records wait to be sent: per-partition queues of batches, and their futures.

Theory of operation
-------------------
`send()` and `send_batch()` run on application threads; the sender runs on its own thread.
The `RecordAccumulator` is what they share, behind one lock held only for list appends:

- Each partition has a deque of `ProducerBatch`es in the order their records were
  appended. Only the tail may be *open* (still taking records). A batch is *sealed* when
  the next record would take it past batch.size (an estimate of its encoded size), when
  the sender drains it, or when a bulk append fills it.
- An open batch is plain Python lists (values, timestamps; keys and headers only once a
  record has one). Appending a record is two list appends under the lock; encoding
  happens once per batch on the sender thread, with `BatchBuilder.append_many`
  (per-record work as cheap as Python allows, and off the application's thread).
- send()'s path is the hot one: one record per call, so every attribute lookup and call
  counts. The accumulator keeps the open batch each per-record append last used, by
  topic for the sticky partition and by (topic, partition) for an explicit one
  (`_append_tails`); while that batch is open and has room, an append is a dict lookup,
  a size check and two list appends. Everything else (a new batch, a switch of sticky
  partition, buffer memory) takes the general path. Only an open batch takes records,
  and an open batch is always the tail of its partition's deque, so a cached batch
  that is still open is the right one. produce()'s commonest record (a bytes value and
  nothing else, from a producer without a partitioner or transaction) has a shorter path
  still, `append_to_open_tail`: no partition count, no future, one call from produce(),
  and the general path only when the topic's open batch is missing, full, or holds keys
  or headers (a record there would have to add its own). A record's on_delivery is
  kept only where it differs from the previous record's (runs of one callback), so the
  usual producer, which passes the same callback every time, allocates nothing per
  record for it.
- Memory: each new batch reserves max(batch.size, its first record) bytes of
  buffer.memory (a bulk batch: the bytes it is made to hold) until it is delivered or
  failed; the reservation is also the batch's capacity. When the buffer is full, appends
  wait up to max.block.ms for space, then raise `BufferExhaustedError` (Kafka's
  BufferExhaustedException).
- Backlog: a sealed batch the sender has not taken yet is work the sender is behind on
  (its records are encoded when it is taken). An application that appends faster than the
  sender sends would fill all of buffer.memory with such batches, and every record would
  then wait behind 32 MiB of others: a flush, a commit_transaction, pays for all of it
  (measured flat out: commit 34-74 ms with the whole buffer queued, 4-6 ms with a sixteenth,
  at the same records/s). So a new batch also waits while the backlog holds
  `backlog_bytes_max` (buffer.memory / BACKLOG_SHARE_OF_BUFFER, at least batch.size), until
  the sender has taken it down to half of that. Open batches do not count (a producer
  writing to many partitions has one open in each), nor do batches in flight (what keeps
  a distant broker busy still has all of buffer.memory). The bound paces; it never fails
  an append: the wait ends at max.block.ms (so max.block.ms=0 never waits), and there is
  none while the sender has taken nothing for BACKLOG_STALL_MS (held up by a missing
  leader, a quota, a broker down: then appends fill buffer.memory as in Kafka, and only a
  full buffer raises `BufferExhaustedError`).
- Readiness: the head batch of a partition is ready when it is sealed, or linger.ms has
  passed since it was opened, or a flush or close is in progress -- and its retry backoff
  (if it is a retry) has passed. `drain` hands ready head batches to the sender, which
  decides per batch whether it can take it now (a leader is known, the broker has a free
  request slot, idempotence allows another unacknowledged batch).
- Retries go back into their partition's deque *in append order* (`creation_index`),
  ahead of younger batches, so a retried batch is resent before anything that followed it.
- Waking the sender: whatever gives it work (a new or sealed batch, a flush, a close, a
  posted answer) sets `wakeup`, an `eos.wakeup.Wakeup`. While the sender also waits for
  answers on sockets it reads itself (direct produce streams), it sleeps in poll() on those
  sockets and the Wakeup's pipe, and set() writes one byte to the pipe -- only while the
  sender sleeps, so appends pay the write only then.

The batches and their futures are in `producer/batch.py`.
"""
from __future__ import annotations

import bisect
import collections
import itertools
import logging
import threading
from typing import Callable, Sequence

from eos.errors import EosError, ErrorCode, RequestTimedOutError
from eos.wakeup import Wakeup
from producer.batch import BATCH_HEADER_BYTES, ProducerBatch, RecordFuture, _BulkCompletion, _Segment

log = logging.getLogger("eos.producer")

# The backlog of sealed, untaken batches an append may add to: this share of buffer.memory
# (see the module doc, "Backlog").
BACKLOG_SHARE_OF_BUFFER = 16
# A sender that took no batch for this long is held up (no leader, a quota, a broker down),
# not slow: the backlog then paces nobody.
BACKLOG_STALL_MS = 500

class BufferExhaustedError(RequestTimedOutError):
    """buffer.memory stayed full for max.block.ms (Kafka's BufferExhaustedException)."""


class ProducerClosedError(EosError):
    """The producer was closed before the record could be delivered."""


class RecordAccumulator:
    """Per-partition batch queues shared by application threads and the sender."""

    def __init__(self, *, batch_size: int, buffer_memory: int, linger_ms: int, max_block_ms: int,
                 sticky, clock: Callable[[], int], report_only_errors: bool = False):
        self.batch_size = batch_size
        self.report_only_errors = report_only_errors
        self.buffer_memory = buffer_memory
        self.linger_ms = linger_ms
        self.max_block_ms = max_block_ms
        self._sticky = sticky
        self._clock = clock
        self.lock = threading.Lock()
        self.wakeup = Wakeup()      # the sender waits on this (set: it has something to do)
        self._space = threading.Condition(self.lock)      # appenders wait for buffer memory
        self._backlog_drop = threading.Condition(self.lock)   # ... or for the sender to catch up
        self.backlog_bytes_max = max(buffer_memory // BACKLOG_SHARE_OF_BUFFER, batch_size)
        self._backlog_bytes = 0       # sum of the queued batches' backlog_bytes
        self._backlog_waiters = 0
        self.backlog_stall_ms = BACKLOG_STALL_MS
        self._last_taken_ms = -BACKLOG_STALL_MS   # when drain last took a batch (clock ms)
        self._deques: dict[tuple, collections.deque] = {}
        self._creation_counter = itertools.count()
        self._available_bytes = buffer_memory
        self._incomplete: dict[ProducerBatch, None] = {}  # insertion-ordered set
        self._flushes_in_progress = 0
        self.closing = False
        self.closed = False
        self._drain_start = 0
        # The open batch the last per-record append of a topic's sticky partition (key:
        # topic) or of an explicit partition (key: (topic, partition)) went to; see the
        # module doc. Entries are hints: a sealed batch here means "take the general path".
        self._append_tails: dict = {}
        self.drain_passes = 0     # drain() calls so far: lets tests wait for the sender to look
        self.posted: collections.deque = collections.deque()  # finished RPCs, for the sender

    # ---- appending (application threads) ---------------------------------------------------

    def _new_batch_locked(self, topic: str, partition: int, first_record_bytes: int,
                          deadline_ms: int | None, reserve_bytes: int | None = None) -> ProducerBatch:
        # A batch's reservation is also its capacity: records go in while they fit in it.
        reserve = max(reserve_bytes or self.batch_size, first_record_bytes + BATCH_HEADER_BYTES)
        if reserve > self.buffer_memory:
            raise EosError(
                f"a record of about {first_record_bytes} bytes is larger than buffer.memory "
                f"({self.buffer_memory} bytes)", ErrorCode.MESSAGE_TOO_LARGE)
        backlog_limit = self.backlog_bytes_max
        while True:
            short_of_memory = self._available_bytes < reserve
            if not short_of_memory and self._backlog_bytes < backlog_limit:
                break
            now_ms = self._clock()
            if deadline_ms is None:
                deadline_ms = now_ms + self.max_block_ms
            remaining_ms = deadline_ms - now_ms
            if short_of_memory:
                if remaining_ms <= 0:
                    raise BufferExhaustedError(
                        f"failed to allocate {reserve} bytes within max.block.ms ({self.max_block_ms} ms): "
                        f"buffer.memory ({self.buffer_memory} bytes) is full of undelivered batches")
                self._space.wait(remaining_ms / 1000)
            else:
                # The backlog paces the application only while the sender is taking batches,
                # and only within max.block.ms: it never fails an append (only a full buffer
                # does), and a sender held up (no leader, a quota) lets appends fill the
                # buffer as in Kafka.
                stall_left_ms = self._last_taken_ms + self.backlog_stall_ms - now_ms
                if remaining_ms <= 0 or stall_left_ms <= 0:
                    break
                # Resume at half: one wake-up lets many batches in, not one per batch taken.
                backlog_limit = self.backlog_bytes_max // 2
                self._backlog_waiters += 1
                try:
                    self._backlog_drop.wait(min(remaining_ms, stall_left_ms) / 1000)
                finally:
                    self._backlog_waiters -= 1
            self._check_open()   # closed while we waited
        self._available_bytes -= reserve
        batch = ProducerBatch(topic, partition, next(self._creation_counter), self._clock(), reserve)
        batch.report_only_errors = self.report_only_errors
        dq = self._deques.get(batch.tp)
        if dq is None:
            dq = self._deques[batch.tp] = collections.deque()
        elif dq:
            # Another thread may have opened a batch while we waited for memory: only the
            # tail takes records, so the one before it is complete.
            self._seal_locked(dq[-1])
        dq.append(batch)
        self._incomplete[batch] = None
        # A new batch starts a linger timer the sender may not know about yet.
        self.wakeup.set()
        return batch

    def _seal_locked(self, batch: ProducerBatch) -> None:
        """Seal a queued batch (it takes no more records): it joins the backlog."""
        if not batch.sealed:
            batch.sealed = True
            # A head that absorbed sealed followers already counts their bytes.
            self._backlog_bytes += batch.size_estimate_bytes - batch.backlog_bytes
            batch.backlog_bytes = batch.size_estimate_bytes

    def _leave_backlog_locked(self, batch: ProducerBatch) -> None:
        """The batch left the queue (taken, expired, aborted, finished)."""
        if batch.backlog_bytes:
            self._backlog_bytes -= batch.backlog_bytes
            batch.backlog_bytes = 0
            if self._backlog_waiters and self._backlog_bytes < self.backlog_bytes_max // 2:
                self._backlog_drop.notify_all()

    def _check_open(self) -> None:
        if self.closing or self.closed:
            raise ProducerClosedError("cannot send after the producer is closed")

    def _open_tail(self, tp) -> ProducerBatch | None:
        dq = self._deques.get(tp)
        if dq:
            batch = dq[-1]
            if not batch.sealed:
                return batch
        return None

    def _batch_with_room_locked(self, topic: str, partition: int, sticky: bool, partition_count: int,
                                record_bytes: int, deadline_ms: int | None,
                                reserve_bytes: int | None = None) -> ProducerBatch:
        """The open batch that takes a record of `record_bytes` (a new one, reserving
        `reserve_bytes` or batch.size, if needed; a batch always takes its first record,
        whatever its size)."""
        batch = self._open_tail((topic, partition))
        if batch is not None:
            if batch.size_estimate_bytes + record_bytes <= batch.reserved_bytes or not batch.values:
                return batch
            self._seal_locked(batch)
        if sticky:
            # KIP-480: needing a new batch is the moment to move to another partition.
            partition = self._sticky.switch(topic, partition_count)
            batch = self._open_tail((topic, partition))
            if batch is not None:
                if batch.size_estimate_bytes + record_bytes <= batch.reserved_bytes or not batch.values:
                    return batch
                self._seal_locked(batch)
        return self._new_batch_locked(topic, partition, record_bytes, deadline_ms, reserve_bytes)

    def append(self, topic: str, partition: int | None, partition_count: int, value, key,
               headers, timestamp_ms: int, record_bytes: int, on_delivery,
               want_future: bool = True) -> RecordFuture | None:
        """Add one record; partition None means the topic's sticky partition. Returns the
        record's future, or None when `want_future` is false (Producer.produce).

        The hot path of send(): see the module doc for the cached open batch."""
        # acquire/try/finally rather than `with`: on CPython 3.11 `with` on a Lock costs
        # about twice as much (0.3 against 0.15 us), and this runs once per record.
        lock = self.lock
        lock.acquire()
        try:
            if self.closing or self.closed:
                raise ProducerClosedError("cannot send after the producer is closed")
            batch = self._append_tails.get(topic if partition is None else (topic, partition))
            if (batch is None or batch.sealed or batch.size_estimate_bytes + record_bytes > self.batch_size
                    or batch.partition >= partition_count):
                batch = self._append_tail_locked(topic, partition, partition_count, record_bytes)
            values = batch.values
            index = len(values)
            values.append(value)
            batch.timestamps_ms.append(timestamp_ms)
            if key is not None or batch.keys is not None:
                batch.add_key(index, key)
            if headers is not None or batch.headers is not None:
                batch.add_headers(index, headers)
            batch.size_estimate_bytes += record_bytes
            if on_delivery is not batch.run_callback:
                batch.add_record_callback(index, on_delivery)
            if batch.size_estimate_bytes >= self.batch_size:
                self._seal_locked(batch)
                self.wakeup.set()
        finally:
            lock.release()
        return RecordFuture(batch, index) if want_future else None

    def append_to_open_tail(self, topic: str, value: bytes, timestamp_ms: int, record_bytes: int,
                            on_delivery) -> bool:
        """Producer.produce()'s shortest path: add a keyless, headerless record to the open
        batch of `topic`'s sticky partition if there is one with room, and say whether it
        did. False changes nothing: the caller takes the general path (append)."""
        lock = self.lock
        lock.acquire()
        try:
            batch = self._append_tails.get(topic)
            if (batch is None or batch.sealed or batch.keys is not None or batch.headers is not None
                    or batch.size_estimate_bytes + record_bytes > self.batch_size
                    or self.closing or self.closed):
                return False
            batch.values.append(value)
            batch.timestamps_ms.append(timestamp_ms)
            batch.size_estimate_bytes += record_bytes
            if on_delivery is not batch.run_callback:
                batch.add_record_callback(len(batch.values) - 1, on_delivery)
            if batch.size_estimate_bytes >= self.batch_size:
                self._seal_locked(batch)
                self.wakeup.set()
            return True
        finally:
            lock.release()

    def _append_tail_locked(self, topic: str, partition: int | None, partition_count: int,
                            record_bytes: int) -> ProducerBatch:
        """append()'s general path: the open batch that takes the record (switching the
        sticky partition or opening a batch as needed), remembered for the next append."""
        sticky = partition is None
        if sticky:
            partition = self._sticky.current(topic, partition_count)
        batch = self._open_tail((topic, partition))
        if batch is None or (batch.size_estimate_bytes + record_bytes > self.batch_size and batch.values):
            batch = self._batch_with_room_locked(topic, partition, sticky, partition_count,
                                                 record_bytes, None)
        # A bulk batch may have known its one timestamp; per-record appends do not keep it.
        batch.single_timestamp_ms = None
        self._append_tails[topic if sticky else (topic, batch.partition)] = batch
        return batch

    def append_many(self, topic: str, partition: int | None, partition_count: int,
                    values: list, keys: list | None, timestamps_ms: list, headers: list | None,
                    record_sizes: list[int], positions: Sequence[int] | None,
                    bulk: _BulkCompletion, single_timestamp_ms: int = -1,
                    batch_bytes_max: int = 0) -> None:
        """Add many records to one partition (or to the sticky partitions, switching at
        each new batch); `positions` says where each record sits in the caller's call.
        `single_timestamp_ms` is the timestamp of every record when they share one.

        New batches hold up to max(batch.size, `batch_bytes_max`) bytes (the bulk path's
        larger batches: one request, one sequence range and one append per batch, where
        per-batch costs dominate in Python); each reserves the buffer memory it holds.
        Records go into an open batch left by send() only up to its own reservation."""
        count = len(values)
        if positions is None:
            positions = range(count)
        cumulative = list(itertools.accumulate(record_sizes))
        start = 0
        new_batch_bytes_max = max(self.batch_size, batch_bytes_max)
        deadline_ms = self._clock() + self.max_block_ms
        with self.lock:
            self._check_open()
            sticky = partition is None
            if sticky:
                partition = self._sticky.current(topic, partition_count)
            while start < count:
                consumed_before = cumulative[start - 1] if start else 0
                reserve = max(self.batch_size, min(new_batch_bytes_max,
                                                   cumulative[-1] - consumed_before + BATCH_HEADER_BYTES))
                batch = self._batch_with_room_locked(topic, partition, sticky, partition_count,
                                                     record_sizes[start], deadline_ms, reserve)
                partition = batch.partition
                room = batch.reserved_bytes - batch.size_estimate_bytes
                # The records that fit; at least one (a record over batch.size goes alone).
                end = bisect.bisect_right(cumulative, consumed_before + room, lo=start)
                if end <= start:
                    end = start + 1
                batch_start = len(batch.values)
                if batch.run_callback is not None:
                    # A bulk call's records report through its own future, not the
                    # on_delivery of the produce() calls before them in this batch.
                    batch.add_record_callback(batch_start, None)
                batch.values.extend(values[start:end])
                batch.timestamps_ms.extend(timestamps_ms[start:end])
                if not batch_start:
                    batch.single_timestamp_ms = single_timestamp_ms
                elif batch.single_timestamp_ms != single_timestamp_ms:
                    batch.single_timestamp_ms = -1
                if keys is not None:
                    if batch.keys is None:
                        batch.keys = [None] * batch_start
                    batch.keys.extend(keys[start:end])
                elif batch.keys is not None:
                    batch.keys.extend(itertools.repeat(None, end - start))
                if headers is not None:
                    if batch.headers is None:
                        batch.headers = [None] * batch_start
                    batch.headers.extend(headers[start:end])
                elif batch.headers is not None:
                    batch.headers.extend(itertools.repeat(None, end - start))
                batch.size_estimate_bytes += cumulative[end - 1] - consumed_before
                bulk.watch(_Segment(batch, batch_start, end - start, positions[start:end]))
                if end < count or batch.size_estimate_bytes >= self.batch_size:
                    self._seal_locked(batch)
                    self.wakeup.set()
                start = end

    # ---- flush and close (application threads) --------------------------------------------

    def begin_flush(self) -> list[ProducerBatch]:
        """Make every batch ready now; returns the batches the flush waits for."""
        with self.lock:
            self._flushes_in_progress += 1
            self.wakeup.set()
            return list(self._incomplete)

    def end_flush(self) -> None:
        with self.lock:
            self._flushes_in_progress -= 1

    def begin_close(self) -> None:
        with self.lock:
            self.closing = True
            self.wakeup.set()

    def incomplete_batches(self) -> list[ProducerBatch]:
        with self.lock:
            return list(self._incomplete)

    @property
    def has_incomplete(self) -> bool:
        return bool(self._incomplete)

    # ---- the sender's side ---------------------------------------------------------------

    def post(self, item) -> None:
        """From any thread (gRPC callbacks): hand something to the sender and wake it."""
        with self.lock:
            self.posted.append(item)
            self.wakeup.set()

    def wait_for_work(self, timeout_s: float, readable_fds: Sequence[int] = ()) -> list:
        """Sender: sleep until woken, `timeout_s` passed, or (when given) one of
        `readable_fds` can be read; returns what was posted meanwhile."""
        if timeout_s > 0:
            self.wakeup.wait(timeout_s, readable_fds)
        # Cleared before the sender looks at anything: work that comes after this sets it
        # again for the next sleep; work that came before is what the sender now handles.
        self.wakeup.clear()
        with self.lock:
            posted = list(self.posted)
            self.posted.clear()
            return posted

    def drain(self, now_ms: int, take: Callable[[ProducerBatch], bool],
              batch_bytes_max: Callable[[str], int] | None = None) -> tuple[list[ProducerBatch], int]:
        """Pop ready head batches that `take(batch)` accepts, head first per partition.

        With `batch_bytes_max` (topic -> bytes), a head batch that was never sent first
        absorbs the sealed, never-sent batches queued behind it, up to that size: when a
        partition has a backlog (its in-flight window is full, or the sender fell
        behind), it goes out as fewer, larger batches. A batch costs a request (one batch
        per partition per request for idempotence), a sequence range and a broker append
        whatever its size; under backlog, waiting batches gain nothing by staying small.

        Returns (batches, next_ready_ms): the earliest time a batch left behind becomes
        ready by itself (linger or backoff), or a large number when none will.
        """
        taken: list[ProducerBatch] = []
        next_ready_ms = now_ms + 3_600_000
        with self.lock:
            self.drain_passes += 1
            force = self._flushes_in_progress > 0 or self.closing
            deques = list(self._deques.values())
            if not deques:
                return taken, next_ready_ms
            # Start at a different partition each time, so that when take() runs out of
            # request slots no partition is always the one left behind.
            self._drain_start = (self._drain_start + 1) % len(deques)
            for dq in itertools.chain(deques[self._drain_start:], deques[:self._drain_start]):
                while dq:
                    batch = dq[0]
                    if batch.attempts and batch.retry_after_ms > now_ms:
                        next_ready_ms = min(next_ready_ms, batch.retry_after_ms)
                        break
                    if not (batch.sealed or force or batch.attempts):
                        linger_end_ms = batch.created_ms + self.linger_ms
                        if linger_end_ms > now_ms:
                            next_ready_ms = min(next_ready_ms, linger_end_ms)
                            break
                    if (batch_bytes_max is not None and len(dq) > 1 and not batch.attempts
                            and batch.base_sequence < 0):
                        self._absorb_followers_locked(dq, batch_bytes_max(batch.topic))
                    if not take(batch):
                        break
                    batch.sealed = True
                    dq.popleft()
                    self._leave_backlog_locked(batch)
                    taken.append(batch)
            if taken:
                self._last_taken_ms = now_ms
        return taken, next_ready_ms

    @staticmethod
    def _absorb_followers_locked(dq: collections.deque, limit_bytes: int) -> None:
        head = dq[0]
        while len(dq) > 1:
            follower = dq[1]
            if (not follower.sealed or follower.attempts or follower.base_sequence >= 0
                    or head.size_estimate_bytes + follower.size_estimate_bytes - BATCH_HEADER_BYTES > limit_bytes):
                return
            head.absorb(follower)
            head.backlog_bytes += follower.backlog_bytes    # still queued, inside the head
            follower.backlog_bytes = 0
            del dq[1]

    def reenqueue(self, batch: ProducerBatch) -> None:
        """Put a batch back for a retry, ahead of every younger batch of its partition."""
        with self.lock:
            dq = self._deques.get(batch.tp)
            if dq is None:
                dq = self._deques[batch.tp] = collections.deque()
            position = 0
            for position, queued in enumerate(dq):
                if queued.creation_index > batch.creation_index:
                    break
            else:
                position = len(dq)
            dq.insert(position, batch)
            self.wakeup.set()

    def expire(self, now_ms: int, delivery_timeout_ms: int) -> list[ProducerBatch]:
        """Pop queued batches older than delivery.timeout.ms (none of them is in flight)."""
        expired = []
        with self.lock:
            for dq in self._deques.values():
                while dq and now_ms - dq[0].created_ms >= delivery_timeout_ms:
                    batch = dq.popleft()
                    batch.sealed = True
                    self._leave_backlog_locked(batch)
                    expired.append(batch)
        return expired

    def queued_batches(self) -> list[ProducerBatch]:
        with self.lock:
            return [batch for dq in self._deques.values() for batch in dq]

    def clear_sequences(self) -> None:
        """After an epoch bump: every queued batch gets a fresh sequence when drained."""
        with self.lock:
            self.clear_sequences_locked()

    def clear_sequences_locked(self) -> None:
        """clear_sequences() for a caller that holds the lock (a drain's `take`)."""
        for dq in self._deques.values():
            for batch in dq:
                batch.clear_sequence()

    def abort_queued(self, exception: BaseException) -> list[ProducerBatch]:
        """Pop every queued batch (for a forced close); the caller fails them."""
        with self.lock:
            batches = [batch for dq in self._deques.values() for batch in dq]
            for dq in self._deques.values():
                dq.clear()
            for batch in batches:
                batch.sealed = True
                self._leave_backlog_locked(batch)
            return batches

    def deallocate(self, batch: ProducerBatch) -> None:
        """The batch (and the batches it absorbed) is delivered or failed: give its memory back."""
        with self.lock:
            freed = False
            tails = self._append_tails
            for done in itertools.chain((batch,), (f for f, _ in batch.absorbed or ())):
                if self._incomplete.pop(done, False) is not False:
                    self._available_bytes += done.reserved_bytes
                    freed = True
                self._leave_backlog_locked(done)
                # A finished batch is sealed, so the append cache would only skip it; drop
                # it so the cache does not keep its records alive for the producer's life.
                for key in (done.topic, (done.topic, done.partition)):
                    if tails.get(key) is done:
                        del tails[key]
            if freed:
                self._space.notify_all()

    def mark_closed(self) -> None:
        """The sender stopped (it never waits again, so nothing writes to its pipe)."""
        with self.lock:
            self.closed = True
            self._space.notify_all()
            self._backlog_drop.notify_all()
        self.wakeup.close()

    def available_bytes(self) -> int:
        """buffer.memory not reserved by a batch (read without the lock: one int, for the
        buffer_available_bytes gauge at a scrape)."""
        return self._available_bytes

    def backlog_bytes(self) -> int:
        """Bytes of sealed batches the sender has not taken yet (see "Backlog")."""
        with self.lock:
            return self._backlog_bytes

    def has_queued(self) -> bool:
        with self.lock:
            return any(self._deques.values())
