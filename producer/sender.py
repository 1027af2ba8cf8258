"""The producer's I/O thread: drains ready batches, sends ProduceRequests, handles answers.

Theory of operation
-------------------
One thread per producer owns everything about sending: the requests in flight, retries,
the idempotence bookkeeping (`IdempotenceState`), and the producer id. It loops:

1. Take the answers to Produce requests -- read from the sockets of direct produce streams
   (the socket port: this thread reads them itself), or posted by reader threads and gRPC
   callbacks -- and handle each partition's answer:
   success completes the batch's futures; a retriable error puts the batch back in its
   partition's queue, in append order, with an exponential backoff; anything else fails
   it with the exception of its error code (`eos.errors.error_for`). With idempotence the
   decision comes from `IdempotenceState.on_error` (RETRY, REBUILD, FAIL, FAIL_AND_BUMP).
2. Drop failed produce streams; abort a stream whose oldest request outlived
   request.timeout.ms (Kafka closes the connection in that case) and reopen it
   (`producer.stream.ProduceStreams`, which owns the streams).
3. Fail queued batches older than delivery.timeout.ms, naming the last broker error their
   partition was retried on (a batch queued behind a retried one was never sent itself, and
   "Expiring 5 record(s)" alone hides a broker that refuses every produce).
4. Get a producer id (InitProducerId) before the first send, and bump the epoch after an
   unrecoverable sequence error -- only once nothing is in flight, so no batch of the new
   epoch overtakes one of the old.
5. Refresh metadata of topics whose leaders are unknown or moved.
6. Drain: each ready head batch is taken if its leader is known, its broker has a request
   slot free (max.in.flight.requests.per.connection), and, with idempotence, its
   partition's window has room (`IdempotenceState.can_assign`). A batch gets its sequence
   number the first time it is taken; a retry resends the same bytes, once every older
   batch of its partition is answered.
7. Send one ProduceRequest per slot -- many partitions, one batch of each (idempotent) or
   all that fit (plain) -- on the broker's `ProduceStream` (`producer.stream`): one ordered
   gRPC stream per broker, which the broker handles one request at a time, in order, as
   Kafka handles a connection. So up to max.in.flight requests are pipelined, and an
   idempotent producer keeps up to 5 batches of a partition in flight without the broker
   ever seeing them out of order. Answers are posted back to step 1.
8. Sleep until something is posted, a new batch appears, an answer arrives on a direct
   stream's socket (poll() on those sockets and the accumulator's wake-up pipe), or the
   next linger or backoff deadline.

Unary Produce is still used where order cannot matter or the stream is missing:
- acks=0: the batches are completed as soon as they are handed to gRPC (offset -1).
- a broker without ProduceStream (it answers UNIMPLEMENTED; the sender falls back for that
  broker). Concurrent unary calls may be handled in either order, so there a plain
  producer sends a partition's next request only when the previous one is answered (the
  batches that queue meanwhile travel together), and an idempotent one keeps at most
  IDEMPOTENT_IN_FLIGHT_PER_PARTITION_UNARY new batches of a partition in flight.

Transactions (a producer with a transactional.id; `producer.transactions` owns the state,
shared with application threads under a lock): the sender sends a partition's first batch
of a transaction only once the coordinator registered the partition. The drain collects
the partitions still unregistered (send() may have queued them already) and, right after
it, one AddPartitionsToTxn asks for all of them; its answer is posted back like a produce
answer, and the batches go in the next pass. While the transaction cannot commit
(ABORTABLE_ERROR) or is aborting, queued batches are failed at once (Kafka's
abortUndrainedBatches); only batches in flight are waited for. A batch that fails for good
makes the transaction abortable; a fenced epoch (for a participant also a transaction that no
longer takes its writes: `TransactionManager.fences`) makes the producer fail for good. The
producer id and epoch of a transactional producer come from init_transactions() and
EndTxn, applied on this thread through `run_task`; it never bumps an epoch itself.

Request-level failures (the broker went away, the stream broke, the request timed out)
count as NETWORK_EXCEPTION / REQUEST_TIMED_OUT for every batch of the request: the batch
may or may not have been appended, and only idempotence makes the retry safe from
duplicates.

Metrics (`metrics`: a `ProducerMetrics`, or None) are counted here per batch and per
request, where the counts are known anyway: a batch's size when it is encoded, its records
when it is acknowledged, retried or failed, a request's latency when its answer is handled.
"""
from __future__ import annotations

import collections
import itertools
import logging
import threading
from concurrent.futures import Future
from typing import Callable

import grpc

from eos import net
from eos.client_metrics import ProducerMetrics
from eos.errors import (
    EosError,
    ErrorCode,
    NetworkError,
    Reaction,
    RequestTimedOutError,
    error_for,
    reaction_for,
)
from eos.records.codec import BatchBuilder
from eos.v1 import broker_pb2, common_pb2, txn_pb2
from producer.accumulator import ProducerClosedError, RecordAccumulator
from producer.batch import NO_OFFSET, NO_TIMESTAMP, ProducerBatch
from eos.calls import CallThreads
from producer.coordinator import concurrent_transactions_delay_ms
from producer.idempotence import Decision, IdempotenceState
from producer.stream import IDEMPOTENT_IN_FLIGHT_PER_PARTITION_UNARY, ProduceStreams
from producer.transactions import (
    TransactionAbortedError,
    TransactionManager,
    TxnState,
)

