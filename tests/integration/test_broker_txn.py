"""Transactions through a real broker over raw gRPC: the TxnCoordinator RPCs drive them,
transactional batches are produced by hand, and the Broker's side is checked: read_committed
fetches stop at the last stable offset and carry the aborted transactions, ListOffsets
latest answers the LSO, unregistered and fenced writes are refused with nothing appended, a
commit survives kill -9 right after EndTxn, and a transaction open past its timeout is
aborted so the LSO moves on.

Markers are written asynchronously after EndTxn returns (as in Kafka), so a test that needs
them waits for the LSO with long-poll fetches, bounded by a deadline."""
from __future__ import annotations

import threading
import time

import pytest

from eos.errors import ErrorCode, Reaction, reaction_for
from eos.records.codec import CONTROL_TYPE_ABORT, decode_control_record, decode_records, encode_batch
from eos.records.header import iter_headers
from eos.types import TopicPartition
from eos.v1 import broker_pb2, common_pb2, txn_pb2
from tests.waits import wait_for

WAIT_S = 30.0
FENCED = {ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH}


# ---- a hand-driven transactional producer ----------------------------------------------------

class TxnProducer:
    """The client side of KIP-98/KIP-890 by hand: InitProducerId, AddPartitionsToTxn, produce
    transactional batches with sequences, EndTxn (which hands back the bumped epoch)."""

    def __init__(self, handle, transactional_id: str, timeout_ms: int = 60000):
        self.broker = handle.broker_stub()
        self.txn = handle.txn_stub()
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id = self.epoch = -1
        self.sequences: dict[tuple[str, int], int] = {}

    def init(self) -> "TxnProducer":
        response = _retry(lambda: self.txn.InitProducerId(txn_pb2.InitProducerIdRequest(
            transactional_id=self.transactional_id, transaction_timeout_ms=self.timeout_ms,
            producer_id=-1, producer_epoch=-1), timeout=30))
        assert response.error_code == ErrorCode.NONE, response.error_message
        self.producer_id, self.epoch = response.producer_id, response.producer_epoch
        self.sequences.clear()
        return self

    def add(self, *partitions: tuple[str, int]) -> None:
        response = _retry(lambda: self.txn.AddPartitionsToTxn(txn_pb2.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.epoch,
            partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in partitions]), timeout=30))
        assert response.error_code == ErrorCode.NONE, response.error_message
        assert all(p.error_code == ErrorCode.NONE for p in response.partitions), response

    def send(self, topic: str, partition: int, values: list[bytes], *, transactional_id: str | None = None,
             add: bool = False):
        """Produce one transactional batch; returns the partition result (sequence advanced
        on success). `add`: the broker adds the partition to the transaction (KIP-890 part 2)."""
        sequence = self.sequences.get((topic, partition), 0)
        batch = encode_batch(values, producer_id=self.producer_id, producer_epoch=self.epoch,
                             base_sequence=sequence, transactional=True)
        [result] = self.broker.Produce(broker_pb2.ProduceRequest(
            transactional_id=self.transactional_id if transactional_id is None else transactional_id, acks=-1,
            partitions=[broker_pb2.PartitionRecords(topic=topic, partition=partition, records=batch)],
            add_partitions_to_txn=add), timeout=30).partitions
        if result.error_code == ErrorCode.NONE:
            self.sequences[(topic, partition)] = sequence + len(values)
        return result

    def end(self, commit: bool):
        response = _retry(lambda: self.txn.EndTxn(txn_pb2.EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.epoch,
            committed=commit), timeout=30))
        if response.error_code == ErrorCode.NONE:
            # KIP-890: the next transaction runs at the bumped epoch, sequences from 0
            self.producer_id, self.epoch = response.producer_id, response.producer_epoch
            self.sequences.clear()
        return response


