"""The consumer's fetch pipeline: positions, pipelined Fetch calls, and turning batches into records.

Theory of operation
-------------------
The `Fetcher` owns, for each assigned partition, a `PartitionState`: the *position* (the
offset of the next record the application gets), the *fetch offset* (where the next Fetch
starts: past everything already received), and a small queue of received data not yet
handed out. It is driven by the application's thread (`Consumer.poll`), like Kafka's
consumer, and is not thread-safe.

Pipelining: a partition is fetchable when no Fetch for it is in flight and at most one
received response of it waits to be consumed. Each broker gets at most one Fetch in flight
(with every fetchable partition it leads); so while the application works through one
response the next one is already on its way, and memory is bounded by two responses per
partition plus the one in flight. (When a Fetch is sent is the consumer's choice:
consumer/consumer.py's module doc.)

The calls themselves: over a broker's socket port (eos/socket_rpc.py) each Fetch is a
`PendingCall`, sent from the application's thread and read by it too: `handle_arrivals` polls
the calls in flight without waiting, and `wait` sleeps on their sockets and on `wakeup` (an
`eos.wakeup.Wakeup` that other threads set), so no thread stands between an answer and
poll(). Over gRPC they run on `eos.calls.CallThreads`: one long-lived daemon thread per
broker that makes each Fetch as a blocking gRPC call and completes a
`concurrent.futures.Future` -- not `stub.Fetch.future`, which on an idle channel starts a
thread per call (see eos/calls.py).

A paused partition (`Consumer.pause`) is not fetchable, and what it had received waits in
the ready queue, in its place, until it is resumed: nothing is fetched twice or lost.

Seeks and resets bump the partition's `fetch_epoch`; data that was fetched under an older
epoch is dropped when it arrives, so a seek is never followed by records from before it.

Decoding is lazy, and within a batch too: a batch is decoded a part at a time, only as far
as `max_records` asks, the next part resuming where the last stopped
(`codec.decode_records_part`). Records before the position (the first batch of a response
may start earlier, or a seek landed inside a batch) are walked over, never built. So a
reader that takes a few hundred records out of a batch of thousands pays for those few
hundred. Control batches are never shown, and the position moves to the end of each batch
consumed -- also past batches that hold nothing to show.

read_committed (Kafka's algorithm, KIP-98): the broker stops at the last stable offset and
lists the aborted transactions of the range as (producer id, first offset). Walking the
batches in order, every aborted transaction whose first offset is at or before the batch's
last offset marks its producer as aborted; a transactional batch of an aborted producer is
skipped; that producer's ABORT marker (a control batch) clears the mark.

Metrics (`metrics`: a `ConsumerMetrics`, or None): records handed out are counted once per
collect(), bytes and latency once per Fetch response; each assigned partition's lag is a
function of its state, read when the registry is collected.
"""
from __future__ import annotations

import collections
import functools
import heapq
import logging
import math
import time
import weakref
from concurrent import futures
from typing import Callable, NamedTuple

import grpc

from eos import net
from eos.calls import CallThreads
from eos.client_metrics import ConsumerMetrics
from eos.errors import (
    CorruptRecordError,
    EosError,
    ErrorCode,
    NetworkError,
    OffsetOutOfRangeError,
    Reaction,
    error_for,
    reaction_for,
)
from eos.records.codec import PartialDecode, decode_control_record, decode_records_part
from eos.records.header import parse_header, verify_crc
from eos.types import Record, TopicPartition
from eos.v1 import broker_pb2
from eos.v1.common_pb2 import IsolationLevel
from eos.wakeup import Wakeup

log = logging.getLogger("eos.consumer")

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
CONTROL_TYPE_ABORT = 0
# Per partition: a Fetch is sent while fewer received responses than this wait to be
# consumed, so one is read ahead while the application works through the other.
BUFFERED_RESPONSES_MAX = 2

OFFSET_RESET_STRATEGIES = ("earliest", "latest", "none")
# The reset strategy of a partition a group consumer was just assigned: its position is the
# group's committed offset, looked up by the consumer (it owns the group client); a partition
# without one falls back to auto.offset.reset.
COMMITTED = "committed"


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """auto.offset.reset is "none" and the partition has no position."""


