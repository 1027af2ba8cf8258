"""BrokerServicer's transaction paths over real partition logs (a temp dir, no sockets): the
verification of transactional writes with a fake coordinator, markers and the group
coordinator hook, read_committed fetches and ListOffsets, DescribeProducers."""
from __future__ import annotations

import pytest

from broker.purgatory import FetchPurgatory
from broker.service import BrokerServicer, NodeAddress
from broker.storage.log_manager import LogManager
from broker.topics import TopicRegistry
from eos.errors import ErrorCode
from eos.records.codec import encode_batch, iter_decoded
from eos.types import TopicPartition
from eos.v1 import broker_pb2, common_pb2

PID, EPOCH = 1000, 0
LATEST = -1


class FakeContext:
    def add_callback(self, callback):
        return True

    def abort(self, code, details):
        raise RuntimeError(f"aborted {code}: {details}")


class FakeCoordinator:
    """verify_txn: a partition is confirmed when it is registered for (pid, epoch)."""

    def __init__(self):
        self.registered: set[TopicPartition] = set()
        self.epoch = EPOCH
        self.calls: list[tuple[str, int, int, list[TopicPartition]]] = []
        self.unavailable = False

    def verify(self, transactional_id, producer_id, producer_epoch, partitions):
        self.calls.append((transactional_id, producer_id, producer_epoch, list(partitions)))
        if self.unavailable:
            return {tp: (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, "loading") for tp in partitions}
        if producer_epoch != self.epoch:
            return {tp: (ErrorCode.PRODUCER_FENCED, "fenced") for tp in partitions}
        return {tp: (ErrorCode.NONE if tp in self.registered else ErrorCode.INVALID_TXN_STATE, "")
                for tp in partitions}


@pytest.fixture
def coordinator():
    return FakeCoordinator()


@pytest.fixture
def marker_calls():
    return []


@pytest.fixture
def servicer(tmp_path, coordinator, marker_calls):
    registry = TopicRegistry(tmp_path / "data")
    registry.load()
    log_manager = LogManager(str(tmp_path / "data"))
    log_manager.load({})
    servicer = BrokerServicer(registry=registry, log_manager=log_manager, purgatory=FetchPurgatory(max_waiters=4),
                              node=NodeAddress(0, "127.0.0.1", 1234), cluster_id="c1",
                              verify_txn=coordinator.verify,
                              on_offsets_txn_marker=lambda *args: marker_calls.append(args))
    yield servicer
    log_manager.shutdown()


def create(servicer, name, partitions=1):
    [result] = servicer.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
        broker_pb2.NewTopic(name=name, num_partitions=partitions)]), FakeContext()).topics
    assert result.error_code == ErrorCode.NONE, result.error_message


def txn_batch(values, sequence=0, pid=PID, epoch=EPOCH):
    return encode_batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=sequence, transactional=True)


def produce(servicer, parts, transactional_id="tx"):
    """parts: [(topic, partition, records)] -> [(error code, message, base offset)]"""
    response = servicer.Produce(broker_pb2.ProduceRequest(acks=-1, transactional_id=transactional_id, partitions=[
        broker_pb2.PartitionRecords(topic=t, partition=p, records=r) for t, p, r in parts]), FakeContext())
    return [(r.error_code, r.error_message, r.base_offset) for r in response.partitions]


def markers(servicer, committed, partitions, pid=PID, epoch=EPOCH + 1, coordinator_epoch=0):
    response = servicer.WriteTxnMarkers(broker_pb2.WriteTxnMarkersRequest(markers=[broker_pb2.TxnMarker(
        producer_id=pid, producer_epoch=epoch, committed=committed, coordinator_epoch=coordinator_epoch,
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions])]), FakeContext())
    [result] = response.markers
    return [(r.error_code, r.error_message) for r in result.partitions]


def fetch(servicer, topic, partition, offset=0, committed=True):
    [result] = servicer.Fetch(broker_pb2.FetchRequest(
        isolation_level=common_pb2.READ_COMMITTED if committed else common_pb2.READ_UNCOMMITTED,
        partitions=[broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]),
        FakeContext()).partitions
    assert result.error_code == ErrorCode.NONE, result.error_message
    return result


