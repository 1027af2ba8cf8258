"""The transactional producer against a real broker process: commit, abort, offsets in the
transaction, zombie fencing, `with producer.transaction()`, participants.

Markers are written by the coordinator after EndTxn answers, so what a read_committed
consumer sees is waited for (bounded); that something is *not* visible is checked after
a later committed transaction of the same producer is visible, whose markers come after.
"""
from __future__ import annotations


import pytest

import eos
from eos.errors import ProducerFencedError
from eos.types import TopicPartition
from eos.v1 import common_pb2, group_pb2, group_pb2_grpc
from producer import IllegalStateError, TransactionAbortedError
from tests.integration.test_clients_producer import consume_all
from tests.waits import wait_for

WAIT_S = 30


@pytest.fixture
def admin(broker):
    with eos.Admin(broker.address) as admin:
        yield admin


def values_of(records) -> list[bytes]:
    return [r.value for r in records]


def read_committed(address: str, topic: str, partitions: int, expected: int) -> list:
    return consume_all(address, topic, partitions, expected, isolation_level="read_committed")


def committed_offsets(broker, group: str, tps, *, require_stable: bool = False) -> dict:
    stub = group_pb2_grpc.GroupCoordinatorStub(broker.channel())
    response = stub.OffsetFetch(group_pb2.OffsetFetchRequest(
        group_id=group, require_stable=require_stable,
        partitions=[common_pb2.TopicPartition(topic=t, partition=p) for t, p in tps]), timeout=10)
    return {(p.topic, p.partition): p.offset for p in response.partitions}


@pytest.mark.parametrize("transaction_version", [2, 1])
def test_commit_makes_records_visible_and_abort_hides_them(broker, admin, transaction_version):
    """transaction.version 2 (the default): partitions join with the produce (KIP-890 part 2);
    1: with an AddPartitionsToTxn first. The outcome is the same."""
    topic = f"tx-out-v{transaction_version}"
    admin.create_topic(topic, partitions=2)
    with eos.Producer(broker.address, transactional_id=f"tx-a-v{transaction_version}",
                      transaction_version=transaction_version) as producer:
        producer.init_transactions()
        first_epoch = producer.producer_epoch
        producer.begin_transaction()
        futures = [producer.send(topic, b"c1-%d" % i, partition=i % 2) for i in range(100)]
        producer.commit_transaction()
        assert all(f.done() and f.exception() is None for f in futures)
        assert producer.producer_epoch == first_epoch + 1      # KIP-890: bumped at every end

        producer.begin_transaction()
        aborted = [producer.send(topic, b"a-%d" % i, partition=i % 2) for i in range(50)]
        producer.flush()                # written to the log, then aborted
        assert all(f.exception() is None for f in aborted)
        producer.abort_transaction()
        assert producer.producer_epoch == first_epoch + 2

        with producer.transaction():
            for i in range(10):
                producer.send(topic, b"c2-%d" % i, partition=i % 2)
        assert producer.transaction_state == "READY"

    committed = read_committed(broker.address, topic, 2, 110)
    assert sorted(values_of(committed)) == sorted([b"c1-%d" % i for i in range(100)] +
                                                  [b"c2-%d" % i for i in range(10)])
    everything = consume_all(broker.address, topic, 2, 160)
    # read_uncommitted sees the aborted data too, and never a marker
    assert sorted(values_of(everything)) == sorted([b"c1-%d" % i for i in range(100)] +
                                                   [b"a-%d" % i for i in range(50)] +
                                                   [b"c2-%d" % i for i in range(10)])
    assert all(not r.value.startswith(b"\x00\x00") for r in everything)
    # 3 transactions x 2 partitions: a marker after each, at the offsets the data skips
    for p in range(2):
        offsets = [r.offset for r in everything if r.partition == p]
        assert offsets[-1] - offsets[0] + 1 == len(offsets) + 2


def test_unsent_records_of_an_aborted_transaction_fail_and_are_never_written(broker, admin):
    admin.create_topic("tx-drop", partitions=1)
    with eos.Producer(broker.address, transactional_id="tx-drop", linger_ms=60_000) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        lingering = producer.send("tx-drop", b"never")        # waits for linger.ms
        producer.abort_transaction()
        with pytest.raises(TransactionAbortedError):
            lingering.result(WAIT_S)
        with producer.transaction():
            producer.send("tx-drop", b"kept")
    assert values_of(consume_all(broker.address, "tx-drop", 1, 1)) == [b"kept"]


