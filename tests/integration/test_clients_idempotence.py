"""The idempotent producer through faults: retries never duplicate, order holds per partition.

The producer talks to the broker through `tests.faults.FaultProxy`, which drops requests,
drops responses after the broker applied them, duplicates requests and delays (so reorders)
them. A consumer reads straight from the broker and must find every record exactly once,
in send order per partition.
"""
from __future__ import annotations

import threading
import time

import grpc
import pytest

import eos
from eos.errors import MessageTooLargeError
from eos.types import TopicPartition
from eos.v1 import broker_pb2, common_pb2
from tests.faults import FaultProxy
from tests.waits import wait_for
from tests.integration.test_clients_producer import consume_all

PARTITIONS = 3
WAIT_S = 60


def check_exactly_once_in_order(records, per_partition: int) -> None:
    for p in range(PARTITIONS):
        values = [r.value for r in records if r.partition == p]
        expected = [b"%d-%d" % (p, i) for i in range(per_partition)]
        assert len(values) == len(expected), f"partition {p}: {len(values)} records, sent {len(expected)}"
        assert values == expected, f"partition {p}: duplicates, losses or reordering"


def fast_retries(**extra):
    # max.request.size bounds how far a backlog is coalesced into larger batches (and the
    # bulk path's batches): small batches make many requests for the faults to hit.
    return {**dict(retry_backoff_ms=10, retry_backoff_max_ms=100, request_timeout_ms=5000,
                   delivery_timeout_ms=120_000, linger_ms=2, batch_size=4096, max_request_size=4096),
            **extra}


@pytest.mark.parametrize("seed, produce_stream", [(1, True), (2, True), (3, False)])
def test_dropped_and_duplicated_requests_and_responses(broker, seed, produce_stream):
    """On the ordered ProduceStream, and on unary Produce calls (a broker without the
    stream: the producer falls back)."""
    with eos.Admin(broker.address) as admin:
        admin.create_topic("idem", partitions=PARTITIONS)
    per_partition = 2000
    unimplemented = () if produce_stream else ("/eos.v1.Broker/ProduceStream",)
    with FaultProxy(broker.address, seed=seed, drop_request_p=0.05, drop_response_p=0.15,
                    duplicate_request_p=0.1, delay_ms=(0, 3), unimplemented_methods=unimplemented) as proxy:
        with eos.Producer(proxy.address, **fast_retries()) as producer:
            futures = []
            for i in range(per_partition):
                for p in range(PARTITIONS):
                    futures.append(producer.send("idem", b"%d-%d" % (p, i), partition=p))
            producer.flush(WAIT_S)
            assert [f.exception() for f in futures if f.exception() is not None] == []
            # per partition, the acknowledged offsets are exactly 0..n-1 in send order
            for p in range(PARTITIONS):
                offsets = [f.result().offset for f in futures[p::PARTITIONS]]
                assert offsets == list(range(per_partition))
        counters = proxy.counters
    assert counters.dropped_responses > 0 and counters.duplicated > 0
    produce_method = "/eos.v1.Broker/ProduceStream" if produce_stream else "/eos.v1.Broker/Produce"
    assert counters.by_method.get(produce_method, 0) > 10
    records = consume_all(broker.address, "idem", PARTITIONS, PARTITIONS * per_partition)
    check_exactly_once_in_order(records, per_partition)


def broker_serves_produce_stream(broker) -> bool:
    try:
        list(broker.broker_stub().ProduceStream(iter(()), timeout=10))
    except grpc.RpcError as error:
        if error.code() is grpc.StatusCode.UNIMPLEMENTED:
            return False
        raise
    return True


def test_five_batches_of_a_partition_in_flight_keep_their_order_through_faults(broker):
    """On the ordered ProduceStream an idempotent producer pipelines its whole window (5
    batches of a partition); broken streams (lost answers), duplicates and delays never
    duplicate, lose or reorder a record."""
    assert broker_serves_produce_stream(broker), "the broker must serve ProduceStream"
    with eos.Admin(broker.address) as admin:
        admin.create_topic("idem-5", partitions=1)
    count = 3000
    highest_in_flight = 0
    sending = threading.Event()
    sending.set()
    with FaultProxy(broker.address, seed=11, drop_response_p=0.02, duplicate_request_p=0.05,
                    delay_ms=(1, 3)) as proxy:
        with eos.Producer(proxy.address, **fast_retries(linger_ms=0, batch_size=200, max_request_size=400)) as producer:
            in_flight = producer._sender._in_flight_tps

            def sample():   # how many batches of the partition were in flight at once
                nonlocal highest_in_flight
                while sending.is_set():
                    highest_in_flight = max(highest_in_flight, len(in_flight.get(("idem-5", 0), ())))
                    time.sleep(0.001)

            sampler = threading.Thread(target=sample)
            sampler.start()
            try:
                futures = [producer.send("idem-5", b"0-%d" % i, partition=0) for i in range(count)]
                producer.flush(WAIT_S)
            finally:
                sending.clear()
                sampler.join(WAIT_S)
            assert [f.exception() for f in futures if f.exception() is not None] == []
            assert [f.result().offset for f in futures] == list(range(count))
        counters = proxy.counters
    assert counters.dropped_responses > 0 and counters.duplicated > 0
    assert highest_in_flight > 2, "the producer never pipelined more than the unary fallback's 2 batches"
    records = consume_all(broker.address, "idem-5", 1, count)
    assert [r.value for r in records] == [b"0-%d" % i for i in range(count)]


