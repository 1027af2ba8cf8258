"""The fault proxy (tests/faults.py) against a tiny echo service built from generic handlers."""
from __future__ import annotations

import threading
from concurrent import futures

import grpc
import pytest

from tests.faults import MESSAGE_BYTES_MAX, FaultProxy

ECHO = "/test.Echo/Echo"
REFUSE = "/test.Echo/Refuse"
STREAM = "/test.Echo/Stream"
MISSING_STREAM = "/test.Echo/NoSuchStream"
CALL_TIMEOUT_S = 10


class EchoServer:
    """Echoes raw bytes; Refuse answers INVALID_ARGUMENT. Records every request it received."""

    def __init__(self):
        self.received: list[bytes] = []
        self.metadata: list[dict] = []
        self._lock = threading.Lock()
        handlers = {
            "Echo": grpc.unary_unary_rpc_method_handler(self._echo),
            "Refuse": grpc.unary_unary_rpc_method_handler(self._refuse),
            "Stream": grpc.stream_stream_rpc_method_handler(self._stream),
        }
        options = [("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
                   ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX)]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                   handlers=[grpc.method_handlers_generic_handler("test.Echo", handlers)],
                                   options=options)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _echo(self, request: bytes, context) -> bytes:
        with self._lock:
            self.received.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
        return request

    def _refuse(self, request: bytes, context) -> bytes:
        with self._lock:
            self.received.append(request)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "refused: " + request.decode())

    def _stream(self, request_iterator, context):
        for request in request_iterator:       # in order, one at a time, like a broker's stream
            with self._lock:
                self.received.append(request)
            yield request

    def stop(self):
        self._server.stop(0).wait(5)


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.stop()


class Client:
    def __init__(self, address: str):
        self.channel = grpc.insecure_channel(address, options=[
            ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
            ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX)])
        self.echo = self.channel.unary_unary(ECHO)
        self.refuse = self.channel.unary_unary(REFUSE)

    def call(self, payload: bytes, method=None, **kwargs):
        """The response bytes, or the status code of the error."""
        try:
            return (method or self.echo)(payload, timeout=CALL_TIMEOUT_S, **kwargs)
        except grpc.RpcError as error:
            return error.code()

    def close(self):
        self.channel.close()


def run(proxy_kwargs, echo: EchoServer, payloads):
    with FaultProxy(echo.address, **proxy_kwargs) as proxy:
        client = Client(proxy.address)
        try:
            return [client.call(p) for p in payloads], proxy.counters, proxy.decisions
        finally:
            client.close()


def test_forwards_bytes_unchanged(echo):
    big = bytes(range(256)) * (5 * 4096)          # 5 MiB: over gRPC's default 4 MiB limit
    results, counters, _ = run(dict(seed=1), echo, [b"hello", b"", big])
    assert results == [b"hello", b"", big]
    assert echo.received == [b"hello", b"", big]
    assert (counters.requests, counters.forwarded, counters.dropped_requests) == (3, 3, 0)
    assert counters.by_method == {ECHO: 3}


def test_dropped_request_never_reaches_the_server(echo):
    results, counters, _ = run(dict(seed=1, drop_request_p=1.0), echo, [b"a", b"b"])
    assert results == [grpc.StatusCode.UNAVAILABLE] * 2
    assert echo.received == []
    assert (counters.dropped_requests, counters.forwarded) == (2, 0)


def test_dropped_response_was_still_delivered_to_the_server(echo):
    results, counters, _ = run(dict(seed=1, drop_response_p=1.0), echo, [b"a", b"b"])
    assert results == [grpc.StatusCode.UNAVAILABLE] * 2
    assert echo.received == [b"a", b"b"]
    assert (counters.dropped_responses, counters.forwarded) == (2, 2)


def test_duplicated_request_arrives_twice(echo):
    results, counters, _ = run(dict(seed=1, duplicate_request_p=1.0), echo, [b"a", b"b"])
    assert results == [b"a", b"b"]
    assert echo.received == [b"a", b"a", b"b", b"b"]
    assert (counters.duplicated, counters.forwarded) == (2, 4)


def test_delay_is_counted_and_changes_nothing_else(echo):
    results, counters, decisions = run(dict(seed=1, delay_ms=(1, 3)), echo, [b"a", b"b"])
    assert results == [b"a", b"b"]
    assert counters.delayed == 2 and all(1 <= d.delay_ms <= 3 for d in decisions)


def test_target_errors_pass_through(echo):
    with FaultProxy(echo.address, seed=1) as proxy:
        client = Client(proxy.address)
        try:
            with pytest.raises(grpc.RpcError) as raised:
                client.refuse(b"bad input", timeout=CALL_TIMEOUT_S)
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.details() == "refused: bad input"
            assert proxy.counters.target_errors == 1
        finally:
            client.close()


def test_call_metadata_is_forwarded(echo):
    with FaultProxy(echo.address, seed=1) as proxy:
        client = Client(proxy.address)
        try:
            assert client.call(b"x", metadata=(("x-request-id", "42"),)) == b"x"
        finally:
            client.close()
    assert echo.metadata[0]["x-request-id"] == "42"


