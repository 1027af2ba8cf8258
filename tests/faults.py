"""A fault-injecting gRPC proxy to put between a client and a broker in integration tests.

Theory of operation
-------------------
`FaultProxy` listens on 127.0.0.1 (a free port) and forwards every RPC to `target` as raw
bytes: the server side registers one generic handler with no (de)serialisers, and the
client side calls `channel.unary_unary(method)` (or `stream_stream`) with none either, so
the proxy knows no proto and costs one copy per message. A gRPC handler cannot tell a
unary call from a stream by its bytes, so the methods that are bidirectional streams are
named (`stream_methods`, by default eos's `/eos.v1.Broker/ProduceStream`); every other
method is forwarded as unary.

For each request, in arrival order, one decision is drawn from `random.Random(seed)`;
each decision consumes the same number of draws, so the n-th request always meets the
n-th decision and a failing run replays from its seed (with concurrent clients the
arrival order itself may vary). A decision is a combination of:

- drop the request: answer UNAVAILABLE without forwarding (the broker never saw it);
- delay: hold the request `delay_ms` (uniform in the given range) before forwarding,
  which also reorders requests that are in flight together;
- duplicate: forward it twice, one after the other; the client gets the second answer
  (for a produce request, the broker's answer to a retry it has already applied);
- drop the response: forward, let the broker apply it, then answer UNAVAILABLE. This is
  the fault that makes retries dangerous and that idempotence exists for.

On a bidirectional stream each message of the client is a request and meets a decision;
the stream behaves like the TCP connection it stands for. A message is forwarded on one
upstream stream opened for the client's stream, in order, and answers come back in
order. A delay holds the message and every one behind it (no reordering: a connection
keeps its order). A dropped request or a dropped response breaks the whole stream with
UNAVAILABLE -- for a dropped request before the message is forwarded, for a dropped
response when its answer comes back, after the answers before it were relayed -- so
every message still unanswered is lost to the client, whether the broker applied it or
not. A duplicate is forwarded twice and the first answer is swallowed.

Methods in `unimplemented_methods` are answered UNIMPLEMENTED without forwarding, as by a
target that lacks them (a broker of an older contract). Errors from the target (status and
details) pass through unchanged. `counters` tells what
was done, `decisions` lists every decision in order (bounded). Threads are bounded by a
pool, concurrent RPCs by `maximum_concurrent_rpcs` (a stream also takes one thread of its
own, reading the client's messages), messages by 64 MiB each way.
"""
from __future__ import annotations

import collections
import queue
import random
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc

MESSAGE_BYTES_MAX = 64 * 1024 * 1024
DECISIONS_KEPT_MAX = 100_000
_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    # a broker killed and restarted behind the proxy is found again quickly
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
]
_SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    ("grpc.so_reuseport", 0),
]
# Metadata that belongs to a hop, not to the call: grpc sets it again on the next hop.
_HOP_METADATA_PREFIXES = (":", "grpc-")
_HOP_METADATA_KEYS = {"user-agent", "te", "content-type"}
STREAM_METHODS_DEFAULT = frozenset({"/eos.v1.Broker/ProduceStream"})
# What the answer reader does with the next upstream answer (one entry per forwarded message,
# queued before the message goes upstream, so entries and answers pair up in order).
_RELAY, _SWALLOW, _DROP_RESPONSE = "relay", "swallow", "drop-response"
_REQUEST_DROPPED, _CLIENT_DONE = "request-dropped", "client-done"


@dataclass(frozen=True)
class FaultDecision:
    """What the proxy did to one request."""

    method: str
    drop_request: bool
    duplicate: bool
    drop_response: bool
    delay_ms: int


@dataclass
class FaultCounters:
    requests: int = 0            # requests received from clients
    forwarded: int = 0           # calls made to the target (a duplicate counts twice)
    dropped_requests: int = 0
    dropped_responses: int = 0
    duplicated: int = 0
    delayed: int = 0
    target_errors: int = 0       # forwarded calls the target answered with an error (or was down)
    by_method: dict[str, int] = field(default_factory=dict)


