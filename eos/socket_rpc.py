"""gRPC's calls over a plain TCP socket: the client's channel.

Theory of operation
-------------------
A message on a Python gRPC stream costs about 0.55 ms and 300-500 us of CPU on each side on
this project's 2-core VM, most of it thread hand-offs inside gRPC (bench/README, "The
round-trip floor"); the same exchange as a length-prefixed frame on a TCP connection costs
0.15 ms. Kafka's clients speak such frames. A broker with `socket.transport.port` serves the
same services, the same handlers and the same server interceptors (identity, request quota,
metrics) over such a connection too (broker/socket_server.py), and says so in Metadata
(`BrokerNode.socket_port`); a PLAINTEXT client then makes its calls to that broker there.
It carries gRPC's call model, not a second protocol: a method name, the request's protobuf
bytes, the response's protobuf bytes or a gRPC status code with details and trailing
metadata. So every handler, and every client's error handling (`grpc.RpcError.code()`),
is the same code on both transports.

The frames and their kinds are eos/socket_frames.py's.

The client's side (`SocketChannel`) has the face of a `grpc.Channel` for what the generated
stubs build (`unary_unary`, `stream_stream`), so `stub_class(SocketChannel(...))` is a stub
whose calls go over the socket: `Method(request, timeout=, metadata=)` makes the call on the
calling thread itself (it sends, then reads its answer: no other thread is woken);
`Method.future(...)` runs that on a thread of its own; `Method.start(...)` (a `PendingCall`)
sends the call at once and leaves its answer to the caller, who waits on its `fileno()` and
reads it with `poll()` (the consumer's Fetch); `ProduceStream.open(metadata=)` gives a stream
the caller sends on directly (`send`), with answers read by iterating it on a thread, or by
its owner with `receive_ready()` when `fileno()` is readable (the producer's sender).
Failures are `SocketRpcError`, a `grpc.RpcError` with gRPC's codes: a connection that cannot
be made or breaks is UNAVAILABLE (the request may or may not have been handled), a call
past its timeout is DEADLINE_EXCEEDED, and the server's own statuses come through as sent.
A connection that failed is closed, never reused. Plaintext only: TLS and SASL clients stay
on gRPC.
"""
from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
import weakref
from concurrent.futures import InvalidStateError
from typing import Callable, Iterator

import grpc

from eos.socket_frames import (CALL, HALF_CLOSE, MESSAGE, OPEN, REFUSED, REPLY, STATUS, ConnectionClosed,
                               READ_BUFFER_BYTES, FrameError, FrameTooLarge, call_frame, decode_status, frame,
                               read_frame, receive_available, send_within, split_frames, wait_for)

log = logging.getLogger("eos.socket_rpc")

CONNECT_TIMEOUT_S = 10.0
# How long a stream's send may wait for room in the connection (a broker that stopped
# reading) before the stream is given up; the producer passes its request.timeout.ms.
STREAM_SEND_TIMEOUT_S = 30.0
IDLE_CONNECTIONS_MAX = 8                   # kept open per channel for later calls
# A pooled connection unused this long is closed rather than reused: Kafka's client
# connections.max.idle.ms, below the broker's default (10 minutes), so that the client, not
# the broker, ends an idle connection and no call is sent on one the broker is closing.
IDLE_CONNECTION_MAX_S = 540.0
# A started call (`PendingCall`) connects on its caller's thread, which is an application's
# poll(): a port that drops connection attempts (a firewall) must not hold it for the full
# CONNECT_TIMEOUT_S. Past this the call fails UNAVAILABLE, and the client's routes send that
# broker's calls back to gRPC (eos/socket_routes.py). A loopback or LAN connect takes well
# under a millisecond; one SYN lost to a full accept queue is resent after 1 s.
STARTED_CALL_CONNECT_TIMEOUT_S = 2.0
CORRELATION_ID_MODULUS = 1 << 32

