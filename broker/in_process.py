"""A Broker stub that calls this process's BrokerServicer directly, for the embedded
transaction coordinator.

Theory of operation
-------------------
The transaction coordinator reaches brokers only through the Broker gRPC contract (it never
imports `broker`), so it can run in its own process. When it runs inside a broker, every
state write (PrepareCommit, CompleteCommit, ...) and every marker for a partition this
broker leads was a gRPC call over loopback to its own process: two serialisations, a
socket round trip and two thread hand-offs on the commit path, for a call whose handler is
right here. `InProcessBrokerStub` has a `BrokerStub`'s shape (`stub.Produce(request,
timeout=...)`) and hands the request object to the servicer's handler on the calling
thread: the same handler, the same checks, the same acks=all wait for the in-sync
replicas on a cluster, with no copy and no hop. The coordinator cannot tell the two apart.

What a handler does with its gRPC context is covered by `_InProcessContext`: `abort`
raises `InProcessRpcError` (a `grpc.RpcError`, as a failed call raises in a client: the
broker shutting down answers UNAVAILABLE either way), `add_callback` registers nothing (a
caller on this thread cannot cancel its own call), and a deadline is not enforced (the
handlers bound their own waits: a Produce by its timeout_ms, a Fetch by max_wait_ms).
The handler runs with no call identity (`run_as_broker`): ACL checks let the broker's own
writes through even when the thread is serving a client's EndTxn.
"""
from __future__ import annotations

import grpc

from broker.security import run_as_broker


class InProcessRpcError(grpc.RpcError):
    """What `context.abort` raises for an in-process call: a `grpc.RpcError` with the
    `code()` and `details()` a client-side error has."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _InProcessContext:
    """The part of grpc.ServicerContext the Broker handlers use."""

    def abort(self, code: grpc.StatusCode, details: str):
        raise InProcessRpcError(code, details)

    def add_callback(self, callback) -> bool:
        return False        # nothing can cancel a call made on the caller's own thread


class InProcessBrokerStub:
    """`stub.<Rpc>(request, timeout=None)` for the unary RPCs of `servicer`."""

    # What the transaction coordinator calls (txn_coordinator.coordinator.BrokerLink).
    _UNARY_RPCS = frozenset({"Produce", "Fetch", "Metadata", "CreateTopics", "WriteTxnMarkers"})

    def __init__(self, servicer):
        self._servicer = servicer

    def __getattr__(self, name: str):
        if name not in self._UNARY_RPCS:
            raise AttributeError(f"{name} is not a unary Broker RPC callable in process")
        handler = getattr(self._servicer, name)

        def call(request, timeout: float | None = None, metadata=None):   # (metadata: the call is the broker's own)
            # The caller may be serving a client's call on this thread (EndTxn writing the
            # coordinator's state): the handler runs as the broker, not as that client.
            return run_as_broker(handler, request, _InProcessContext())

        call.__name__ = name
        return call