def test_offsets_in_a_transaction_become_visible_only_on_commit(broker, admin):
    admin.create_topic("tx-in", partitions=2)
    admin.create_topic("tx-copy", partitions=1)
    tps = [("tx-in", 0), ("tx-in", 1)]
    group = "copier"
    with eos.Producer(broker.address, transactional_id="tx-offsets") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("tx-copy", b"x")
        producer.send_offsets_to_transaction({TopicPartition("tx-in", 0): 5, TopicPartition("tx-in", 1): 7}, group)
        producer.flush()
        assert committed_offsets(broker, group, tps) == {("tx-in", 0): -1, ("tx-in", 1): -1}
        producer.abort_transaction()
        assert committed_offsets(broker, group, tps) == {("tx-in", 0): -1, ("tx-in", 1): -1}

        producer.begin_transaction()
        producer.send_offsets_to_transaction({TopicPartition("tx-in", 0): 11, ("tx-in", 1): 13}, group)
        producer.commit_transaction()
    wait_for(lambda: committed_offsets(broker, group, tps) == {("tx-in", 0): 11, ("tx-in", 1): 13},
             "the offsets committed with the transaction")
    # the aborted transaction's offsets never appeared on the way
    assert committed_offsets(broker, group, tps, require_stable=True) == {("tx-in", 0): 11, ("tx-in", 1): 13}


def test_bad_offsets_are_refused_before_anything_is_sent(broker, admin):
    with eos.Producer(broker.address, transactional_id="tx-bad") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(ValueError, match="offset"):
            producer.send_offsets_to_transaction({TopicPartition("t", 0): -3}, "g")
        with pytest.raises(TypeError, match="group_metadata"):
            producer.send_offsets_to_transaction({TopicPartition("t", 0): 3}, 42)
        assert producer.transaction_state == "IN_TRANSACTION"
        producer.abort_transaction()


def test_zombie_is_fenced_and_its_data_never_appears(broker, admin):
    admin.create_topic("tx-zombie", partitions=2)
    old = eos.Producer(broker.address, transactional_id="tx-z")
    try:
        old.init_transactions()
        old.begin_transaction()
        old.send("tx-zombie", b"zombie-1", partition=0).result(WAIT_S)     # written, in its open transaction
        with eos.Producer(broker.address, transactional_id="tx-z") as new:
            new.init_transactions()          # bumps the epoch: fences `old`, aborts its transaction
            late = [old.send("tx-zombie", b"zombie-2", partition=0),       # registered partition
                    old.send("tx-zombie", b"zombie-3", partition=1)]       # new partition
            for future in late:
                with pytest.raises(ProducerFencedError):
                    future.result(WAIT_S)
            with pytest.raises(ProducerFencedError):
                old.commit_transaction()
            with pytest.raises(ProducerFencedError):
                old.send("tx-zombie", b"zombie-4")
            with pytest.raises(ProducerFencedError):
                old.abort_transaction()
            assert old.transaction_state == "FATAL_ERROR"
            with new.transaction():
                new.send("tx-zombie", b"new-0", partition=0)
                new.send("tx-zombie", b"new-1", partition=1)
    finally:
        old.close()
    records = read_committed(broker.address, "tx-zombie", 2, 2)
    assert sorted(values_of(records)) == [b"new-0", b"new-1"]


def test_with_transaction_aborts_on_exception_and_reraises(broker, admin):
    admin.create_topic("tx-with", partitions=1)

    class Boom(Exception):
        pass

    with eos.Producer(broker.address, transactional_id="tx-with") as producer:
        producer.init_transactions()
        with pytest.raises(Boom):
            with producer.transaction():
                producer.send("tx-with", b"lost").result(WAIT_S)
                raise Boom()
        assert producer.transaction_state == "READY"
        with producer.transaction():
            producer.send("tx-with", b"kept")
    assert values_of(read_committed(broker.address, "tx-with", 1, 1)) == [b"kept"]
    assert sorted(values_of(consume_all(broker.address, "tx-with", 1, 2))) == [b"kept", b"lost"]


def test_a_failed_record_makes_the_transaction_abortable(broker, admin):
    admin.create_topic("tx-fail", partitions=1, config={"max.message.bytes": "2000"})
    with eos.Producer(broker.address, transactional_id="tx-fail") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("tx-fail", b"small")
        too_big = producer.send("tx-fail", b"x" * 5000)      # over the topic's max.message.bytes
        with pytest.raises(TransactionAbortedError):
            producer.commit_transaction()                     # nothing is committed
        assert too_big.exception(WAIT_S) is not None
        with pytest.raises(TransactionAbortedError):
            producer.send("tx-fail", b"more")                 # until the application aborts
        producer.abort_transaction()
        with producer.transaction():
            producer.send("tx-fail", b"after")
    assert values_of(read_committed(broker.address, "tx-fail", 1, 1)) == [b"after"]


