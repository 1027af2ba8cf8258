"""A batch of records on its way to a partition, and the futures that are views of it.

Theory of operation
-------------------
A `ProducerBatch` is what the accumulator (`producer/accumulator.py`) queues for one
partition: plain Python lists of values and timestamps (keys and headers only once a record
has one) while it is open, the encoded payload once the sender builds it, and the outcome
(base offset or exception) once it is delivered or failed, which happens once, on the
sender thread, under the batch's Condition. A record's on_delivery is kept only where it
differs from the previous record's (runs of one callback).

Futures: a `ProducerBatch` is also the completion of all its records. `RecordFuture` is a
`concurrent.futures.Future` that stores only (batch, index): creating one costs no
Condition, no lock. Waiting, callbacks and `concurrent.futures.wait()` work through the
batch's one Condition. Callbacks (`add_done_callback`, `on_delivery`) run on the sender
thread, as Kafka's callbacks run on its I/O thread, so they must be quick.

`send_batch()`'s one future covers many batches: `_BulkCompletion` resolves it when the
last of them finishes, with a `SendBatchResult` (one RecordMetadata per record, in the
call's order, found through the `_Segment`s each batch holds).
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import Callable, NamedTuple, Sequence

from eos.errors import InvariantError

log = logging.getLogger("eos.producer")

# A v2 record adds a few bytes to its key and value (length, attributes, timestamp and
# offset deltas, header count); 16 is above what a record of a batch under 1 MiB needs
# unless its timestamp is far from the batch's first one.
RECORD_OVERHEAD_ESTIMATE_BYTES = 16
BATCH_HEADER_BYTES = 61
NO_OFFSET = -1
NO_TIMESTAMP = -1


class RecordMetadata(NamedTuple):
    """Where a record landed. offset is -1 when unknown (acks=0)."""

    topic: str
    partition: int
    offset: int
    timestamp: int


def record_size_estimate(value, key, headers) -> int:
    size = RECORD_OVERHEAD_ESTIMATE_BYTES
    if value is not None:
        size += len(value)
    if key is not None:
        size += len(key)
    if headers:
        for hkey, hvalue in headers:
            size += len(hkey) + 4 + (len(hvalue) if hvalue is not None else 0)
    return size


class ProducerBatch:
    """One batch of one partition: its records, its delivery state, and its sending state.

    Records are written by application threads under the accumulator lock until the batch
    is sealed; from then on the sender thread owns every field. Delivery (`complete` /
    `fail`) happens once, on the sender thread, under the batch's Condition.
    """

    __slots__ = (
        "topic", "partition", "tp", "creation_index", "created_ms",
        "values", "keys", "timestamps_ms", "headers", "size_estimate_bytes", "reserved_bytes",
        "sealed", "backlog_bytes", "single_timestamp_ms",
        "_condition", "_done", "base_offset", "log_append_time_ms", "exception",
        "_callback_runs", "run_callback", "_done_callbacks", "_watched_futures",
        "payload", "producer_id", "producer_epoch", "base_sequence",
        "attempts", "retry_after_ms", "last_error", "absorbed", "report_only_errors", "__weakref__",
    )

    def __init__(self, topic: str, partition: int, creation_index: int, created_ms: int,
                 reserved_bytes: int):
        self.topic = topic
        self.partition = partition
        self.tp = (topic, partition)
        self.creation_index = creation_index
        self.created_ms = created_ms
        self.values: list = []
        # keys and headers stay None while every record so far has none (most batches):
        # then an append does not pay for them; once one record has one, they are lists
        # aligned with values (None for records without).
        self.keys: list | None = None
        self.timestamps_ms: list = []
        self.headers: list | None = None
        self.size_estimate_bytes = BATCH_HEADER_BYTES
        self.reserved_bytes = reserved_bytes
        self.sealed = False
        # What this batch counts in its accumulator's backlog (sealed, not yet taken by the
        # sender): RecordAccumulator owns the count; 0 once taken, expired or aborted.
        self.backlog_bytes = 0
        # The one timestamp all records share (bulk appends know it), -1 when they differ,
        # None when nobody looked (per-record appends): the encoder finds out then.
        self.single_timestamp_ms = None
        self._condition = threading.Condition()
        self._done = False
        self.base_offset = NO_OFFSET
        self.log_append_time_ms = NO_TIMESTAMP
        self.exception: BaseException | None = None
        # on_delivery callbacks as runs, not one entry per record: a flat list
        # [first_index, callback, first_index, callback, ...] where each pair says "records
        # from first_index up to the next pair's have this callback" (None: no callback).
        # A producer mostly passes the same callback to every produce() call, so the usual
        # batch has one run and an append pays one identity test instead of a tuple (an
        # allocation the cyclic GC then tracks). `run_callback` is the last run's callback.
        self._callback_runs: list | None = None
        self.run_callback = None
        self._done_callbacks: list | None = None       # [callable()]
        self._watched_futures: list | None = None      # RecordFutures with waiters
        # delivery.report.only.error: on_delivery runs only for records that failed
        self.report_only_errors = False
        self.payload: bytes | None = None
        self.producer_id = -1
        self.producer_epoch = -1
        self.base_sequence = -1
        self.attempts = 0
        self.retry_after_ms = 0
        self.last_error: BaseException | None = None
        # Batches whose records this one took over before it was first sent (see
        # RecordAccumulator.drain), with the index of their first record in this one: they
        # are delivered or failed with it.
        self.absorbed: list[tuple[ProducerBatch, int]] | None = None

    def __repr__(self) -> str:
        return (f"ProducerBatch({self.topic}-{self.partition} #{self.creation_index}, "
                f"{self.record_count} records, seq {self.base_sequence}, attempts {self.attempts})")

    @property
    def record_count(self) -> int:
        return len(self.timestamps_ms)   # values are let go at delivery; timestamps stay

    def add_key(self, index: int, key) -> None:
        """Give record `index` (the last one appended) a key: the keys list is made on
        the first key."""
        if self.keys is None:
            self.keys = [None] * index
        self.keys.append(key)

    def add_headers(self, index: int, headers) -> None:
        if self.headers is None:
            self.headers = [None] * index
        self.headers.append(headers)

    @property
    def done(self) -> bool:
        return self._done

    def clear_sequence(self) -> None:
        """Forget sequence and bytes: the batch is rebuilt when next drained."""
        self.base_sequence = -1
        self.producer_id = -1
        self.producer_epoch = -1
        self.payload = None

    def metadata(self, index: int) -> RecordMetadata:
        base = self.base_offset
        timestamp = self.log_append_time_ms
        if timestamp == NO_TIMESTAMP:
            timestamp = self.timestamps_ms[index]
        return RecordMetadata(self.topic, self.partition, base + index if base >= 0 else NO_OFFSET,
                              timestamp)

    # ---- waiting and callbacks (any thread) ---------------------------------------------

    def wait(self, timeout: float | None) -> bool:
        if self._done:
            return True
        with self._condition:
            return self._condition.wait_for(lambda: self._done, timeout)

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call fn() when the batch is delivered or failed (now, if it already is)."""
        with self._condition:
            if not self._done:
                if self._done_callbacks is None:
                    self._done_callbacks = []
                self._done_callbacks.append(fn)
                return
        fn()

    def add_record_callback(self, index: int, on_delivery) -> None:
        """Record `index` (the last one appended) and those appended after it, until the
        next call, have `on_delivery` (None: no callback). Called only when the callback
        changes (`run_callback` is the current one); under the accumulator lock, before the
        batch is sealed."""
        if self._callback_runs is None:
            self._callback_runs = [index, on_delivery]
        else:
            self._callback_runs += (index, on_delivery)
        self.run_callback = on_delivery

    def _run_record_callbacks(self, runs: list, record_count: int, exception) -> None:
        """on_delivery(metadata, exception) for each record of each run with a callback."""
        for position in range(0, len(runs), 2):
            on_delivery = runs[position + 1]
            if on_delivery is None:
                continue
            end = runs[position + 2] if position + 2 < len(runs) else record_count
            for index in range(runs[position], end):
                try:
                    on_delivery(self.metadata(index), exception)
                except Exception:
                    log.exception("on_delivery callback raised for %s-%d", self.topic, self.partition)

    # ---- delivery (sender thread) ---------------------------------------------------------

    def complete(self, base_offset: int, log_append_time_ms: int = NO_TIMESTAMP) -> None:
        self._finish(base_offset, log_append_time_ms, None)

    def fail(self, exception: BaseException) -> None:
        self._finish(NO_OFFSET, NO_TIMESTAMP, exception)

    def _finish(self, base_offset: int, log_append_time_ms: int, exception) -> None:
        with self._condition:
            if self._done:
                raise InvariantError(f"{self!r} delivered twice")
            self.base_offset = base_offset
            self.log_append_time_ms = log_append_time_ms if log_append_time_ms is not None else NO_TIMESTAMP
            self.exception = exception
            self._done = True
            # Futures may outlive the send by far: keep only what RecordMetadata needs.
            self.values = self.keys = self.headers = None
            self.payload = None
            self._condition.notify_all()
            watched = self._watched_futures
            self._watched_futures = None
            if watched:
                for future in watched:
                    for waiter in future._waiters:
                        if exception is None:
                            waiter.add_result(future)
                        else:
                            waiter.add_exception(future)
            callback_runs = self._callback_runs
            done_callbacks = self._done_callbacks
            self._callback_runs = self._done_callbacks = None
        if callback_runs and (exception is not None or not self.report_only_errors):
            # Absorbed followers' records come after ours: they are the followers' to report.
            own_count = self.absorbed[0][1] if self.absorbed else len(self.timestamps_ms)
            self._run_record_callbacks(callback_runs, own_count, exception)
        if done_callbacks:
            for fn in done_callbacks:
                try:
                    fn()
                except Exception:
                    log.exception("done callback raised for %s-%d", self.topic, self.partition)
        if self.absorbed:
            for follower, first_index in self.absorbed:
                if not follower._done:
                    follower._finish(base_offset + first_index if base_offset >= 0 else base_offset,
                                     log_append_time_ms, exception)

    def absorb(self, follower: ProducerBatch) -> None:
        """Take over the records of `follower` (the next unsent batch of this partition)
        before this batch is first sent; the follower is delivered with this one."""
        first_index = len(self.timestamps_ms)
        follower_count = len(follower.timestamps_ms)
        self.values.extend(follower.values)
        self.timestamps_ms.extend(follower.timestamps_ms)
        if follower.keys is not None or self.keys is not None:
            self.keys = ((self.keys or [None] * first_index)
                         + (follower.keys or [None] * follower_count))
        if follower.headers is not None or self.headers is not None:
            self.headers = ((self.headers or [None] * first_index)
                            + (follower.headers or [None] * follower_count))
        if self.single_timestamp_ms is None or follower.single_timestamp_ms is None:
            self.single_timestamp_ms = None
        elif self.single_timestamp_ms != follower.single_timestamp_ms:
            self.single_timestamp_ms = -1
        self.size_estimate_bytes += follower.size_estimate_bytes - BATCH_HEADER_BYTES
        if self.absorbed is None:
            self.absorbed = []
        self.absorbed.append((follower, first_index))
        if follower.absorbed:
            self.absorbed.extend((f, first_index + i) for f, i in follower.absorbed)
            follower.absorbed = None
        # The follower keeps its timestamps for its records' metadata; the rest is ours now.
        follower.values = follower.keys = follower.headers = None
        follower.sealed = True