log = logging.getLogger("eos.producer")

# Kafka's rule for idempotent and transactional produce requests: one batch per partition
# per request (the broker checks one sequence range per partition and answers one base
# offset). Plain producers may send several batches of a partition back to back in one
# request: the broker appends them at once, at consecutive offsets, so one base offset still
# locates every record -- and a request costs far more than a batch in Python's gRPC.
IDEMPOTENT_BATCHES_PER_PARTITION_PER_REQUEST = 1
PLAIN_BATCHES_PER_PARTITION_PER_REQUEST = 1 << 30   # bounded by max.request.size
SLEEP_MAX_MS = 250          # wake at least this often to expire batches and retry metadata
CLOSE_POLL_MS = 50

# Codes after which a topic's leaders are worth asking again.
_METADATA_REFRESH_CODES = frozenset({
    ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ErrorCode.LEADER_NOT_AVAILABLE,
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.NETWORK_EXCEPTION,
    ErrorCode.BROKER_NOT_AVAILABLE,
    ErrorCode.REPLICA_NOT_AVAILABLE,
    ErrorCode.KAFKA_STORAGE_ERROR,
})


class _InFlight:
    __slots__ = ("request_id", "node_id", "batches", "sent_ms")

    def __init__(self, request_id: int, node_id: int, batches: list[ProducerBatch], sent_ms: int):
        self.request_id = request_id
        self.node_id = node_id
        self.batches = batches
        self.sent_ms = sent_ms


class _RequestSlot:
    """A ProduceRequest being filled during one drain."""

    __slots__ = ("batches", "tps", "size_bytes")

    def __init__(self) -> None:
        self.batches: list[ProducerBatch] = []
        self.tps: dict = {}
        self.size_bytes = 0