def list_latest(servicer, topic, partition, committed):
    [result] = servicer.ListOffsets(broker_pb2.ListOffsetsRequest(
        isolation_level=common_pb2.READ_COMMITTED if committed else common_pb2.READ_UNCOMMITTED,
        partitions=[broker_pb2.ListOffsetsPartition(topic=topic, partition=partition, timestamp=LATEST)]),
        FakeContext()).partitions
    assert result.error_code == ErrorCode.NONE, result.error_message
    return result.offset


def values(records, topic="t", partition=0):
    return [r.value for r in iter_decoded(records, topic, partition)]


def end_offset(servicer, topic, partition):
    return servicer._log_manager.get_log(topic, partition).log_end_offset


def test_unregistered_partition_is_refused_and_nothing_appended(servicer, coordinator):
    create(servicer, "t", 2)
    coordinator.registered = {TopicPartition("t", 0)}
    (ok, _, offset), (refused, message, _) = produce(servicer, [("t", 0, txn_batch([b"a"])),
                                                               ("t", 1, txn_batch([b"b"]))])
    assert (ok, offset, refused) == (ErrorCode.NONE, 0, ErrorCode.INVALID_TXN_STATE)
    assert "t-1" in message and "'tx'" in message
    assert end_offset(servicer, "t", 1) == 0
    assert coordinator.calls == [("tx", PID, EPOCH, [TopicPartition("t", 0), TopicPartition("t", 1)])]


def test_open_transaction_skips_the_coordinator(servicer, coordinator):
    create(servicer, "t")
    coordinator.registered = {TopicPartition("t", 0)}
    assert produce(servicer, [("t", 0, txn_batch([b"a"]))])[0][0] == ErrorCode.NONE
    coordinator.registered = set()   # would refuse now: it is not asked again
    assert produce(servicer, [("t", 0, txn_batch([b"b"], sequence=1))])[0][0] == ErrorCode.NONE
    assert len(coordinator.calls) == 1


def test_coordinator_errors_pass_through_or_become_retriable(servicer, coordinator):
    create(servicer, "t")
    coordinator.registered = {TopicPartition("t", 0)}
    coordinator.epoch = 3
    [(code, message, _)] = produce(servicer, [("t", 0, txn_batch([b"a"]))])
    assert code == ErrorCode.PRODUCER_FENCED and "fenced" in message
    coordinator.unavailable = True
    [(code, message, _)] = produce(servicer, [("t", 0, txn_batch([b"a"], epoch=3))])
    assert code == ErrorCode.NOT_ENOUGH_REPLICAS and "COORDINATOR_LOAD_IN_PROGRESS" in message
    assert end_offset(servicer, "t", 0) == 0


def test_coordinator_that_raises_refuses_retriably(servicer, coordinator):
    create(servicer, "t")

    def broken(*args):
        raise ConnectionError("down")

    servicer._verify_txn = broken
    [(code, message, _)] = produce(servicer, [("t", 0, txn_batch([b"a"]))])
    assert code == ErrorCode.NOT_ENOUGH_REPLICAS and "down" in message
    assert end_offset(servicer, "t", 0) == 0


def test_whole_request_refusals(servicer, coordinator):
    create(servicer, "t", 2)
    coordinator.registered = {TopicPartition("t", 0), TopicPartition("t", 1)}
    plain = encode_batch([b"plain"])
    no_id = produce(servicer, [("t", 0, plain), ("t", 1, txn_batch([b"a"]))], transactional_id="")
    assert [code for code, _, _ in no_id] == [ErrorCode.INVALID_REQUEST] * 2
    assert "transactional_id" in no_id[0][1]
    two = produce(servicer, [("t", 0, txn_batch([b"a"])), ("t", 1, txn_batch([b"b"], pid=PID + 1))])
    assert [code for code, _, _ in two] == [ErrorCode.INVALID_PRODUCER_ID_MAPPING] * 2
    assert end_offset(servicer, "t", 0) == end_offset(servicer, "t", 1) == 0
    assert coordinator.calls == []
    # plain batches need no transactional id and are never verified
    assert produce(servicer, [("t", 0, plain)], transactional_id="")[0][0] == ErrorCode.NONE


