"""Participant transactions through a real broker (no Spark): the owner opens the
transaction, writers on "executors" (here: threads of the test) write into it as
participants, and one decision commits the owner's offsets with the accepted participants'
records while every other participant's records are aborted.

Markers are written after EndTxn returns; `read_committed` (spark_sink.readback) waits,
bounded, until no transaction is open and then reads everything back."""
from __future__ import annotations

import json
import time

import pytest

from eos.errors import EosError, ErrorCode
from eos.types import TopicPartition
from eos.v1 import common_pb2, txn_pb2
from spark_sink.owner import TransactionOwner
from spark_sink.participant import ParticipantWriter, write_arrow_batches
from spark_sink.readback import read_committed

TXN_ID = "sink-under-test"


def values_of(records) -> list[bytes]:
    return sorted(r.value for r in records)


def write(owner: TransactionOwner, topic: str, prefix: str, count: int, **kwargs) -> ParticipantWriter:
    writer = ParticipantWriter(owner.identity(), topic, **kwargs)
    keys = [f"{prefix}-k{i % 7}".encode() for i in range(count)]
    values = [f"{prefix}-{i}".encode() for i in range(count)]
    writer.write(keys, values)
    return writer


@pytest.fixture
def cluster(inprocess_broker):
    import eos

    with eos.Admin(inprocess_broker.address) as admin:
        admin.create_topic("out", partitions=3)
        admin.create_topic("in", partitions=2)
    return inprocess_broker


def test_accepted_participants_commit_with_the_offsets_and_the_rest_abort(cluster):
    owner = TransactionOwner(cluster.address, TXN_ID)
    owner.init()
    a = write(owner, "out", "a", 500)
    b = write(owner, "out", "b", 300, producer_config={"batch.size": 1024})   # many small batches
    stray = write(owner, "out", "stray", 200)               # a task attempt Spark discarded
    results = [w.close() for w in (a, b, stray)]
    assert len({r.producer_id for r in results}) == 3 and all(r.producer_id >= 0 for r in results)
    assert [r.records for r in results] == [500, 300, 200]
    offsets = {TopicPartition("in", 0): 40, TopicPartition("in", 1): 2}
    owner.commit_offsets("g", offsets, json.dumps({"batch": 7}))
    epoch_before = owner.producer_epoch
    owner.commit([results[0].producer_id, results[1].producer_id])
    assert owner.producer_epoch == epoch_before + 1

    records = read_committed(cluster.address, "out")
    assert values_of(records) == sorted([f"a-{i}".encode() for i in range(500)] +
                                        [f"b-{i}".encode() for i in range(300)])
    committed = owner.committed("g", list(offsets))
    assert committed == {tp: (offset, json.dumps({"batch": 7})) for tp, offset in offsets.items()}
    owner.close()


def test_a_new_owner_instance_aborts_the_open_transaction_with_its_participants(cluster):
    crashed = TransactionOwner(cluster.address, TXN_ID)
    crashed.init()
    zombie = write(crashed, "out", "old", 100)
    zombie_result = zombie.close()
    late = write(crashed, "out", "early", 30)    # a task still running when the driver dies
    late.flush()
    crashed.commit_offsets("g", {TopicPartition("in", 0): 99}, "old")
    # the driver dies here; a new one starts
    restarted = TransactionOwner(cluster.address, TXN_ID)
    restarted.init()
    assert restarted.producer_epoch > crashed.producer_epoch
    # the old participant's late writes are refused, and the old owner cannot commit
    with pytest.raises(EosError) as info:
        late.write([f"k{i}".encode() for i in range(30)], [b"late"] * 30)
        late.flush()
    assert info.value.code in (ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.PRODUCER_FENCED,
                               ErrorCode.INVALID_PRODUCER_ID_MAPPING, ErrorCode.INVALID_TXN_STATE)
    late.abandon()
    with pytest.raises(EosError) as info:
        crashed.commit([zombie_result.producer_id])
    assert info.value.code is ErrorCode.PRODUCER_FENCED
    # a new participant of the old owner is refused too
    with pytest.raises(EosError):
        write(crashed, "out", "zombie-task", 5).close()

    fresh = write(restarted, "out", "new", 50).close()
    restarted.commit_offsets("g", {TopicPartition("in", 0): 5}, "new")
    restarted.commit([fresh.producer_id])
    assert values_of(read_committed(cluster.address, "out")) == sorted(f"new-{i}".encode() for i in range(50))
    assert restarted.committed("g", [TopicPartition("in", 0)]) == {TopicPartition("in", 0): (5, "new")}
    for owner in (crashed, restarted):
        owner.close()