# ---- the client's side --------------------------------------------------------------------------

class SocketRpcError(grpc.RpcError, grpc.Call):
    """A failed call, shaped like gRPC's: code(), details(), trailing_metadata()."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing=()):
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details
        self._trailing = tuple(trailing or ())

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self):
        return self._trailing

    def initial_metadata(self):
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self):
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback) -> bool:
        return False


class _Connection:
    """One TCP connection to the broker's socket port."""

    def __init__(self, address: tuple[str, int], connect_timeout_s: float):
        try:
            self.sock = socket.create_connection(address, timeout=connect_timeout_s)
        except OSError as exc:
            raise SocketRpcError(grpc.StatusCode.UNAVAILABLE,
                                 f"cannot connect to {address[0]}:{address[1]}: {exc}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking, for good: sends go through `send_within`, a call's answer is read without
        # waiting (`receive_available`) once poll() says it came, and a stream's reader
        # blocks; so no call sets a timeout (each setting, and the poll Python makes before
        # every I/O on a socket with one, is a system call that gives up the GIL).
        self.sock.settimeout(None)
        self.reader = self.sock.makefile("rb", buffering=READ_BUFFER_BYTES)
        self.next_correlation_id = 0
        self.address = address
        self.idle_since = time.monotonic()     # when it last went back to its pool

    def take_correlation_id(self) -> int:
        correlation_id = self.next_correlation_id
        self.next_correlation_id = (correlation_id + 1) % CORRELATION_ID_MODULUS
        return correlation_id

    def close(self) -> None:
        close_connection(self.sock, self.reader)


def shut_down(sock: socket.socket) -> None:
    """End both directions now: a thread blocked reading the socket wakes with end of file."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def close_connection(sock: socket.socket, reader) -> None:
    """Close a connection and its buffered reader (client's or broker's side). Shut down
    first: closing the reader waits for its lock, which a thread blocked reading holds."""
    shut_down(sock)
    try:
        reader.close()
    except Exception:       # a reader failed mid-read is already unusable
        pass
    sock.close()


def _status_error(body) -> SocketRpcError:
    """The SocketRpcError a STATUS frame's body carries (FrameError if it is malformed)."""
    code, details, trailing = decode_status(body)
    return SocketRpcError(code, details, trailing)


def _check_answer(kind: int, answered_id: int, correlation_id: int) -> None:
    """FrameError unless the frame is a REPLY or STATUS to unary call `correlation_id`: the
    connection is out of step, and never reused."""
    if answered_id != correlation_id or kind not in (REPLY, STATUS):
        raise FrameError(f"answer {kind}/{answered_id} to call {correlation_id}")


def _too_large(exc: FrameTooLarge) -> SocketRpcError:
    return SocketRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"Received message larger than max ({exc.size} vs. {exc.limit})")


def _cancelled() -> SocketRpcError:
    return SocketRpcError(grpc.StatusCode.CANCELLED, "Locally cancelled by application!")


def _failure(exc: BaseException, where: str) -> SocketRpcError:
    if isinstance(exc, SocketRpcError):
        return exc
    if isinstance(exc, socket.timeout):
        return SocketRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"Deadline Exceeded ({where})")
    return SocketRpcError(grpc.StatusCode.UNAVAILABLE, f"the connection to {where} failed: {exc}")


