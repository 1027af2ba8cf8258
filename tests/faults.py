"""A fault-injecting gRPC proxy to put between a client and a broker in integration tests.

Theory of operation
-------------------
`FaultProxy` listens on 127.0.0.1 (a free port) and forwards every unary RPC to `target`
as raw bytes: the server side registers one generic handler with no (de)serialisers, and
the client side calls `channel.unary_unary(method)` with none either, so the proxy knows no
proto and costs one copy per message. Streaming RPCs are not supported (eos has none).

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

Errors from the target (status and details) pass through unchanged. `counters` tells what
was done, `decisions` lists every decision in order (bounded). Threads are bounded by a
pool, concurrent RPCs by `maximum_concurrent_rpcs`, messages by 64 MiB each way.
"""
from __future__ import annotations

import collections
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
                 maximum_concurrent_rpcs: int = 256):
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
        self._random = random.Random(seed)
        self._lock = threading.Lock()                 # guards _random, _counters, _decisions, _target
        self._counters = FaultCounters()
        self._decisions: collections.deque[FaultDecision] = collections.deque(maxlen=DECISIONS_KEPT_MAX)
        self._target = target
        self._channel = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        self._callables: dict[str, grpc.UnaryUnaryMultiCallable] = {}
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

    def _callable(self, method: str) -> grpc.UnaryUnaryMultiCallable:
        with self._lock:
            call = self._callables.get(method)
            if call is None:
                call = self._channel.unary_unary(method, request_serializer=None, response_deserializer=None)
                self._callables[method] = call
            return call

    def _forward_once(self, method: str, request: bytes, context: grpc.ServicerContext):
        """One call to the target: (response bytes, None) or (None, RpcError)."""
        metadata = tuple((m.key, m.value) for m in context.invocation_metadata()
                         if m.key not in _HOP_METADATA_KEYS and not m.key.startswith(_HOP_METADATA_PREFIXES))
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


class _ForwardingHandler(grpc.GenericRpcHandler):
    """Accepts every method as a unary call on raw bytes."""

    def __init__(self, proxy: FaultProxy):
        self._proxy = proxy

    def service(self, handler_call_details):
        method = handler_call_details.method
        proxy = self._proxy

        def forward(request: bytes, context: grpc.ServicerContext) -> bytes:
            return proxy._handle(method, request, context)

        return grpc.unary_unary_rpc_method_handler(forward, request_deserializer=None, response_serializer=None)
