"""One ordered ProduceStream to one broker: Kafka's connection, over gRPC or the socket port.

Theory of operation
-------------------
gRPC runs concurrent unary calls of one channel in any order on the server's worker
threads; Kafka's clients rely on a TCP connection whose requests the broker handles one at
a time, in arrival order. The broker's `ProduceStream` RPC gives that back: it handles the
requests of one stream in order and answers in order, each answer echoing the request's
`correlation_id`. The sender keeps one `ProduceStream` per broker and pipelines up to
max.in.flight.requests.per.connection requests on it.

- Requests go into a queue that feeds the call's request iterator (gRPC consumes it on a
  thread of its own). The sender never has more than its in-flight bound outstanding on a
  stream (more is a bug: InvariantError), which bounds the queue. It is a
  `queue.SimpleQueue`: put and get are single C calls, where `queue.Queue` wakes the
  consumer through a Python-level Condition (two more lock round trips, each a chance to
  wait for the GIL) -- this handoff is on the path of every record sent.
- A reader thread takes the answers in order. Each must carry the correlation id of the
  oldest outstanding request; it is handed to `on_answer(request_id, answer)` (the
  sender's mailbox), where `answer.result()` returns the ProduceResponse or raises.
- The stream fails as a whole: the broker went away, the stream broke, an answer came out
  of order, or the sender aborted it (a request outlived request.timeout.ms, the producer
  closed). Every outstanding request is then answered with the error -- a retriable
  NetworkError, or RequestTimedOutError -- since each may or may not have been handled,
  which is what idempotence makes safe to retry. The sender opens a new stream for what
  it sends next. A failed stream never takes another request.
- A broker without ProduceStream answers UNIMPLEMENTED before handling anything; the
  stream says so (`unimplemented`), fails its requests as retriable, and the sender falls
  back to unary Produce for that broker. A broker that serves as many streams as it can
  refuses one more at open (RESOURCE_EXHAUSTED with trailing metadata
  `eos-produce-stream-refused`); the stream says so (`refused`) and the sender uses unary
  Produce for that broker for a while before it tries a stream again.

Over a broker's socket port (eos/socket_rpc.py, when Metadata names one) the stream is
*direct*: the call is a `SocketStreamCall`, and the sender's own thread does both halves.
`send` writes the request to the connection, with no queue and no gRPC thread in between (a
send waits for room in the connection at most `send_timeout_s`, request.timeout.ms: a broker
that stops reading fails the stream instead of holding the sender). There is no reader
thread: the sender sleeps in poll() on the stream's socket (`fileno`) beside its wake-up
pipe, and `take_answers` hands it the answers that came, read without waiting. So an answer
reaches the sender with no thread woken in between, as a Kafka client's sender reads its own
connections. A direct stream that ends (the broker closed it, an answer out of order, an
abort) fails its outstanding requests through `on_answer`, as a reader thread would: from
`take_answers`, or from `abort` itself.

One lock guards the outstanding list and the closed flag, so that a request is either
accepted before the stream fails (and is failed with it) or refused (and the sender sends
it elsewhere): none is lost between the two.

`ProduceStreams` is the sender's set of them: the stream of each broker (opened on the first
send, reopened after a failure), the brokers on unary Produce instead (none there, or one
refused lately: tried again after STREAM_REFUSED_RETRY_MS), the abort of a stream whose
oldest request outlived request.timeout.ms, and which streams the sender sleeps on.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
from typing import Callable

import grpc

from eos import net
from eos.errors import EosError, InvariantError, NetworkError, RequestTimedOutError
from eos.v1 import broker_pb2

log = logging.getLogger("eos.producer")

CORRELATION_ID_MODULUS = 1 << 31      # int32 on the wire, kept non-negative
# Trailing metadata with which a broker refuses a stream at open (broker/service.py): the
# value says why, "resource_exhausted" (it serves as many streams as it can) or
# "unavailable" (it is stopping). It tells the refusal from gRPC's own RESOURCE_EXHAUSTED
# (a message over the broker's size limit).
STREAM_REFUSAL_METADATA_KEY = "eos-produce-stream-refused"
REFUSED_RESOURCE_EXHAUSTED = "resource_exhausted"
_END_OF_STREAM = object()
# New batches of one partition in flight at once for an idempotent producer that has to
# fall back to unary Produce (a broker without ProduceStream). gRPC hands concurrent unary
# calls to the broker's worker threads, which may append them in either order; every
# inversion costs an OUT_OF_ORDER_SEQUENCE_NUMBER answer and a resend of the batch and of
# those behind it. Measured on one partition, 16 KiB batches: 2 in flight gave the most
# records/s. On a ProduceStream the broker keeps the order, and the window (5) is the bound.
IDEMPOTENT_IN_FLIGHT_PER_PARTITION_UNARY = 2
# A broker that refused a produce stream (it serves as many as it can) gets unary Produce
# calls for this long before the sender asks for a stream again.
STREAM_REFUSED_RETRY_MS = 30_000


def _refusal_of(exc: grpc.RpcError) -> str | None:
    try:
        trailing = exc.trailing_metadata() or ()
    except Exception:   # an error that carries no call (the channel was closed)
        return None
    for key, value in trailing:
        if key == STREAM_REFUSAL_METADATA_KEY:
            return value
    return None


class StreamAnswer:
    """A ProduceResponse (or the stream's failure) for one request, shaped like a finished
    gRPC future: `result()` returns the response or raises."""

    __slots__ = ("_response", "_error")

    def __init__(self, response: broker_pb2.ProduceResponse | None, error: BaseException | None = None):
        self._response = response
        self._error = error

    def result(self) -> broker_pb2.ProduceResponse:
        if self._error is not None:
            raise self._error
        return self._response


class ProduceStream:
    """One ProduceStream call to `node_id`; see the module doc."""

    def __init__(self, stub, node_id: int, *, in_flight_max: int,
                 on_answer: Callable[[int, StreamAnswer], None], metadata: tuple = (),
                 send_timeout_s: float = 30.0):
        self.node_id = node_id
        self._on_answer = on_answer
        self._in_flight_max = in_flight_max
        # Holds at most in_flight_max requests (send() checks) and the end-of-stream marker.
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding: collections.deque = collections.deque()   # (correlation_id, request_id, sent_ms)
        self._next_correlation_id = 0
        self._closed = False
        self._abort_error: EosError | None = None
        self.unimplemented = False      # the broker has no ProduceStream
        self.refused = False            # the broker had no room for another stream
        open_direct = getattr(stub.ProduceStream, "open", None)
        # direct: the broker's socket port (eos/socket_rpc.py); the sender's thread writes
        # each request to the connection and reads the answers itself (`take_answers`, when
        # poll() says `fileno()` is readable), with no thread between it and the socket
        self.direct = open_direct is not None
        if self.direct:
            self._call = open_direct(metadata=metadata or None, send_timeout_s=send_timeout_s)
            self._put = self._call.send
            self._reader = None
        else:
            self._call = stub.ProduceStream(self._request_iterator(), metadata=metadata or None)
            self._put = self._requests.put
            self._reader = threading.Thread(target=self._read, name=f"eos-produce-stream-{node_id}", daemon=True)
            self._reader.start()

    # ---- the sender's side ----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def aborted(self) -> bool:
        """abort() was called: its requests are being failed (or were), none is taken."""
        return self._abort_error is not None

    def outstanding_count(self) -> int:
        return len(self._outstanding)

    def oldest_sent_ms(self) -> int | None:
        """When the oldest unanswered request was sent, or None."""
        with self._lock:
            return self._outstanding[0][2] if self._outstanding else None

    def send(self, request_id: int, request: broker_pb2.ProduceRequest, now_ms: int) -> bool:
        """Queue `request` (its correlation_id is set here). False if the stream has
        failed: the request was not taken."""
        with self._lock:
            if self._closed:
                return False
            if len(self._outstanding) >= self._in_flight_max:
                raise InvariantError(f"more than {self._in_flight_max} requests outstanding on the "
                                     f"produce stream to node {self.node_id}")
            correlation_id = self._next_correlation_id
            self._next_correlation_id = (correlation_id + 1) % CORRELATION_ID_MODULUS
            request.correlation_id = correlation_id
            self._outstanding.append((correlation_id, request_id, now_ms))
        # Outside the lock: a socket's send may wait for room in the connection, while the
        # reader needs the lock to take the answers that make room. Requests still go out in
        # order: the sender's one thread is the only caller. A send that fails (the stream
        # broke) leaves the request outstanding, and the reader fails it with the stream.
        self._put(request)
        return True

    def abort(self, error: EosError) -> None:
        """Fail the stream and every outstanding request with `error` (the answers arrive
        through on_answer: from the reader thread, or at once on a direct stream)."""
        with self._lock:
            if self._closed:
                return
            if self._abort_error is None:
                self._abort_error = error
        self._call.cancel()
        if self.direct:
            self._fail(error)

    def close(self) -> None:
        """Half-close (no more requests) and cancel: used when the producer stops."""
        self.abort(NetworkError(f"the produce stream to node {self.node_id} was closed"))

    def join(self, timeout_s: float | None = None) -> None:
        if self._reader is not None:
            self._reader.join(timeout_s)

    # ---- a direct stream: read by the sender's thread ---------------------------------------

    def fileno(self) -> int:
        return self._call.fileno()

    def take_answers(self) -> list[tuple[int, StreamAnswer]]:
        """The (request id, answer) pairs that have arrived on a direct stream, in order,
        without waiting (the sender's thread, after poll()). When the stream is over, its
        outstanding requests are failed through on_answer as on a reader thread, and
        `closed` turns true."""
        answers: list[tuple[int, StreamAnswer]] = []
        error: EosError | None = None
        try:
            responses, outcome = self._call.receive_ready()
            for response in responses:
                request_id, error = self._match(response)
                if error is not None:
                    break
                answers.append((request_id, StreamAnswer(response)))
            else:
                if outcome is not None:
                    error = self._error_of_end(outcome)
        except Exception as exc:   # a malformed answer: fail the stream rather than the sender
            log.exception("reading the produce stream failed")
            error = NetworkError(f"the produce stream to node {self.node_id} failed: {exc!r}")
        if error is not None:
            self._call.cancel()
            self._fail(error)
        return answers

    # ---- gRPC's side -----------------------------------------------------------------------

    def _request_iterator(self):
        requests = self._requests
        while True:
            request = requests.get()
            if request is _END_OF_STREAM:
                return
            yield request

    def _read(self) -> None:
        error: EosError | None = None
        try:
            for response in self._call:
                request_id, error = self._match(response)
                if error is not None:
                    break
                self._on_answer(request_id, StreamAnswer(response))
            else:
                error = NetworkError(f"the broker (node {self.node_id}) ended the produce stream")
        except grpc.RpcError as exc:
            error = self._error_of_end(exc)
        except Exception as exc:   # a bug in a callback: fail the stream rather than hang it
            log.exception("produce stream reader failed")
            error = NetworkError(f"the produce stream to node {self.node_id} failed: {exc!r}")
        self._fail(error)

    def _match(self, response) -> tuple[int, EosError | None]:
        """(the request id `response` answers, None), or (-1, the error) when it answers
        no request or not the oldest one."""
        with self._lock:
            if not self._outstanding:
                return -1, NetworkError(f"the produce stream to node {self.node_id} answered a request it "
                                        f"was never sent (correlation id {response.correlation_id})")
            correlation_id, request_id, _ = self._outstanding[0]
            if response.correlation_id != correlation_id:
                return -1, NetworkError(f"the produce stream to node {self.node_id} answered correlation id "
                                        f"{response.correlation_id} where {correlation_id} was due")
            self._outstanding.popleft()
        return request_id, None

    def _error_of_end(self, end: grpc.RpcError) -> EosError:
        """The error that fails the outstanding requests when the stream ended with `end`."""
        if end.code() is grpc.StatusCode.OK:
            return NetworkError(f"the broker (node {self.node_id}) ended the produce stream")
        refusal = _refusal_of(end)
        if end.code() is grpc.StatusCode.UNIMPLEMENTED:
            self.unimplemented = True
            return NetworkError(f"node {self.node_id} does not serve ProduceStream; using unary Produce")
        if refusal == REFUSED_RESOURCE_EXHAUSTED:
            # The broker serves as many streams as it can: nothing was handled.
            self.refused = True
            return NetworkError(f"node {self.node_id} refused a produce stream (too many open); "
                                f"using unary Produce for a while")
        if refusal is not None:   # "unavailable": the broker is stopping
            return NetworkError(f"node {self.node_id} refused a produce stream: {end.details()}")
        return net.error_from_rpc(end, f"ProduceStream to node {self.node_id}")

    def _fail(self, error: EosError) -> None:
        with self._lock:
            if self._abort_error is not None:
                error = self._abort_error
            # End the request iterator so gRPC's consumer thread is not left waiting.
            self._requests.put(_END_OF_STREAM)
            # The failures are handed over before `closed` turns true: a sender that sees
            # the stream closed finds them in its mailbox on its next pass.
            for _, request_id, _ in self._outstanding:
                self._on_answer(request_id, StreamAnswer(None, error))
            self._outstanding.clear()
            self._closed = True
        self._call.cancel()


class ProduceStreams:
    """The sender's produce streams: one `ProduceStream` per broker, and the brokers that get
    unary Produce calls instead (one without ProduceStream, or one that refused a stream
    lately). The sender's thread alone uses it; nothing here is shared.

    `enabled` is false for acks=0 (nothing answers it, so nothing needs order) and when the
    producer was told not to use streams: then every node is unary."""

    def __init__(self, *, enabled: bool, in_flight_max: int, on_answer: Callable[[int, StreamAnswer], None],
                 call_metadata: tuple, request_timeout_ms: int):
        self._enabled = enabled
        self._in_flight_max = in_flight_max
        self._on_answer = on_answer
        self._call_metadata = call_metadata
        self._request_timeout_ms = request_timeout_ms
        self._by_node: dict[int, ProduceStream] = {}
        # node -> None (no ProduceStream there) or the time to try a stream again (refused)
        self._unary_nodes: dict[int, int | None] = {}

    @property
    def any(self) -> bool:
        """Whether there is anything for `check` to look at."""
        return bool(self._by_node or self._unary_nodes)

    def stream_to(self, node: int) -> ProduceStream | None:
        return self._by_node.get(node)

    def all(self) -> list[ProduceStream]:
        return list(self._by_node.values())

    def ordered(self, node: int) -> bool:
        """Whether requests to `node` go on its ProduceStream (which keeps their order)."""
        return self._enabled and node not in self._unary_nodes

    def send(self, node: int, stub, request_id: int, request: broker_pb2.ProduceRequest, now_ms: int) -> bool:
        """Queue the request on the node's stream, opening one if there is none (or the one
        there just failed). False if no stream could be opened."""
        for _ in range(2):
            stream = self._by_node.get(node)
            if stream is None or stream.closed:
                try:
                    stream = self._by_node[node] = ProduceStream(
                        stub, node, in_flight_max=self._in_flight_max, on_answer=self._on_answer,
                        metadata=self._call_metadata, send_timeout_s=self._request_timeout_ms / 1000)
                except Exception as exc:  # the channel is closed
                    log.info("opening a produce stream to node %d failed: %r", node, exc)
                    return False
            if stream.send(request_id, request, now_ms):
                return True
        return False

    def awaited(self) -> list[ProduceStream]:
        """The direct streams with answers due: the sender sleeps on their sockets too."""
        return [stream for stream in self._by_node.values()
                if stream.direct and not stream.closed and stream.outstanding_count()]

    def check(self, now_ms: int, in_flight_by_node: dict[int, int]) -> bool:
        """Drop failed streams (a broker without ProduceStream, or one that refused a stream,
        gets unary Produce) and abort streams whose oldest request outlived
        request.timeout.ms. `in_flight_by_node[node]`: requests in flight to the node.
        True if a stream was dropped: its failed requests are in the mailbox, and the sender
        handles them before it drains again."""
        dropped = False
        for node, until_ms in list(self._unary_nodes.items()):
            if until_ms is not None and now_ms >= until_ms and not in_flight_by_node.get(node, 0):
                # Try a stream again, once no unary call is in flight there: a plain
                # producer's next request must not overtake one that is.
                del self._unary_nodes[node]
        for node, stream in list(self._by_node.items()):
            if stream.closed:
                del self._by_node[node]
                dropped = True
                if stream.unimplemented and node not in self._unary_nodes:
                    log.warning("node %d has no ProduceStream RPC: falling back to unary Produce "
                                "(idempotent producers then keep at most %d batches of a partition in flight)",
                                node, IDEMPOTENT_IN_FLIGHT_PER_PARTITION_UNARY)
                    self._unary_nodes[node] = None
                elif stream.refused:
                    log.info("node %d refused a produce stream (too many open): unary Produce for %d ms",
                             node, STREAM_REFUSED_RETRY_MS)
                    self._unary_nodes[node] = now_ms + STREAM_REFUSED_RETRY_MS
                continue
            if stream.aborted:
                continue    # its reader thread is failing its requests; the drain holds the node
            oldest_ms = stream.oldest_sent_ms()
            if oldest_ms is not None and now_ms - oldest_ms >= self._request_timeout_ms:
                stream.abort(RequestTimedOutError(
                    f"no answer from node {node} within request.timeout.ms ({self._request_timeout_ms} ms); "
                    f"the produce stream is reopened"))
                # Nothing newer may go to the node before the failed requests are handled and
                # queued for their retry, or it would overtake them: a direct stream failed them
                # at once (they are in the mailbox), so the sender handles them before it
                # drains; a gRPC stream's reader fails them later, and the drain holds the node
                # until then (`aborting_nodes`).
                if stream.closed:
                    del self._by_node[node]
                    dropped = True
        return dropped

    def aborting_nodes(self) -> set[int]:
        """Nodes whose stream was aborted and is still failing its requests (gRPC's reader)."""
        return {node for node, stream in self._by_node.items() if stream.aborted and not stream.closed}

    def close(self) -> None:
        streams = list(self._by_node.values())
        self._by_node.clear()
        for stream in streams:
            stream.close()
        for stream in streams:
            stream.join(1.0)