class SocketChannel:
    """A channel's face over the broker's socket port (see the module doc); method kinds the
    socket does not carry (unary-stream, stream-unary) go to `fallback`, a grpc.Channel."""

    def __init__(self, host: str, port: int, fallback: grpc.Channel | None = None, *,
                 receive_bytes_max: int = 100 * 1024 * 1024, on_unreachable: Callable[[], None] | None = None):
        self.address = (host, port)
        self._on_unreachable = on_unreachable     # told when a connection cannot be made
        self._where = f"{host}:{port}"
        self._fallback = fallback
        self.receive_bytes_max = receive_bytes_max
        self._idle: list[_Connection] = []
        self._streams: weakref.WeakSet = weakref.WeakSet()   # open streams, cancelled by close()
        self._lock = threading.Lock()
        self._closed = False

    # what the generated stubs call
    def unary_unary(self, method, request_serializer=None, response_deserializer=None, **_):
        return _UnaryMethod(self, method, request_serializer, response_deserializer)

    def stream_stream(self, method, request_serializer=None, response_deserializer=None, **_):
        return _StreamMethod(self, method, request_serializer, response_deserializer)

    def unary_stream(self, method, *args, **kwargs):
        if self._fallback is None:
            return _not_carried(method)
        return self._fallback.unary_stream(method, *args, **kwargs)

    def stream_unary(self, method, *args, **kwargs):
        if self._fallback is None:
            return _not_carried(method)
        return self._fallback.stream_unary(method, *args, **kwargs)

    def close(self) -> None:
        """Close the pooled connections and cancel the open streams (as closing a gRPC
        channel cancels its calls)."""
        with self._lock:
            self._closed = True
            streams = list(self._streams)
        self._drop_idle()
        for stream in streams:
            stream.cancel()

    def track_stream(self, stream: "SocketStreamCall") -> None:
        with self._lock:
            closed = self._closed
            if not closed:
                self._streams.add(stream)
        if closed:
            stream.cancel()

    # connections
    def connect(self, timeout_s: float | None = None) -> _Connection:
        if self._closed:
            raise SocketRpcError(grpc.StatusCode.CANCELLED, "the channel was closed")
        try:
            return _Connection(self.address, min(timeout_s or CONNECT_TIMEOUT_S, CONNECT_TIMEOUT_S))
        except SocketRpcError:
            if self._on_unreachable is not None:
                self._on_unreachable()
            raise

    def refusal(self, body: bytes) -> SocketRpcError:
        """A REFUSED frame came: this port serves no more connections now. Its broker's calls
        go over gRPC for a while (`on_unreachable`, as after a refused connect); the call
        fails UNAVAILABLE -- it was not handled -- and its retry takes the gRPC route."""
        if self._on_unreachable is not None:
            self._on_unreachable()
        return SocketRpcError(grpc.StatusCode.UNAVAILABLE,
                              f"the socket port {self._where} refused the connection: "
                              f"{bytes(body).decode('utf-8', 'replace')}")

    def _take(self, timeout_s: float | None) -> tuple[_Connection, bool]:
        """A connection for one call, and whether it was idle in the pool (used before)."""
        stale = []
        taken = None
        with self._lock:
            oldest_kept = time.monotonic() - IDLE_CONNECTION_MAX_S
            while self._idle and taken is None:
                connection = self._idle.pop()
                if connection.idle_since < oldest_kept:
                    stale.append(connection)
                else:
                    taken = connection
        for connection in stale:
            connection.close()
        if taken is not None:
            return taken, True
        return self.connect(timeout_s), False

    def _drop_idle(self) -> None:
        """A connection from the pool broke: the others were opened to the same broker
        process and most likely broke with it (a restart), so none is tried again."""
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _give_back(self, connection: _Connection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < IDLE_CONNECTIONS_MAX:
                connection.idle_since = time.monotonic()
                self._idle.append(connection)
                return
        connection.close()

    def call(self, method: str, payload: bytes, timeout_s: float | None, metadata,
             on_connection: Callable[[_Connection | None], bool] | None = None) -> bytes:
        """One unary call on a connection of the pool, on this thread: the response's bytes,
        or SocketRpcError. `on_connection` (a SocketFuture's) is told the connection when
        the call takes it and None when it lets go of it; False means the call was
        cancelled meanwhile, and the connection is closed rather than pooled."""
        pending = PendingCall(self, method, payload, None, timeout_s, metadata,
                              connect_timeout_s=timeout_s, on_connection=on_connection)
        pending.wait()
        return pending.result()


def _not_carried(method: str):
    def call(*_args, **_kwargs):
        raise SocketRpcError(grpc.StatusCode.UNIMPLEMENTED,
                             f"{method}: the socket transport carries unary calls and bidirectional streams only")
    return call


class _UnaryMethod:
    """`stub.Method`: called, or `.future(...)`."""

    def __init__(self, channel: SocketChannel, method: str, serialize, deserialize):
        self._channel = channel
        self._method = method
        self._serialize = serialize
        self._deserialize = deserialize

    def __call__(self, request, timeout=None, metadata=None, **_):
        return self._deserialize(self._channel.call(self._method, self._serialize(request), timeout, metadata))

    def future(self, request, timeout=None, metadata=None, **_) -> "SocketFuture":
        return SocketFuture(self._channel, self._method, self._serialize(request), self._deserialize,
                            timeout, metadata)

    def start(self, request, timeout=None, metadata=None) -> "PendingCall":
        """Send the call now and read its answer later, on the caller's thread (`PendingCall`)."""
        return PendingCall(self._channel, self._method, self._serialize(request), self._deserialize,
                           timeout, metadata)


class PendingCall:
    """A unary call sent at once whose answer its caller reads itself, later, without a
    thread: it waits on `fileno()` (eos.wakeup.Wakeup) and calls `poll()`, which reads what
    came without waiting and says whether the call is over; `result()` then gives the
    response or raises SocketRpcError, as the call itself would have. Past its timeout,
    poll() ends it with DEADLINE_EXCEEDED. One thread uses a PendingCall; the connection
    goes back to the channel's pool when the answer is read, and is closed if the call
    fails or is cancelled."""

    def __init__(self, channel: SocketChannel, method: str, payload: bytes, deserialize, timeout_s, metadata, *,
                 connect_timeout_s: float | None = STARTED_CALL_CONNECT_TIMEOUT_S,
                 on_connection: Callable[[_Connection | None], bool] | None = None):
        """`deserialize` None: the response is its bytes. `on_connection`: see SocketChannel.call."""
        self._channel = channel
        self._deserialize = deserialize
        self._on_connection = on_connection
        self._where = f"{channel.address[0]}:{channel.address[1]} ({method})"
        # when poll() ends the call as DEADLINE_EXCEEDED (time.monotonic()); None: never
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._inbox = bytearray()
        self._response = None
        self._error: SocketRpcError | None = None
        self._done = False
        self._connection: _Connection | None = None
        self._reused = False      # the connection came from the pool (it may have gone stale)
        try:
            self._connection, self._reused = channel._take(
                connect_timeout_s if timeout_s is None or connect_timeout_s is None
                else min(timeout_s, connect_timeout_s))
            if on_connection is not None:
                on_connection(self._connection)   # cancelled: it closed the connection; the send fails
            self._correlation_id = self._connection.take_correlation_id()
            send_within(self._connection.sock, call_frame(CALL, self._correlation_id, method, metadata, payload),
                        timeout_s)
        except (SocketRpcError, OSError, ValueError, struct.error) as exc:
            # (ValueError, struct.error: metadata the frame cannot carry; the call fails
            # UNAVAILABLE as it did before, and the connection it took is closed)
            self._fail(exc)

    def fileno(self) -> int:
        return -1 if self._done or self._connection is None else self._connection.sock.fileno()

    def wait(self) -> None:
        """Block until the call is over: answered, failed, or past its deadline. (It sleeps
        first: just after the send, a read could only find nothing.)"""
        while not self._done:
            remaining_s = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
            wait_for(self.fileno(), select.POLLIN, remaining_s)
            self.poll()

    def done(self) -> bool:
        return self._done

    def poll(self) -> bool:
        """Read what has arrived, without waiting; True once the call is over."""
        if self._done:
            return True
        failure = receive_available(self._connection.sock, self._inbox)
        try:
            frames = split_frames(self._inbox, self._channel.receive_bytes_max)
        except FrameTooLarge as exc:
            self._finish(None, _too_large(exc))
            return True
        except FrameError as exc:
            frames, failure = [], exc
        if frames:
            # an answer that came before the connection ended is still the answer
            self._answered(*frames[0], stray=len(frames) > 1 or bool(self._inbox), reusable=failure is None)
        elif failure is not None:
            self._fail(failure)
        elif self.deadline is not None and time.monotonic() >= self.deadline:
            self._finish(None, SocketRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, f"Deadline Exceeded ({self._where})"))
        return self._done

    def _fail(self, exc: BaseException) -> None:
        cancelled = self._on_connection is not None and not self._on_connection(None)
        if self._reused and not cancelled and not isinstance(exc, (socket.timeout, SocketRpcError)):
            # as `SocketChannel.call`: a pooled connection that broke most likely broke with
            # the others (a broker restart), so none of them is tried again
            self._channel._drop_idle()
        self._finish(None, _failure(exc, self._where))

    def _answered(self, kind: int, answered_id: int, body: bytes, *, stray: bool, reusable: bool) -> None:
        try:
            if kind == REFUSED:
                self._finish(None, self._channel.refusal(body))
                return
            if stray:     # more than one answer: the connection is out of step
                raise FrameError(f"more than one answer to call {self._correlation_id}")
            _check_answer(kind, answered_id, self._correlation_id)
            if kind == STATUS:
                self._finish(None, _status_error(body), reusable=reusable)
            else:
                self._finish(body, None, reusable=reusable)
        except FrameError as exc:
            self._finish(None, _failure(exc, self._where))

    def result(self):
        if not self._done:
            raise InvalidStateError(f"{self._where}: the call is not over")
        if self._error is not None:
            raise self._error
        return self._response

    def cancel(self) -> bool:
        if self._done:
            return False
        self._finish(None, _cancelled())
        return True

    def _finish(self, body, error: SocketRpcError | None, reusable: bool = False) -> None:
        self._done = True
        self._error = error
        if body is not None:
            try:
                self._response = body if self._deserialize is None else self._deserialize(body)
            except Exception as exc:   # a malformed answer: the call fails, not its reader
                self._error = SocketRpcError(grpc.StatusCode.INTERNAL, f"{self._where}: a malformed answer: {exc}")
        connection, self._connection = self._connection, None
        if connection is not None:
            released = self._on_connection is None or self._on_connection(None)
            if reusable and released:
                self._channel._give_back(connection)
            else:
                connection.close()