_PENDING = "PENDING"
_FINISHED = "FINISHED"


class RecordFuture(Future):
    """The future of one record: a view of its batch's completion.

    It never runs Future.__init__ (which builds a Condition per future); every method of
    Future is answered from the batch. `_condition`, `_state` and `_waiters` are provided so
    that `concurrent.futures.wait()` and `as_completed()` work too.
    """

    __slots__ = ("_batch", "_index", "_own_waiters")

    def __init__(self, batch: ProducerBatch, index: int):  # noqa: no super().__init__ on purpose
        self._batch = batch
        self._index = index
        self._own_waiters = None

    # What concurrent.futures.wait/as_completed read under the future's condition.
    @property
    def _condition(self):
        return self._batch._condition

    @property
    def _state(self):
        return _FINISHED if self._batch._done else _PENDING

    @property
    def _waiters(self):
        if self._own_waiters is None:
            batch = self._batch
            with batch._condition:
                if self._own_waiters is None:
                    self._own_waiters = []
                    if not batch._done:
                        if batch._watched_futures is None:
                            batch._watched_futures = []
                        batch._watched_futures.append(self)
        return self._own_waiters

    def __repr__(self) -> str:
        batch = self._batch
        if not batch._done:
            return f"<RecordFuture {batch.topic}-{batch.partition} pending>"
        if batch.exception is not None:
            return f"<RecordFuture {batch.topic}-{batch.partition} raised {type(batch.exception).__name__}>"
        return f"<RecordFuture {batch.topic}-{batch.partition} offset {self._metadata().offset}>"

    def _metadata(self) -> RecordMetadata:
        return self._batch.metadata(self._index)

    def cancel(self) -> bool:
        return False   # a record handed to the producer is sent; Kafka's futures cannot cancel

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self._batch._done

    def done(self) -> bool:
        return self._batch._done

    def result(self, timeout: float | None = None) -> RecordMetadata:
        batch = self._batch
        if not batch._done and not batch.wait(timeout):
            raise TimeoutError(f"record for {batch.topic}-{batch.partition} not delivered "
                               f"within {timeout} s")
        if batch.exception is not None:
            raise batch.exception
        return batch.metadata(self._index)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        batch = self._batch
        if not batch._done and not batch.wait(timeout):
            raise TimeoutError(f"record for {batch.topic}-{batch.partition} not delivered "
                               f"within {timeout} s")
        return batch.exception

    def add_done_callback(self, fn) -> None:
        self._batch.add_done_callback(lambda: fn(self))

    def set_running_or_notify_cancel(self) -> bool:
        raise RuntimeError("a RecordFuture is completed by the producer only")

    def set_result(self, result) -> None:
        raise RuntimeError("a RecordFuture is completed by the producer only")

    def set_exception(self, exception) -> None:
        raise RuntimeError("a RecordFuture is completed by the producer only")


