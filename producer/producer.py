"""`eos.Producer`: Kafka's KafkaProducer, over gRPC.

Theory of operation
-------------------
`send()` picks the partition (explicit, else partitioner.class, else murmur2 of the key
unless partitioner.ignore.keys, else the topic's sticky partition: producer/partitioner.py),
stamps the record's timestamp, and appends it to the partition's open batch in
the `RecordAccumulator`; it returns a `RecordFuture` at once. The `Sender` thread drains
ready batches, encodes each once, and sends them to the partition leaders in
ProduceRequests of many partitions; answers complete the futures (callbacks run on the
sender thread, as Kafka's do). `send_batch()` is the bulk path: one call appends many
records of one topic, a batch-size slice at a time, and returns one future for them all.

Transactions (`transactional_id=...`): init_transactions(), then per transaction
begin_transaction(), send()s, send_offsets_to_transaction() and commit_transaction() or
abort_transaction() -- or `with producer.transaction():`. The state machine is
`producer.transactions.TransactionManager`; the coordinator calls run on the calling
thread (`producer.coordinator`), the partition registrations on the sender thread. A
*participant* (`Producer.participant(...)`, or participant_of=) writes into another
producer's open transaction under an id of its own and never ends it.

Configuration uses Kafka's names and defaults, given as a dict of Kafka names
(`config={"linger.ms": 10}`) or as keyword arguments with dots turned into underscores
(`linger_ms=10`). Idempotence is on by default (acks=all, retries, up to 5 requests in
flight); as in Kafka >= 3.2, when enable.idempotence is *not* given and another setting
conflicts with it (acks=1, say), idempotence is quietly turned off, and when it *is* given
as true, the conflict is an error.

Metrics (`metrics=True`, or a prometheus_client CollectorRegistry): eos/client_metrics.py's
producer families, labelled with client.id (Kafka's default "producer-N", or
"producer-<transactional.id>", when none is given); counted by the sender per batch and per
request, and here per transaction.

Thread safety: a producer is meant to be shared by threads. Every method may be called
from any thread; appends serialise on the accumulator's lock for a few list appends.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import operator
import threading
import time
from concurrent.futures import Future
from time import time_ns as _time_ns
from typing import Callable, Iterable, Sequence

from eos import net
from eos.allocator import CLIENT_THRESHOLD_BYTES, keep_large_buffers_in_the_heap
from eos.client_config import channel_security
from eos.client_metrics import ProducerMetrics
from eos.errors import EosError, ErrorCode, MessageTooLargeError, Reaction
from eos.v1 import common_pb2, group_pb2, txn_pb2
from producer.accumulator import BufferExhaustedError, ProducerClosedError, RecordAccumulator
from producer.arguments import (as_bytes, bulk_records, check_headers, check_participant_of, group_fields,
                                offsets_to_commit, participant_partitions)
from producer.batch import (
    RECORD_OVERHEAD_ESTIMATE_BYTES,
    RecordFuture,
    RecordMetadata,
    SendBatchResult,
    _BulkCompletion,
    record_size_estimate,
)
from producer.config import resolve_producer_config
from producer.coordinator import CoordinatorCaller, first_partition_error
from producer.idempotence import IdempotenceState
from producer.partitioner import (
    NO_KEY_PARTITION,
    StickyPartitions,
    _numpy,
    checked_partition,
    make_partitioner,
    partition_for_key,
    partitions_by_partitioner,
    partitions_for_keys,
)
from producer.sender import Sender
from producer.transactions import (
    IllegalStateError,
    TransactionAbortedError,
    TransactionManager,
    TransactionTimeoutError,
    TxnState,
)

log = logging.getLogger("eos.producer")

__all__ = ["Producer", "RecordMetadata", "RecordFuture", "SendBatchResult",
           "BufferExhaustedError", "ProducerClosedError"]

# send_batch() builds batches of up to this many bytes (bounded by max.request.size and the
# topic's max.message.bytes): in Python a batch costs a request, a sequence range and an
# append on the broker whatever its size, so a bulk call of 100-byte records sent in
# 16 KiB batches spends most of its time per batch. 1 MiB is Kafka's default
# max.request.size and (nearly) max.message.bytes, so such a batch is always accepted.
BULK_BATCH_BYTES = 1024 * 1024
TIMESTAMP_DELTA_EXTRA_BYTES = 9
_client_numbers = itertools.count(1)


def _metrics_client_id(settings: dict) -> str:
    """The client_id label of a producer's metrics: client.id, else Kafka's default
    ("producer-<transactional.id>", or "producer-N" numbered in this process)."""
    if settings["client.id"]:
        return settings["client.id"]
    if settings["transactional.id"] is not None:
        return f"producer-{settings['transactional.id']}"
    return f"producer-{next(_client_numbers)}"


def _failed_future(error: BaseException) -> Future:
    future: Future = Future()
    future.set_exception(error)
    return future


def _positions_by_partition(partitions) -> list[tuple[int | None, list[int]]]:
    """(partition, the positions that go there in call order) for each partition in
    `partitions` (`partitions_for_keys`' answer); None for the keyless records' sticky
    partition. One stable sort when it is a numpy array, no Python loop per record."""
    if isinstance(partitions, list):
        groups: dict[int, list[int]] = {}
        for position, p in enumerate(partitions):
            group = groups.get(p)
            if group is None:
                group = groups[p] = []
            group.append(position)
        items = groups.items()
    else:
        np = _numpy()     # partitions is a numpy array: numpy is loaded
        order = np.argsort(partitions, kind="stable")
        present, starts = np.unique(partitions[order], return_index=True)
        ends = list(starts[1:].tolist()) + [len(order)]
        items = [(p, order[start:end].tolist())
                 for p, start, end in zip(present.tolist(), starts.tolist(), ends)]
    return [(None if p == NO_KEY_PARTITION else p, positions) for p, positions in items]


def _picker(positions: list[int]) -> Callable[[Sequence], Sequence]:
    """seq -> the items of seq at `positions`, in that order (one C call, not a Python
    loop per item)."""
    if len(positions) == 1:
        only = positions[0]
        return lambda seq: (seq[only],)
    return operator.itemgetter(*positions)


class Producer:
    """A thread-safe, by default idempotent, Kafka-style producer.

    ``Producer(bootstrap="127.0.0.1:9092", *, config=None, **kwargs)``
    """

    def __init__(self, bootstrap: str = net.DEFAULT_BOOTSTRAP, *, config: dict | None = None,
                 participant_of: tuple[int, int] | None = None, **kwargs):
        settings = resolve_producer_config(config, kwargs)
        # a batch's request (up to max.request.size) is built and freed again and again:
        # from the heap, not from fresh pages (eos/allocator.py)
        keep_large_buffers_in_the_heap(CLIENT_THRESHOLD_BYTES)
        if participant_of is not None:
            check_participant_of(participant_of, settings["transactional.id"])
        self._participant_of = participant_of
        self.config = settings
        if settings["bootstrap.servers"]:
            bootstrap = settings["bootstrap.servers"]
        self._bootstrap = net.parse_bootstrap(bootstrap)
        self._transactional_id = settings["transactional.id"]
        self._acks = settings["acks"]
        self._max_request_size = settings["max.request.size"]
        self._batch_size = max(1, settings["batch.size"])
        self._buffer_memory = settings["buffer.memory"]
        self._record_bytes_max = min(self._max_request_size, self._buffer_memory)
        self._max_block_ms = settings["max.block.ms"]
        self._ignore_keys = settings["partitioner.ignore.keys"]
        # partitioner.class, resolved once here (None: the built-in choice). Built before
        # any thread or connection starts, so a partitioner that fails to build fails the
        # constructor alone; the metadata it reads (round-robin's leaders) is looked up per call.
        self._partitioner = make_partitioner(settings["partitioner.class"], settings, self._topic_leaders)
        if self._partitioner is not None:
            # send() and produce() call self._append_one: with a partitioner.class, this
            # instance's is a step that asks it first. Chosen once, here, so the built-in
            # path pays no per-record check for the option (and stays a plain method call:
            # a bound method kept on the instance calls ~20 ns slower on CPython 3.11+).
            self._append_one = self._append_one_partitioned
        self._idempotent = settings["enable.idempotence"]
        backoff = net.Backoff(settings["retry.backoff.ms"], settings["retry.backoff.max.ms"])
        self._metadata = net.ClusterMetadata(
            self._bootstrap, request_timeout_ms=settings["request.timeout.ms"],
            retry_backoff_ms=settings["retry.backoff.ms"],
            retry_backoff_max_ms=settings["retry.backoff.max.ms"],
            metadata_max_age_ms=settings["metadata.max.age.ms"],
            security=channel_security(settings))
        # batch.size=0 means "no batching" in Kafka: every record is a batch of its own.
        self._accumulator = RecordAccumulator(
            batch_size=self._batch_size, buffer_memory=self._buffer_memory,
            linger_ms=settings["linger.ms"], max_block_ms=self._max_block_ms,
            sticky=StickyPartitions(), clock=net.now_ms,
            report_only_errors=settings["delivery.report.only.error"])
        self._txn: TransactionManager | None = None
        self._txn_lock = threading.Condition()
        if self._transactional_id is not None:
            participant = participant_of is not None
            self._txn = TransactionManager(
                self._transactional_id, participant=participant,
                partitions_added_by_produce=not participant and settings["transaction.version"] >= 2)
        self._transaction_timeout_ms = settings["transaction.timeout.ms"]
        self._request_timeout_ms = settings["request.timeout.ms"]
        self._coordinator = CoordinatorCaller(backoff=backoff, request_timeout_ms=settings["request.timeout.ms"])
        self._metrics: ProducerMetrics | None = None
        if settings["metrics"]:
            self._metrics = ProducerMetrics(settings["metrics"], _metrics_client_id(settings),
                                            buffer_total_bytes=self._buffer_memory,
                                            buffer_available_bytes=self._accumulator.available_bytes,
                                            backlog_bytes=self._accumulator.backlog_bytes)
        self._sender = Sender(
            accumulator=self._accumulator, metadata=self._metadata,
            idempotence=(IdempotenceState(first_batch_alone=self._txn is None) if self._idempotent else None),
            transactional_id=self._transactional_id or "",
            transaction_timeout_ms=self._transaction_timeout_ms,
            txn=self._txn, txn_lock=self._txn_lock,
            acks=self._acks, retries=settings["retries"], retry_backoff=backoff,
            request_timeout_ms=settings["request.timeout.ms"],
            delivery_timeout_ms=settings["delivery.timeout.ms"],
            max_in_flight=settings["max.in.flight.requests.per.connection"],
            max_request_size=self._max_request_size, compression=settings["compression.type"],
            client_id=settings["client.id"], batch_bytes_max=self._bulk_batch_bytes, metrics=self._metrics)
        self._close_lock = threading.Lock()
        self._closed = False
        # produce()'s shortest path is open to this producer (see produce): no
        # partitioner.class to ask, no transaction to check, not closed.
        self._plain_appends = self._partitioner is None and self._txn is None
        self._sender.start()

    # ---- metadata ------------------------------------------------------------------------

    def _partition_count(self, topic: str) -> int:
        count = self._metadata.partition_count(topic)
        if count is None:
            if not isinstance(topic, str) or not topic:
                raise TypeError(f"topic must be a non-empty str, got {topic!r}")
            count = self._metadata.wait_for_topic(topic, self._max_block_ms).partition_count
        return count

    def _topic_leaders(self, topic: str) -> tuple[int, ...] | None:
        info = self._metadata.topic(topic)
        return info.leaders if info is not None else None

    def partitions_for(self, topic: str) -> list[int]:
        """The partition ids of `topic` (waiting up to max.block.ms for its metadata)."""
        return list(range(self._partition_count(topic)))

    # ---- sending -------------------------------------------------------------------------

    def send(self, topic: str, value=None, key=None, partition: int | None = None, headers=None,
             timestamp_ms: int | None = None,
             on_delivery: Callable[[RecordMetadata, BaseException | None], None] | None = None
             ) -> Future:
        """Queue one record; returns a Future of its RecordMetadata.

        `on_delivery(metadata, exception)` runs on the sender thread once the record is
        acknowledged (exception None) or has failed (metadata.offset -1). Errors the
        producer can name before sending (too large, topic unknown after max.block.ms,
        buffer full for max.block.ms) come back as an already failed future, as in Kafka;
        wrong argument types raise at once.
        """
        self._check_can_send()
        try:
            return self._append_one(topic, value, key, partition, headers, timestamp_ms, on_delivery, True)
        except ProducerClosedError:
            raise
        except EosError as exc:
            if on_delivery is not None:
                try:
                    on_delivery(RecordMetadata(topic, -1 if partition is None else partition, -1,
                                               _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms),
                                exc)
                except Exception:
                    log.exception("on_delivery callback raised")
            return _failed_future(exc)

    def produce(self, topic: str, value=None, key=None, partition: int | None = None, headers=None,
                timestamp_ms: int | None = None,
                on_delivery: Callable[[RecordMetadata, BaseException | None], None] | None = None) -> None:
        """Queue one record and return nothing, as confluent-kafka's produce() does: the
        per-record path without a Future. The outcome reaches `on_delivery(metadata,
        exception)` on the sender thread; flush() waits for every record. An error the
        producer can name before sending (too large, topic unknown after max.block.ms,
        buffer full for max.block.ms, the transaction's state) is raised here instead."""
        if (key is None and partition is None and headers is None and timestamp_ms is None
                and value.__class__ is bytes and self._plain_appends):
            # The commonest record (a bytes value and nothing else, no partitioner, no
            # transaction): straight into its topic's open sticky batch, if it has room.
            # The partition count is not looked up: the open batch's partition was chosen
            # under the count known when it opened, as a record appended then would be.
            size = RECORD_OVERHEAD_ESTIMATE_BYTES + len(value)
            if size <= self._record_bytes_max and self._accumulator.append_to_open_tail(
                    topic, value, _time_ns() // 1_000_000, size, on_delivery):
                return
        elif self._closed or self._txn is not None:     # the check without a call when it passes
            self._check_can_send()
        self._append_one(topic, value, key, partition, headers, timestamp_ms, on_delivery, False)

    def _check_can_send(self) -> None:
        if self._closed:
            raise ProducerClosedError("cannot send after the producer is closed")
        if self._txn is not None:
            with self._txn_lock:
                self._txn.check_send()

    def _append_one(self, topic: str, value, key, partition: int | None, headers, timestamp_ms: int | None,
                    on_delivery, want_future: bool) -> RecordFuture | None:
        """send() and produce(), after `_check_can_send`: check, partition and queue one record."""
        # One record per call: this is the hot path of a per-record producer, written for
        # the fewest lookups and calls in the common case (bytes value, no key, headers,
        # partition or timestamp); the general cases branch off it.
        if value.__class__ is not bytes and value is not None:
            value = as_bytes("value", value)
        if key is not None and key.__class__ is not bytes:
            key = as_bytes("key", key)
        if headers is not None:
            headers = check_headers(headers)
        if timestamp_ms is None:
            timestamp_ms = _time_ns() // 1_000_000
        elif isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0:
            raise ValueError(f"timestamp_ms must be a non-negative int, got {timestamp_ms!r}")
        count = self._metadata.partition_count(topic)
        if count is None:
            count = self._partition_count(topic)
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < count:
                raise ValueError(f"partition {partition!r} is not in the range [0...{count - 1}] "
                                 f"of topic {topic!r}")
        elif key is not None and not self._ignore_keys:
            partition = partition_for_key(key, count)
        if partition is not None and self._txn is not None:
            self._note_partition(topic, partition)
        if key is None and headers is None:
            size = RECORD_OVERHEAD_ESTIMATE_BYTES if value is None else RECORD_OVERHEAD_ESTIMATE_BYTES + len(value)
        else:
            size = record_size_estimate(value, key, headers)
        if size > self._record_bytes_max:
            self._raise_too_large(size)
        return self._accumulator.append(topic, partition, count, value, key, headers,
                                        timestamp_ms, size, on_delivery, want_future)

    def _append_one_partitioned(self, topic: str, value, key, partition: int | None, headers,
                                timestamp_ms: int | None, on_delivery, want_future: bool) -> RecordFuture | None:
        """`_append_one` of a producer with a partitioner.class (it replaces the method on the
        instance): unless the record names its partition, the partitioner chooses it from
        the record's bytes (checked: an int in range, else ValueError), and the record goes
        on as if it had named it."""
        if partition is None:
            if value.__class__ is not bytes and value is not None:
                value = as_bytes("value", value)
            if key is not None and key.__class__ is not bytes:
                key = as_bytes("key", key)
            count = self._metadata.partition_count(topic)
            if count is None:
                count = self._partition_count(topic)
            partition = self._partitioner.partition(topic, key, value, count)
            if partition.__class__ is not int or not 0 <= partition < count:
                partition = checked_partition(partition, count, topic, self._partitioner.name)
        return Producer._append_one(self, topic, value, key, partition, headers, timestamp_ms, on_delivery,
                                    want_future)

    def _raise_too_large(self, size: int) -> None:
        if size > self._max_request_size:
            raise MessageTooLargeError(
                f"the message is {size} bytes when serialized, which is larger than "
                f"max.request.size ({self._max_request_size})")
        raise MessageTooLargeError(
            f"the message is {size} bytes when serialized, which is larger than "
            f"buffer.memory ({self._buffer_memory})")

    def _note_partition(self, topic: str, partition: int) -> None:
        tp = (topic, partition)
        txn = self._txn
        if tp in txn.partitions_in_txn or txn.partitions_added_by_produce:   # common cases, without the lock
            return
        with self._txn_lock:
            newly_pending = txn.note_partition(tp)
        if newly_pending:
            self._sender.wake()

    def send_batch(self, topic: str, values: Sequence, keys: Sequence | None = None,
                   partition: int | None = None, timestamps_ms=None,
                   headers: Sequence | None = None) -> Future:
        """Queue many records of one topic in one call; returns one Future.

        `values` (and `keys`, `headers`, `timestamps_ms` when given as sequences) are
        aligned lists. `timestamps_ms` may also be one int for all records; None stamps
        them all with the time of the call. Partitioning is the same as send(): explicit
        `partition`, else partitioner.class asked for each record in order, else murmur2 of
        each key (unless partitioner.ignore.keys), else sticky partitions (a new partition
        for each batch). The records of one partition stay in the order given.

        Batch size: send_batch() builds batches of up to max(batch.size, 1 MiB bounded by
        max.request.size, the topic's max.message.bytes override and buffer.memory / 8),
        not batch.size. batch.size tunes how long send() waits to fill a batch; a bulk call
        has its records at hand, and in Python every batch costs a request slot, a
        sequence range and a broker append whatever its size, so 16 KiB batches of
        100-byte records would spend most of the call on per-batch work. Each batch still
        reserves the buffer memory it holds.

        The future's result is a `SendBatchResult`: a sequence of RecordMetadata in the
        order of `values`, built lazily (``result[i]``, iteration, ``len``), plus
        ``offsets_by_partition()``. If any batch fails, the future fails with the first
        error; the other batches may have been written.
        """
        self._check_can_send()
        values, keys, timestamps, single_timestamp_ms, headers = bulk_records(
            values, keys, timestamps_ms, headers, _time_ns() // 1_000_000)
        count = len(values)
        future: Future = Future()
        bulk = _BulkCompletion(future, count)
        if count == 0:
            bulk.sealed()
            return future
        try:
            partition_count = self._partition_count(topic)
            if partition is not None and (isinstance(partition, bool) or not isinstance(partition, int)
                                          or not 0 <= partition < partition_count):
                raise ValueError(f"partition {partition!r} is not in the range "
                                 f"[0...{partition_count - 1}] of topic {topic!r}")
            sizes = self._record_sizes(values, keys, headers)
            if single_timestamp_ms < 0:
                # Timestamps of their own may be far apart: a timestamp delta takes up to
                # 10 bytes, where the per-record estimate allows 1.
                sizes = [size + TIMESTAMP_DELTA_EXTRA_BYTES for size in sizes]
            largest = max(sizes)
            if largest > self._max_request_size:
                raise MessageTooLargeError(
                    f"a message is {largest} bytes when serialized, which is larger than "
                    f"max.request.size ({self._max_request_size})")
            acc = self._accumulator
            batch_bytes_max = self._bulk_batch_bytes(topic)
            if partition is not None and self._txn is not None:
                self._note_partition(topic, partition)
            if partition is not None or (self._partitioner is None and (keys is None or self._ignore_keys)):
                acc.append_many(topic, partition, partition_count, values, keys, timestamps, headers,
                                sizes, None, bulk, single_timestamp_ms, batch_bytes_max)
            else:
                if self._partitioner is not None:
                    chosen = partitions_by_partitioner(self._partitioner, topic, keys, values, partition_count)
                else:
                    chosen = partitions_for_keys(keys, partition_count)
                for p, positions in _positions_by_partition(chosen):
                    pick = _picker(positions)
                    acc.append_many(
                        topic, p, partition_count, pick(values), pick(keys) if keys is not None else None,
                        pick(timestamps),
                        pick(headers) if headers is not None else None, pick(sizes),
                        positions, bulk, single_timestamp_ms, batch_bytes_max)
        except ProducerClosedError:
            raise
        except EosError as exc:
            bulk._error = bulk._error or exc
        bulk.sealed()
        return future

    def _bulk_batch_bytes(self, topic: str) -> int:
        """The size of the batches send_batch() builds: max(batch.size, BULK_BATCH_BYTES
        bounded by max.request.size, the topic's max.message.bytes when it overrides the
        broker's, the topic's segment.bytes likewise (a batch must fit a segment), and an
        eighth of buffer.memory)."""
        limit = min(BULK_BATCH_BYTES, self._max_request_size, self._buffer_memory // 8)
        info = self._metadata.topic(topic)
        for name in ("max.message.bytes", "segment.bytes"):
            topic_max = info.configs.get(name) if info is not None else None
            if topic_max:
                try:
                    limit = min(limit, int(topic_max))
                except ValueError:
                    pass   # the broker validated it; an unreadable value leaves the other bounds
        return max(self._batch_size, limit)

    @staticmethod
    def _record_sizes(values: list, keys: list | None, headers: list | None) -> list[int]:
        # map() over C callables (len, int.__add__): no Python frame per record.
        overhead = record_size_estimate(None, None, None)
        if None in values:
            sizes = [overhead + (len(v) if v is not None else 0) for v in values]
        else:
            sizes = list(map(overhead.__add__, map(len, values)))
        if keys is not None:
            if None in keys:
                sizes = [s + (len(k) if k is not None else 0) for s, k in zip(sizes, keys)]
            else:
                sizes = list(map(operator.add, sizes, map(len, keys)))
        if headers is not None:
            sizes = [s + record_size_estimate(None, None, h) - overhead if h else s
                     for s, h in zip(sizes, headers)]
        return sizes

    # ---- flush and close -----------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now (ignoring linger.ms) and wait until each record sent
        before the call is acknowledged or failed. TimeoutError after `timeout` seconds.

        A participant's flush also raises when any of its records failed (the transaction
        error: TransactionAbortedError, or ProducerFencedError): when it returns, every
        record the participant sent is written into the owner's transaction."""
        self._flush(timeout)
        if self._txn is not None and self._txn.participant:
            with self._txn_lock:
                if self._txn.has_error:
                    self._txn.check_send()      # raises the error

    def _flush(self, timeout: float | None) -> None:
        batches = self._accumulator.begin_flush()
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            for batch in batches:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not batch.wait(remaining):
                    undelivered = sum(1 for b in batches if not b.done)
                    raise TimeoutError(f"flush: {undelivered} batch(es) still undelivered after {timeout} s")
        finally:
            self._accumulator.end_flush()

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (up to `timeout` seconds), then stop. Records still
        undelivered at the timeout fail with ProducerClosedError. Idempotent.

        A transactional producer (not a participant) with a transaction open aborts it
        first, as Kafka's does on a graceful close, so read_committed readers need not
        wait for transaction.timeout.ms to pass it."""
        with self._close_lock:
            if self._closed:
                return
            self._abort_open_transaction_on_close(timeout)
            self._closed = True
            self._plain_appends = False
        self._accumulator.begin_close()
        self._sender.join(timeout)
        if self._sender.is_alive():
            self._sender.force_close()
            self._sender.join()
        self._metadata.close()
        if self._metrics is not None:
            self._metrics.close()
        if self._partitioner is not None and self._partitioner.close is not None:
            try:
                self._partitioner.close()      # after the last send() could call it
            except Exception:
                log.exception("partitioner.class %s: close() raised", self._partitioner.name)

    def _abort_open_transaction_on_close(self, timeout: float | None) -> None:
        txn = self._txn
        if txn is None or txn.participant:
            return
        with self._txn_lock:
            open_transaction = txn.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.ABORTING)
        if not open_transaction:
            return
        log.info("closing %r with a transaction open: aborting it", self._transactional_id)
        try:
            self.abort_transaction(timeout)
        except Exception as exc:      # the coordinator will abort it at its timeout
            log.warning("aborting the open transaction of %r on close failed: %s", self._transactional_id, exc)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ---- transactions (issue 4) ----------------------------------------------------------

    def _transactions(self, what: str) -> TransactionManager:
        if self._txn is None:
            raise IllegalStateError(f"{what} needs a transactional producer: "
                                    f"Producer(..., transactional_id=...)")
        if self._closed:
            raise ProducerClosedError(f"cannot {what} after the producer is closed")
        return self._txn

    def _deadline_ms(self, timeout: float | None) -> int:
        return net.now_ms() + (self._max_block_ms if timeout is None else max(0, int(timeout * 1000)))

    def _producer_id_and_epoch(self) -> tuple[int, int]:
        # Changed only through _set_producer_id, which the application's transactional calls
        # run one at a time: a read here sees the pair the last of them set.
        return self._sender.producer_id_and_epoch()

    def _set_producer_id(self, producer_id: int, producer_epoch: int, timeout_ms: int, *,
                         wait: bool = False) -> None:
        """A new producer id/epoch (InitProducerId, EndTxn): sequences restart at 0 for every
        partition. Handed to the sender thread, which owns the sequences and takes it before
        it next sends (Sender.set_producer_id); `wait` until it has."""
        # The sender takes it within milliseconds; the caller's deadline may be spent on the
        # coordinator already, so this short step gets request.timeout.ms of its own.
        self._sender.set_producer_id(producer_id, producer_epoch,
                                     max(timeout_ms, self._request_timeout_ms) / 1000 if wait else None)

    def _on_coordinator_error(self, txn: TransactionManager, error: EosError, *, fatal_otherwise: bool) -> None:
        """Record what a coordinator's refusal does to the transaction, then the caller raises."""
        if error.retriable:
            return      # ran out of time on a passing condition: the same call again resumes
        with self._txn_lock:
            reaction = txn.error(error.code, str(error))
            if reaction is not Reaction.FATAL and fatal_otherwise:
                txn.fatal_error(error)

    def init_transactions(self, timeout: float | None = None, *,
                          partitions: Iterable[tuple[str, int]] | None = None) -> None:
        """Get the transactional.id's producer id and epoch from the coordinator
        (InitProducerId, with transaction.timeout.ms), which fences any earlier instance of
        the id and aborts its open transaction. Retries the coordinator's passing refusals
        (CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS) until `timeout` seconds
        (default max.block.ms), then TransactionTimeoutError (a TimeoutError) -- calling
        again resumes. A participant (participant_of=...) asks InitParticipant with its
        owner's id and epoch instead; `partitions` (participants only: (topic, partition)
        pairs) are registered by that same request, so their first batches need no
        AddPartitionsToTxn round trip."""
        txn = self._transactions("init_transactions()")
        registered = participant_partitions(partitions, self._participant_of is not None)
        with self._txn_lock:
            txn.begin_init()
        deadline_ms = self._deadline_ms(timeout)
        stub = self._metadata.txn_coordinator_stub(self._transactional_id)
        try:
            if self._participant_of is not None:
                owner_id, owner_epoch = self._participant_of
                answer = self._coordinator.call(
                    "InitParticipant", stub.InitParticipant,
                    txn_pb2.InitParticipantRequest(
                        transactional_id=self._transactional_id, producer_id=owner_id, producer_epoch=owner_epoch,
                        partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)
                                    for topic, partition in registered]),
                    deadline_ms)
            else:
                answer = self._coordinator.call(
                    "InitProducerId", stub.InitProducerId,
                    txn_pb2.InitProducerIdRequest(transactional_id=self._transactional_id,
                                                  transaction_timeout_ms=self._transaction_timeout_ms,
                                                  producer_id=-1, producer_epoch=-1),
                    deadline_ms)
        except EosError as error:
            self._on_coordinator_error(txn, error, fatal_otherwise=True)
            raise
        self._set_producer_id(answer.producer_id, answer.producer_epoch, deadline_ms - net.now_ms(), wait=True)
        with self._txn_lock:
            txn.init_done()
            if registered:
                txn.participant_partitions_registered(registered)

    def begin_transaction(self) -> None:
        """Start a transaction: every send until commit or abort belongs to it."""
        txn = self._transactions("begin_transaction()")
        with self._txn_lock:
            txn.begin_transaction()

    def send_offsets_to_transaction(self, offsets: dict, group_metadata, timeout: float | None = None) -> None:
        """Commit consumer offsets as part of the transaction: visible to the group when it
        commits, dropped when it aborts (KIP-98; KIP-447 fences a zombie by its generation).

        `offsets`: {TopicPartition (or (topic, partition)): next offset to read} (an int, or
        an object with .offset and optionally .metadata). `group_metadata`: the consumer's
        group_metadata() -- any object with group_id, generation_id, member_id and
        group_instance_id -- or a plain group id (generation -1: no fencing by generation).
        Sends AddOffsetsToTxn to the transaction coordinator, then TxnOffsetCommit to the
        group coordinator."""
        txn = self._transactions("send_offsets_to_transaction()")
        group_id, generation_id, member_id, instance_id = group_fields(group_metadata)
        to_commit = offsets_to_commit(offsets)
        with self._txn_lock:
            txn.check_send_offsets()
            txn.offsets_added()
        deadline_ms = self._deadline_ms(timeout)
        producer_id, producer_epoch = self._producer_id_and_epoch()
        try:
            self._coordinator.call(
                f"AddOffsetsToTxn for group {group_id!r}", self._metadata.txn_coordinator_stub(self._transactional_id).AddOffsetsToTxn,
                txn_pb2.AddOffsetsToTxnRequest(transactional_id=self._transactional_id, producer_id=producer_id,
                                               producer_epoch=producer_epoch, group_id=group_id),
                deadline_ms)
            with self._txn_lock:
                txn.offsets_confirmed()
            if to_commit:
                self._coordinator.call(
                    f"TxnOffsetCommit for group {group_id!r}", self._metadata.group_coordinator_stub(group_id).TxnOffsetCommit,
                    group_pb2.TxnOffsetCommitRequest(
                        transactional_id=self._transactional_id, group_id=group_id, producer_id=producer_id,
                        producer_epoch=producer_epoch, generation_id=generation_id, member_id=member_id,
                        group_instance_id=instance_id, offsets=to_commit),
                    deadline_ms, error_of=first_partition_error)
        except EosError as error:
            if error.code is ErrorCode.FENCED_INSTANCE_ID:
                # KIP-447: another instance of the static member owns the group's work now;
                # this transaction's offsets cannot commit, the producer itself is healthy.
                with self._txn_lock:
                    txn.abortable_error(error)
            else:
                self._on_coordinator_error(txn, error, fatal_otherwise=False)
            raise

    def commit_transaction(self, timeout: float | None = None, *,
                           accepted_participants: Iterable[int] | None = None) -> None:
        """Flush the transaction's records, then commit it (EndTxn): its records and offsets
        become visible to read_committed consumers together. If any record of the
        transaction failed, nothing is committed and the error is raised: call
        abort_transaction() and carry on. After `timeout` seconds (default max.block.ms)
        TransactionTimeoutError (a TimeoutError); calling commit_transaction() again
        resumes. The coordinator answers
        with the next epoch (KIP-890); sequences restart at 0.

        An owner that handed out participants (Producer.participant with this producer's
        producer_id and producer_epoch) names the participant ids whose writes commit
        with its own in `accepted_participants`; the others' are aborted in the same
        decision. Given (even empty), EndTxn is sent even if the owner wrote nothing
        itself; None means the transaction has no participants."""
        txn = self._transactions("commit_transaction()")
        accepted = None
        if accepted_participants is not None:
            accepted = list(accepted_participants)
            if any(isinstance(pid, bool) or not isinstance(pid, int) or pid < 0 for pid in accepted):
                raise ValueError(f"accepted_participants must be producer ids >= 0, got {accepted!r}")
        with self._txn_lock:
            txn.begin_commit()
        started_s = time.perf_counter()
        deadline_ms = self._deadline_ms(timeout)
        self._flush_for("commit_transaction", deadline_ms)
        with self._txn_lock:
            if txn.has_error:
                txn.begin_commit()          # raises the transaction's error
            end_needed = txn.end_txn_needed or accepted is not None
        if end_needed:
            self._end_transaction(txn, committed=True, deadline_ms=deadline_ms, accepted_participants=accepted)
        with self._txn_lock:
            txn.end_done()
        if self._metrics is not None:
            self._metrics.txn_commit_seconds.observe(time.perf_counter() - started_s)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: records not sent yet are dropped (their futures fail with
        TransactionAbortedError), those in flight are waited for, and the coordinator writes
        ABORT markers (EndTxn), so read_committed consumers never see any of it. Allowed
        after an abortable error. After `timeout` seconds (default max.block.ms)
        TransactionTimeoutError (a TimeoutError); calling abort_transaction() again resumes."""
        txn = self._transactions("abort_transaction()")
        with self._txn_lock:
            txn.begin_abort()
        started_s = time.perf_counter()
        deadline_ms = self._deadline_ms(timeout)
        self._sender.wake()                 # it fails what is queued, being ABORTING
        self._flush_for("abort_transaction", deadline_ms)
        with self._txn_lock:
            # An AddPartitionsToTxn still in flight would register partitions after the
            # abort and leave a transaction open on the coordinator: wait for its answer.
            if not self._txn_lock.wait_for(lambda: not txn.partitions_being_added,
                                           max(0, deadline_ms - net.now_ms()) / 1000):
                raise TransactionTimeoutError("abort_transaction: AddPartitionsToTxn still unanswered; "
                                              "call abort_transaction() again to resume")
            nothing_registered = txn.nothing_registered
        # Always told to the coordinator, even when this producer registered nothing: the
        # owner of participants may not know whether they opened the transaction. An idle
        # coordinator answers at once, and one that never saw this transaction is handled
        # in _end_transaction.
        self._end_transaction(txn, committed=False, deadline_ms=deadline_ms,
                              nothing_registered=nothing_registered)
        with self._txn_lock:
            txn.end_done()
        if self._metrics is not None:
            self._metrics.txn_abort_seconds.observe(time.perf_counter() - started_s)

    def _flush_for(self, what: str, deadline_ms: int) -> None:
        try:
            self._flush(max(0, deadline_ms - net.now_ms()) / 1000)
        except TimeoutError as exc:
            raise TransactionTimeoutError(f"{what}: {exc}; call {what}() again to resume") from None

    def _end_transaction(self, txn: TransactionManager, *, committed: bool, deadline_ms: int,
                         nothing_registered: bool = False, accepted_participants: list | None = None) -> None:
        producer_id, producer_epoch = self._producer_id_and_epoch()
        try:
            answer = self._coordinator.call(
                "EndTxn(commit)" if committed else "EndTxn(abort)", self._metadata.txn_coordinator_stub(self._transactional_id).EndTxn,
                txn_pb2.EndTxnRequest(transactional_id=self._transactional_id, producer_id=producer_id,
                                      producer_epoch=producer_epoch, committed=committed,
                                      accepted_participants=accepted_participants or ()),
                deadline_ms)
        except EosError as error:
            if not committed and nothing_registered and error.code is ErrorCode.INVALID_TXN_STATE:
                # The coordinator never registered anything of this transaction (the only
                # request that might have was refused): there is nothing to abort.
                self._set_producer_id(producer_id, producer_epoch, deadline_ms - net.now_ms())
                return
            self._on_coordinator_error(txn, error, fatal_otherwise=False)
            raise
        self._set_producer_id(answer.producer_id, answer.producer_epoch, deadline_ms - net.now_ms())

    @contextlib.contextmanager
    def transaction(self):
        """``with producer.transaction():`` begins a transaction, commits it when the block
        ends normally, and aborts it (then re-raises) when the block raises -- or when the
        commit itself fails with an abortable error."""
        self.begin_transaction()
        try:
            yield self
        except BaseException:
            self._abort_after_failure()
            raise
        try:
            self.commit_transaction()
        except EosError as error:
            if not error.fatal:
                self._abort_after_failure()
            raise

    def _abort_after_failure(self) -> None:
        txn = self._txn
        with self._txn_lock:
            abortable = txn.state in (TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.ABORTING,
                                      TxnState.COMMITTING)
        if not abortable:
            return          # fatal (or already over): only close() is left
        if txn.state is TxnState.COMMITTING:
            with self._txn_lock:
                if txn.state is TxnState.COMMITTING:
                    txn.abortable_error(TransactionAbortedError("the commit failed"))
        try:
            self.abort_transaction()
        except Exception:
            log.exception("aborting the transaction of %r after a failure failed", self._transactional_id)

    # ---- participants ----------------------------------------------------------------------

    @classmethod
    def participant(cls, transactional_id: str, owner_producer_id: int, owner_producer_epoch: int,
                    bootstrap: str = net.DEFAULT_BOOTSTRAP, *, timeout: float | None = None,
                    config: dict | None = None, partitions: Iterable[tuple[str, int]] | None = None,
                    **kwargs) -> "Producer":
        """A producer that writes into the open transaction of `transactional_id`'s owner
        (eos's participant extension, for writers on other machines such as Spark
        executors): it gets a producer id of its own from InitParticipant, registers its
        partitions like a transactional producer, and sends. It never ends the transaction:
        commit and abort are the owner's (EndTxn with accepted_participants, naming
        `participant_id`). flush() returns when every record it sent is written (and raises
        if one failed: such a participant must not be accepted). `partitions`, the
        (topic, partition) pairs it knows it will write, are registered by InitParticipant
        itself (no AddPartitionsToTxn for them). Once the transaction no longer takes its
        writes (decided, over, or its owner fenced) it fails with ProducerFencedError. Same
        as ``Producer(bootstrap, transactional_id=..., participant_of=(id, epoch))``
        followed by init_transactions(partitions=...)."""
        # Bad input is refused before anything starts; the checked list is what is passed on
        # (`partitions` may be a one-shot iterator).
        checked_partitions = participant_partitions(partitions, True)
        producer = cls(bootstrap, config=config, participant_of=(owner_producer_id, owner_producer_epoch),
                       transactional_id=transactional_id, **kwargs)
        try:
            producer.init_transactions(timeout, partitions=checked_partitions if partitions is not None else None)
        except BaseException:
            producer.close()
            raise
        return producer

    @property
    def participant_id(self) -> int:
        """A participant's own producer id (-1 before init, or for other producers)."""
        if self._participant_of is None or self._txn.state is TxnState.UNINITIALIZED:
            return -1
        return self._producer_id_and_epoch()[0]

    @property
    def participant_epoch(self) -> int:
        if self._participant_of is None or self._txn.state is TxnState.UNINITIALIZED:
            return -1
        return self._producer_id_and_epoch()[1]

    @property
    def producer_id(self) -> int:
        """The producer id in use (-1 before there is one or without idempotence)."""
        return self._producer_id_and_epoch()[0] if self._sender._idempotence is not None else -1

    @property
    def producer_epoch(self) -> int:
        return self._producer_id_and_epoch()[1] if self._sender._idempotence is not None else -1

    @property
    def transaction_state(self) -> str | None:
        """The transactional state's name (UNINITIALIZED, READY, IN_TRANSACTION, ...), or
        None for a producer without transactional.id."""
        return None if self._txn is None else self._txn.state.name