class PartitionState:
    __slots__ = ("tp", "position", "reset_strategy", "fetch_offset", "fetch_epoch", "buffered",
                 "in_flight", "retry_at_ms", "high_watermark", "last_stable_offset",
                 "log_start_offset", "paused")

    def __init__(self, tp: TopicPartition):
        self.tp = tp
        self.position: int | None = None        # next offset to hand out; None: to be reset
        self.reset_strategy: str | None = None  # seek_to_beginning/end or COMMITTED pending
        self.fetch_offset: int | None = None    # where the next Fetch starts
        self.fetch_epoch = 0
        self.buffered = 0                       # responses received and not yet consumed
        self.in_flight = False
        self.retry_at_ms = 0
        self.high_watermark = -1
        self.last_stable_offset = -1
        self.log_start_offset = -1
        self.paused = False                     # Consumer.pause(): not fetched, nothing handed out

    def seek(self, offset: int) -> None:
        self.position = offset
        self.fetch_offset = offset
        self.reset_strategy = None
        self.fetch_epoch += 1       # anything fetched before is now stale ...
        self.buffered = 0           # ... and is dropped unread

    def request_reset(self, strategy: str | None) -> None:
        self.position = None
        self.fetch_offset = None
        self.reset_strategy = strategy
        self.fetch_epoch += 1
        self.buffered = 0


class _Received:
    """One partition's part of one Fetch response, consumed batch by batch."""

    __slots__ = ("tp", "epoch", "buf", "position_in_buf", "batch", "batch_resume", "aborted_heap",
                 "aborted_producers", "exhausted")

    def __init__(self, tp: TopicPartition, epoch: int, buf: bytes, aborted: list | None):
        self.tp = tp
        self.epoch = epoch
        self.buf = buf
        self.position_in_buf = 0             # the next batch's header
        self.batch = None                    # the header of a batch partly handed out
        self.batch_resume: PartialDecode | None = None
        self.aborted_heap = aborted           # [(first_offset, producer_id)] heap, read_committed
        self.aborted_producers: set[int] = set()
        self.exhausted = not buf


class _FetchInFlight(NamedTuple):
    node_id: int
    epochs: dict            # tp -> fetch_epoch when sent
    call: object            # a concurrent.futures.Future, or a socket_rpc.PendingCall (direct)
    sent_ms: int = 0        # the clock when it was sent: the start of its latency
    direct: bool = False    # read by the application's thread itself (the socket port)


def _records_lag(state: PartitionState, read_committed: bool) -> float:
    """Kafka's records-lag of a partition: from the position to the end the last Fetch saw
    (the last stable offset under read_committed); NaN while either is unknown."""
    end = state.last_stable_offset if read_committed else state.high_watermark
    position = state.position
    if end < 0 or position is None:
        return math.nan
    return max(0, end - position)


