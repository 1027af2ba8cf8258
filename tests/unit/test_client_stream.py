"""producer/stream.py against a scripted in-process ProduceStream server: one stream, and
the sender's set of them (ProduceStreams)."""
from __future__ import annotations

import queue
import threading
from concurrent import futures

import grpc
import pytest

from eos.errors import InvariantError, NetworkError, RequestTimedOutError
from eos.v1 import broker_pb2, broker_pb2_grpc
from producer.stream import STREAM_REFUSED_RETRY_MS, ProduceStream, ProduceStreams
from tests.waits import wait_for

WAIT_S = 10


class ScriptedBroker(broker_pb2_grpc.BrokerServicer):
    """Answers each request of a stream with `answer(request)`; None ends the stream,
    an exception aborts it. Records what it received."""

    def __init__(self, answer=None, refuse=None):
        self.received: list[int] = []
        self.answer = answer or (lambda request: broker_pb2.ProduceResponse(correlation_id=request.correlation_id))
        self.refuse = refuse
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        broker_pb2_grpc.add_BrokerServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def ProduceStream(self, request_iterator, context):
        if self.refuse is not None:
            context.set_trailing_metadata(self.refuse[0])
            context.abort(*self.refuse[1])
        for request in request_iterator:
            self.received.append(request.correlation_id)
            response = self.answer(request)
            if response is None:
                return
            yield response

    def stop(self):
        self.server.stop(0).wait(5)


@pytest.fixture
def channel():
    channels = []

    def make(server):
        ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        channels.append(ch)
        return broker_pb2_grpc.BrokerStub(ch)

    yield make
    for ch in channels:
        ch.close()


class Answers:
    def __init__(self):
        self.queue: queue.Queue = queue.Queue()

    def __call__(self, request_id, answer):
        self.queue.put((request_id, answer))

    def take(self, n):
        out = []
        for _ in range(n):
            request_id, answer = self.queue.get(timeout=WAIT_S)
            try:
                out.append((request_id, answer.result()))
            except Exception as exc:
                out.append((request_id, exc))
        return out


def open_stream(stub, answers, in_flight_max=5):
    return ProduceStream(stub, 0, in_flight_max=in_flight_max, on_answer=answers)


def test_answers_come_back_in_order_with_their_request_ids(channel):
    broker = ScriptedBroker()
    try:
        answers = Answers()
        stream = open_stream(channel(broker), answers)
        for request_id in (10, 11, 12, 13, 14):
            assert stream.send(request_id, broker_pb2.ProduceRequest(), now_ms=0)
        got = answers.take(5)
        assert [rid for rid, _ in got] == [10, 11, 12, 13, 14]
        assert [r.correlation_id for _, r in got] == [0, 1, 2, 3, 4]
        assert broker.received == [0, 1, 2, 3, 4]
        assert stream.outstanding_count() == 0 and stream.oldest_sent_ms() is None
        stream.close()
        stream.join(WAIT_S)
        assert stream.closed
    finally:
        broker.stop()


def test_more_than_the_in_flight_bound_is_a_bug(channel):
    release = threading.Event()

    def slow(request):
        release.wait(WAIT_S)
        return broker_pb2.ProduceResponse(correlation_id=request.correlation_id)

    broker = ScriptedBroker(slow)
    try:
        stream = open_stream(channel(broker), Answers(), in_flight_max=2)
        assert stream.send(1, broker_pb2.ProduceRequest(), now_ms=7)
        assert stream.send(2, broker_pb2.ProduceRequest(), now_ms=9)
        assert stream.oldest_sent_ms() == 7
        with pytest.raises(InvariantError):
            stream.send(3, broker_pb2.ProduceRequest(), now_ms=9)
        release.set()
        stream.close()
    finally:
        broker.stop()


