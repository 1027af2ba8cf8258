"""BrokerServicer against an in-memory fake of the storage API: per-partition errors,
isolation of unexpected failures, fetch sizing and the long poll. No sockets, no disk logs."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest

from broker.purgatory import FetchPurgatory
from broker.service import BrokerServicer, NodeAddress
from broker.topics import TopicRegistry
from eos.errors import CorruptRecordError, ErrorCode, OffsetOutOfRangeError
from eos.records.header import iter_headers, verify_crc, write_base_offset
from eos.v1 import broker_pb2
from tests.waits import wait_for


@dataclass
class FakeAppendInfo:
    first_offset: int
    last_offset: int
    log_append_time_ms: int = -1
    duplicate: bool = False


@dataclass
class FakeFetchData:
    records: bytes
    first_offset: int
    high_watermark: int
    log_start_offset: int
    last_stable_offset: int
    aborted_transactions: tuple = ()


class FakeLog:
    """Batches in a list; offsets assigned as the real log does; reads whole batches."""

    def __init__(self, topic, partition):
        self.topic, self.partition = topic, partition
        self.batches: list[tuple[int, bytes]] = []  # (base offset, bytes)
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.fail_with: Exception | None = None

    @property
    def high_watermark(self):
        return self.log_end_offset

    @property
    def last_stable_offset(self):   # no transactions in the fake
        return self.log_end_offset

    def has_ongoing_transaction(self, producer_id, producer_epoch):
        return False

    def append_as_leader(self, records: bytes, now_ms: int, *, headers=None, leader_epoch: int = 0):
        if self.fail_with is not None:
            raise self.fail_with
        buf = bytearray(records)
        if headers is not None:
            # The service hands over its own parse; it must be the parse of these bytes.
            assert [h.position for h in headers] == [h.position for h in iter_headers(buf)]
        headers = list(iter_headers(buf))
        if not headers:
            raise CorruptRecordError("no batch")
        for header in headers:
            verify_crc(buf, header)
        first = self.log_end_offset
        for header in headers:
            write_base_offset(buf, header.position, self.log_end_offset)
            self.batches.append((self.log_end_offset, bytes(buf[header.position:header.position + header.size_bytes])))
            self.log_end_offset += header.last_offset_delta + 1
        return FakeAppendInfo(first, self.log_end_offset - 1)

    def read(self, fetch_offset, max_bytes, *, max_offset_exclusive=None, min_one_batch=True,
             isolation_committed=False):
        upper = self.high_watermark if max_offset_exclusive is None else max_offset_exclusive
        if not self.log_start_offset <= fetch_offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(f"offset {fetch_offset} outside [{self.log_start_offset}, {self.log_end_offset}]")
        out = b""
        for base, data in self.batches:
            if base < fetch_offset:  # the test batches hold one record each
                continue
            if base >= upper:
                break
            if len(out) + len(data) > max_bytes and not (min_one_batch and not out):
                break
            out += data
        return FakeFetchData(out, fetch_offset, self.high_watermark, self.log_start_offset, self.last_stable_offset)

    def offset_for_timestamp(self, ts, *, isolation_committed=False):
        return None

    producer_state = None


class FakeLogManager:
    def __init__(self):
        self.logs = {}

    def get_log(self, topic, partition):
        return self.logs.get((topic, partition))

    def create_log(self, topic, partition, config, *, sync_directory=True):
        self.logs[(topic, partition)] = FakeLog(topic, partition)
        return self.logs[(topic, partition)]

    def sync_directories(self, created=()):
        return {}                       # nothing on disk, nothing offline

    def delete_log(self, topic, partition):
        self.logs.pop((topic, partition), None)

    def offline_reason(self, topic, partition):
        return None                     # one healthy directory

    def all_logs(self):
        return list(self.logs.values())


def one_record_batch(value: bytes) -> bytes:
    from eos.records.codec import encode_batch
    return encode_batch([value])


@pytest.fixture
def servicer(tmp_path):
    registry = TopicRegistry(tmp_path)
    registry.load()
    return BrokerServicer(registry=registry, log_manager=FakeLogManager(),
                          purgatory=FetchPurgatory(max_waiters=4),
                          node=NodeAddress(0, "127.0.0.1", 1234), cluster_id="c1")


class FakeContext:
    def __init__(self):
        self.callbacks = []

    def add_callback(self, callback):
        self.callbacks.append(callback)
        return True

    def abort(self, code, details):
        raise RuntimeError(f"aborted {code}: {details}")


def create(servicer, name, partitions=1, **configs):
    response = servicer.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
        broker_pb2.NewTopic(name=name, num_partitions=partitions, configs=configs)]), FakeContext())
    return response.topics[0]


def produce(servicer, topic, partition, records, acks=-1):
    return servicer.Produce(broker_pb2.ProduceRequest(acks=acks, partitions=[
        broker_pb2.PartitionRecords(topic=topic, partition=partition, records=records)]), FakeContext())


def test_unexpected_failure_is_confined_to_its_partition(servicer):
    assert create(servicer, "t", 2).error_code == ErrorCode.NONE
    servicer._log_manager.get_log("t", 0).fail_with = ZeroDivisionError("boom")
    response = servicer.Produce(broker_pb2.ProduceRequest(acks=1, partitions=[
        broker_pb2.PartitionRecords(topic="t", partition=0, records=one_record_batch(b"x")),
        broker_pb2.PartitionRecords(topic="t", partition=1, records=one_record_batch(b"y")),
        broker_pb2.PartitionRecords(topic="t", partition=7, records=one_record_batch(b"z")),
        broker_pb2.PartitionRecords(topic="nope", partition=0, records=one_record_batch(b"z")),
    ]), FakeContext())
    codes = [p.error_code for p in response.partitions]
    assert codes == [ErrorCode.UNKNOWN_SERVER_ERROR, ErrorCode.NONE,
                     ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert "ZeroDivisionError" in response.partitions[0].error_message
    assert "0..1" in response.partitions[2].error_message


def test_bad_acks_refuse_every_partition(servicer):
    create(servicer, "t")
    response = produce(servicer, "t", 0, one_record_batch(b"x"), acks=2)
    assert response.partitions[0].error_code == ErrorCode.INVALID_REQUIRED_ACKS
    assert servicer._log_manager.get_log("t", 0).log_end_offset == 0


def test_acks_all_needs_min_insync_replicas_of_one(servicer):
    create(servicer, "strict", **{"min.insync.replicas": "2"})
    assert produce(servicer, "strict", 0, one_record_batch(b"x"), acks=-1).partitions[0].error_code \
        == ErrorCode.NOT_ENOUGH_REPLICAS
    assert produce(servicer, "strict", 0, one_record_batch(b"x"), acks=1).partitions[0].error_code \
        == ErrorCode.NONE
    assert servicer._log_manager.get_log("strict", 0).log_end_offset == 1


def test_first_batch_always_fits_and_budget_is_shared(servicer):
    create(servicer, "t", 2)
    big = one_record_batch(b"v" * 500)
    for partition in (0, 1):
        produce(servicer, "t", partition, big)
    response = servicer.Fetch(broker_pb2.FetchRequest(max_bytes=100, partitions=[
        broker_pb2.FetchPartition(topic="t", partition=p, fetch_offset=0, partition_max_bytes=100)
        for p in (0, 1)]), FakeContext())
    assert len(response.partitions[0].records) == len(big)   # larger than both limits, still sent
    assert response.partitions[1].records == b""             # the budget is spent
    assert response.partitions[1].high_watermark == 1


def test_fetch_out_of_range_reports_the_bounds(servicer):
    create(servicer, "t")
    produce(servicer, "t", 0, one_record_batch(b"x"))
    [result] = servicer.Fetch(broker_pb2.FetchRequest(partitions=[
        broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=5)]), FakeContext()).partitions
    assert result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (result.log_start_offset, result.high_watermark) == (0, 1)


def test_long_poll_returns_data_appended_while_waiting(servicer):
    create(servicer, "t")
    responses = []
    request = broker_pb2.FetchRequest(max_wait_ms=30000, min_bytes=1, partitions=[
        broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=0)])
    fetcher = threading.Thread(target=lambda: responses.append(servicer.Fetch(request, FakeContext())))
    fetcher.start()
    wait_for(lambda: servicer._purgatory.waiter_count > 0, "the fetch to park", timeout_s=10)
    produce(servicer, "t", 0, one_record_batch(b"late"))
    fetcher.join(20)
    assert not fetcher.is_alive()
    assert b"late" in responses[0].partitions[0].records
    assert servicer._purgatory.waiter_count == 0


def test_fetch_bound_and_offsets_come_from_the_snapshot_it_reads(servicer):
    """The read is bounded inside the log by the same snapshot that gives the records and
    the offsets answered: a high watermark read from the log beforehand may be older."""
    create(servicer, "t")
    produce(servicer, "t", 0, one_record_batch(b"x"))
    log = servicer._log_manager.get_log("t", 0)
    calls = []

    def read_from_a_later_snapshot(fetch_offset, max_bytes, **kwargs):
        calls.append(kwargs)
        return FakeFetchData(log.batches[0][1], 0, high_watermark=7, log_start_offset=0, last_stable_offset=6)

    log.read = read_from_a_later_snapshot
    [result] = servicer.Fetch(broker_pb2.FetchRequest(partitions=[
        broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=0)]), FakeContext()).partitions
    assert [kwargs.get("max_offset_exclusive") for kwargs in calls] == [None]
    assert (result.high_watermark, result.last_stable_offset) == (7, 6)


def test_long_poll_that_times_out_reads_each_partition_once(servicer):
    """Nothing moved while it waited: the first read is the answer, not read again."""
    create(servicer, "t", 2)
    reads = []
    for partition in (0, 1):
        log = servicer._log_manager.get_log("t", partition)
        log.read = (lambda original, partition: lambda *a, **k: reads.append(partition) or original(*a, **k))(
            log.read, partition)
    response = servicer.Fetch(broker_pb2.FetchRequest(max_wait_ms=20, min_bytes=1, partitions=[
        broker_pb2.FetchPartition(topic="t", partition=p, fetch_offset=0) for p in (0, 1)]), FakeContext())
    assert [p.records for p in response.partitions] == [b"", b""]
    assert sorted(reads) == [0, 1]
    assert servicer._purgatory.waiter_count == 0


def test_long_poll_is_cancelled_with_its_rpc(servicer):
    create(servicer, "t")
    context = FakeContext()
    responses = []
    request = broker_pb2.FetchRequest(max_wait_ms=30000, min_bytes=1, partitions=[
        broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=0)])
    fetcher = threading.Thread(target=lambda: responses.append(servicer.Fetch(request, context)))
    fetcher.start()
    wait_for(lambda: context.callbacks, "the fetch to register its cancel callback", timeout_s=10)
    for callback in context.callbacks:
        callback()
    fetcher.join(20)
    assert not fetcher.is_alive() and responses[0].partitions[0].records == b""


def test_shutdown_wakes_long_polls_and_refuses_new_requests(servicer):
    create(servicer, "t")
    request = broker_pb2.FetchRequest(max_wait_ms=30000, min_bytes=1, partitions=[
        broker_pb2.FetchPartition(topic="t", partition=0, fetch_offset=0)])
    fetcher = threading.Thread(target=lambda: servicer.Fetch(request, FakeContext()))
    fetcher.start()
    wait_for(lambda: servicer._purgatory.waiter_count > 0, "the fetch to park", timeout_s=10)
    assert servicer.close_and_drain(20)
    fetcher.join(20)
    assert not fetcher.is_alive()
    with pytest.raises(RuntimeError, match="shutting down"):
        servicer.Metadata(broker_pb2.MetadataRequest(), FakeContext())


def test_admin_rpcs(servicer):
    assert create(servicer, "a.b", 3).error_code == ErrorCode.NONE
    assert create(servicer, "a.b").error_code == ErrorCode.TOPIC_ALREADY_EXISTS
    assert create(servicer, "a_b").error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert create(servicer, "bad name").error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    assert create(servicer, "c", **{"retention.ms": "x"}).error_code == ErrorCode.INVALID_CONFIG
    twice = servicer.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
        broker_pb2.NewTopic(name="d"), broker_pb2.NewTopic(name="d")]), FakeContext())
    assert [t.error_code for t in twice.topics] == [ErrorCode.INVALID_REQUEST] * 2
    assert servicer._registry.get("d") is None
    validate = servicer.CreateTopics(broker_pb2.CreateTopicsRequest(
        validate_only=True, topics=[broker_pb2.NewTopic(name="e")]), FakeContext())
    assert validate.topics[0].error_code == ErrorCode.NONE and servicer._registry.get("e") is None

    grow = servicer.CreatePartitions(broker_pb2.CreatePartitionsRequest(topics=[
        broker_pb2.NewPartitions(name="a.b", count=5), broker_pb2.NewPartitions(name="c", count=5)]),
        FakeContext())
    assert [t.error_code for t in grow.topics] == [ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert servicer._log_manager.get_log("a.b", 4) is not None
    shrink = servicer.CreatePartitions(broker_pb2.CreatePartitionsRequest(topics=[
        broker_pb2.NewPartitions(name="a.b", count=2)]), FakeContext())
    assert shrink.topics[0].error_code == ErrorCode.INVALID_PARTITIONS

    metadata = servicer.Metadata(broker_pb2.MetadataRequest(topics=["a.b", "zz", "bad name"]), FakeContext())
    assert [t.error_code for t in metadata.topics] == [
        ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_TOPIC_EXCEPTION]
    assert [p.partition for p in metadata.topics[0].partitions] == [0, 1, 2, 3, 4]
    assert metadata.brokers[0].port == 1234 and metadata.cluster_id == "c1"

    deleted = servicer.DeleteTopics(broker_pb2.DeleteTopicsRequest(names=["a.b", "a.b", "__transaction_state"]),
                                    FakeContext())
    assert [t.error_code for t in deleted.topics] == [
        ErrorCode.NONE, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_REQUEST]
    assert servicer._log_manager.logs == {}


def test_the_in_process_stub_runs_the_handlers_and_fails_as_a_grpc_call_does(servicer):
    """The embedded transaction coordinator's stub: the same handler answers, and a broker
    shutting down is a grpc.RpcError UNAVAILABLE, as a remote call would raise."""
    import grpc

    from broker.in_process import InProcessBrokerStub

    stub = InProcessBrokerStub(servicer)
    create(servicer, "t")
    answer = stub.Produce(broker_pb2.ProduceRequest(acks=-1, partitions=[
        broker_pb2.PartitionRecords(topic="t", partition=0, records=one_record_batch(b"x"))]), timeout=5)
    assert answer.partitions[0].error_code == ErrorCode.NONE
    assert servicer._log_manager.get_log("t", 0).log_end_offset == 1
    with pytest.raises(AttributeError, match="ProduceStream"):
        stub.ProduceStream
    assert servicer.close_and_drain(5)
    with pytest.raises(grpc.RpcError) as refused:
        stub.Metadata(broker_pb2.MetadataRequest())
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE and "shutting down" in refused.value.details()