def _retry(call):
    """Call until the answer is not a retriable error (coordinator loading, a transaction
    completing), bounded by WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        response = call()
        if response.error_code == ErrorCode.NONE or reaction_for(response.error_code) is not Reaction.RETRY:
            return response
        assert time.monotonic() < deadline, f"still {ErrorCode(response.error_code).name} after {WAIT_S} s"
        time.sleep(0.05)   # a retry backoff, as a client's


# ---- reading ---------------------------------------------------------------------------------

def create_topic(stub, name, partitions=1):
    [result] = stub.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
        broker_pb2.NewTopic(name=name, num_partitions=partitions)]), timeout=30).topics
    assert result.error_code == ErrorCode.NONE, result.error_message


def produce_plain(stub, topic, partition, values):
    [result] = stub.Produce(broker_pb2.ProduceRequest(acks=-1, partitions=[
        broker_pb2.PartitionRecords(topic=topic, partition=partition, records=encode_batch(values))]),
        timeout=30).partitions
    assert result.error_code == ErrorCode.NONE, result.error_message


def fetch(stub, topic, partition, offset=0, *, committed=True, min_bytes=0, max_wait_ms=0):
    [result] = stub.Fetch(broker_pb2.FetchRequest(
        isolation_level=common_pb2.READ_COMMITTED if committed else common_pb2.READ_UNCOMMITTED,
        min_bytes=min_bytes, max_wait_ms=max_wait_ms,
        partitions=[broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset)]),
        timeout=60).partitions
    assert result.error_code == ErrorCode.NONE, result.error_message
    return result


def read(stub, topic, partition, *, committed=True) -> list[bytes]:
    """Every value a consumer at this isolation level sees, from offset 0 to the LSO (or
    high watermark), dropping aborted batches as Kafka's consumer does and never markers."""
    values, offset = [], 0
    while True:
        result = fetch(stub, topic, partition, offset, committed=committed)
        upper = result.last_stable_offset if committed else result.high_watermark
        if not result.records:
            assert offset >= upper, f"nothing returned at {offset} below {upper}"
            return values
        pending = sorted((a.first_offset, a.producer_id) for a in result.aborted_transactions)
        aborted_producers: set[int] = set()
        buf = result.records
        for header in iter_headers(buf):
            while pending and pending[0][0] <= header.last_offset:
                aborted_producers.add(pending.pop(0)[1])
            if header.is_control:
                marker_type, _ = decode_control_record(buf, header)
                if marker_type == CONTROL_TYPE_ABORT:
                    aborted_producers.discard(header.producer_id)
            elif not (header.is_transactional and header.producer_id in aborted_producers):
                values += [r.value for r in decode_records(buf, header, topic, partition) if r.offset >= offset]
            offset = header.next_offset
        if offset >= upper:
            return values


def latest_offset(stub, topic, partition, *, committed):
    [result] = stub.ListOffsets(broker_pb2.ListOffsetsRequest(
        isolation_level=common_pb2.READ_COMMITTED if committed else common_pb2.READ_UNCOMMITTED,
        partitions=[broker_pb2.ListOffsetsPartition(topic=topic, partition=partition, timestamp=-1)]),
        timeout=30).partitions
    assert result.error_code == ErrorCode.NONE, result.error_message
    return result.offset