def test_an_answer_out_of_order_fails_every_outstanding_request(channel):
    def wrong(request):
        return broker_pb2.ProduceResponse(correlation_id=request.correlation_id + 100)

    broker = ScriptedBroker(wrong)
    try:
        answers = Answers()
        stream = open_stream(channel(broker), answers)
        stream.send(1, broker_pb2.ProduceRequest(), now_ms=0)
        [(request_id, error)] = answers.take(1)
        assert request_id == 1 and isinstance(error, NetworkError) and "correlation id" in str(error)
        stream.join(WAIT_S)
        assert stream.closed and not stream.send(2, broker_pb2.ProduceRequest(), now_ms=0)
    finally:
        broker.stop()


def test_a_broken_stream_fails_what_is_outstanding_as_retriable(channel):
    first_answered = threading.Event()

    def end_after_first(request):
        if request.correlation_id == 0:
            first_answered.set()
            return broker_pb2.ProduceResponse(correlation_id=0)
        return None     # the broker ends the stream without answering

    broker = ScriptedBroker(end_after_first)
    try:
        answers = Answers()
        stream = open_stream(channel(broker), answers)
        stream.send(1, broker_pb2.ProduceRequest(), now_ms=0)
        first_answered.wait(WAIT_S)
        stream.send(2, broker_pb2.ProduceRequest(), now_ms=0)
        got = answers.take(2)
        assert got[0][0] == 1 and isinstance(got[0][1], broker_pb2.ProduceResponse)
        assert got[1][0] == 2 and isinstance(got[1][1], NetworkError) and got[1][1].retriable
    finally:
        broker.stop()


def test_abort_fails_outstanding_requests_with_the_reason(channel):
    never = threading.Event()
    broker = ScriptedBroker(lambda request: never.wait(WAIT_S) and None)
    try:
        answers = Answers()
        stream = open_stream(channel(broker), answers)
        stream.send(1, broker_pb2.ProduceRequest(), now_ms=0)
        stream.send(2, broker_pb2.ProduceRequest(), now_ms=0)
        stream.abort(RequestTimedOutError("too slow"))
        got = answers.take(2)
        assert [rid for rid, _ in got] == [1, 2]
        assert all(isinstance(e, RequestTimedOutError) and "too slow" in str(e) for _, e in got)
        never.set()
    finally:
        broker.stop()


@pytest.mark.parametrize("refusal, flag", [
    ((((),), (grpc.StatusCode.UNIMPLEMENTED, "no such method")), "unimplemented"),
    ((((("eos-produce-stream-refused", "resource_exhausted"),),), (grpc.StatusCode.RESOURCE_EXHAUSTED, "full")),
     "refused"),
])
def test_refusals_at_open_say_why(channel, refusal, flag):
    (metadata,), status = refusal
    broker = ScriptedBroker(refuse=(metadata, status))
    try:
        answers = Answers()
        stream = open_stream(channel(broker), answers)
        if stream.send(1, broker_pb2.ProduceRequest(), now_ms=0):   # else refused already: not taken
            [(request_id, error)] = answers.take(1)
            assert request_id == 1 and isinstance(error, NetworkError) and error.retriable
        stream.join(WAIT_S)
        assert getattr(stream, flag) and stream.closed
    finally:
        broker.stop()


# ---- ProduceStreams: the sender's stream per broker, and the brokers on unary Produce ----

def _streams(answers, request_timeout_ms=30_000):
    return ProduceStreams(enabled=True, in_flight_max=5, on_answer=answers, call_metadata=(),
                          request_timeout_ms=request_timeout_ms)


def _until_dropped(streams, now_ms):
    """check() until the failed stream is dropped (its failure arrives on gRPC's thread)."""
    wait_for(lambda: streams.check(now_ms, {}), "the failed stream dropped", timeout_s=WAIT_S)