def test_abort_aborts_every_participant_and_the_offsets(cluster):
    owner = TransactionOwner(cluster.address, TXN_ID)
    owner.init()
    write(owner, "out", "x", 100).close()
    owner.commit_offsets("g", {TopicPartition("in", 1): 3}, "x")
    owner.abort()
    assert read_committed(cluster.address, "out") == []
    assert owner.committed("g", [TopicPartition("in", 1)]) == {}
    owner.close()


def test_accepting_an_unknown_participant_is_refused_and_the_transaction_stays_open(cluster):
    owner = TransactionOwner(cluster.address, TXN_ID)
    owner.init()
    writer = write(owner, "out", "y", 10)
    result = writer.close()
    with pytest.raises(EosError) as info:
        owner.commit([result.producer_id, 123456789])
    assert info.value.code is ErrorCode.INVALID_PRODUCER_ID_MAPPING and "123456789" in str(info.value)
    described = cluster.txn_stub().DescribeTransactions(
        txn_pb2.DescribeTransactionsRequest(transactional_ids=[TXN_ID]), timeout=10).transactions[0]
    assert described.state == "Ongoing"
    [participant] = described.participants
    assert participant.producer_id == result.producer_id and not participant.accepted
    assert {p.partition for p in participant.partitions} == writer.partitions_written and writer.partitions_written
    listed = cluster.txn_stub().ListTransactions(txn_pb2.ListTransactionsRequest(), timeout=10).transactions
    assert [(t.transactional_id, t.participant_count) for t in listed if t.transactional_id == TXN_ID] == [(TXN_ID, 1)]
    owner.commit([result.producer_id])
    assert values_of(read_committed(cluster.address, "out")) == sorted(f"y-{i}".encode() for i in range(10))
    owner.close()


def test_plain_writer_writes_without_a_transaction(cluster):
    import pyarrow as pa

    from spark_sink.participant import OwnerIdentity

    batches = [pa.RecordBatch.from_pydict({"key": [b"k1", None, b"k3"], "value": [b"1", b"2", b"3"]})]
    result = write_arrow_batches(OwnerIdentity(cluster.address, "", -1, -1), "out", batches, transactional=False)
    assert (result.producer_id, result.records) == (-1, 3)
    assert values_of(read_committed(cluster.address, "out")) == [b"1", b"2", b"3"]


def test_a_task_body_writes_its_arrow_batches_as_one_participant_and_commits(cluster):
    # what a Spark task runs (write_arrow_batches), without Spark: an empty batch, then rows
    import pyarrow as pa

    owner = TransactionOwner(cluster.address, TXN_ID)
    owner.init()

    def batches():
        yield pa.RecordBatch.from_pydict({"key": [], "value": []}, schema=pa.schema(
            [("key", pa.binary()), ("value", pa.binary())]))
        for first in (0, 3):
            yield pa.RecordBatch.from_pydict({"key": [b"k%d" % i for i in range(first, first + 3)],
                                              "value": [b"v%d" % i for i in range(first, first + 3)]})

    result = write_arrow_batches(owner.identity(), "out", batches())
    assert result.producer_id >= 0 and result.records == 6
    owner.commit([result.producer_id])
    assert values_of(read_committed(cluster.address, "out")) == [b"v%d" % i for i in range(6)]
    owner.close()