def wait_until_stable(stub, topic, partition, timeout_s=WAIT_S):
    """Wait until nothing is open in the partition (LSO == high watermark): long-poll
    read_committed fetches at the current LSO, which the broker wakes when a marker moves it."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = fetch(stub, topic, partition, 0)
        if result.last_stable_offset == result.high_watermark:
            return result
        remaining_ms = int((deadline - time.monotonic()) * 1000)
        assert remaining_ms > 0, (f"{topic}-{partition}: LSO {result.last_stable_offset} still below the high "
                                  f"watermark {result.high_watermark} after {timeout_s} s")
        fetch(stub, topic, partition, result.last_stable_offset, min_bytes=1, max_wait_ms=min(remaining_ms, 2000))


def describe_producers(stub, topic, partition):
    [result] = stub.DescribeProducers(broker_pb2.DescribeProducersRequest(partitions=[
        common_pb2.TopicPartition(topic=topic, partition=partition)]), timeout=30).partitions
    assert result.error_code == ErrorCode.NONE, result.error_message
    return {p.producer_id: p for p in result.producers}


def high_watermark(stub, topic, partition):
    return fetch(stub, topic, partition, 0, committed=False).high_watermark


# ---- tests -----------------------------------------------------------------------------------

def test_commit_becomes_visible_at_the_lso(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t", 2)
    produce_plain(stub, "t", 0, [b"before"])
    producer = TxnProducer(inprocess_broker, "tx-commit").init()
    producer.add(("t", 0), ("t", 1))
    assert producer.send("t", 0, [b"a", b"b"]).error_code == ErrorCode.NONE
    assert producer.send("t", 1, [b"c"]).error_code == ErrorCode.NONE

    open_view = fetch(stub, "t", 0)
    assert (open_view.last_stable_offset, open_view.high_watermark) == (1, 3)
    assert read(stub, "t", 0) == [b"before"]
    assert read(stub, "t", 0, committed=False) == [b"before", b"a", b"b"]
    assert fetch(stub, "t", 0, committed=False).last_stable_offset == 1   # always reported
    assert (latest_offset(stub, "t", 0, committed=True), latest_offset(stub, "t", 0, committed=False)) == (1, 3)
    assert describe_producers(stub, "t", 0)[producer.producer_id].current_txn_start_offset == 1

    # a read_committed long poll parked at the LSO is woken by the COMMIT marker
    woken = []
    poller = threading.Thread(target=lambda: woken.append(
        fetch(stub, "t", 1, 0, min_bytes=1, max_wait_ms=int(WAIT_S * 1000))))
    poller.start()
    wait_for(lambda: inprocess_broker.server.fetch_waiter_count > 0, "the read_committed fetch to park",
             timeout_s=WAIT_S)
    epoch = producer.epoch
    assert producer.end(commit=True).error_code == ErrorCode.NONE
    assert producer.epoch == epoch + 1
    poller.join(WAIT_S)
    assert not poller.is_alive()
    assert [r.value for r in _values_of(woken[0], "t", 1)] == [b"c"]

    wait_until_stable(stub, "t", 0)
    assert read(stub, "t", 0) == [b"before", b"a", b"b"]
    assert read(stub, "t", 1) == [b"c"]
    end = high_watermark(stub, "t", 0)
    assert end == 4 and latest_offset(stub, "t", 0, committed=True) == end   # the marker took offset 3
    state = describe_producers(stub, "t", 0)[producer.producer_id]
    assert (state.producer_epoch, state.current_txn_start_offset) == (epoch + 1, -1)


def _values_of(result, topic, partition):
    return [r for h in iter_headers(result.records) if not h.is_control
            for r in decode_records(result.records, h, topic, partition)]


def test_aborted_data_is_listed_and_hidden_from_read_committed(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t")
    producer = TxnProducer(inprocess_broker, "tx-abort").init()
    producer.add(("t", 0))
    producer.send("t", 0, [b"x1", b"x2"])
    assert producer.end(commit=False).error_code == ErrorCode.NONE
    stable = wait_until_stable(stub, "t", 0)
    assert [(a.producer_id, a.first_offset) for a in stable.aborted_transactions] == [(producer.producer_id, 0)]
    assert not fetch(stub, "t", 0, committed=False).aborted_transactions
    assert read(stub, "t", 0) == []
    assert read(stub, "t", 0, committed=False) == [b"x1", b"x2"]   # data records, never the marker

    producer.add(("t", 0))   # the next transaction, at the bumped epoch
    assert producer.send("t", 0, [b"y"]).error_code == ErrorCode.NONE
    assert producer.end(commit=True).error_code == ErrorCode.NONE
    wait_until_stable(stub, "t", 0)
    assert read(stub, "t", 0) == [b"y"]
    assert read(stub, "t", 0, committed=False) == [b"x1", b"x2", b"y"]


def test_unregistered_and_late_writes_are_refused(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t", 2)
    producer = TxnProducer(inprocess_broker, "tx-late").init()
    producer.add(("t", 0))
    refused = producer.send("t", 1, [b"stray"])
    assert refused.error_code == ErrorCode.INVALID_TXN_STATE and "t-1" in refused.error_message
    assert high_watermark(stub, "t", 1) == 0
    no_id = producer.send("t", 0, [b"anonymous"], transactional_id="")
    assert no_id.error_code == ErrorCode.INVALID_REQUEST
    assert producer.send("t", 0, [b"ok"]).error_code == ErrorCode.NONE
    old_epoch, old_sequences = producer.epoch, dict(producer.sequences)
    assert producer.end(commit=True).error_code == ErrorCode.NONE
    wait_until_stable(stub, "t", 0)
    ends = (high_watermark(stub, "t", 0), high_watermark(stub, "t", 1))

    # Late writes from the finished transaction: neither may open a transaction.
    producer.epoch, producer.sequences = old_epoch, old_sequences
    for partition in (0, 1):
        late = producer.send("t", partition, [b"late"])
        assert late.error_code in FENCED, (partition, late)
    assert (high_watermark(stub, "t", 0), high_watermark(stub, "t", 1)) == ends
    for partition in (0, 1):
        assert fetch(stub, "t", partition).last_stable_offset == ends[partition]
        assert all(p.current_txn_start_offset == -1 for p in describe_producers(stub, "t", partition).values())
    assert read(stub, "t", 0) == [b"ok"] and read(stub, "t", 1) == []


def txn_partitions(handle, transactional_id: str) -> tuple[str, set[tuple[str, int]]]:
    """(state, partitions) of the id as DescribeTransactions gives them."""
    [described] = handle.txn_stub().DescribeTransactions(txn_pb2.DescribeTransactionsRequest(
        transactional_ids=[transactional_id]), timeout=30).transactions
    return described.state, {(p.topic, p.partition) for p in described.partitions}


def test_a_produce_that_asks_adds_its_partition_and_a_fenced_one_adds_nothing(inprocess_broker):
    """KIP-890 part 2: with add_partitions_to_txn the broker registers the partition with the
    coordinator itself (no AddPartitionsToTxn), the transaction commits and its records are
    visible; a late write of the finished transaction asking the same is refused, appends
    nothing and opens no transaction."""
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t", 2)
    producer = TxnProducer(inprocess_broker, "tx-v2").init()
    assert producer.send("t", 0, [b"a", b"b"], add=True).error_code == ErrorCode.NONE
    assert producer.send("t", 0, [b"c"], add=True).error_code == ErrorCode.NONE   # already open there
    assert producer.send("t", 1, [b"d"], add=True).error_code == ErrorCode.NONE
    assert txn_partitions(inprocess_broker, "tx-v2") == ("Ongoing", {("t", 0), ("t", 1)})
    old_epoch, old_sequences = producer.epoch, dict(producer.sequences)
    assert producer.end(commit=True).error_code == ErrorCode.NONE
    wait_until_stable(stub, "t", 0)
    wait_until_stable(stub, "t", 1)
    assert read(stub, "t", 0) == [b"a", b"b", b"c"] and read(stub, "t", 1) == [b"d"]
    wait_for(lambda: txn_partitions(inprocess_broker, "tx-v2")[0] == "CompleteCommit", "CompleteCommit")

    ends = (high_watermark(stub, "t", 0), high_watermark(stub, "t", 1))
    producer.epoch, producer.sequences = old_epoch, old_sequences
    for partition in (0, 1):
        late = producer.send("t", partition, [b"late"], add=True)
        assert late.error_code in FENCED, (partition, late)
    assert (high_watermark(stub, "t", 0), high_watermark(stub, "t", 1)) == ends
    assert txn_partitions(inprocess_broker, "tx-v2") == ("CompleteCommit", set())

    # Without the flag nothing is added: the write is only verified, and refused.
    current = TxnProducer(inprocess_broker, "tx-v2").init()
    assert current.send("t", 0, [b"unregistered"]).error_code == ErrorCode.INVALID_TXN_STATE
    assert high_watermark(stub, "t", 0) == ends[0]


def test_zombie_is_fenced_and_never_visible(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t")
    zombie = TxnProducer(inprocess_broker, "tx-zombie").init()
    zombie.add(("t", 0))
    assert zombie.send("t", 0, [b"zombie-1"]).error_code == ErrorCode.NONE

    successor = TxnProducer(inprocess_broker, "tx-zombie").init()   # fences and aborts the zombie
    assert (successor.producer_id, successor.epoch) != (zombie.producer_id, zombie.epoch)
    assert zombie.send("t", 0, [b"zombie-2"]).error_code in FENCED
    assert zombie.end(commit=True).error_code in FENCED

    successor.add(("t", 0))
    assert successor.send("t", 0, [b"successor"]).error_code == ErrorCode.NONE
    assert successor.end(commit=True).error_code == ErrorCode.NONE
    wait_until_stable(stub, "t", 0)
    assert read(stub, "t", 0) == [b"successor"]
    assert read(stub, "t", 0, committed=False) == [b"zombie-1", b"successor"]
    assert zombie.send("t", 0, [b"zombie-3"]).error_code in FENCED
    assert read(stub, "t", 0, committed=False) == [b"zombie-1", b"successor"]


def test_commit_completes_after_kill_9_right_after_end_txn(broker):
    stub = broker.broker_stub()
    create_topic(stub, "t", 2)
    producer = TxnProducer(broker, "tx-crash").init()
    producer.add(("t", 0), ("t", 1))
    for i in range(5):
        for partition in (0, 1):
            assert producer.send("t", partition, [b"%d-%d" % (partition, i)]).error_code == ErrorCode.NONE
    assert producer.end(commit=True).error_code == ErrorCode.NONE
    broker.kill()   # the embedded coordinator dies with the broker, markers perhaps unsent
    broker.start()

    stub = broker.broker_stub()
    for partition in (0, 1):
        wait_until_stable(stub, "t", partition)
        assert read(stub, "t", partition) == [b"%d-%d" % (partition, i) for i in range(5)]
    deadline = time.monotonic() + WAIT_S
    while True:
        [described] = broker.txn_stub().DescribeTransactions(
            txn_pb2.DescribeTransactionsRequest(transactional_ids=["tx-crash"]), timeout=30).transactions
        if described.error_code == ErrorCode.NONE and described.state == "CompleteCommit":
            break
        assert time.monotonic() < deadline, described
        time.sleep(0.05)


def test_hanging_transaction_is_aborted_at_its_timeout(inprocess_broker_factory):
    handle = inprocess_broker_factory(config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    stub = handle.broker_stub()
    create_topic(stub, "t")
    produce_plain(stub, "t", 0, [b"plain"])
    producer = TxnProducer(handle, "tx-hang", timeout_ms=1000).init()
    producer.add(("t", 0))
    assert producer.send("t", 0, [b"never-committed"]).error_code == ErrorCode.NONE
    assert fetch(stub, "t", 0).last_stable_offset == 1

    # no EndTxn: the coordinator aborts it once transaction.timeout.ms has passed
    stable = wait_until_stable(stub, "t", 0)
    assert stable.last_stable_offset == stable.high_watermark == 3
    assert [(a.producer_id, a.first_offset) for a in stable.aborted_transactions] == [(producer.producer_id, 1)]
    assert read(stub, "t", 0) == [b"plain"]
    # the producer was fenced: it can neither commit nor write on
    assert producer.end(commit=True).error_code in FENCED
    assert producer.send("t", 0, [b"after"]).error_code in FENCED
    assert high_watermark(stub, "t", 0) == 3


# ---- the coordinator's own writes --------------------------------------------------------------

def test_the_coordinators_own_writes_take_a_produces_checks_and_land_in_its_log(inprocess_broker):
    """BrokerLink.append in the broker's process goes through append_own_records, not a
    Produce: the same checks and errors, the record in the state log, and a broker that
    stops refuses it."""
    from eos.errors import EosError, InvalidRecordError, UnknownTopicOrPartitionError
    from txn_coordinator import txn_log

    server = inprocess_broker.server
    wait_for(lambda: server.txn_coordinator.ready, "the transaction coordinator loaded")
    append_own = server._servicer.append_own_records
    state_log = server._log_manager.get_log("__transaction_state", 7)
    end_before = state_log.log_end_offset
    record = encode_batch([b"state"], keys=[txn_log.encode_key("an-id")])
    assert append_own("__transaction_state", 7, record) == end_before
    assert state_log.log_end_offset == end_before + 1
    with pytest.raises(InvalidRecordError, match="compacted"):      # a keyless record, as a Produce
        append_own("__transaction_state", 7, encode_batch([b"no key"]))
    with pytest.raises(UnknownTopicOrPartitionError):
        append_own("__transaction_state", 50, record)
    assert state_log.log_end_offset == end_before + 1
    assert server._servicer.close_and_drain(5)
    with pytest.raises(EosError) as refused:
        append_own("__transaction_state", 7, record)
    assert refused.value.code == ErrorCode.BROKER_NOT_AVAILABLE
    assert state_log.log_end_offset == end_before + 1


def test_the_coordinators_own_markers_take_write_txn_markers_checks_and_answer_per_partition(inprocess_broker):
    """BrokerLink.write_markers in the broker's process goes through write_own_markers, not
    a WriteTxnMarkers: each partition answered as that RPC answers it (written, unknown, a
    stale epoch), and a stopping broker answers BROKER_NOT_AVAILABLE for each."""
    from txn_coordinator.state import MarkerEntry

    server = inprocess_broker.server
    wait_for(lambda: server.txn_coordinator.ready, "the transaction coordinator loaded")
    create_topic(inprocess_broker.broker_stub(), "marked")
    write_own = server._servicer.write_own_markers
    marked, missing = TopicPartition("marked", 0), TopicPartition("never-created", 0)
    marked_log = server._log_manager.get_log("marked", 0)
    answers = write_own(3, [MarkerEntry(4242, 1, True, frozenset({marked, missing}))])
    assert answers[(0, marked)][0] == ErrorCode.NONE
    assert answers[(0, missing)][0] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert marked_log.log_end_offset == 1
    [header] = list(iter_headers(marked_log.read(0, 1 << 20).records))
    assert header.is_control and header.producer_id == 4242 and header.producer_epoch == 1
    stale = write_own(3, [MarkerEntry(4242, 0, False, frozenset({marked}))])
    assert stale[(0, marked)][0] == ErrorCode.INVALID_PRODUCER_EPOCH and marked_log.log_end_offset == 1
    assert server._servicer.close_and_drain(5)
    closed = write_own(3, [MarkerEntry(4242, 2, True, frozenset({marked}))])
    assert closed == {(0, marked): (ErrorCode.BROKER_NOT_AVAILABLE, "the broker is shutting down")}
    assert marked_log.log_end_offset == 1