def test_read_committed_stops_at_the_lso_until_the_commit(servicer, coordinator, marker_calls):
    create(servicer, "t")
    coordinator.registered = {TopicPartition("t", 0)}
    plain = encode_batch([b"before"])
    assert produce(servicer, [("t", 0, plain)])[0][0] == ErrorCode.NONE
    assert produce(servicer, [("t", 0, txn_batch([b"x", b"y"]))])[0][0] == ErrorCode.NONE
    committed = fetch(servicer, "t", 0)
    assert (committed.last_stable_offset, committed.high_watermark) == (1, 3)
    assert values(committed.records) == [b"before"]
    uncommitted = fetch(servicer, "t", 0, committed=False)
    assert values(uncommitted.records) == [b"before", b"x", b"y"] and uncommitted.last_stable_offset == 1
    assert (list_latest(servicer, "t", 0, True), list_latest(servicer, "t", 0, False)) == (1, 3)

    assert markers(servicer, True, [("t", 0)]) == [(ErrorCode.NONE, "")]
    after = fetch(servicer, "t", 0)
    assert after.last_stable_offset == after.high_watermark == 4
    assert values(after.records) == [b"before", b"x", b"y"] and not after.aborted_transactions
    assert list_latest(servicer, "t", 0, True) == 4
    assert marker_calls == []   # not a __consumer_offsets partition


def test_abort_lists_the_aborted_transaction(servicer, coordinator):
    create(servicer, "t")
    coordinator.registered = {TopicPartition("t", 0)}
    produce(servicer, [("t", 0, txn_batch([b"gone"]))])
    assert markers(servicer, False, [("t", 0)]) == [(ErrorCode.NONE, "")]
    result = fetch(servicer, "t", 0)
    assert values(result.records) == [b"gone"]   # the consumer drops it
    assert [(a.producer_id, a.first_offset) for a in result.aborted_transactions] == [(PID, 0)]
    assert not fetch(servicer, "t", 0, committed=False).aborted_transactions


def test_marker_errors_are_per_partition(servicer, coordinator):
    create(servicer, "t")
    coordinator.registered = {TopicPartition("t", 0)}
    produce(servicer, [("t", 0, txn_batch([b"a"]))])
    results = markers(servicer, True, [("t", 0), ("t", 5), ("nope", 0)], epoch=EPOCH)
    assert [code for code, _ in results] == [ErrorCode.INVALID_PRODUCER_EPOCH,
                                             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                             ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
    assert end_offset(servicer, "t", 0) == 1
    assert markers(servicer, True, [("t", 0)], coordinator_epoch=2) == [(ErrorCode.NONE, "")]
    # a zombie coordinator (older coordinator epoch) is fenced
    [(code, _)] = markers(servicer, False, [("t", 0)], epoch=EPOCH + 2, coordinator_epoch=1)
    assert code == ErrorCode.TRANSACTION_COORDINATOR_FENCED


def test_offsets_markers_reach_the_group_coordinator(servicer, coordinator, marker_calls):
    create(servicer, "__consumer_offsets", 3)
    assert markers(servicer, True, [("__consumer_offsets", 2)]) == [(ErrorCode.NONE, "")]
    assert marker_calls == [(2, PID, True)]
    # a refused marker does not reach it
    markers(servicer, False, [("__consumer_offsets", 2)], epoch=EPOCH)
    assert marker_calls == [(2, PID, True)]

    def failing(*args):
        raise RuntimeError("not loaded")

    servicer._on_offsets_txn_marker = failing
    [(code, message)] = markers(servicer, False, [("__consumer_offsets", 1)])
    assert code == ErrorCode.UNKNOWN_SERVER_ERROR and "not loaded" in message


def test_describe_producers(servicer, coordinator):
    create(servicer, "t")
    coordinator.registered = {TopicPartition("t", 0)}
    produce(servicer, [("t", 0, encode_batch([b"p"]))])
    produce(servicer, [("t", 0, txn_batch([b"a", b"b"]))])
    [result] = servicer.DescribeProducers(broker_pb2.DescribeProducersRequest(partitions=[
        common_pb2.TopicPartition(topic="t", partition=0)]), FakeContext()).partitions
    [producer] = result.producers
    assert (producer.producer_id, producer.producer_epoch, producer.last_sequence,
            producer.current_txn_start_offset) == (PID, EPOCH, 1, 1)
    markers(servicer, True, [("t", 0)], coordinator_epoch=4)
    result, missing = servicer.DescribeProducers(broker_pb2.DescribeProducersRequest(partitions=[
        common_pb2.TopicPartition(topic="t", partition=0),
        common_pb2.TopicPartition(topic="t", partition=1)]), FakeContext()).partitions
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    [producer] = result.producers
    assert (producer.producer_epoch, producer.coordinator_epoch, producer.current_txn_start_offset) == (
        EPOCH + 1, 4, -1)