class Fetcher:
    def __init__(self, metadata: net.ClusterMetadata, *, isolation_level: int,
                 auto_offset_reset: str, fetch_min_bytes: int, fetch_max_wait_ms: int,
                 fetch_max_bytes: int, max_partition_fetch_bytes: int, check_crcs: bool,
                 request_timeout_ms: int, backoff: net.Backoff, clock: Callable[[], int] = net.now_ms,
                 client_id: str = "", metrics: ConsumerMetrics | None = None):
        self._metadata = metadata
        self._call_metadata = net.client_id_metadata(client_id)   # the broker's client quotas read it
        self.isolation_level = isolation_level
        self.auto_offset_reset = auto_offset_reset
        self._fetch_min_bytes = fetch_min_bytes
        self._fetch_max_wait_ms = fetch_max_wait_ms
        self._fetch_max_bytes = fetch_max_bytes
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._check_crcs = check_crcs
        self._request_timeout_ms = request_timeout_ms
        self._backoff = backoff
        self._clock = clock
        self.states: dict[TopicPartition, PartitionState] = {}
        self._ready: collections.deque[_Received] = collections.deque()
        self._in_flight: dict[int, _FetchInFlight] = {}      # node id -> the call
        self._callers = CallThreads("eos-consumer-fetch")
        # A consumer dropped without close(): its idle fetch threads stop with it.
        weakref.finalize(self, self._callers.close)
        # (node, when its call finished) from gRPC threads: the time is the end of the fetch's
        # latency, which must not include how long the application took to poll again. (A
        # direct call's answer is read by poll() itself, so its time is when poll() read it,
        # as in Kafka's consumer, whose network I/O happens in poll() too.)
        self._arrived: collections.deque = collections.deque()
        self.wakeup = Wakeup()     # set by other threads (a Fetch done, a rebalance step)
        weakref.finalize(self, self.wakeup.close)     # its pipe, for a consumer dropped unclosed
        self._pending_error: BaseException | None = None
        self._metadata_retry_at_ms = 0
        self._metadata_attempts = 0
        self._metrics = metrics

    # ---- assignment ----------------------------------------------------------------------

    def assign(self, partitions: list[TopicPartition], initial_reset: str | None = None) -> None:
        """Fetch exactly these partitions. New ones start without a position, to be reset by
        `initial_reset` (COMMITTED for a group consumer) or else auto.offset.reset."""
        wanted = dict.fromkeys(partitions)
        metrics = self._metrics
        for tp in list(self.states):
            if tp not in wanted:
                del self.states[tp]
                if metrics is not None:
                    metrics.unwatch_lag(tp.topic, tp.partition)
        for tp in wanted:
            if tp not in self.states:
                state = self.states[tp] = PartitionState(tp)
                state.reset_strategy = initial_reset
                if metrics is not None:
                    metrics.watch_lag(tp.topic, tp.partition, functools.partial(
                        _records_lag, state, self.isolation_level == IsolationLevel.READ_COMMITTED))
        self._ready = collections.deque(r for r in self._ready if r.tp in self.states)

    def state(self, tp: TopicPartition) -> PartitionState:
        state = self.states.get(tp)
        if state is None:
            raise ValueError(f"partition {tp.topic}-{tp.partition} is not assigned to this consumer")
        return state

    # ---- offsets -------------------------------------------------------------------------

    def list_offsets(self, timestamps: dict[TopicPartition, int], timeout_ms: int) -> dict[TopicPartition, int]:
        """ListOffsets for each partition's timestamp (or -1 latest / -2 earliest), asking
        each partition's leader; retriable errors are retried until `timeout_ms`."""
        deadline = self._clock() + timeout_ms
        result: dict[TopicPartition, int] = {}
        remaining = dict(timestamps)
        attempt = 0
        last_error: EosError | None = None
        while remaining:
            by_node: dict[int, list] = {}
            for tp, timestamp in remaining.items():
                node = self._leader(tp, deadline)
                by_node.setdefault(node, []).append((tp, timestamp))
            for node, items in by_node.items():
                stub = self._metadata.broker_stub(node) if node != net.NO_LEADER else None
                if stub is None:
                    # No leader in our metadata (an election under way, say): ask again after
                    # the backoff. Without marking the topic stale the cached answer would be
                    # read again on every attempt until the deadline.
                    last_error = EosError(f"no leader known for {items[0][0]}", ErrorCode.LEADER_NOT_AVAILABLE)
                    for tp, _ in items:
                        self._metadata.mark_stale(tp.topic)
                    continue
                request = broker_pb2.ListOffsetsRequest(
                    isolation_level=self.isolation_level,
                    partitions=[broker_pb2.ListOffsetsPartition(topic=tp.topic, partition=tp.partition,
                                                                timestamp=ts) for tp, ts in items])
                try:
                    response = stub.ListOffsets(request, timeout=self._timeout_s(deadline))
                except grpc.RpcError as exc:
                    last_error = net.error_from_rpc(exc, "ListOffsets")
                    for tp, _ in items:
                        self._metadata.mark_stale(tp.topic)
                    continue
                for listed in response.partitions:
                    tp = TopicPartition(listed.topic, listed.partition)
                    if tp not in remaining:
                        continue
                    if listed.error_code == ErrorCode.NONE:
                        result[tp] = listed.offset
                        del remaining[tp]
                    elif reaction_for(listed.error_code) is Reaction.RETRY:
                        last_error = error_for(listed.error_code, listed.error_message)
                        self._metadata.mark_stale(tp.topic)
                    else:
                        raise error_for(listed.error_code, listed.error_message)
            if remaining:
                attempt += 1
                if self._clock() >= deadline:
                    raise last_error if last_error is not None else EosError(
                        f"ListOffsets for {sorted(remaining)} timed out", ErrorCode.REQUEST_TIMED_OUT)
                self._sleep_backoff(attempt, deadline)
                self._refresh_stale()
        return result

    def _leader(self, tp: TopicPartition, deadline: int) -> int:
        node = self._metadata.leader(tp.topic, tp.partition)
        if node == net.NO_LEADER or tp.topic in self._metadata.stale_topics():
            try:
                self._metadata.wait_for_topic(tp.topic, max(1, deadline - self._clock()))
            except EosError as exc:
                if not exc.retriable:
                    raise
            node = self._metadata.leader(tp.topic, tp.partition)
        return node

    def _timeout_s(self, deadline: int) -> float:
        return max(0.001, min(self._request_timeout_ms, deadline - self._clock()) / 1000)

    def _sleep_backoff(self, attempt: int, deadline: int) -> None:
        delay_ms = min(self._backoff.delay_ms(attempt), max(0, deadline - self._clock()))
        if delay_ms > 0:
            self.wakeup.wait(delay_ms / 1000)

    def _refresh_stale(self) -> None:
        stale = self._metadata.stale_topics()
        if stale:
            try:
                self._metadata.refresh_topics(stale)
            except EosError as exc:
                log.info("metadata refresh failed: %s", exc)

    def reset_positions(self, timeout_ms: int) -> None:
        """Give every partition without a position one, by its reset strategy."""
        timestamps = {}
        for tp, state in self.states.items():
            if state.position is not None:
                continue
            strategy = state.reset_strategy or self.auto_offset_reset
            if strategy == COMMITTED:
                continue   # the consumer looks the committed offset up first (it owns the group)
            if strategy == "none":
                raise NoOffsetForPartitionError(
                    f"no position for {tp.topic}-{tp.partition} and auto.offset.reset is none")
            timestamps[tp] = EARLIEST_TIMESTAMP if strategy == "earliest" else LATEST_TIMESTAMP
        if not timestamps:
            return
        offsets = self.list_offsets(timestamps, timeout_ms)
        for tp, offset in offsets.items():
            state = self.states.get(tp)
            if state is not None and state.position is None:
                state.seek(offset)

    # ---- fetching ------------------------------------------------------------------------

    def _fetchable(self, state: PartitionState, now: int) -> bool:
        return (state.position is not None and not state.in_flight and not state.paused
                and state.buffered < BUFFERED_RESPONSES_MAX and now >= state.retry_at_ms)

    def send_fetches(self) -> None:
        """One Fetch per broker that has fetchable partitions and none in flight."""
        now = self._clock()
        by_node: dict[int, list[PartitionState]] = {}
        missing_leader = False
        for state in self.states.values():
            if not self._fetchable(state, now):
                continue
            node = self._metadata.leader(state.tp.topic, state.tp.partition)
            if node == net.NO_LEADER or self._metadata.address_of(node) is None:
                self._metadata.mark_stale(state.tp.topic)
                missing_leader = True
                continue
            if node in self._in_flight:
                continue
            by_node.setdefault(node, []).append(state)
        # A leader that moved or died (NOT_LEADER_OR_FOLLOWER, a broken connection) marked its
        # topic stale: refresh it too, not only when a leader is missing, or the fetches would
        # go on to the old leader for good.
        stale = bool(self._metadata.stale_topics())
        if (missing_leader or stale) and now >= self._metadata_retry_at_ms:
            try:
                self._metadata.refresh_topics(self._metadata.stale_topics())
                self._metadata_attempts = 0
            except EosError as exc:
                self._metadata_attempts += 1
                self._metadata_retry_at_ms = now + self._backoff.delay_ms(self._metadata_attempts)
                log.info("metadata refresh failed: %s", exc)
        for node, states in by_node.items():
            stub = self._metadata.broker_stub(node)
            if stub is None:
                continue
            request = broker_pb2.FetchRequest(
                max_wait_ms=self._fetch_max_wait_ms, min_bytes=self._fetch_min_bytes,
                max_bytes=self._fetch_max_bytes, isolation_level=self.isolation_level,
                partitions=[broker_pb2.FetchPartition(
                    topic=s.tp.topic, partition=s.tp.partition, fetch_offset=s.fetch_offset,
                    partition_max_bytes=self._max_partition_fetch_bytes) for s in states])
            epochs = {}
            for s in states:
                s.in_flight = True
                epochs[s.tp] = (s.fetch_epoch, s.fetch_offset)
            timeout_s = (self._request_timeout_ms + self._fetch_max_wait_ms) / 1000
            start = getattr(stub.Fetch, "start", None)
            if start is not None:
                # the broker's socket port: sent from this thread now, its answer read by
                # this thread too (`handle_arrivals`, after `wait` on its socket)
                call = start(request, timeout=timeout_s, metadata=self._call_metadata or None)
                self._in_flight[node] = _FetchInFlight(node, epochs, call, now, direct=True)
                continue
            call = self._callers.submit(node, stub.Fetch, request, timeout=timeout_s,
                                        metadata=self._call_metadata or None)
            self._in_flight[node] = _FetchInFlight(node, epochs, call, now)
            call.add_done_callback(lambda _f, node=node: self._on_done(node))

    def has_records_waiting(self) -> bool:
        """Whether a partition that may be fetched now has, or may have, records at the
        broker past what has been received: its fetch offset is below the high watermark
        (the LSO under read_committed) its last response gave, or it has had no response yet.
        A Fetch for it is then worth sending before the records in hand are decoded
        (`Consumer.poll`)."""
        read_committed = self.isolation_level == IsolationLevel.READ_COMMITTED
        now = self._clock()
        for state in self.states.values():
            if state.fetch_offset is None or not self._fetchable(state, now):
                continue
            upper = state.last_stable_offset if read_committed else state.high_watermark
            if upper < 0 or state.fetch_offset < upper:
                return True
        return False

    def _on_done(self, node: int) -> None:  # a gRPC thread
        self._arrived.append((node, self._clock()))
        self.wakeup.set()

    @property
    def has_in_flight(self) -> bool:
        return bool(self._in_flight)

    def wait(self, timeout_s: float) -> None:
        """Sleep until a Fetch may have finished or another thread set `wakeup`, at most
        `timeout_s` (application thread) -- and no later than the first deadline of a Fetch
        read here, so that a broker that never answers fails the call on time."""
        direct = [in_flight.call for in_flight in self._in_flight.values()
                  if in_flight.direct and not in_flight.call.done()]
        deadlines = [call.deadline for call in direct if call.deadline is not None]
        if deadlines:
            timeout_s = min(timeout_s, max(0.0, min(deadlines) - time.monotonic()))
        self.wakeup.wait(timeout_s, [call.fileno() for call in direct])

    def handle_arrivals(self) -> bool:
        """Turn finished Fetch calls into received data (application thread); True when
        any call finished."""
        for in_flight in self._in_flight.values():
            if in_flight.direct and in_flight.call.poll():
                self._arrived.append((in_flight.node_id, self._clock()))
                self.wakeup.set()     # as `_on_done` does: the poll() loop must not sleep now
        handled = False
        while self._arrived:
            node, arrived_ms = self._arrived.popleft()
            in_flight = self._in_flight.pop(node, None)
            if in_flight is not None:
                self._handle_response(in_flight, arrived_ms)
                handled = True
        return handled

    def _handle_response(self, in_flight: _FetchInFlight, arrived_ms: int | None = None) -> None:
        """One finished Fetch call; `arrived_ms`, when it finished (default: now)."""
        now = self._clock()
        if arrived_ms is None:
            arrived_ms = now
        for tp in in_flight.epochs:
            state = self.states.get(tp)
            if state is not None:
                state.in_flight = False
        try:
            response = in_flight.call.result()
        except futures.CancelledError:
            return   # dropped by close()
        except (grpc.RpcError, ValueError) as exc:
            # ValueError: gRPC refuses a call on a channel closed under it (the metadata
            # replaced the broker's channel); retried like a broken connection.
            if isinstance(exc, grpc.RpcError):
                error = net.error_from_rpc(exc, f"Fetch from node {in_flight.node_id}")
                if exc.code() is grpc.StatusCode.CANCELLED:
                    return
            else:
                error = NetworkError(f"Fetch from node {in_flight.node_id}: {exc}")
            log.info("%s", error)
            for tp in in_flight.epochs:
                self._metadata.mark_stale(tp.topic)
                state = self.states.get(tp)
                if state is not None:
                    state.retry_at_ms = now + self._backoff.base_ms
            if not error.retriable:
                self._pending_error = error
            return
        if response.throttle_time_ms > 0:
            # Over a client quota (KIP-219): the broker answered without data; ask it again
            # only when the throttle is over.
            for tp in in_flight.epochs:
                state = self.states.get(tp)
                if state is not None:
                    state.retry_at_ms = max(state.retry_at_ms, now + response.throttle_time_ms)
        metrics = self._metrics
        if metrics is not None:
            metrics.fetch_latency_seconds.observe((arrived_ms - in_flight.sent_ms) / 1000)
            metrics.bytes_consumed.inc(sum(len(fetched.records) for fetched in response.partitions))
        for fetched in response.partitions:
            tp = TopicPartition(fetched.topic, fetched.partition)
            state = self.states.get(tp)
            sent = in_flight.epochs.get(tp)
            if state is None or sent is None or sent[0] != state.fetch_epoch:
                continue  # unassigned or sought since: stale data
            code = fetched.error_code
            if code == ErrorCode.NONE:
                state.high_watermark = fetched.high_watermark
                state.last_stable_offset = fetched.last_stable_offset
                state.log_start_offset = fetched.log_start_offset
                if fetched.records:
                    self._receive(state, fetched)
            elif code == ErrorCode.OFFSET_OUT_OF_RANGE:
                if self.auto_offset_reset == "none":
                    self._pending_error = OffsetOutOfRangeError(
                        f"fetch offset {sent[1]} is out of range for {tp.topic}-{tp.partition} "
                        f"and auto.offset.reset is none ({fetched.error_message})")
                else:
                    log.info("fetch offset %d out of range for %s-%d: resetting to %s", sent[1],
                             tp.topic, tp.partition, self.auto_offset_reset)
                    state.request_reset(None)
            elif reaction_for(code) is Reaction.RETRY:
                if fetched.HasField("current_leader") and self._metadata.learn_leader(
                        tp.topic, tp.partition, fetched.current_leader, in_flight.node_id):
                    continue    # KIP-951: the refusal named the new leader; fetch there at once
                self._metadata.mark_stale(tp.topic)
                state.retry_at_ms = now + self._backoff.base_ms
            else:
                self._pending_error = error_for(code, fetched.error_message)

    def _receive(self, state: PartitionState, fetched) -> None:
        buf = fetched.records
        # Where the next fetch starts: after the last whole batch received.
        position = 0
        next_offset = state.fetch_offset
        end = len(buf)
        while position < end:
            try:
                header = parse_header(buf, position)
            except CorruptRecordError as exc:
                if position == 0:
                    self._pending_error = exc
                    return
                break   # a partial batch at the end: fetched again next time
            next_offset = header.base_offset + header.last_offset_delta + 1
            position += header.size_bytes
        if position < end:
            buf = buf[:position]
        if next_offset <= state.fetch_offset:
            return  # only batches already consumed
        state.fetch_offset = next_offset
        aborted = None
        if self.isolation_level == IsolationLevel.READ_COMMITTED:
            aborted = [(a.first_offset, a.producer_id) for a in fetched.aborted_transactions]
            heapq.heapify(aborted)
        state.buffered += 1
        self._ready.append(_Received(state.tp, state.fetch_epoch, buf, aborted))

    # ---- handing out records -------------------------------------------------------------

    def raise_pending_error(self) -> None:
        error, self._pending_error = self._pending_error, None
        if error is not None:
            raise error

    @property
    def has_pending_error(self) -> bool:
        return self._pending_error is not None

    def collect(self, max_records: int) -> list[Record]:
        out: list[Record] = []
        ready = self._ready
        held = []       # of paused partitions: kept, in order, for after resume()
        while ready and len(out) < max_records:
            received = ready[0]
            state = self.states.get(received.tp)
            if state is None or received.epoch != state.fetch_epoch:
                ready.popleft()   # unassigned, or sought since it was fetched
                continue
            if state.paused:
                held.append(ready.popleft())
                continue
            self._take(received, state, max_records - len(out), out)
            if received.exhausted:
                ready.popleft()
                state.buffered -= 1
        if held:
            ready.extendleft(reversed(held))
        if out and self._metrics is not None:
            self._metrics.records_consumed.inc(len(out))
        return out

    def _take(self, received: _Received, state: PartitionState, limit: int, out: list) -> None:
        """Up to `limit` records of `received` from the partition's position on. A batch is
        decoded only as far as it is handed out (a part at a time, resumed where the last
        part stopped), and from the position on: a consumer that sought into a big batch,
        or stops reading before its end, does not pay for the records it never takes."""
        buf = received.buf
        topic, partition = received.tp
        while limit > 0:
            header = received.batch
            if header is None:
                if received.position_in_buf >= len(buf):
                    received.exhausted = True
                    return
                header = parse_header(buf, received.position_in_buf)
                received.position_in_buf += header.size_bytes
                next_offset = header.base_offset + header.last_offset_delta + 1
                if next_offset <= state.position:
                    continue
                if received.aborted_heap is not None and header.producer_id >= 0:
                    if self._skip_for_read_committed(received, header):
                        state.position = next_offset
                        continue
                if header.is_control:
                    state.position = next_offset
                    continue
                if self._check_crcs:
                    verify_crc(buf, header)
                received.batch = header
                received.batch_resume = None
            records, resume = decode_records_part(buf, header, topic, partition, first_offset=state.position,
                                                  max_records=limit, resume=received.batch_resume)
            if records:
                out.extend(records)
                limit -= len(records)
                state.position = records[-1].offset + 1
            received.batch_resume = resume
            if resume is None:
                # The batch is done; offsets compaction removed from its end are passed too.
                state.position = max(state.position, header.base_offset + header.last_offset_delta + 1)
                received.batch = None
                if received.position_in_buf >= len(buf):
                    received.exhausted = True
                    return

    @staticmethod
    def _skip_for_read_committed(received: _Received, header) -> bool:
        """Kafka's read_committed walk: whether this batch belongs to an aborted transaction."""
        heap = received.aborted_heap
        last_offset = header.base_offset + header.last_offset_delta
        while heap and heap[0][0] <= last_offset:
            received.aborted_producers.add(heapq.heappop(heap)[1])
        producer_id = header.producer_id
        if header.is_control:
            if producer_id in received.aborted_producers:
                marker_type, _ = decode_control_record(received.buf, header)
                if marker_type == CONTROL_TYPE_ABORT:
                    received.aborted_producers.discard(producer_id)
            return True   # control batches are never shown
        return header.is_transactional and producer_id in received.aborted_producers

    # ---- shutdown ------------------------------------------------------------------------

    def close(self) -> None:
        for in_flight in list(self._in_flight.values()):
            in_flight.call.cancel()   # only one not started yet; a running one ends with its channel
        self._in_flight.clear()
        self._callers.close()
        self.wakeup.close()
        self._ready.clear()