class SocketFuture(grpc.Future):
    """A unary call made on a thread of its own (`stub.Method.future`): the rare calls a
    client must not wait for (JoinGroup, SyncGroup, an async offset commit)."""

    def __init__(self, channel: SocketChannel, method: str, payload: bytes, deserialize, timeout_s, metadata):
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._callbacks: list = []
        self._response = None
        self._error: BaseException | None = None
        self._cancelled = False
        self._connection: _Connection | None = None

        def run() -> None:
            try:
                body = channel.call(method, payload, timeout_s, metadata, on_connection=self._using)
                response, error = deserialize(body), None
            except BaseException as exc:   # handed to whoever asks result()
                response, error = None, exc
            self._finish(response, error)
        threading.Thread(target=run, name="eos-socket-call", daemon=True).start()

    def _using(self, connection: _Connection | None) -> bool:
        """The call took `connection`, or let go of it (None); False once cancelled."""
        with self._lock:
            if self._cancelled:
                if connection is not None:
                    connection.close()     # cancelled before the call began
                return False
            self._connection = connection
            return True

    def _finish(self, response, error) -> None:
        with self._lock:
            callbacks = self._settle(response, error)
        for callback in callbacks:
            callback(self)

    def _settle(self, response, error) -> list:
        """Under the lock: the outcome, unless there is one; the callbacks to run."""
        if self._done.is_set():
            return []
        self._response, self._error = response, error
        self._done.set()
        callbacks, self._callbacks = self._callbacks, []
        return callbacks

    def cancel(self) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            self._cancelled = True
            # settled before the connection closes: the call's own failure, which the close
            # brings about, must not become the outcome
            callbacks = self._settle(None, grpc.FutureCancelledError())
            connection, self._connection = self._connection, None
            if connection is not None:
                # under the lock: the call cannot hand it back to the pool meanwhile
                connection.close()     # its call fails at once; the answer is dropped
        for callback in callbacks:
            callback(self)
        return True

    def cancelled(self) -> bool:
        return self._cancelled

    def running(self) -> bool:
        return not self._done.is_set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout=None):
        if not self._done.wait(timeout):
            raise grpc.FutureTimeoutError()
        if self._error is not None:
            raise self._error
        return self._response

    def exception(self, timeout=None):
        if not self._done.wait(timeout):
            raise grpc.FutureTimeoutError()
        return self._error

    def traceback(self, timeout=None):
        error = self.exception(timeout)
        return None if error is None else error.__traceback__

    def add_done_callback(self, fn) -> None:
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)