class Sender(threading.Thread):
    def __init__(self, *, accumulator: RecordAccumulator, metadata: net.ClusterMetadata,
                 idempotence: IdempotenceState | None, acks: int, retries: int,
                 retry_backoff: net.Backoff, request_timeout_ms: int, delivery_timeout_ms: int,
                 max_in_flight: int, max_request_size: int, compression: int,
                 transactional_id: str = "", transaction_timeout_ms: int = 60000,
                 client_id: str = "", clock: Callable[[], int] = net.now_ms,
                 use_streams: bool = True, batch_bytes_max: Callable[[str], int] | None = None,
                 txn: TransactionManager | None = None, txn_lock: threading.Condition | None = None,
                 metrics: ProducerMetrics | None = None):
        super().__init__(name=f"eos-producer-sender{'-' + client_id if client_id else ''}", daemon=True)
        self._acc = accumulator
        self._metadata = metadata
        self._idempotence = idempotence
        self._acks = acks
        self._retries = retries
        self._backoff = retry_backoff
        self._request_timeout_ms = request_timeout_ms
        self._delivery_timeout_ms = delivery_timeout_ms
        self._max_in_flight = max_in_flight
        self._max_request_size = max_request_size
        self._compression = compression
        self._transactional_id = transactional_id
        self._transaction_timeout_ms = transaction_timeout_ms
        self._clock = clock
        self._request_ids = itertools.count()
        self._in_flight: dict[int, _InFlight] = {}
        self._in_flight_by_node: collections.Counter = collections.Counter()
        # tp -> creation indexes of its batches in flight (at most 5 with idempotence)
        self._in_flight_tps: dict[tuple, set[int]] = {}
        # topic -> the size up to which a never-sent head batch absorbs the batches queued
        # behind it (RecordAccumulator.drain); None: batches go as they were built
        self._batch_bytes_max = batch_bytes_max
        self._pid_attempts = 0
        self._pid_retry_at_ms = 0
        self._metadata_attempts = 0
        self._metadata_retry_at_ms = 0
        self._topics_without_leader: set[str] = set()
        self._force_close = False
        self.fatal_error: EosError | None = None   # set once; every later batch fails with it
        # Transactions: the producer's TransactionManager, shared with application threads
        # under txn_lock (a Condition, notified when an AddPartitionsToTxn answer is in).
        # Lock order: the accumulator's lock, then txn_lock; never the other way round.
        self._txn = txn
        self._txn_lock = txn_lock if txn_lock is not None else threading.Condition()
        self._add_partitions_in_flight = False
        # A producer id and epoch handed over by set_producer_id and not taken yet: written
        # by the application's thread, taken (and cleared) by this one.
        self._next_producer_id: tuple[int, int] | None = None
        self._next_producer_id_lock = threading.Lock()
        self._throttled_until_ms: dict[int, int] = {}   # node -> when its quota throttle ends
        self._call_metadata = net.client_id_metadata(client_id)   # the broker's client quotas read it
        # One ProduceStream per broker (ordered, pipelined), or unary Produce calls to a broker
        # without one. acks=0 always goes unary: nothing answers it.
        self._streams = ProduceStreams(enabled=use_streams and acks != 0, in_flight_max=max_in_flight,
                                       on_answer=self._post_answer, call_metadata=self._call_metadata,
                                       request_timeout_ms=request_timeout_ms)
        self._call_threads = CallThreads(f"eos-producer-calls{'-' + client_id if client_id else ''}")
        self._add_partitions_attempts = 0
        self._add_partitions_retry_at_ms = 0
        self._metrics = metrics
        # tp -> the broker's last error for it, until a batch of it is acknowledged: named by
        # the expiry of batches that were queued behind a retried one (one entry a partition).
        self._last_error_by_tp: dict[tuple, EosError] = {}

    # ---- control from application threads ----------------------------------------------

    def force_close(self) -> None:
        self._force_close = True
        self._acc.post(None)

    # ---- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        acc = self._acc
        timeout_ms = 0
        try:
            while True:
                # Streams read on this thread (the socket port) with answers due: sleep on
                # their sockets too, and read what came as soon as the loop wakes.
                awaited = self._streams.awaited()
                fds = [stream.fileno() for stream in awaited]
                if -1 in fds:
                    timeout_ms = 0    # a connection closed under its stream: read its end now
                posted = acc.wait_for_work(timeout_ms / 1000, fds)
                now = self._clock()
                for stream in awaited:
                    for answer in stream.take_answers():
                        self._handle_completed_call(answer, now)
                for item in posted:
                    if isinstance(item, tuple):
                        self._handle_completed_call(item, now)
                    elif item is not None:
                        item.run(self, now)
                if self._force_close:
                    self._abort_everything(ProducerClosedError(
                        "producer closed before the record was acknowledged"))
                    break
                if acc.closing and not acc.has_incomplete and not self._in_flight:
                    break
                if self._streams.any and self._streams.check(now, self._in_flight_by_node):
                    timeout_ms = 0      # handle the dropped stream's failures first
                    continue
                timeout_ms = self._run_once(now)
        except BaseException as exc:  # a bug: fail every waiting future rather than hang them
            log.exception("producer sender thread failed")
            self._abort_everything(EosError(f"producer sender thread failed: {exc!r}"))
        finally:
            self._streams.close()
            self._call_threads.close()
            acc.mark_closed()

    def _run_once(self, now: int) -> int:
        """One pass; returns how long the loop may sleep (ms) before the next."""
        acc = self._acc
        for batch in acc.expire(now, self._delivery_timeout_ms):
            self._give_up(batch, self._expiry_error(batch, now))
        wait_ms = SLEEP_MAX_MS
        txn = self._txn
        if txn is not None:
            with self._txn_lock:
                if txn.state is TxnState.FATAL_ERROR and self.fatal_error is None:
                    self.fatal_error = txn.last_error
                unsendable = not txn.sending_allowed
                abort_error = None
                if unsendable and txn.state is not TxnState.FATAL_ERROR:
                    abort_error = TransactionAbortedError(
                        "the record was not sent: its transaction is being aborted"
                        + (f" after an error: {txn.last_error}" if txn.last_error is not None else ""))
            if abort_error is not None:
                # Kafka's abortUndrainedBatches: what was not sent never will be; only the
                # batches in flight are waited for before EndTxn(abort).
                for batch in acc.abort_queued(abort_error):
                    self._fail(batch, abort_error)
        if self.fatal_error is not None:
            for batch in acc.abort_queued(self.fatal_error):
                self._fail(batch, self.fatal_error)
            return SLEEP_MAX_MS
        idem = self._idempotence
        if idem is not None and not idem.ready_to_send and txn is None:
            # A transactional producer gets its id and epochs from init_transactions() and
            # EndTxn, on the application's thread, never here.
            if not idem.bump_required or not self._in_flight:
                self._init_producer_id(now)
            if not idem.ready_to_send:
                wait_ms = min(wait_ms, max(1, self._pid_retry_at_ms - now))
        topics = self._metadata.stale_topics() | self._topics_without_leader
        if topics and now >= self._metadata_retry_at_ms:
            self._refresh_metadata(topics, now)
        self._topics_without_leader = set()
        throttled = {node for node, until in self._throttled_until_ms.items() if until > now}
        if throttled:
            wait_ms = min(wait_ms, min(self._throttled_until_ms[node] for node in throttled) - now)
        elif self._throttled_until_ms:
            self._throttled_until_ms.clear()
        held = self._streams.aborting_nodes() if self._streams.any else ()
        take, slots_by_node = self._make_taker(throttled.union(held) if held else throttled)
        batches, next_ready_ms = acc.drain(now, take, self._batch_bytes_max)
        if batches:
            self._send(slots_by_node, now)
        if txn is not None and not unsendable:
            # The drain found the partitions that wait for registration: ask at once.
            self._maybe_add_partitions(now)
            if self._add_partitions_retry_at_ms > now:
                wait_ms = min(wait_ms, self._add_partitions_retry_at_ms - now)
        if self._topics_without_leader:
            wait_ms = min(wait_ms, max(1, self._metadata_retry_at_ms - now))
        return max(0, min(wait_ms, next_ready_ms - now))

    # ---- producer id -----------------------------------------------------------------------

    def _init_producer_id(self, now: int) -> None:
        idem = self._idempotence
        if now < self._pid_retry_at_ms:
            return
        bump = idem.has_producer_id
        request = txn_pb2.InitProducerIdRequest(
            transactional_id=self._transactional_id,
            transaction_timeout_ms=self._transaction_timeout_ms,
            producer_id=idem.producer_id if bump else -1,
            producer_epoch=idem.producer_epoch if bump else -1)
        try:
            response = self._metadata.txn_coordinator_stub(self._transactional_id).InitProducerId(
                request, timeout=self._request_timeout_ms / 1000)
        except grpc.RpcError as exc:
            self._pid_attempts += 1
            self._pid_retry_at_ms = now + self._backoff.delay_ms(self._pid_attempts)
            log.info("InitProducerId failed, retrying: %s", net.error_from_rpc(exc, "InitProducerId"))
            return
        if response.error_code != ErrorCode.NONE:
            error = error_for(response.error_code, response.error_message)
            if reaction_for(response.error_code) is Reaction.RETRY:
                self._pid_attempts += 1
                self._pid_retry_at_ms = now + self._backoff.delay_ms(self._pid_attempts)
                log.info("InitProducerId: %s, retrying", error)
                return
            log.error("InitProducerId failed for good: %s", error)
            self.fatal_error = error
            return
        self._pid_attempts = 0
        idem.set_producer_id(response.producer_id, response.producer_epoch)
        if bump:
            log.info("producer epoch bumped: producer id %d epoch %d", response.producer_id,
                     response.producer_epoch)
            self._acc.clear_sequences()

    # ---- transactions: the producer id and epoch the application's calls hand over --------

    def set_producer_id(self, producer_id: int, producer_epoch: int, wait_s: float | None = None) -> None:
        """A new producer id and epoch (InitProducerId, EndTxn), from the application's
        thread; sequences restart at 0. This thread owns them with the sequences, and takes
        the new pair before it next uses it: before it builds an AddPartitionsToTxn and before
        it stamps a batch (it is not woken for it: a wake would only compete with the
        application's thread). So EndTxn need not wait for the hand-over (a thread round
        trip on every commit): nothing of the ended transaction is queued or in flight any
        more, and whatever the next transaction queues is queued after this call, so this
        thread sees the new pair with it.
        `wait_s`: wait until the pair is taken (init_transactions, before its first send)."""
        with self._next_producer_id_lock:
            self._next_producer_id = (producer_id, producer_epoch)
        if wait_s is not None:
            self.run_task(self._take_next_producer_id, wait_s)

    def producer_id_and_epoch(self) -> tuple[int, int]:
        """The pair in force for what is sent next (any thread): one handed over and not
        yet taken, else the idempotence state's."""
        pending = self._next_producer_id      # taken only after the idempotence state has it
        if pending is not None:
            return pending
        return self._idempotence.producer_id, self._idempotence.producer_epoch

    def _take_next_producer_id(self, accumulator_locked: bool = False) -> None:
        pending = self._next_producer_id
        if pending is None:
            return
        self._idempotence.set_producer_id(*pending)
        if accumulator_locked:
            self._acc.clear_sequences_locked()
        else:
            self._acc.clear_sequences()
        with self._next_producer_id_lock:
            if self._next_producer_id is pending:    # (a newer one waits for the next use)
                self._next_producer_id = None

    def run_task(self, fn: Callable[[], object], timeout_s: float | None = None):
        """Run fn() on the sender thread and return its result (from any other thread)."""
        task = SenderTask(fn)
        self._acc.post(task)
        return task.future.result(timeout_s)

    def wake(self) -> None:
        self._acc.post(SenderTask(lambda: None))

    def _maybe_add_partitions(self, now: int) -> None:
        """One AddPartitionsToTxn for every partition waiting to be registered."""
        if self._add_partitions_in_flight or now < self._add_partitions_retry_at_ms:
            return
        idem = self._idempotence
        with self._txn_lock:
            partitions = self._txn.partitions_to_add()
        if not partitions:
            return
        # Read after the partitions: a partition of the next transaction was added after its
        # pair was handed over (set_producer_id), so the pair is seen here.
        self._take_next_producer_id()
        request = txn_pb2.AddPartitionsToTxnRequest(
            transactional_id=self._transactional_id, producer_id=idem.producer_id,
            producer_epoch=idem.producer_epoch,
            partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)
                        for topic, partition in partitions])
        self._add_partitions_in_flight = True
        try:
            stub = self._metadata.txn_coordinator_stub(self._transactional_id)
        except Exception as exc:   # no coordinator channel
            self._acc.post(_AddPartitionsAnswer(_FailedCall(exc)))
            return
        # A blocking call on a long-lived thread, not AddPartitionsToTxn.future: see
        # eos.calls (a future on the idle coordinator channel starts a thread per call).
        call = self._call_threads.submit("txn-coordinator", stub.AddPartitionsToTxn, request,
                                         timeout=self._request_timeout_ms / 1000)
        call.add_done_callback(lambda f: self._acc.post(_AddPartitionsAnswer(f)))

    def _handle_add_partitions(self, call, now: int) -> None:
        self._add_partitions_in_flight = False
        txn = self._txn
        try:
            response = call.result()
        except Exception as exc:
            error = net.error_from_rpc(exc, "AddPartitionsToTxn") if isinstance(exc, grpc.RpcError) else exc
            log.info("AddPartitionsToTxn failed, retrying: %s", error)
            with self._txn_lock:
                txn.add_partitions_failed()
                self._txn_lock.notify_all()
            self._add_partitions_attempts += 1
            self._add_partitions_retry_at_ms = now + self._backoff.delay_ms(self._add_partitions_attempts)
            return
        with self._txn_lock:
            asked = set(txn.partitions_being_added)
            results = {(p.topic, p.partition): (p.error_code, p.error_message) for p in response.partitions}
            if response.error_code != ErrorCode.NONE:
                for tp in asked:
                    code = results.get(tp, (ErrorCode.NONE, ""))[0]
                    if code == ErrorCode.NONE:
                        results[tp] = (response.error_code, response.error_message)
            reaction = txn.add_partitions_done(results)
            if txn.state is TxnState.FATAL_ERROR and self.fatal_error is None:
                self.fatal_error = txn.last_error
            self._txn_lock.notify_all()
        if reaction is Reaction.RETRY:
            self._add_partitions_attempts += 1
            concurrent = any(code == ErrorCode.CONCURRENT_TRANSACTIONS for code, _ in results.values())
            # The previous transaction is still writing its markers: that takes a moment,
            # not a backoff.
            delay_ms = (concurrent_transactions_delay_ms(self._add_partitions_attempts, self._backoff.base_ms)
                        if concurrent else self._backoff.delay_ms(self._add_partitions_attempts))
            self._add_partitions_retry_at_ms = now + delay_ms
        else:
            self._add_partitions_attempts = 0

    # ---- metadata ------------------------------------------------------------------------

    def _refresh_metadata(self, topics: set[str], now: int) -> None:
        try:
            self._metadata.refresh_topics(topics)
            self._metadata_attempts = 0
            self._metadata_retry_at_ms = now + self._backoff.base_ms
        except EosError as exc:
            self._metadata_attempts += 1
            self._metadata_retry_at_ms = now + self._backoff.delay_ms(self._metadata_attempts)
            log.info("metadata refresh for %s failed: %s", sorted(topics), exc)

    # ---- draining and sending ------------------------------------------------------------

    def _may_send(self, batch: ProducerBatch, ordered: bool, taken_now: dict) -> bool:
        """Whether the transaction and the partition's order let `batch` go in this drain
        (`ordered`: on its node's ProduceStream; `taken_now`: batches per partition taken so far)."""
        txn = self._txn
        if txn is not None:
            with self._txn_lock:
                # The first batch of a partition in a transaction waits until the
                # coordinator registered the partition (AddPartitionsToTxn after this drain).
                if not txn.sending_allowed or not txn.partition_ready(batch.tp):
                    return False
        if self._next_producer_id is not None:
            # `batch` was queued after the pair it goes with was handed over (see
            # set_producer_id); the drain calling this holds the accumulator's lock
            self._take_next_producer_id(accumulator_locked=True)
        idem = self._idempotence
        in_flight_tps = self._in_flight_tps
        if idem is not None:
            if not idem.ready_to_send:
                return False   # no producer id yet, or an epoch bump is due
            if batch.base_sequence < 0:
                if not idem.can_assign(batch.tp):
                    return False
                if not ordered:
                    flying = in_flight_tps.get(batch.tp)
                    if ((len(flying) if flying else 0) + taken_now.get(batch.tp, 0)
                            >= IDEMPOTENT_IN_FLIGHT_PER_PARTITION_UNARY):
                        return False
            else:
                # A resend waits until every older batch of its partition is answered:
                # sent together again they could arrive out of order again.
                flying = in_flight_tps.get(batch.tp)
                if flying and min(flying) < batch.creation_index:
                    return False
        elif not ordered and batch.tp in in_flight_tps:
            # Unary calls may run in either order (Kafka's TCP connection keeps it): a
            # plain producer keeps a partition's order by sending its next request only
            # when the previous one is answered; what queues meanwhile goes together.
            return False
        return True

    def _make_taker(self, held_nodes: set[int]):
        """The drain's `take(batch)`, and the request slots it fills per node; nothing goes
        to `held_nodes` in this drain (a quota throttle, an aborted stream still failing its
        requests)."""
        metadata = self._metadata
        idem = self._idempotence
        slots_by_node: dict[int, list[_RequestSlot]] = {}
        in_flight_by_node = self._in_flight_by_node
        max_in_flight = self._max_in_flight
        max_request_size = self._max_request_size
        per_partition = (IDEMPOTENT_BATCHES_PER_PARTITION_PER_REQUEST if idem is not None
                         else PLAIN_BATCHES_PER_PARTITION_PER_REQUEST)
        ordered_by_node: dict[int, bool] = {}

        last_slot_by_tp: dict = {}    # tp -> index of the slot holding its latest batch
        taken_now: dict = {}          # tp -> batches taken in this drain

        def take(batch: ProducerBatch) -> bool:
            node = metadata.leader(batch.topic, batch.partition)
            if node == net.NO_LEADER or metadata.address_of(node) is None:
                self._topics_without_leader.add(batch.topic)
                return False
            if node in held_nodes:
                return False
            ordered = ordered_by_node.get(node)
            if ordered is None:
                ordered = ordered_by_node[node] = self._streams.ordered(node)
            if not self._may_send(batch, ordered, taken_now):
                return False
            slots = slots_by_node.get(node)
            if slots is None:
                slots = slots_by_node[node] = []
            size = len(batch.payload) if batch.payload is not None else batch.size_estimate_bytes
            # The first slot that has room, but never one before the slot of this
            # partition's previous batch: requests go out in slot order.
            slot_index = -1
            first = last_slot_by_tp.get(batch.tp, -1)
            muted = not ordered and idem is None
            last_index = first + 1 if (muted and first >= 0) else len(slots)
            for index in range(max(first, 0), last_index):
                candidate = slots[index]
                if (candidate.tps.get(batch.tp, 0) < per_partition
                        and (not candidate.batches or candidate.size_bytes + size <= max_request_size)):
                    slot_index = index
                    break
            if slot_index < 0:
                if muted and first >= 0:
                    return False   # one request per partition at a time: the rest waits
                if in_flight_by_node[node] + len(slots) >= max_in_flight:
                    return False
                slots.append(_RequestSlot())
                slot_index = len(slots) - 1
            slot = slots[slot_index]
            if idem is not None and batch.base_sequence < 0:
                batch.base_sequence = idem.assign(batch.tp, batch.record_count)
                batch.producer_id = idem.producer_id
                batch.producer_epoch = idem.producer_epoch
                batch.payload = None
            slot.batches.append(batch)
            slot.tps[batch.tp] = slot.tps.get(batch.tp, 0) + 1
            slot.size_bytes += size
            last_slot_by_tp[batch.tp] = slot_index
            taken_now[batch.tp] = taken_now.get(batch.tp, 0) + 1
            return True

        return take, slots_by_node

    def _build(self, batch: ProducerBatch) -> bytes:
        builder = BatchBuilder(compression=self._compression)
        timestamps = batch.single_timestamp_ms
        if timestamps is None or timestamps < 0:
            timestamps = batch.timestamps_ms   # the builder finds runs of equal timestamps
        builder.append_many(batch.values, batch.keys, timestamps, batch.headers)
        return builder.build(producer_id=batch.producer_id, producer_epoch=batch.producer_epoch,
                             base_sequence=batch.base_sequence, transactional=self._txn is not None)

    def _send(self, slots_by_node: dict[int, list[_RequestSlot]], now: int) -> None:
        idem = self._idempotence
        timeout_s = self._request_timeout_ms / 1000
        for node, slots in slots_by_node.items():
            stub = self._metadata.broker_stub(node)
            for slot in slots:
                if not slot.batches:
                    continue
                payloads_by_tp: dict[tuple, list[bytes]] = {}
                for batch in slot.batches:   # per partition in append order
                    if batch.payload is None:
                        batch.payload = self._build(batch)
                        if self._metrics is not None:
                            self._metrics.batch_size_bytes.observe(len(batch.payload))
                    if idem is not None:
                        idem.on_sent(batch.tp, batch.base_sequence)
                    batch.attempts += 1
                    payloads = payloads_by_tp.get(batch.tp)
                    if payloads is None:
                        payloads_by_tp[batch.tp] = [batch.payload]
                    else:
                        payloads.append(batch.payload)
                partitions = [
                    broker_pb2.PartitionRecords(
                        topic=tp[0], partition=tp[1],
                        records=payloads[0] if len(payloads) == 1 else b"".join(payloads))
                    for tp, payloads in payloads_by_tp.items()]
                request = broker_pb2.ProduceRequest(
                    transactional_id=self._transactional_id, acks=self._acks,
                    timeout_ms=self._request_timeout_ms, partitions=partitions,
                    # KIP-890 part 2: the leader adds the partitions to the transaction.
                    add_partitions_to_txn=self._txn is not None and self._txn.partitions_added_by_produce)
                request_id = next(self._request_ids)
                in_flight = _InFlight(request_id, node, slot.batches, now)
                self._in_flight[request_id] = in_flight
                self._in_flight_by_node[node] += 1
                for batch in slot.batches:
                    flying = self._in_flight_tps.get(batch.tp)
                    if flying is None:
                        flying = self._in_flight_tps[batch.tp] = set()
                    flying.add(batch.creation_index)
                if self._streams.ordered(node):
                    if not self._streams.send(node, stub, request_id, request, now):
                        self._acc.post((request_id, _FailedCall(NetworkError(
                            f"could not open a produce stream to node {node}"))))
                    continue
                try:
                    call = stub.Produce.future(request, timeout=timeout_s, metadata=self._call_metadata)
                except Exception as exc:  # the channel refused before sending (closed)
                    self._acc.post((request_id, _FailedCall(exc)))
                    continue
                call.add_done_callback(lambda f, rid=request_id: self._acc.post((rid, f)))
                if self._acks == 0:
                    # Fire and forget: nothing will tell us where the records went.
                    for batch in slot.batches:
                        self._complete(batch, NO_OFFSET, NO_TIMESTAMP)

    def _post_answer(self, request_id: int, answer) -> None:
        self._acc.post((request_id, answer))

    # ---- answers -------------------------------------------------------------------------

    def _handle_completed_call(self, item, now: int) -> None:
        request_id, call = item
        in_flight = self._in_flight.pop(request_id, None)
        if in_flight is None:
            return
        self._in_flight_by_node[in_flight.node_id] -= 1
        for batch in in_flight.batches:
            flying = self._in_flight_tps.get(batch.tp)
            if flying is not None:
                flying.discard(batch.creation_index)
                if not flying:
                    del self._in_flight_tps[batch.tp]
        if self._acks == 0:
            try:      # nothing to complete, but a quota throttle to respect all the same
                self._note_throttle(in_flight.node_id, call.result().throttle_time_ms, now)
            except Exception:
                pass
            return
        try:
            response = call.result()
        except Exception as exc:
            if isinstance(exc, grpc.RpcError):
                error = net.error_from_rpc(exc, f"Produce to node {in_flight.node_id}")
            elif isinstance(exc, EosError):   # a produce stream failed (or timed out)
                error = exc
            else:  # the channel refused to start the call (e.g. closed)
                error = EosError(f"Produce to node {in_flight.node_id} failed: {exc!r}",
                                 ErrorCode.NETWORK_EXCEPTION)
            for batch in in_flight.batches:
                self._on_batch_error(batch, error.code, str(error), NO_OFFSET, now)
            return
        self._note_throttle(in_flight.node_id, response.throttle_time_ms, now)
        if self._metrics is not None:
            self._metrics.request_latency_seconds.observe((now - in_flight.sent_ms) / 1000)
        results = {(r.topic, r.partition): r for r in response.partitions}
        next_offset_by_tp: dict[tuple, int] = {}   # several batches of a partition: consecutive
        for batch in in_flight.batches:
            result = results.get(batch.tp)
            if result is None:
                self._on_batch_error(batch, ErrorCode.UNKNOWN_SERVER_ERROR,
                                     f"the broker's answer has no result for {batch.topic}-{batch.partition}",
                                     NO_OFFSET, now)
            elif result.error_code == ErrorCode.NONE:
                base_offset = next_offset_by_tp.get(batch.tp, result.base_offset)
                if base_offset >= 0:
                    next_offset_by_tp[batch.tp] = base_offset + batch.record_count
                self._complete(batch, base_offset, result.log_append_time_ms)
            else:
                # KIP-951: a broker that no longer leads names the leader it knows
                leader_moved = result.HasField("current_leader") and self._metadata.learn_leader(
                    batch.topic, batch.partition, result.current_leader, in_flight.node_id)
                self._on_batch_error(batch, result.error_code, result.error_message,
                                     result.base_offset, now, leader_moved=leader_moved)

    def _note_throttle(self, node: int, throttle_time_ms: int, now: int) -> None:
        """A client quota (KIP-219): send this broker nothing more until the time is over (it
        would hold or refuse what comes earlier)."""
        if throttle_time_ms > 0:
            self._throttled_until_ms[node] = max(self._throttled_until_ms.get(node, 0), now + throttle_time_ms)

    def _on_batch_error(self, batch: ProducerBatch, code: int, message: str, base_offset: int,
                        now: int, *, leader_moved: bool = False) -> None:
        """A batch the broker refused (or a failed call): retried, failed, or accepted as
        written. `leader_moved`: the answer named the partition's new leader, which the
        metadata now holds (KIP-951), so the retry goes there at once, without a Metadata
        refresh or a backoff."""
        error = error_for(code, message)
        batch.last_error = error
        idem = self._idempotence
        if idem is not None and batch.base_sequence >= 0:
            decision = idem.on_error(batch.tp, batch.base_sequence, batch.producer_id,
                                     batch.producer_epoch, code)
        else:
            decision = Decision.RETRY if reaction_for(code) is Reaction.RETRY else Decision.FAIL
        if decision in (Decision.RETRY, Decision.REBUILD):
            # what a batch of this partition that expires unsent will name: an error retried on
            # (one that failed its own batch for good says nothing of the next one's fate)
            self._last_error_by_tp[batch.tp] = error
        if code in _METADATA_REFRESH_CODES and not leader_moved:
            self._metadata.mark_stale(batch.topic)
        if decision is Decision.ACCEPT:
            self._complete(batch, base_offset, NO_TIMESTAMP)
            return
        if decision is Decision.RETRY or decision is Decision.REBUILD:
            if decision is Decision.REBUILD:
                batch.clear_sequence()
            if batch.attempts > self._retries:
                self._give_up(batch, error)
                return
            if now - batch.created_ms >= self._delivery_timeout_ms:
                self._give_up(batch, self._expiry_error(batch, now))
                return
            log.debug("retrying %r after %s", batch, error)
            if self._metrics is not None:
                self._metrics.record_retry.inc(batch.record_count)
            if (code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and decision is Decision.RETRY) or leader_moved:
                # An older batch of the partition was behind it (gRPC does not keep the
                # order of concurrent calls): resend as soon as the older ones are answered,
                # which take() waits for; a backoff would only stall the partition. Or the
                # partition has a new leader, known already: a backoff would only wait.
                batch.retry_after_ms = now
            else:
                batch.retry_after_ms = now + self._backoff.delay_ms(batch.attempts)
            self._acc.reenqueue(batch)
            return
        if decision is Decision.FAIL_AND_BUMP:
            if self._txn is None:
                log.warning("%s-%d: %s; failing the batch and bumping the producer epoch",
                            batch.topic, batch.partition, error)
            else:
                # A transactional producer's epoch moves only with init_transactions() and
                # EndTxn, never here; a participant's never moves at all.
                log.warning("%s-%d: %s; failing the batch", batch.topic, batch.partition, error)
        self._fail(batch, error)

    def _expiry_error(self, batch: ProducerBatch, now: int) -> RequestTimedOutError:
        """delivery.timeout.ms has passed for `batch`: Kafka's message, plus the last error
        the broker answered for it -- or, for a batch queued behind a retried one and never
        sent, for its partition -- as the message's end and the exception's cause."""
        last = batch.last_error or self._last_error_by_tp.get(batch.tp)
        error = RequestTimedOutError(
            f"Expiring {batch.record_count} record(s) for {batch.topic}-{batch.partition}: "
            f"{now - batch.created_ms} ms has passed since batch creation"
            + ("" if last is None else f"; last error: {_with_code(last)}"))
        error.__cause__ = last
        return error

    def _give_up(self, batch: ProducerBatch, error: BaseException) -> None:
        """Fail a batch without a final verdict from the broker (timeout, retries exhausted)."""
        idem = self._idempotence
        if idem is not None and batch.base_sequence >= 0:
            idem.on_given_up(batch.tp, batch.base_sequence, batch.producer_id, batch.producer_epoch)
        self._fail(batch, error)

    def _complete(self, batch: ProducerBatch, base_offset: int, log_append_time_ms: int) -> None:
        idem = self._idempotence
        if idem is not None and batch.base_sequence >= 0:
            idem.on_acked(batch.tp, batch.base_sequence, batch.producer_id, batch.producer_epoch)
        txn = self._txn
        if txn is not None and batch.tp not in txn.partitions_in_txn:
            with self._txn_lock:
                txn.partition_written(batch.tp)
        if self._last_error_by_tp:
            self._last_error_by_tp.pop(batch.tp, None)
        if self._metrics is not None:
            self._metrics.record_send.inc(batch.record_count)
        batch.complete(base_offset, log_append_time_ms)
        self._acc.deallocate(batch)

    def _fail(self, batch: ProducerBatch, error: BaseException) -> None:
        txn = self._txn
        if txn is not None:
            code = getattr(error, "code", None)
            if code is not None and txn.fences(code):
                error = txn.fenced_error(code, str(error))
                with self._txn_lock:
                    txn.fatal_error(error)
                if self.fatal_error is None:
                    self.fatal_error = error
            else:
                # Kafka's rule: a batch that fails for good leaves a hole in the
                # transaction, which therefore must not commit.
                with self._txn_lock:
                    txn.abortable_error(error)
        if self._metrics is not None:
            self._metrics.record_error.inc(batch.record_count)
        batch.fail(error)
        self._acc.deallocate(batch)

    def _abort_everything(self, error: BaseException) -> None:
        for in_flight in list(self._in_flight.values()):
            for batch in in_flight.batches:
                if not batch.done:
                    self._fail(batch, error)
        self._in_flight.clear()
        for batch in self._acc.abort_queued(error):
            if not batch.done:
                self._fail(batch, error)
        # Batches still open in no deque cannot exist; any left incomplete are failed too.
        for batch in self._acc.incomplete_batches():
            if not batch.done:
                self._fail(batch, error)


def _with_code(error: BaseException) -> str:
    """An error as "CODE_NAME: message" (the name alone when the message is only that), so
    that an operator can tell KAFKA_STORAGE_ERROR from the text of the disk's complaint."""
    code = getattr(error, "code", None)
    text = str(error)
    return text if code is None or text == code.name else f"{code.name}: {text}"


class SenderTask:
    """A function run on the sender thread, between its passes (the owner of the
    idempotence state and of the queues); `future` gets its result."""

    def __init__(self, fn: Callable[[], object]):
        self.fn = fn
        self.future: Future = Future()

    def run(self, sender: "Sender", now: int) -> None:
        try:
            self.future.set_result(self.fn())
        except BaseException as exc:
            self.future.set_exception(exc)


class _AddPartitionsAnswer:
    def __init__(self, call):
        self.call = call

    def run(self, sender: "Sender", now: int) -> None:
        sender._handle_add_partitions(self.call, now)


class _FailedCall:
    """Stands in for a gRPC future whose call could not even start."""

    def __init__(self, exc: BaseException):
        self._exc = exc

    def result(self):
        raise self._exc