class _Segment(NamedTuple):
    batch: ProducerBatch
    batch_start: int            # index of the first of these records in the batch
    count: int
    positions: Sequence[int]    # positions of these records in the send_batch call


class SendBatchResult(Sequence):
    """The RecordMetadata of every record of one send_batch() call, in the call's order.

    Built lazily: indexing creates the RecordMetadata asked for; nothing is created for a
    caller that only wants to know the call succeeded.
    """

    def __init__(self, segments: list[_Segment], record_count: int):
        self._segments = segments
        self._count = record_count
        self._where: list | None = None   # position -> (segment index, index in segment)

    def __len__(self) -> int:
        return self._count

    def _locate(self, position: int) -> tuple[_Segment, int]:
        if self._where is None:
            where = [None] * self._count
            for seg_index, seg in enumerate(self._segments):
                for i, pos in enumerate(seg.positions):
                    where[pos] = (seg_index, i)
            self._where = where
        seg_index, i = self._where[position]
        return self._segments[seg_index], i

    def __getitem__(self, position):
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(self._count))]
        if position < 0:
            position += self._count
        if not 0 <= position < self._count:
            raise IndexError("SendBatchResult index out of range")
        seg, i = self._locate(position)
        return seg.batch.metadata(seg.batch_start + i)

    def __iter__(self):
        for position in range(self._count):
            yield self[position]

    def offsets_by_partition(self) -> dict[tuple[str, int], list[tuple[int, int]]]:
        """{(topic, partition): [(first_offset, record_count), ...]} in append order."""
        out: dict = {}
        for seg in self._segments:
            base = seg.batch.base_offset
            out.setdefault(seg.batch.tp, []).append(
                (base + seg.batch_start if base >= 0 else NO_OFFSET, seg.count))
        return out


class _BulkCompletion:
    """Resolves one send_batch() future when all its segments' batches are done."""

    __slots__ = ("future", "segments", "record_count", "_pending", "_lock", "_error")

    def __init__(self, future: Future, record_count: int):
        self.future = future
        self.segments: list[_Segment] = []
        self.record_count = record_count
        self._pending = 1          # 1 for the append itself, released by `sealed()`
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def watch(self, segment: _Segment) -> None:
        self.segments.append(segment)
        with self._lock:
            self._pending += 1
        segment.batch.add_done_callback(lambda batch=segment.batch: self._one_done(batch))

    def sealed(self) -> None:
        """Every segment is watched: from now on the last batch to finish resolves it."""
        self._one_done(None)

    def _one_done(self, batch: ProducerBatch | None) -> None:
        with self._lock:
            if batch is not None and batch.exception is not None and self._error is None:
                self._error = batch.exception
            self._pending -= 1
            finished = self._pending == 0
        if finished:
            if self._error is not None:
                self.future.set_exception(self._error)
            else:
                self.future.set_result(SendBatchResult(self.segments, self.record_count))