class _StreamMethod:
    """`stub.ProduceStream`: `open(metadata=)` for a stream sent on directly, or called with
    a request iterator as gRPC's is (a thread then sends what the iterator gives)."""

    def __init__(self, channel: SocketChannel, method: str, serialize, deserialize):
        self._channel = channel
        self._method = method
        self._serialize = serialize
        self._deserialize = deserialize

    def open(self, metadata=None, timeout=None, send_timeout_s: float = STREAM_SEND_TIMEOUT_S) -> "SocketStreamCall":
        return SocketStreamCall(self._channel, self._method, self._serialize, self._deserialize, metadata,
                                send_timeout_s=send_timeout_s)

    def __call__(self, request_iterator, timeout=None, metadata=None, **_) -> "SocketStreamCall":
        call = self.open(metadata)

        def pump() -> None:
            try:
                for request in request_iterator:
                    if not call.send(request):
                        return
                call.done_sending()
            except Exception:       # the iterator failed: the call is cancelled, as gRPC does
                log.exception("a request iterator of %s failed", self._method)
                call.cancel()
        threading.Thread(target=pump, name="eos-socket-stream-send", daemon=True).start()
        return call


class SocketStreamCall:
    """One bidirectional stream on a connection of its own. Sending happens on the caller's
    thread; the answers are read by iterating the call (one reader). Ends with StopIteration
    after an OK status, else SocketRpcError."""

    def __init__(self, channel: SocketChannel, method: str, serialize, deserialize, metadata, *,
                 send_timeout_s: float = STREAM_SEND_TIMEOUT_S):
        self._channel = channel
        self._send_timeout_s = send_timeout_s
        self._method = method
        self._serialize = serialize
        self._deserialize = deserialize
        self._where = f"{channel.address[0]}:{channel.address[1]} ({method})"
        self._send_lock = threading.Lock()
        self._cancelled = False
        self._ended: SocketRpcError | None = None    # the outcome, once the stream is over
        self._connection: _Connection | None = None
        self._inbox = bytearray()     # receive_ready(): bytes of a frame still arriving
        try:
            # No read timeout: a stream waits for answers as long as its owner lets it (the
            # producer aborts it after request.timeout.ms itself). Sends are bounded by
            # `_send_all` instead, so that the reader can keep blocking.
            self._connection = channel.connect(send_timeout_s)
            self._send_all(call_frame(OPEN, 0, method, metadata))
        except (SocketRpcError, OSError) as exc:
            self._ended = _failure(exc, self._where)
            if self._connection is not None:
                self._connection.close()
            return
        channel.track_stream(self)

    def _send_all(self, data: bytes) -> None:
        """Send within the stream's send timeout: a broker that stops reading cannot hold the
        sender's thread longer (socket.timeout, an OSError: the stream is given up)."""
        send_within(self._connection.sock, data, self._send_timeout_s)

    def send(self, message) -> bool:
        """Send one request; False when the stream is over (the reader sees why)."""
        if self._ended is not None or self._cancelled:
            return False
        data = frame(MESSAGE, 0, self._serialize(message))
        try:
            with self._send_lock:
                self._send_all(data)
        except OSError:
            self._connection.close()    # the reader ends with UNAVAILABLE
            return False
        return True

    def done_sending(self) -> None:
        if self._ended is not None or self._cancelled:
            return
        try:
            with self._send_lock:
                self._send_all(frame(HALF_CLOSE, 0))
        except OSError:
            self._connection.close()

    def cancel(self) -> bool:
        if self._cancelled or self._ended is not None:
            return False
        self._cancelled = True
        if self._connection is not None:
            self._connection.close()
        return True

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        if self._ended is not None:
            raise self._end(self._ended)
        try:
            kind, _, body = read_frame(self._connection.reader, self._channel.receive_bytes_max)
        except (OSError, ConnectionClosed, FrameError, FrameTooLarge, ValueError) as exc:
            raise self._end(self._broken(exc)) from None
        outcome = self._outcome_of(kind, body)
        if isinstance(outcome, SocketRpcError):
            raise self._end(outcome)
        return outcome

    # ---- read by the stream's owner itself, without a reader thread ----------------------

    def fileno(self) -> int:
        """The connection's descriptor, to wait on with poll() (-1 once it is closed)."""
        return -1 if self._connection is None else self._connection.sock.fileno()

    def receive_ready(self) -> tuple[list, SocketRpcError | None]:
        """(the messages that have arrived, the stream's outcome if it is over), without
        waiting: for an owner that waits on `fileno()` itself instead of iterating the call
        on a thread of its own. The outcome is a SocketRpcError, code OK after the server's
        OK status; once it is given, every later call gives it again with no messages. Not
        to be mixed with iterating the call."""
        if self._ended is not None:
            return [], self._ended
        inbox = self._inbox
        # a failure after whole frames: those are still answers, handed out before the end
        failure: BaseException | None = receive_available(self._connection.sock, inbox)
        try:
            frames = split_frames(inbox, self._channel.receive_bytes_max)
        except (FrameError, FrameTooLarge) as exc:
            frames, failure = [], exc
        messages = []
        for kind, _, body in frames:
            outcome = self._outcome_of(kind, body)
            if isinstance(outcome, SocketRpcError):
                self._end(outcome)
                return messages, self._ended
            messages.append(outcome)
        if failure is not None:
            self._end(self._broken(failure))
        return messages, self._ended

    def _broken(self, exc: BaseException) -> SocketRpcError:
        if self._cancelled:
            return _cancelled()
        return _failure(exc, self._where)

    def _outcome_of(self, kind: int, body: bytes):
        """A MESSAGE's message, or the SocketRpcError that a STATUS (or a stray frame) ends
        the stream with."""
        if kind == MESSAGE:
            return self._deserialize(body)
        if kind == STATUS:
            return _status_error(body)
        if kind == REFUSED:
            return self._channel.refusal(body)
        return SocketRpcError(grpc.StatusCode.INTERNAL, f"{self._where}: an unexpected frame kind {kind}")

    def _end(self, outcome: SocketRpcError):
        if self._ended is None:
            self._ended = outcome
            self._connection.close()
        return StopIteration() if outcome.code() is grpc.StatusCode.OK else outcome

    # the parts of a grpc.Call the clients read after the end
    def code(self):
        return None if self._ended is None else self._ended.code()

    def details(self):
        return None if self._ended is None else self._ended.details()

    def trailing_metadata(self):
        return None if self._ended is None else self._ended.trailing_metadata()