def test_the_seed_makes_a_run_repeatable(echo):
    faults = dict(drop_request_p=0.3, drop_response_p=0.3, duplicate_request_p=0.3)
    payloads = [str(i).encode() for i in range(40)]
    first, _, first_decisions = run(dict(seed=7, **faults), echo, payloads)
    received_first = list(echo.received)
    echo.received.clear()
    again, _, again_decisions = run(dict(seed=7, **faults), echo, payloads)
    assert again == first and again_decisions == first_decisions and echo.received == received_first
    # every kind of fault happened, and the outcome agrees with the decisions
    assert {d.drop_request for d in first_decisions} == {True, False}
    assert any(d.duplicate for d in first_decisions) and any(d.drop_response for d in first_decisions)
    for payload, result, decision in zip(payloads, first, first_decisions):
        assert result == (grpc.StatusCode.UNAVAILABLE if decision.drop_request or decision.drop_response
                          else payload)
        expected_copies = 0 if decision.drop_request else 2 if decision.duplicate else 1
        assert received_first.count(payload) == expected_copies
    echo.received.clear()
    other, _, other_decisions = run(dict(seed=8, **faults), echo, payloads)
    assert other_decisions != first_decisions


def test_target_down_then_back(echo):
    with FaultProxy(echo.address, seed=1) as proxy:
        client = Client(proxy.address)
        try:
            assert client.call(b"up") == b"up"
            echo.stop()
            assert client.call(b"down") == grpc.StatusCode.UNAVAILABLE
            replacement = EchoServer()
            try:
                proxy.set_target(replacement.address)
                assert client.call(b"again") == b"again"
                assert replacement.received == [b"again"]
            finally:
                replacement.stop()
        finally:
            client.close()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="drop_request_p"):
        FaultProxy("127.0.0.1:1", seed=0, drop_request_p=1.5)
    with pytest.raises(ValueError, match="delay_ms"):
        FaultProxy("127.0.0.1:1", seed=0, delay_ms=(5, 1))


# ---- bidirectional streams ------------------------------------------------------------------

def stream_exchange(address: str, payloads, method=STREAM):
    """Send every payload on one stream; returns (answers received, status code or None)."""
    channel = grpc.insecure_channel(address)
    try:
        call = channel.stream_stream(method)(iter(payloads), timeout=CALL_TIMEOUT_S)
        answers = []
        try:
            for answer in call:
                answers.append(answer)
        except grpc.RpcError as error:
            return answers, error.code()
        return answers, None
    finally:
        channel.close()


def run_stream(proxy_kwargs, echo: EchoServer, payloads, method=STREAM):
    kwargs = dict(stream_methods={STREAM, MISSING_STREAM}, **proxy_kwargs)
    with FaultProxy(echo.address, **kwargs) as proxy:
        answers, code = stream_exchange(proxy.address, payloads, method)
        return answers, code, proxy.counters, proxy.decisions


PAYLOADS = [b"m%d" % i for i in range(40)]


def test_stream_messages_pass_in_order_even_when_delayed(echo):
    answers, code, counters, decisions = run_stream(dict(seed=1, delay_ms=(0, 2)), echo, PAYLOADS)
    assert (answers, code) == (PAYLOADS, None)
    assert echo.received == PAYLOADS
    assert counters.requests == len(PAYLOADS) and counters.by_method == {STREAM: len(PAYLOADS)}
    assert any(d.delay_ms for d in decisions)


def test_stream_duplicate_reaches_the_server_twice_and_answers_once(echo):
    answers, code, counters, _ = run_stream(dict(seed=1, duplicate_request_p=1.0), echo, PAYLOADS[:5])
    assert (answers, code) == (PAYLOADS[:5], None)
    assert echo.received == [p for p in PAYLOADS[:5] for _ in range(2)]
    assert counters.duplicated == 5


def test_stream_dropped_request_breaks_the_stream_before_the_server_sees_it(echo):
    answers, code, counters, _ = run_stream(dict(seed=1, drop_request_p=1.0), echo, PAYLOADS[:5])
    assert (answers, code) == ([], grpc.StatusCode.UNAVAILABLE)
    assert echo.received == []
    assert counters.dropped_requests == 1     # the stream is gone after the first


def test_stream_dropped_response_breaks_the_stream_after_the_server_applied_it(echo):
    answers, code, _, _ = run_stream(dict(seed=1, drop_response_p=1.0), echo, PAYLOADS[:5])
    assert (answers, code) == ([], grpc.StatusCode.UNAVAILABLE)
    assert echo.received[:1] == PAYLOADS[:1]          # applied, then the answer was lost
    assert echo.received == PAYLOADS[:len(echo.received)]


def test_stream_answers_stop_at_the_first_broken_message(echo):
    faults = dict(drop_request_p=0.05, drop_response_p=0.05, duplicate_request_p=0.2)
    answers, code, _, decisions = run_stream(dict(seed=3, **faults), echo, PAYLOADS)
    broken = next(i for i, d in enumerate(decisions) if d.drop_request or d.drop_response)
    assert code == grpc.StatusCode.UNAVAILABLE
    assert answers == PAYLOADS[:broken]
    if decisions[broken].drop_response:
        assert PAYLOADS[broken] in echo.received
    else:
        assert PAYLOADS[broken] not in echo.received


def test_stream_target_errors_pass_through(echo):
    answers, code, _, _ = run_stream(dict(seed=1), echo, PAYLOADS[:2], method=MISSING_STREAM)
    assert (answers, code) == ([], grpc.StatusCode.UNIMPLEMENTED)


def test_unimplemented_methods_are_refused_without_forwarding(echo):
    with FaultProxy(echo.address, seed=1, stream_methods={STREAM}, unimplemented_methods={STREAM, ECHO}) as proxy:
        assert stream_exchange(proxy.address, PAYLOADS[:2]) == ([], grpc.StatusCode.UNIMPLEMENTED)
        client = Client(proxy.address)
        try:
            assert client.call(b"x") == grpc.StatusCode.UNIMPLEMENTED
        finally:
            client.close()
    assert echo.received == []
