"""The broker's services on a plain TCP port: gRPC's calls as frames (eos/socket_frames.py).

Theory of operation
-------------------
`SocketRpcServer` has the face of a `grpc.Server` that `broker/listener_servers.ServerGroup`
and the generated `add_*Servicer_to_server` functions use (`add_generic_rpc_handlers`,
`add_registered_method_handlers`, `start`, `stop`), so the broker adds it beside its gRPC
servers and it serves the very same handlers: the broker's services (through LateServices,
UNAVAILABLE until they open), health, and the same server interceptors in the same order
(metrics, identity, request quota), run for each call as gRPC runs them.

One thread per connection reads a frame, runs the call and writes its answer, then reads
the next: a unary call costs the connection's thread one wake-up (the frame's arrival) and
no hand-off, where a gRPC server hands each call from its completion queue to a poller
thread and then a worker. A connection that opens a stream (ProduceStream) is that
stream's until it ends: the handler's request iterator reads the connection's frames (on
the handler's thread, or on the reader thread ProduceStreamSession starts), its responses
are written as they are yielded, and a STATUS frame ends it; then the connection closes.

What a handler sees is a `SocketCallContext`: the call's metadata, the peer ("ipv4:...",
as gRPC writes it), an insecure auth context (the port is PLAINTEXT: its calls are the
PLAINTEXT listener's, principal User:ANONYMOUS), abort / set_code / set_details /
set_trailing_metadata, add_callback (run when the call ends) and cancel (shuts the
connection down, which wakes a handler waiting for the next request). A request over
socket.request.max.bytes is answered RESOURCE_EXHAUSTED after its bytes are skipped, as
gRPC refuses a message over its receive limit; bytes that are not frames close the
connection.

At most `connections_max` connections are served at once: one more gets a REFUSED frame
and is closed at accept. What it had already sent is read and dropped first, so that the
close does not reset the connection before the client reads why (bytes still on their way
are not: that client sees a cut connection, and retries). The client then makes that
broker's calls over gRPC for a while. A connection that waits longer than
`connections_max_idle_ms` for a frame, or for room to send one (Kafka's
connections.max.idle.ms: 10 minutes; -1 never), is shut down by the sweeper thread, which
looks every `sweep_interval_s`; so idle connections cannot hold the port's places for good,
and a client that stops reading cannot hold a thread. eos's clients close their pooled
connections after 9 minutes unused (eos/socket_rpc.py), before the broker's default would.
The sockets themselves have no timeout: on a socket with one, Python polls before every
recv and send, a system call more each way on every request, and each gives up the GIL.

`stop(grace)` closes the port, ends idle connections at once, lets each busy one finish the
call it is running (a frame read after the stop began is answered UNAVAILABLE) and, after
`grace`, shuts the rest down; the event it returns is set when every connection's thread
has ended.
"""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import NamedTuple

import grpc

from eos import socket_rpc
from eos.socket_frames import (CALL, HALF_CLOSE, MESSAGE, OPEN, READ_BUFFER_BYTES, REPLY, ConnectionClosed, FrameError,
                               FrameTooLarge, decode_call, frame, read_frame, refused_frame, skip_bytes, status_frame)

log = logging.getLogger("eos.broker.socket")

CONNECTIONS_MAX_DEFAULT = 1000
CONNECTIONS_MAX_IDLE_MS_DEFAULT = 600_000     # Kafka's connections.max.idle.ms
# What a refused connection had already sent is read and dropped, at most this much (a close
# with unread bytes resets the connection, and the client may lose the REFUSED frame).
REFUSED_DRAIN_BYTES_MAX = 1 << 20
ACCEPT_RETRY_S = 0.1
# An oversized request's bytes are read and dropped (so the connection goes on and the
# client reads its RESOURCE_EXHAUSTED) up to this many times the limit; past it the
# connection is closed after the status, as Kafka closes one on an oversized request.
SKIP_LIMITS_MAX = 4
# How often the sweeper looks for connections idle past connections.max.idle.ms: a tenth of
# the limit, so one is closed within 110% of it, but at most every second and at least
# every 10 ms (a limit of a few ms must not keep a thread busy).
SWEEP_INTERVAL_MAX_S = 1.0
SWEEP_INTERVAL_MIN_S = 0.01
_INSECURE_AUTH_CONTEXT = {"transport_security_type": [b"insecure"]}