def test_state_errors_change_nothing(broker, admin):
    with eos.Producer(broker.address, transactional_id="tx-states") as producer:
        with pytest.raises(IllegalStateError):
            producer.begin_transaction()
        producer.init_transactions()
        with pytest.raises(IllegalStateError):
            producer.init_transactions()
        producer.begin_transaction()
        with pytest.raises(IllegalStateError):
            producer.begin_transaction()
        producer.commit_transaction()          # an empty transaction: nothing to tell
        with pytest.raises(IllegalStateError):
            producer.abort_transaction()
        assert producer.transaction_state == "READY"


def test_participants_write_into_the_owners_transaction(broker, admin):
    admin.create_topic("tx-part", partitions=3)
    with eos.Producer(broker.address, transactional_id="tx-owner") as owner:
        owner.init_transactions()
        owner.begin_transaction()
        owner.send("tx-part", b"owner", partition=0)
        owner.flush()
        accepted = eos.Producer.participant("tx-owner", owner.producer_id, owner.producer_epoch, broker.address)
        rejected = eos.Producer.participant("tx-owner", owner.producer_id, owner.producer_epoch, broker.address)
        try:
            assert accepted.participant_id >= 0 and accepted.participant_epoch == 0
            assert accepted.participant_id not in (rejected.participant_id, owner.producer_id)
            for i in range(20):
                accepted.send("tx-part", b"accepted-%d" % i, partition=1 + i % 2)
                rejected.send("tx-part", b"rejected-%d" % i, partition=i % 3)
            accepted.flush()
            rejected.flush()
            with pytest.raises(IllegalStateError, match="owner"):
                accepted.commit_transaction()
            owner.commit_transaction(accepted_participants=[accepted.participant_id])
        finally:
            accepted.close()
            rejected.close()
        with owner.transaction():       # the owner carries on with its next epoch
            owner.send("tx-part", b"next", partition=0)
    expected = [b"owner", b"next"] + [b"accepted-%d" % i for i in range(20)]
    records = read_committed(broker.address, "tx-part", 3, len(expected))
    assert sorted(values_of(records)) == sorted(expected)


def test_a_participant_of_a_stale_owner_epoch_is_fenced(broker, admin):
    admin.create_topic("tx-part-stale", partitions=1)
    with eos.Producer(broker.address, transactional_id="tx-owner2") as owner:
        owner.init_transactions()
        stale_epoch = owner.producer_epoch
        with owner.transaction():
            owner.send("tx-part-stale", b"x")
        with pytest.raises(ProducerFencedError):
            eos.Producer.participant("tx-owner2", owner.producer_id, stale_epoch, broker.address)


def test_offsets_with_a_members_group_metadata_and_a_stale_generation_is_fenced(broker, admin):
    """KIP-447 through a real group member: its group_metadata() commits; a generation
    that is not the group's is refused, which makes the transaction abortable."""
    from consumer.group import ConsumerGroupMetadata
    admin.create_topic("tx-447", partitions=1)
    with eos.Consumer(broker.address, group_id="g447", auto_offset_reset="earliest") as member:
        member.subscribe(["tx-447"])
        wait_for(lambda: member.poll(timeout_ms=100) is not None and member.assignment(),
                 "the member's assignment")
        metadata = member.group_metadata()
        assert metadata.generation_id >= 1
        with eos.Producer(broker.address, transactional_id="tx-447") as producer:
            producer.init_transactions()
            with producer.transaction():
                producer.send_offsets_to_transaction({TopicPartition("tx-447", 0): 3}, metadata)
            tp = TopicPartition("tx-447", 0)
            wait_for(lambda: member.committed([tp]) == {tp: 3}, "the committed offset")

            stale = ConsumerGroupMetadata(metadata.group_id, metadata.generation_id + 7, metadata.member_id,
                                          metadata.group_instance_id)
            producer.begin_transaction()
            with pytest.raises(eos.errors.EosError) as refused:
                producer.send_offsets_to_transaction({TopicPartition("tx-447", 0): 9}, stale)
            assert refused.value.code.name == "ILLEGAL_GENERATION"
            assert producer.transaction_state == "ABORTABLE_ERROR"
            producer.abort_transaction()
            assert producer.transaction_state == "READY"
        assert member.committed([tp]) == {tp: 3}


def test_close_aborts_an_open_transaction_so_readers_move_on(broker, admin):
    admin.create_topic("tx-close", partitions=1)
    producer = eos.Producer(broker.address, transactional_id="tx-close", transaction_timeout_ms=600_000)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("tx-close", b"open").result(WAIT_S)      # written: holds the LSO back
    producer.close()
    with eos.Producer(broker.address, transactional_id="tx-close-2") as other:
        other.init_transactions()
        with other.transaction():
            other.send("tx-close", b"after")
    # without the abort, the LSO would stay at "open" for transaction.timeout.ms (10 min)
    assert values_of(read_committed(broker.address, "tx-close", 1, 1)) == [b"after"]
