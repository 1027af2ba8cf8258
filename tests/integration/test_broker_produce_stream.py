"""ProduceStream against a real (in-process) broker over gRPC.

Order kept for 1,000 pipelined requests of an idempotent producer (no OUT_OF_ORDER), the
correlation ids echoed, a bad request in the middle answered with its error while the
stream goes on, the stop of the broker answering the request in flight and then ending
the stream, and the bound on open streams (with the pool still serving short calls while
every long-held worker is taken).
"""
from __future__ import annotations

import queue
import threading

import grpc
import pytest

import broker.server
from broker.writes import STREAM_REFUSAL_METADATA_KEY
from eos import net
from eos.errors import ErrorCode, NetworkError
from eos.records.codec import BatchBuilder, encode_batch, iter_decoded
from eos.v1 import broker_pb2, broker_pb2_grpc, txn_pb2
from tests.waits import wait_for

WAIT_S = 30.0          # bound of every wait; reached only when the behaviour is broken
PIPELINE_DEPTH = 5     # max.in.flight.requests.per.connection of an idempotent producer


# ---- helpers -------------------------------------------------------------------------------

def create_topic(stub, name, partitions=1):
    [result] = stub.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
        broker_pb2.NewTopic(name=name, num_partitions=partitions)]), timeout=WAIT_S).topics
    assert result.error_code == ErrorCode.NONE, result.error_message


def request(topic, partition, records, *, correlation_id=0, acks=-1):
    return broker_pb2.ProduceRequest(acks=acks, timeout_ms=30000, correlation_id=correlation_id, partitions=[
        broker_pb2.PartitionRecords(topic=topic, partition=partition, records=records)])


def idempotent_batch(value: bytes, producer_id: int, producer_epoch: int, sequence: int) -> bytes:
    builder = BatchBuilder()
    builder.append(value, None, 1_000)
    return builder.build(producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=sequence)


def read_values(stub, topic, partition):
    values, offset = [], 0
    while True:
        [result] = stub.Fetch(broker_pb2.FetchRequest(partitions=[
            broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]),
            timeout=WAIT_S).partitions
        assert result.error_code == ErrorCode.NONE, result.error_message
        records = [r for r in iter_decoded(result.records, topic, partition) if r.offset >= offset]
        values += [r.value for r in records]
        if records:
            offset = records[-1].offset + 1
        if offset >= result.high_watermark:
            return values


class OpenStream:
    """A ProduceStream whose requests the test sends one by one, answers read in order."""

    _END = object()

    def __init__(self, stub):
        self._requests: queue.Queue = queue.Queue()
        self.call = stub.ProduceStream(self._iterate(), timeout=WAIT_S * 4)
        self._responses = iter(self.call)

    def _iterate(self):
        while True:
            item = self._requests.get()
            if item is self._END:
                return
            yield item

    def send(self, produce_request) -> None:
        self._requests.put(produce_request)

    def answer(self) -> broker_pb2.ProduceResponse:
        return next(self._responses)

    def close(self) -> None:
        self._requests.put(self._END)

    def rest(self) -> tuple[list, grpc.RpcError | None]:
        """Every answer still to come and the stream's final error (None: it ended OK)."""
        answers = []
        try:
            for response in self._responses:
                answers.append(response)
        except grpc.RpcError as exc:
            return answers, exc
        return answers, None


def reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "eos-produce-stream-reader"]


# ---- order and correlation ids --------------------------------------------------------------