class _CallDetails(NamedTuple):
    """grpc.HandlerCallDetails: what interceptors and generic handlers are asked with."""
    method: str
    invocation_metadata: tuple


class _Aborted(Exception):
    """context.abort(): the call ends with the status set on the context."""


class _StreamBroken(grpc.RpcError):
    """The stream's connection broke or carried something else than its requests."""


class _ClientGone(Exception):
    """Writing an answer failed: the client went away (not an error of the handler's)."""


class SocketCallContext:
    """A grpc.ServicerContext for one call over the socket (see the module doc)."""

    def __init__(self, connection: "_ServedConnection", metadata: tuple):
        self._connection = connection
        self._metadata = metadata
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: tuple = ()
        self._callbacks: list = []
        self._active = True
        # set by the request iterator when the stream failed on its side (a request too
        # large, bytes that are not frames): the status the call ends with
        self.failure: tuple[grpc.StatusCode, str] | None = None

    def invocation_metadata(self):
        return self._metadata

    def peer(self) -> str:
        return self._connection.peer

    def auth_context(self):
        return _INSECURE_AUTH_CONTEXT

    def abort(self, code: grpc.StatusCode, details: str = ""):
        self._code, self._details = code, details
        raise _Aborted(details)

    def abort_with_status(self, status):
        self.set_trailing_metadata(getattr(status, "trailing_metadata", ()) or ())
        self.abort(status.code, status.details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self):
        return self._code

    def set_details(self, details: str) -> None:
        self._details = details

    def details(self):
        return self._details

    def set_trailing_metadata(self, metadata) -> None:
        self._trailing = tuple(metadata or ())

    def add_callback(self, callback) -> bool:
        if not self._active:
            return False
        self._callbacks.append(callback)
        return True

    def is_active(self) -> bool:
        return self._active

    def time_remaining(self):
        return None

    def cancel(self) -> None:
        self._connection.shut_down()

    def status(self) -> tuple[grpc.StatusCode, str, tuple] | None:
        """The status the handler set, when not OK: the call ends with it."""
        if self._code is None or self._code is grpc.StatusCode.OK:
            return None
        return self._code, self._details, self._trailing

    def finish(self) -> None:
        """The call is over: its callbacks run, once."""
        self._active = False
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a call's end callback failed")


class _ServedConnection:
    """One accepted connection: its socket, reader, and whether a call is running."""

    def __init__(self, sock: socket.socket, address):
        self.sock = sock
        self.reader = sock.makefile("rb", buffering=READ_BUFFER_BYTES)
        host, port = address[0], address[1]
        self.peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
        self.busy = False
        self.thread: threading.Thread | None = None
        # Since when (time.monotonic()) it waits for a frame / for room to send one; None
        # while it does not. The sweeper shuts down a connection that waited too long.
        self.reading_since: float | None = None
        self.sending_since: float | None = None

    def read_frame(self, size_max: int) -> tuple[int, int, bytes]:
        self.reading_since = time.monotonic()
        try:
            return read_frame(self.reader, size_max)
        finally:
            self.reading_since = None

    def skip(self, count: int) -> None:
        """Drop an oversized frame's body."""
        self.reading_since = time.monotonic()
        try:
            skip_bytes(self.reader, count)
        finally:
            self.reading_since = None

    def send(self, data: bytes) -> None:
        self.sending_since = time.monotonic()
        try:
            self.sock.sendall(data)
        except OSError as exc:
            raise _ClientGone(str(exc)) from None
        finally:
            self.sending_since = None

    def idle_longer_than(self, limit_s: float, now: float) -> bool:
        reading_since, sending_since = self.reading_since, self.sending_since
        return ((reading_since is not None and now - reading_since > limit_s)
                or (sending_since is not None and now - sending_since > limit_s))

    def shut_down(self) -> None:
        socket_rpc.shut_down(self.sock)

    def close(self) -> None:
        socket_rpc.close_connection(self.sock, self.reader)