def test_bulk_path_through_faults(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("idem-bulk", partitions=PARTITIONS)
    per_partition = 5000
    with FaultProxy(broker.address, seed=7, drop_response_p=0.2, duplicate_request_p=0.1,
                    delay_ms=(0, 2)) as proxy:
        with eos.Producer(proxy.address, **fast_retries()) as producer:
            futures = [producer.send_batch("idem-bulk", [b"%d-%d" % (p, i) for i in range(per_partition)],
                                           partition=p) for p in range(PARTITIONS)]
            for future in futures:
                assert [m.offset for m in future.result(WAIT_S)] == list(range(per_partition))
    records = consume_all(broker.address, "idem-bulk", PARTITIONS, PARTITIONS * per_partition)
    check_exactly_once_in_order(records, per_partition)


def test_broker_killed_and_restarted_mid_stream(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("idem-kill", partitions=PARTITIONS)
    per_partition = 3000
    with FaultProxy(broker.address, seed=3, drop_response_p=0.1, delay_ms=(0, 2)) as proxy:
        with eos.Producer(proxy.address, **fast_retries()) as producer:
            futures = []
            sending_done = threading.Event()

            def send_all():
                for i in range(per_partition):
                    for p in range(PARTITIONS):
                        futures.append(producer.send("idem-kill", b"%d-%d" % (p, i), partition=p))
                    if i % 500 == 0:
                        time.sleep(0.05)     # keep the stream going while the broker dies
                sending_done.set()

            sender = threading.Thread(target=send_all)
            sender.start()
            total = PARTITIONS * per_partition
            acked_at_last_kill, kills_mid_stream = 0, 0

            def acked() -> int:
                return sum(f.done() for f in list(futures))

            for _ in range(2):
                # kill once acknowledgements flow again, not after a guessed delay
                wait_for(lambda: acked() > acked_at_last_kill, "acknowledgements to flow", timeout_s=WAIT_S)
                acked_at_last_kill = acked()
                kills_mid_stream += acked_at_last_kill < total
                broker.kill()                # kill -9: requests in flight get no answer
                time.sleep(0.2)              # the outage itself (the fault), not a synchronisation
                broker.start()
            sender.join(WAIT_S)
            assert sending_done.is_set()
            assert kills_mid_stream >= 1, "no kill landed while records were unacknowledged"
            producer.flush(WAIT_S)
            failed = [f.exception() for f in futures if f.exception() is not None]
            assert failed == []
    records = consume_all(broker.address, "idem-kill", PARTITIONS, PARTITIONS * per_partition)
    check_exactly_once_in_order(records, per_partition)


def test_unrecoverable_batch_bumps_the_epoch_and_the_producer_carries_on(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("bump", partitions=1, config={"max.message.bytes": "2000"})
    tp = TopicPartition("bump", 0)

    def producers_on_partition():
        response = broker.broker_stub().DescribeProducers(broker_pb2.DescribeProducersRequest(
            partitions=[common_pb2.TopicPartition(topic=tp.topic, partition=tp.partition)]), timeout=10)
        return {(p.producer_id, p.producer_epoch) for p in response.partitions[0].producers}

    with eos.Producer(broker.address) as producer:
        assert producer.send("bump", b"before").result(WAIT_S).offset == 0
        first = producers_on_partition()
        too_big = producer.send("bump", b"x" * 5000)     # over the topic's max.message.bytes
        with pytest.raises(MessageTooLargeError):
            too_big.result(WAIT_S)
        after = [producer.send("bump", b"after-%d" % i) for i in range(10)]
        assert [f.result(WAIT_S).offset for f in after] == list(range(1, 11))
        second = producers_on_partition()
    assert len(first) == 1 and second - first, "a new producer id or epoch wrote after the failure"
    records = consume_all(broker.address, "bump", 1, 11)
    assert [r.value for r in records] == [b"before"] + [b"after-%d" % i for i in range(10)]