def test_pipelined_idempotent_requests_keep_their_order(inprocess_broker):
    """1,000 requests, 5 in flight at all times, over 3 partitions with one sequence each:
    handled in arrival order, so no sequence is ever refused as OUT_OF_ORDER, every answer
    echoes its request's correlation id in order, and the logs hold the values in order."""
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "ordered", partitions=3)
    init = inprocess_broker.txn_stub().InitProducerId(txn_pb2.InitProducerIdRequest(
        producer_id=-1, producer_epoch=-1), timeout=WAIT_S)
    assert init.error_code == ErrorCode.NONE, init.error_message
    request_count = 1000
    # Correlation ids that no counter would produce by accident, up to int32's maximum.
    correlation_ids = [(2**31 - 1) - 7919 * i for i in range(request_count)]
    window = threading.Semaphore(PIPELINE_DEPTH)
    max_in_flight = [0]
    in_flight = [0]
    lock = threading.Lock()

    def requests():
        sequences = [0, 0, 0]
        for i in range(request_count):
            window.acquire(timeout=WAIT_S)
            partition = i % 3
            batch = idempotent_batch(b"v%d" % i, init.producer_id, init.producer_epoch, sequences[partition])
            sequences[partition] += 1
            with lock:
                in_flight[0] += 1
                max_in_flight[0] = max(max_in_flight[0], in_flight[0])
            yield request("ordered", partition, batch, correlation_id=correlation_ids[i])

    answers = []
    for response in stub.ProduceStream(requests(), timeout=WAIT_S * 4):
        answers.append(response)
        # One broker: no answer waits for replicas, so the handler reads the stream on its own
        # thread and no reader thread hands requests over.
        assert not reader_threads()
        with lock:
            in_flight[0] -= 1
        window.release()

    assert [a.correlation_id for a in answers] == correlation_ids
    errors = [(i, r.error_code, r.error_message) for i, a in enumerate(answers) for r in a.partitions
              if r.error_code != ErrorCode.NONE]
    assert errors == []
    assert [a.partitions[0].base_offset for a in answers] == [i // 3 for i in range(request_count)]
    assert max_in_flight[0] == PIPELINE_DEPTH   # the pipeline really was 5 deep
    for partition in range(3):
        assert read_values(stub, "ordered", partition) == [b"v%d" % i for i in range(partition, request_count, 3)]


def test_unary_produce_echoes_the_correlation_id(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "unary")
    response = stub.Produce(request("unary", 0, encode_batch([b"x"]), correlation_id=41), timeout=WAIT_S)
    assert response.correlation_id == 41 and response.partitions[0].error_code == ErrorCode.NONE


# ---- bad requests in the middle ------------------------------------------------------------------

def _bad_crc() -> bytes:
    batch = bytearray(encode_batch([b"corrupt"]))
    batch[-1] ^= 0xFF
    return bytes(batch)


def test_bad_requests_are_answered_with_their_errors_and_the_stream_goes_on(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "mixed")
    sent = [
        (request("mixed", 0, encode_batch([b"a"]), correlation_id=1), ErrorCode.NONE),
        (request("mixed", 0, _bad_crc(), correlation_id=2), ErrorCode.CORRUPT_MESSAGE),
        (request("mixed", 0, encode_batch([b"b"]), correlation_id=3, acks=5), ErrorCode.INVALID_REQUIRED_ACKS),
        (request("nope", 0, encode_batch([b"c"]), correlation_id=4), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (request("mixed", 7, encode_batch([b"d"]), correlation_id=5), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (request("mixed", 0, b"", correlation_id=6), ErrorCode.INVALID_RECORD),
        (request("mixed", 0, encode_batch([b"e"]), correlation_id=7), ErrorCode.NONE),
    ]
    answers = list(stub.ProduceStream(iter([r for r, _ in sent]), timeout=WAIT_S))

    assert [a.correlation_id for a in answers] == [1, 2, 3, 4, 5, 6, 7]
    codes = [a.partitions[0].error_code for a in answers]
    assert codes == [code for _, code in sent], [a.partitions[0].error_message for a in answers]
    for answer, (_, code) in zip(answers, sent):
        if code != ErrorCode.NONE:
            assert answer.partitions[0].error_message and answer.partitions[0].base_offset == -1
    assert [answers[0].partitions[0].base_offset, answers[6].partitions[0].base_offset] == [0, 1]
    assert read_values(stub, "mixed", 0) == [b"a", b"e"]


def test_a_client_that_closes_its_side_gets_every_answer_and_a_clean_end(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "closing")
    stream = OpenStream(stub)
    for i in range(10):
        stream.send(request("closing", 0, encode_batch([b"%d" % i]), correlation_id=i))
    stream.close()
    answers, error = stream.rest()
    assert error is None
    assert [a.correlation_id for a in answers] == list(range(10))
    wait_for(lambda: inprocess_broker.server._servicer.produce_stream_count == 0, "the stream to unregister")


# ---- broker stop ---------------------------------------------------------------------------------

def test_broker_stop_answers_the_request_in_flight_then_ends_the_streams(inprocess_broker):
    handle = inprocess_broker
    stub = handle.broker_stub()
    create_topic(stub, "stopping")
    servicer = handle.server._servicer

    # Hold the first request of the busy stream inside the broker until stop() has begun.
    entered, release = threading.Event(), threading.Event()
    real_produce_partitions = servicer._produce_partitions

    def held_produce_partitions(produce_request, waits=None, context=None):
        if produce_request.correlation_id == 100:
            entered.set()
            release.wait(WAIT_S)
        return real_produce_partitions(produce_request, waits, context)

    servicer._produce_partitions = held_produce_partitions

    idle = OpenStream(stub)
    idle.send(request("stopping", 0, encode_batch([b"idle"]), correlation_id=1))
    assert idle.answer().partitions[0].base_offset == 0
    busy = OpenStream(stub)
    busy.send(request("stopping", 0, encode_batch([b"in flight"]), correlation_id=100))
    busy.send(request("stopping", 0, encode_batch([b"queued behind it"]), correlation_id=101))
    assert entered.wait(WAIT_S)
    assert servicer.produce_stream_count == 2

    stopper = threading.Thread(target=handle.server.stop, name="test-stop")
    stopper.start()
    try:
        wait_for(lambda: servicer._gate.closed, "stop() to close the request gate")
        # The idle stream ends now; the busy one is still handling its request.
        idle_answers, idle_error = idle.rest()
        assert idle_answers == []
        assert_idle_stream_cancelled(idle_error)
    finally:
        release.set()
    busy_answers, busy_error = busy.rest()
    stopper.join(WAIT_S)
    assert not stopper.is_alive()

    # The request in flight was answered; the one behind it was not handled at all.
    assert [(a.correlation_id, a.partitions[0].error_code, a.partitions[0].base_offset)
            for a in busy_answers] == [(100, ErrorCode.NONE, 1)]
    assert busy_error is not None and busy_error.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.produce_stream_count == 0
    wait_for(lambda: not reader_threads(), "the stream reader threads to end")

    handle.stop()   # the server is stopped already (stop is idempotent); start again on the same data dir
    handle.start()
    assert read_values(handle.broker_stub(), "stopping", 0) == [b"idle", b"in flight"]


# ---- bounds ----------------------------------------------------------------------------------------

@pytest.fixture
def small_pool(monkeypatch, inprocess_broker_factory):
    """A broker whose bounds are 2 each (num.io.threads=2: a pool of 10 workers), so that
    tests can reach them."""
    for name in ("FETCH_WAITERS_MAX", "GROUP_PARKED_REQUESTS_MAX", "PRODUCE_STREAMS_MAX",
                 "TXN_PARKED_REQUESTS_MAX"):
        monkeypatch.setattr(broker.server, name, 2)
    return inprocess_broker_factory({"num.io.threads": "2"})


def test_streams_beyond_the_bound_are_refused_and_short_calls_still_served(small_pool):
    stub = small_pool.broker_stub()
    create_topic(stub, "bounded")
    servicer = small_pool.server._servicer
    streams = []
    for i in range(2):
        stream = OpenStream(stub)
        stream.send(request("bounded", 0, encode_batch([b"s%d" % i]), correlation_id=i))
        assert stream.answer().correlation_id == i
        streams.append(stream)
    # Both long polls a pool of 8 allows, parked for up to 30 s.
    polls = [stub.Fetch.future(broker_pb2.FetchRequest(max_wait_ms=30000, min_bytes=10**6, partitions=[
        broker_pb2.FetchPartition(topic="bounded", partition=0, fetch_offset=0)]), timeout=WAIT_S * 2)
        for _ in range(2)]
    wait_for(lambda: servicer.fetch_waiter_count == 2, "two parked long polls")

    refused = OpenStream(stub)
    refused.send(request("bounded", 0, encode_batch([b"refused"]), correlation_id=9))
    answers, error = refused.rest()
    assert answers == []
    assert error is not None and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "too many produce streams" in error.details()
    assert (STREAM_REFUSAL_METADATA_KEY, "resource_exhausted") in tuple(error.trailing_metadata())

    # Every long-held worker is taken; short calls still get one.
    third_poll = stub.Fetch(broker_pb2.FetchRequest(max_wait_ms=30000, min_bytes=10**6, partitions=[
        broker_pb2.FetchPartition(topic="bounded", partition=0, fetch_offset=0)]), timeout=WAIT_S)
    assert third_poll.partitions[0].high_watermark == 2      # answered at once: the purgatory is full
    assert stub.Metadata(broker_pb2.MetadataRequest(topics=["bounded"]), timeout=WAIT_S).topics[0].name == "bounded"
    unary = stub.Produce(request("bounded", 0, encode_batch([b"unary"])), timeout=WAIT_S)
    assert unary.partitions[0].base_offset == 2

    # A closed stream frees its place.
    streams[0].close()
    assert streams[0].rest() == ([], None)
    wait_for(lambda: servicer.produce_stream_count == 1, "the closed stream to unregister")
    again = OpenStream(stub)
    again.send(request("bounded", 0, encode_batch([b"again"]), correlation_id=5))
    assert again.answer().partitions[0].base_offset == 3
    for stream in (streams[1], again):
        stream.close()
        assert stream.rest()[1] is None
    for poll in polls:
        poll.cancel()   # a cancelled long poll frees its worker
    wait_for(lambda: servicer.fetch_waiter_count == 0, "the cancelled long polls to leave")


def test_a_cancelled_stream_gives_its_place_back(small_pool):
    stub = small_pool.broker_stub()
    create_topic(stub, "cancelled")
    servicer = small_pool.server._servicer
    for round_number in range(3):    # more than the bound of 2: every place came back
        stream = OpenStream(stub)
        stream.send(request("cancelled", 0, encode_batch([b"%d" % round_number]), correlation_id=round_number))
        assert stream.answer().correlation_id == round_number
        stream.call.cancel()
        assert stream.rest()[1].code() == grpc.StatusCode.CANCELLED
        stream.close()
        wait_for(lambda: servicer.produce_stream_count == 0, "the cancelled stream to unregister")
    wait_for(lambda: not reader_threads(), "the stream reader threads to end")


def assert_idle_stream_cancelled(error) -> None:
    """An idle stream's handler waits inside gRPC's request iterator, which only the call's
    end can wake: a stopping broker cancels the call. The client sees CANCELLED, or
    UNAVAILABLE when the server's shutdown (GOAWAY, the socket closing) reaches it before the
    cancel does; the producer takes either as a network error and retries elsewhere, as
    after Kafka closes a connection."""
    assert error is not None and error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
    assert isinstance(net.error_from_rpc(error, "ProduceStream"), NetworkError)


def test_sigterm_ends_open_streams_and_the_broker_exits_cleanly(broker):
    create_topic(broker.broker_stub(), "sigterm")
    # A channel of the test's own: broker.stop() closes the fixture's channels first.
    with grpc.insecure_channel(broker.address) as channel:
        stream = OpenStream(broker_pb2_grpc.BrokerStub(channel))
        stream.send(request("sigterm", 0, encode_batch([b"before"]), correlation_id=3))
        assert stream.answer().correlation_id == 3
        exit_codes: list[int] = []
        stopper = threading.Thread(target=lambda: exit_codes.append(broker.stop()), name="test-sigterm")
        stopper.start()
        answers, error = stream.rest()
        stopper.join(WAIT_S)
    assert answers == []
    assert_idle_stream_cancelled(error)
    assert exit_codes == [0]