class _AllEnded:
    """What stop() returns: wait(timeout) until every connection's thread has ended."""

    def __init__(self, threads: list[threading.Thread]):
        self._threads = threads

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)


class SocketRpcServer:
    """The broker's handlers served on `host:port` over frames; see the module doc."""

    def __init__(self, host: str, port: int, *, interceptors=(), request_bytes_max: int,
                 connections_max: int = CONNECTIONS_MAX_DEFAULT,
                 connections_max_idle_ms: int = CONNECTIONS_MAX_IDLE_MS_DEFAULT):
        self._handler = self._pipeline(tuple(interceptors))
        self._generic: list = []                  # generic handlers, asked in order
        self._registered: dict[str, object] = {}  # "/service/method" -> handler
        self.request_bytes_max = request_bytes_max
        self.connections_max = connections_max
        self.connections_max_idle_ms = connections_max_idle_ms
        if host in ("", "::"):     # every interface, IPv4 too where the system allows
            try:
                self._listening = socket.create_server(("::", port), family=socket.AF_INET6, backlog=128,
                                                       dualstack_ipv6=socket.has_dualstack_ipv6())
            except OSError:        # IPv6 turned off in this kernel: every IPv4 interface
                self._listening = socket.create_server(("0.0.0.0", port), backlog=128)
        else:
            self._listening = socket.create_server((host, port), backlog=128,
                                                   family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.port = self._listening.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: set[_ServedConnection] = set()
        self._stopping = False
        self._stopped = threading.Event()          # ends the sweeper
        self._accept_thread: threading.Thread | None = None
        self.sweep_interval_s = (None if connections_max_idle_ms < 0 else
                                 max(SWEEP_INTERVAL_MIN_S, min(SWEEP_INTERVAL_MAX_S, connections_max_idle_ms / 10_000)))

    # ---- the grpc.Server face --------------------------------------------------------------

    def add_generic_rpc_handlers(self, handlers) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(self, service_name: str, method_handlers) -> None:
        for method, handler in method_handlers.items():
            self._registered[f"/{service_name}/{method}"] = handler

    def start(self) -> None:
        self._accept_thread = threading.Thread(target=self._accept_loop, name="eos-socket-accept", daemon=True)
        self._accept_thread.start()
        if self.sweep_interval_s is not None:
            threading.Thread(target=self._sweep_loop, name="eos-socket-sweeper", daemon=True).start()

    def stop(self, grace: float | None) -> _AllEnded:
        with self._lock:
            self._stopping = True
            connections = list(self._connections)
        self._stopped.set()
        try:
            self._listening.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listening.close()
        for connection in connections:
            if not connection.busy:
                connection.shut_down()     # idle: waiting for a frame that will not be taken
        threads = [c.thread for c in connections if c.thread is not None]
        if grace:
            def shut_down_late() -> None:
                ended = _AllEnded(threads)
                if not ended.wait(grace):
                    for connection in connections:
                        connection.shut_down()
            threading.Thread(target=shut_down_late, name="eos-socket-stop", daemon=True).start()
        else:
            for connection in connections:
                connection.shut_down()
        return _AllEnded(threads)

    # ---- connections -----------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while True:
            try:
                sock, address = self._listening.accept()
            except OSError as exc:
                if self._stopping:
                    return      # the port was closed: stop()
                # out of file descriptors or buffers for now: the port stays open, so
                # accepting must go on once they are back
                log.warning("accepting a connection on the socket transport's port failed: %s", exc)
                time.sleep(ACCEPT_RETRY_S)
                continue
            try:
                self._serve_in_thread(sock, address)
            except Exception:   # a thread that cannot be started: this connection only
                log.exception("could not serve a connection from %s", address)
                sock.close()

    def _sweep_loop(self) -> None:
        """Shut down the connections that waited longer than connections.max.idle.ms for a
        frame or for room to send: their threads end (end of file, or a failed send) and
        close them."""
        limit_s = self.connections_max_idle_ms / 1000
        while not self._stopped.wait(self.sweep_interval_s):
            now = time.monotonic()
            with self._lock:
                expired = [c for c in self._connections if c.idle_longer_than(limit_s, now)]
            for connection in expired:
                log.debug("closing the connection from %s: idle longer than connections.max.idle.ms=%d",
                          connection.peer, self.connections_max_idle_ms)
                connection.shut_down()

    def _serve_in_thread(self, sock: socket.socket, address) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)   # a vanished peer ends in time
        sock.settimeout(None)      # blocking: the sweeper bounds the waits (see the module doc)
        connection = _ServedConnection(sock, address)
        with self._lock:
            refused = self._stopping or len(self._connections) >= self.connections_max
            if not refused:
                self._connections.add(connection)
        if refused:
            reason = ("the broker is stopping" if self._stopping
                      else f"{self.connections_max} connections are open (the most this port serves)")
            log.warning("refused a connection from %s: %s", connection.peer, reason)
            self._refuse(connection, reason)
            return
        connection.thread = threading.Thread(target=self._serve, args=(connection,),
                                             name="eos-socket-conn", daemon=True)
        try:
            connection.thread.start()
        except BaseException:
            with self._lock:
                self._connections.discard(connection)
            raise

    @staticmethod
    def _refuse(connection: _ServedConnection, reason: str) -> None:
        """REFUSED, then close; on the accept thread, so nothing here waits."""
        sock = connection.sock
        try:
            sock.setblocking(False)
            sock.send(refused_frame(reason))       # a few bytes into an empty send buffer
            sock.shutdown(socket.SHUT_WR)
            drained = 0
            while drained < REFUSED_DRAIN_BYTES_MAX:
                chunk = sock.recv(64 * 1024)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:      # BlockingIOError: nothing more has come; or the client is gone
            pass
        connection.close()

    def _serve(self, connection: _ServedConnection) -> None:
        try:
            while True:
                try:
                    kind, correlation_id, body = connection.read_frame(self.request_bytes_max)
                except FrameTooLarge as exc:
                    refusal = status_frame(exc.correlation_id, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                           f"Received message larger than max ({exc.size} vs. {exc.limit})")
                    if exc.size > SKIP_LIMITS_MAX * exc.limit:
                        connection.send(refusal)
                        return
                    connection.skip(exc.size)
                    connection.send(refusal)
                    continue
                with self._lock:
                    stopping = self._stopping
                    connection.busy = not stopping
                if stopping:
                    connection.send(status_frame(correlation_id, grpc.StatusCode.UNAVAILABLE,
                                                 "the broker is shutting down"))
                    return
                if kind == CALL:
                    self._unary(connection, correlation_id, body)
                elif kind == OPEN:
                    self._stream(connection, correlation_id, body)
                    return         # a stream's connection ends with it
                else:
                    raise FrameError(f"a frame of kind {kind} where a call should begin")
                with self._lock:
                    connection.busy = False
                    if self._stopping:
                        return
        except (ConnectionClosed, OSError, _ClientGone):
            pass                   # the client went away, or stop() shut the connection down
        except FrameError as exc:
            log.warning("closing the connection from %s: %s", connection.peer, exc)
        except Exception:
            log.exception("serving a connection from %s failed", connection.peer)
        finally:
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    def _lookup(self, call_details: _CallDetails):
        """The method's own handler: registered, or from a generic handler (LateServices)."""
        handler = self._registered.get(call_details.method)
        if handler is not None:
            return handler
        for generic in self._generic:
            handler = generic.service(call_details)
            if handler is not None:
                return handler
        return None

    def _pipeline(self, interceptors: tuple):
        """`details -> handler`: the lookup wrapped by the interceptors, outermost first, as
        gRPC's server pipeline calls them (built once; each interceptor still decides per call)."""
        if not interceptors:
            return self._lookup
        outer, inner = interceptors[0], self._pipeline(interceptors[1:])
        return lambda call_details: outer.intercept_service(inner, call_details)

    def _unary(self, connection: _ServedConnection, correlation_id: int, body: bytes) -> None:
        method, metadata, payload = decode_call(body)
        handler = self._handler(_CallDetails(method, metadata))
        if handler is None:
            connection.send(status_frame(correlation_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!"))
            return
        try:
            request = handler.request_deserializer(payload) if handler.request_deserializer else bytes(payload)
        except Exception as exc:
            connection.send(status_frame(correlation_id, grpc.StatusCode.INTERNAL,
                                         f"Exception deserializing request! {exc}"))
            return
        context = SocketCallContext(connection, metadata)
        try:
            if handler.unary_unary is not None:
                response = handler.unary_unary(request, context)
            else:
                # a stream handler (the loading one, until the services open) asked once
                behaviour = handler.stream_stream or handler.unary_stream
                argument = iter((request,)) if handler.stream_stream is not None else request
                response = next(iter(behaviour(argument, context)), None)
            status = context.status()
            if status is not None:
                connection.send(status_frame(correlation_id, *status))
            elif response is None:
                connection.send(status_frame(correlation_id, grpc.StatusCode.INTERNAL, "the handler gave no response"))
            else:
                connection.send(frame(REPLY, correlation_id, handler.response_serializer(response)))
        except _Aborted:
            connection.send(status_frame(correlation_id, *context.status()))
        except _ClientGone:
            raise
        except Exception as exc:      # the handler's own failure, an OSError of its disk too
            log.exception("Exception calling application %s", method)
            connection.send(status_frame(correlation_id, grpc.StatusCode.UNKNOWN,
                                         f"Exception calling application: {exc}"))
        finally:
            context.finish()

    def _stream(self, connection: _ServedConnection, correlation_id: int, body: bytes) -> None:
        method, metadata, _ = decode_call(body)
        handler = self._handler(_CallDetails(method, metadata))
        if handler is None or handler.stream_stream is None:
            connection.send(status_frame(correlation_id, grpc.StatusCode.UNIMPLEMENTED, "Method not found!"))
            return
        context = SocketCallContext(connection, metadata)
        requests = self._requests(connection, handler.request_deserializer, context)
        serialize = handler.response_serializer
        responses = iter(())
        try:
            responses = handler.stream_stream(requests, context)
            for response in responses:
                connection.send(frame(MESSAGE, correlation_id, serialize(response)))
            status = context.failure or context.status()
            connection.send(status_frame(correlation_id, *status) if status is not None
                            else status_frame(correlation_id, grpc.StatusCode.OK, ""))
        except _Aborted:
            connection.send(status_frame(correlation_id, *context.status()))
        except _ClientGone:
            if hasattr(responses, "close"):
                responses.close()  # the client is gone: the handler's finally blocks run now
            raise
        except Exception as exc:
            log.exception("Exception iterating responses of %s", method)
            connection.send(status_frame(correlation_id, grpc.StatusCode.UNKNOWN,
                                         f"Exception iterating responses: {exc}"))
        finally:
            context.finish()

    def _requests(self, connection: _ServedConnection, deserialize, context: SocketCallContext):
        """The stream's requests, read off the connection; StopIteration at the client's
        half-close, _StreamBroken when the connection breaks or carries anything else."""
        while True:
            try:
                kind, _, body = connection.read_frame(self.request_bytes_max)
            except FrameTooLarge as exc:
                # the call fails as gRPC fails it; its bytes are skipped so the status can go out
                context.failure = (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                   f"Received message larger than max ({exc.size} vs. {exc.limit})")
                try:
                    connection.skip(exc.size)
                except (ConnectionClosed, OSError, ValueError):
                    pass
                raise _StreamBroken(context.failure[1]) from None
            except (ConnectionClosed, FrameError, OSError, ValueError) as exc:
                raise _StreamBroken(f"the stream's connection broke: {exc}") from None
            if kind == MESSAGE:
                try:
                    request = deserialize(body) if deserialize else body
                except Exception as exc:
                    context.failure = (grpc.StatusCode.INTERNAL, f"Exception deserializing request! {exc}")
                    raise _StreamBroken(context.failure[1]) from None
                yield request
                continue
            if kind == HALF_CLOSE:
                return
            context.failure = (grpc.StatusCode.INTERNAL, f"a frame of kind {kind} inside a stream")
            raise _StreamBroken(context.failure[1])