def test_a_broker_that_refused_a_stream_gets_unary_calls_for_a_while_then_a_stream_again(channel):
    refusal = ((("eos-produce-stream-refused", "resource_exhausted"),), (grpc.StatusCode.RESOURCE_EXHAUSTED, "full"))
    broker = ScriptedBroker(refuse=refusal)
    try:
        answers = Answers()
        streams = _streams(answers)
        assert streams.ordered(0)
        if streams.send(0, channel(broker), 1, broker_pb2.ProduceRequest(), now_ms=1_000):
            [(request_id, error)] = answers.take(1)
            assert request_id == 1 and isinstance(error, NetworkError) and error.retriable
        _until_dropped(streams, 1_000)
        assert not streams.ordered(0) and streams.stream_to(0) is None
        streams.check(1_000 + STREAM_REFUSED_RETRY_MS - 1, {})
        assert not streams.ordered(0)                       # not yet
        streams.check(1_000 + STREAM_REFUSED_RETRY_MS, {0: 1})
        assert not streams.ordered(0)                       # a unary call is still in flight there
        streams.check(1_000 + STREAM_REFUSED_RETRY_MS, {0: 0})
        assert streams.ordered(0)
        streams.close()
    finally:
        broker.stop()


def test_a_broker_without_produce_stream_gets_unary_calls_for_good(channel):
    broker = ScriptedBroker(refuse=((), (grpc.StatusCode.UNIMPLEMENTED, "no such method")))
    try:
        answers = Answers()
        streams = _streams(answers)
        if streams.send(0, channel(broker), 1, broker_pb2.ProduceRequest(), now_ms=0):
            answers.take(1)
        _until_dropped(streams, 0)
        streams.check(10 * STREAM_REFUSED_RETRY_MS, {})
        assert not streams.ordered(0) and not streams.all()
        streams.close()
    finally:
        broker.stop()


def test_a_request_past_request_timeout_aborts_the_stream_and_the_next_send_opens_another(channel):
    never = threading.Event()
    broker = ScriptedBroker(lambda request: never.wait(WAIT_S) and None)
    try:
        answers = Answers()
        streams = _streams(answers, request_timeout_ms=500)
        stub = channel(broker)
        assert streams.send(0, stub, 1, broker_pb2.ProduceRequest(), now_ms=1_000)
        first = streams.stream_to(0)
        assert not streams.check(1_499, {}) and not first.aborted     # within request.timeout.ms
        streams.check(1_500, {})
        assert first.aborted
        [(request_id, error)] = answers.take(1)
        assert request_id == 1 and isinstance(error, RequestTimedOutError)
        _until_dropped(streams, 1_500)
        assert streams.ordered(0)                            # a timeout is no reason for unary calls
        assert streams.send(0, stub, 2, broker_pb2.ProduceRequest(), now_ms=1_600)
        assert streams.stream_to(0) is not first
        never.set()
        streams.close()
    finally:
        never.set()
        broker.stop()


# ---- eos.calls: blocking calls on one long-lived thread per destination -----------------

def test_call_threads_run_a_destinations_calls_in_order_on_one_reused_thread():
    from eos.calls import CallThreads

    calls = CallThreads("eos-test-calls")
    try:
        def where(tag, *, timeout):
            return tag, timeout, threading.current_thread().name

        first = calls.submit("coordinator", where, "a", timeout=1.5)
        second = calls.submit("coordinator", where, "b", timeout=2.5)
        other = calls.submit(3, where, "c", timeout=0.5)
        assert first.result(WAIT_S) == ("a", 1.5, "eos-test-calls-coordinator")
        assert second.result(WAIT_S) == ("b", 2.5, "eos-test-calls-coordinator")
        assert other.result(WAIT_S) == ("c", 0.5, "eos-test-calls-3")
    finally:
        calls.close()


def test_call_threads_hand_an_exception_to_the_future_and_go_on():
    from eos.calls import CallThreads

    calls = CallThreads("eos-test-calls")
    try:
        def fail():
            raise ValueError("Cannot invoke RPC on closed channel!")

        with pytest.raises(ValueError, match="closed channel"):
            calls.submit(1, fail).result(WAIT_S)
        assert calls.submit(1, lambda: "next").result(WAIT_S) == "next"
    finally:
        calls.close()


def test_call_threads_after_close_cancel_instead_of_calling():
    from eos.calls import CallThreads

    calls = CallThreads("eos-test-calls")
    calls.close()
    made = []
    late = calls.submit(1, lambda: made.append("called"))
    assert late.cancelled()
    with pytest.raises(futures.CancelledError):
        late.result(timeout=0)
    assert made == []