class FaultProxy:
    def __init__(self, target: str, *, seed: int, drop_request_p: float = 0.0, drop_response_p: float = 0.0,
                 duplicate_request_p: float = 0.0, delay_ms: tuple[int, int] = (0, 0), max_workers: int = 16,
                 maximum_concurrent_rpcs: int = 256, stream_methods=STREAM_METHODS_DEFAULT,
                 unimplemented_methods=frozenset()):
        for name, p in (("drop_request_p", drop_request_p), ("drop_response_p", drop_response_p),
                        ("duplicate_request_p", duplicate_request_p)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {p}")
        delay_low_ms, delay_high_ms = delay_ms
        if not 0 <= delay_low_ms <= delay_high_ms:
            raise ValueError(f"delay_ms must be (low, high) with 0 <= low <= high, got {delay_ms}")
        self.seed = seed
        self.drop_request_p = drop_request_p
        self.drop_response_p = drop_response_p
        self.duplicate_request_p = duplicate_request_p
        self.delay_ms = (delay_low_ms, delay_high_ms)
        self.stream_methods = frozenset(stream_methods)
        self.unimplemented_methods = frozenset(unimplemented_methods)
        self._random = random.Random(seed)
        self._lock = threading.Lock()                 # guards _random, _counters, _decisions, _target
        self._counters = FaultCounters()
        self._decisions: collections.deque[FaultDecision] = collections.deque(maxlen=DECISIONS_KEPT_MAX)
        self._target = target
        self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._callables: dict[str, object] = {}     # method -> multicallable on _channel
        self._executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="fault-proxy")
        self._server = grpc.server(self._executor, handlers=[_ForwardingHandler(self)], options=_SERVER_OPTIONS,
                                   maximum_concurrent_rpcs=maximum_concurrent_rpcs)
        self._port = self._server.add_insecure_port("127.0.0.1:0")
        if self._port == 0:
            raise RuntimeError("fault proxy could not bind a port on 127.0.0.1")
        self._started = False
        self._stopped = False

    # ---- lifecycle ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    @property
    def target(self) -> str:
        return self._target

    def start(self) -> FaultProxy:
        if self._stopped:
            raise RuntimeError("a stopped fault proxy cannot be started again")
        if not self._started:
            self._server.start()
            self._started = True
        return self

    def stop(self, grace_s: float = 1.0) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(grace_s).wait(grace_s + 5.0)
        with self._lock:
            channel = self._channel
        channel.close()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def set_target(self, target: str) -> None:
        """Send later requests to `target` (a broker restarted on another port)."""
        new_channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        with self._lock:
            old_channel, self._channel = self._channel, new_channel
            self._target = target
            self._callables = {}
        old_channel.close()

    # ---- what happened ----------------------------------------------------------------------

    @property
    def counters(self) -> FaultCounters:
        """A copy of the counters, consistent at one instant."""
        with self._lock:
            c = self._counters
            return FaultCounters(c.requests, c.forwarded, c.dropped_requests, c.dropped_responses, c.duplicated,
                                 c.delayed, c.target_errors, dict(c.by_method))

    @property
    def decisions(self) -> list[FaultDecision]:
        with self._lock:
            return list(self._decisions)

    # ---- the forwarding path -----------------------------------------------------------------

    def _decide(self, method: str) -> FaultDecision:
        with self._lock:
            rnd = self._random
            # always four draws, so that the n-th request meets the n-th decision
            drop_request = rnd.random() < self.drop_request_p
            duplicate = rnd.random() < self.duplicate_request_p
            drop_response = rnd.random() < self.drop_response_p
            delay_ms = rnd.randint(*self.delay_ms)
            decision = FaultDecision(method, drop_request, duplicate and not drop_request,
                                     drop_response and not drop_request, 0 if drop_request else delay_ms)
            c = self._counters
            c.requests += 1
            c.by_method[method] = c.by_method.get(method, 0) + 1
            c.dropped_requests += decision.drop_request
            c.duplicated += decision.duplicate
            c.dropped_responses += decision.drop_response
            c.delayed += decision.delay_ms > 0
            self._decisions.append(decision)
            return decision

    def _callable(self, method: str):
        with self._lock:
            call = self._callables.get(method)
            if call is None:
                if method in self.stream_methods:
                    call = self._channel.stream_stream(method, request_serializer=None, response_deserializer=None)
                else:
                    call = self._channel.unary_unary(method, request_serializer=None, response_deserializer=None)
                self._callables[method] = call
            return call

    @staticmethod
    def _call_metadata(context: grpc.ServicerContext) -> tuple:
        return tuple((m.key, m.value) for m in context.invocation_metadata()
                     if m.key not in _HOP_METADATA_KEYS and not m.key.startswith(_HOP_METADATA_PREFIXES))

    def _forward_once(self, method: str, request: bytes, context: grpc.ServicerContext):
        """One call to the target: (response bytes, None) or (None, RpcError)."""
        metadata = self._call_metadata(context)
        timeout_s = context.time_remaining()
        with self._lock:
            self._counters.forwarded += 1
        try:
            return self._callable(method)(request, timeout=timeout_s, metadata=metadata), None
        except grpc.RpcError as error:
            with self._lock:
                self._counters.target_errors += 1
            return None, error

    def _handle(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        decision = self._decide(method)
        if decision.drop_request:
            context.abort(grpc.StatusCode.UNAVAILABLE, "fault proxy: request dropped")
        if decision.delay_ms:
            time.sleep(decision.delay_ms / 1000.0)   # the injected fault itself, not synchronisation
        response, error = self._forward_once(method, request, context)
        if decision.duplicate:
            response, error = self._forward_once(method, request, context)
        if decision.drop_response:
            context.abort(grpc.StatusCode.UNAVAILABLE, "fault proxy: response dropped")
        if error is not None:
            code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
            details = error.details() if hasattr(error, "details") else str(error)
            context.abort(code, details or "")
        return response


    def _handle_stream(self, method: str, request_iterator, context: grpc.ServicerContext):
        """Forward one client stream on one upstream stream (see the module doc)."""
        upstream_requests: queue.Queue = queue.Queue()
        plan: queue.Queue = queue.Queue()       # what to do with each upstream answer, in order
        end = object()

        def upstream_iterator():
            while True:
                item = upstream_requests.get()
                if item is end:
                    return
                yield item

        with self._lock:
            self._counters.forwarded += 1       # the stream itself; its messages are counted as requests
        call = self._callable(method)(upstream_iterator(), metadata=self._call_metadata(context))
        context.add_callback(call.cancel)       # the client went away: so does the upstream stream

        def pump() -> None:
            """Read the client's messages, decide, forward (on its own thread)."""
            try:
                for request in request_iterator:
                    decision = self._decide(method)
                    if decision.drop_request:
                        plan.put(_REQUEST_DROPPED)
                        return
                    if decision.delay_ms:
                        time.sleep(decision.delay_ms / 1000.0)   # the injected fault itself
                    if decision.duplicate:
                        plan.put(_SWALLOW)
                        upstream_requests.put(request)
                    plan.put(_DROP_RESPONSE if decision.drop_response else _RELAY)
                    upstream_requests.put(request)
                plan.put(_CLIENT_DONE)
            except Exception:   # the client's stream ended with an error (cancelled)
                plan.put(_CLIENT_DONE)
            finally:
                upstream_requests.put(end)

        threading.Thread(target=pump, name="fault-proxy-stream", daemon=True).start()
        answers = iter(call)
        while True:
            action = plan.get()
            if action == _CLIENT_DONE:
                try:
                    for _ in answers:     # the upstream ends too
                        pass
                except grpc.RpcError:
                    pass                  # cancelled with the client's stream
                return
            if action == _REQUEST_DROPPED:
                call.cancel()
                context.abort(grpc.StatusCode.UNAVAILABLE, "fault proxy: request dropped (stream broken)")
            try:
                answer = next(answers)
            except StopIteration:
                context.abort(grpc.StatusCode.UNAVAILABLE, "fault proxy: the target ended the stream early")
            except grpc.RpcError as error:
                with self._lock:
                    self._counters.target_errors += 1
                call.cancel()
                code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
                context.abort(code, (error.details() if hasattr(error, "details") else str(error)) or "")
            if action == _SWALLOW:
                continue
            if action == _DROP_RESPONSE:
                call.cancel()
                context.abort(grpc.StatusCode.UNAVAILABLE, "fault proxy: response dropped (stream broken)")
            yield answer


class _ForwardingHandler(grpc.GenericRpcHandler):
    """Accepts every method on raw bytes: the proxy's stream methods as bidirectional
    streams, every other as a unary call."""

    def __init__(self, proxy: FaultProxy):
        self._proxy = proxy

    def service(self, handler_call_details):
        method = handler_call_details.method
        proxy = self._proxy
        if method in proxy.unimplemented_methods:
            return None     # gRPC answers UNIMPLEMENTED, as a server without the method does
        if method in proxy.stream_methods:
            def forward_stream(request_iterator, context: grpc.ServicerContext):
                return proxy._handle_stream(method, request_iterator, context)

            return grpc.stream_stream_rpc_method_handler(forward_stream, request_deserializer=None,
                                                         response_serializer=None)

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            return proxy._handle(method, request, context)

        return grpc.unary_unary_rpc_method_handler(forward, request_deserializer=None, response_serializer=None)