def test_a_participant_that_registered_partitions_but_wrote_nothing_still_completes(cluster):
    owner = TransactionOwner(cluster.address, TXN_ID)
    owner.init()
    txn = cluster.txn_stub()
    answer = txn.InitParticipant(txn_pb2.InitParticipantRequest(
        transactional_id=TXN_ID, producer_id=owner.producer_id, producer_epoch=owner.producer_epoch,
        partitions=[common_pb2.TopicPartition(topic="out", partition=p) for p in (0, 1)]), timeout=10)
    assert answer.error_code == ErrorCode.NONE and answer.producer_epoch == 0
    silent = answer.producer_id
    writer = write(owner, "out", "z", 20)
    result = writer.close()
    owner.commit([silent, result.producer_id])
    assert values_of(read_committed(cluster.address, "out")) == sorted(f"z-{i}".encode() for i in range(20))
    # read_committed settled, so every marker is in; Complete* follows right after
    deadline = time.monotonic() + 30
    while True:
        described = txn.DescribeTransactions(txn_pb2.DescribeTransactionsRequest(transactional_ids=[TXN_ID]),
                                             timeout=10).transactions[0]
        if described.state == "CompleteCommit" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert described.state == "CompleteCommit" and list(described.participants) == []
    owner.close()


# ---- Producer.participant directly: fencing surfaces as PRODUCER_FENCED; partitions at init ----------

def test_a_fenced_participant_fails_with_producer_fenced_naming_the_cause_and_logs_no_epoch_bump(cluster, caplog):
    import logging

    import eos
    from eos.errors import ProducerFencedError

    owner = eos.Producer(cluster.address, transactional_id=TXN_ID)
    owner.init_transactions(10)
    owner.begin_transaction()
    participant = eos.Producer.participant(TXN_ID, owner.producer_id, owner.producer_epoch, cluster.address,
                                           timeout=10)
    participant.send("out", value=b"before", partition=0)
    participant.flush(10)
    restarted = eos.Producer(cluster.address, transactional_id=TXN_ID)
    restarted.init_transactions(10)             # fences the owner and aborts its transaction
    caplog.set_level(logging.WARNING, logger="eos.producer")
    late = participant.send("out", value=b"late", partition=0)
    with pytest.raises(ProducerFencedError) as info:
        participant.flush(10)
    assert info.value.code is ErrorCode.PRODUCER_FENCED
    assert "INVALID_PRODUCER_ID_MAPPING" in str(info.value) or "INVALID_TXN_STATE" in str(info.value)
    assert isinstance(late.exception(10), ProducerFencedError)
    with pytest.raises(ProducerFencedError):
        participant.send("out", value=b"later", partition=1)
    assert not [r for r in caplog.records if "bumping" in r.getMessage()]
    for producer in (participant, owner, restarted):
        producer.close(10)


def test_partitions_named_at_init_need_no_add_partitions_round_trip(cluster):
    import eos

    owner = eos.Producer(cluster.address, transactional_id=TXN_ID)
    owner.init_transactions(10)
    owner.begin_transaction()
    participant = eos.Producer.participant(TXN_ID, owner.producer_id, owner.producer_epoch, cluster.address,
                                           timeout=10, partitions=[("out", 0), ("out", 2)])
    asked = []
    real_submit = participant._sender._call_threads.submit
    participant._sender._call_threads.submit = lambda *args, **kwargs: (asked.append(args[0]),
                                                                        real_submit(*args, **kwargs))[1]
    for partition in (0, 2):
        participant.send("out", value=b"p%d" % partition, partition=partition)
    participant.flush(10)
    assert asked == []                           # no AddPartitionsToTxn went out
    participant.send("out", value=b"p1", partition=1)
    participant.flush(10)
    assert asked == ["txn-coordinator"]          # a partition not named at init is registered as before
    pid = participant.participant_id
    participant.close(10)
    owner.commit_transaction(10, accepted_participants=[pid])
    assert values_of(read_committed(cluster.address, "out")) == [b"p0", b"p1", b"p2"]
    owner.close(10)


@pytest.mark.parametrize("partitions, error", [
    ([("out", -1)], ValueError), ([("", 0)], ValueError), (["out"], TypeError), ("out", TypeError),
])
def test_bad_partitions_at_init_are_refused_before_anything_starts(cluster, partitions, error):
    import eos

    with pytest.raises(error, match="partition"):
        eos.Producer.participant(TXN_ID, 0, 0, cluster.address, timeout=10, partitions=partitions)


def test_only_a_participant_names_partitions_at_init(cluster):
    import eos

    producer = eos.Producer(cluster.address, transactional_id=TXN_ID)
    try:
        with pytest.raises(ValueError, match="participant"):
            producer.init_transactions(10, partitions=[("out", 0)])
        assert producer.transaction_state == "UNINITIALIZED"
    finally:
        producer.close(10)
