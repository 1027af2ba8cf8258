"""`eos groups ...` and `eos txn ...` as a user runs them: `python -m eos.cli` subprocesses
against a real broker, checked against a state the test built and knows exactly (committed
offsets, an open transaction holding the last stable offset back, hanging transactions
made by taking the coordinator's log away)."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

import eos
from eos.errors import EosError, ErrorCode, Reaction, reaction_for
from eos.records.codec import encode_batch
from eos.types import TopicPartition
from eos.v1 import broker_pb2, common_pb2, txn_pb2
from tests.conftest import REPO_ROOT, BrokerProcess
from tests.waits import wait_for

WAIT_S = 60.0
FAST_GROUPS = {"group.min.session.timeout.ms": "500", "group.initial.rebalance.delay.ms": "200"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    process = BrokerProcess(tmp_path_factory.mktemp("cli") / "data", config=FAST_GROUPS)
    process.start()
    yield process
    process.close()


def eos_cli(broker, *args: str, expect_code: int = 0) -> str:
    done = subprocess.run([sys.executable, "-m", "eos.cli", *args, "--bootstrap-server", broker.address],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == expect_code, f"eos {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout if expect_code == 0 else done.stderr


# kafka-transactions.sh's columns (Kafka's TransactionsCommand), which eos txn prints in the same order.
KAFKA_TXN_LIST_COLUMNS = ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
KAFKA_TXN_DESCRIBE_COLUMNS = ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                              "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs",
                              "TopicPartitions"]
KAFKA_TXN_PRODUCERS_COLUMNS = ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence",
                               "LastTimestamp", "CurrentTransactionStartOffset"]
KAFKA_TXN_HANGING_COLUMNS = ["Topic", "Partition", "ProducerId", "ProducerEpoch", "CoordinatorEpoch", "StartOffset",
                             "LastTimestamp", "Duration(min)"]


class _AnyCell(str):
    """Equal to any cell (the transaction's duration moves between two calls)."""

    def __eq__(self, other) -> bool:
        return isinstance(other, str)

    __hash__ = str.__hash__


ANY_CELL = _AnyCell()


def table(output: str, header_word: str) -> list[list[str]]:
    """The rows (split on whitespace) of the table whose header starts with `header_word`."""
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [header_word])
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


class TxnProducer:
    """A transactional producer by hand (the raw RPCs of KIP-98/KIP-890)."""

    def __init__(self, broker, transactional_id: str):
        self.broker, self.txn = broker.broker_stub(), broker.txn_stub()
        self.transactional_id = transactional_id
        init = self._retry(lambda: self.txn.InitProducerId(txn_pb2.InitProducerIdRequest(
            transactional_id=transactional_id, transaction_timeout_ms=600_000, producer_id=-1, producer_epoch=-1),
            timeout=30))
        self.producer_id, self.epoch = init.producer_id, init.producer_epoch
        self.sequences: dict[tuple[str, int], int] = {}

    @staticmethod
    def _retry(call):
        deadline = time.monotonic() + WAIT_S
        while True:
            response = call()
            if response.error_code == ErrorCode.NONE:
                return response
            assert reaction_for(response.error_code) is Reaction.RETRY and time.monotonic() < deadline, response
            time.sleep(0.05)

    def send(self, topic: str, partition: int, values: list[bytes]) -> None:
        self._retry(lambda: self.txn.AddPartitionsToTxn(txn_pb2.AddPartitionsToTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.epoch,
            partitions=[common_pb2.TopicPartition(topic=topic, partition=partition)]), timeout=30))
        sequence = self.sequences.get((topic, partition), 0)
        batch = encode_batch(values, producer_id=self.producer_id, producer_epoch=self.epoch, base_sequence=sequence,
                             transactional=True)
        [result] = self.broker.Produce(broker_pb2.ProduceRequest(
            transactional_id=self.transactional_id, acks=-1,
            partitions=[broker_pb2.PartitionRecords(topic=topic, partition=partition, records=batch)]),
            timeout=30).partitions
        assert result.error_code == ErrorCode.NONE, result
        self.sequences[(topic, partition)] = sequence + len(values)

    def end(self, commit: bool) -> None:
        self._retry(lambda: self.txn.EndTxn(txn_pb2.EndTxnRequest(
            transactional_id=self.transactional_id, producer_id=self.producer_id, producer_epoch=self.epoch,
            committed=commit), timeout=30))


def last_stable_offset(broker, tp: TopicPartition) -> int:
    with eos.Admin(broker.address) as admin:
        return admin.list_offsets({tp: "latest"}, isolation_level="read_committed")[tp]


# ---- groups ---------------------------------------------------------------------------------

def test_groups_list_describe_and_offsets_with_lag_against_the_lso(broker):
    topic, group = "lag", "lag-readers"
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with eos.Admin(broker.address) as admin:
        admin.create_topic(topic, partitions=2)
    with eos.Producer(broker.address) as producer:
        for i in range(10):
            producer.send(topic, value=b"x", partition=0)
        for i in range(5):
            producer.send(topic, value=b"y", partition=1)
        producer.flush()
    open_txn = TxnProducer(broker, "lag-writer")
    open_txn.send(topic, 0, [b"t1", b"t2", b"t3"])      # offsets 10..12, open: the LSO stays at 10
    consumer = eos.Consumer(broker.address, group_id=group, isolation_level="read_committed",
                            auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=300,
                            client_id="lag-client")
    try:
        consumer.subscribe([topic])
        wait_for(lambda: consumer.poll(timeout_ms=50) is not None and consumer.assignment() == {tp0, tp1},
                 "the assignment")
        consumer.commit({tp0: 4, tp1: 5})
        member_id = consumer.group_metadata().member_id

        assert group in eos_cli(broker, "groups", "list").split()
        assert [group, "Stable"] in table(eos_cli(broker, "groups", "list", "--state", "Stable"), "GROUP")

        rows = table(eos_cli(broker, "groups", "describe", group), "TOPIC")
        assert rows == [[topic, "0", "4", "10", "6", member_id, "/127.0.0.1", "lag-client"],
                        [topic, "1", "5", "5", "0", member_id, "/127.0.0.1", "lag-client"]]
        rows = table(eos_cli(broker, "groups", "describe", group, "--isolation", "read_uncommitted"), "TOPIC")
        assert [r[:5] for r in rows] == [[topic, "0", "4", "13", "9"], [topic, "1", "5", "5", "0"]]

        members = table(eos_cli(broker, "groups", "describe", group, "--members"), "CONSUMER-ID")
        assert members == [[member_id, "-", "/127.0.0.1", "lag-client", "2", f"{topic}-0,{topic}-1"]]
        state = table(eos_cli(broker, "groups", "describe", group, "--state"), "GROUP")
        assert state == [[group, "range", "Stable", str(consumer.group_metadata().generation_id), "1"]]
        assert table(eos_cli(broker, "groups", "offsets", group), "TOPIC") == [[topic, "0", "4"], [topic, "1", "5"]]
    finally:
        consumer.close()
    output = eos_cli(broker, "groups", "describe", group)
    assert f"Consumer group '{group}' has no active members." in output
    assert [r[:5] for r in table(output, "TOPIC")] == [[topic, "0", "4", "10", "6"], [topic, "1", "5", "5", "0"]]
    open_txn.end(commit=True)
    wait_for(lambda: last_stable_offset(broker, tp0) == 14, "the commit marker")
    rows = table(eos_cli(broker, "groups", "describe", group), "TOPIC")
    assert rows[0][:5] == [topic, "0", "4", "14", "10"]
    error = eos_cli(broker, "groups", "describe", "no-such-group", expect_code=1)
    assert "GROUP_ID_NOT_FOUND" in error and "does not exist" in error
    assert "unknown group state" in eos_cli(broker, "groups", "list", "--state", "Sleeping", expect_code=2)


def _group_of_stopped_members(broker, topic: str, group: str, while_active) -> None:
    """`topic` (2 partitions of 10 records) and `group`, which committed {0: 7, 1: 3} through a
    member; `while_active()` runs while that member is in the group, then it leaves."""
    with eos.Admin(broker.address) as admin:
        admin.create_topic(topic, partitions=2)
    with eos.Producer(broker.address) as producer:
        for i in range(10):
            producer.send(topic, value=b"r%d" % i, partition=0)
            producer.send(topic, value=b"r%d" % i, partition=1)
        producer.flush()
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    consumer = eos.Consumer(broker.address, group_id=group, session_timeout_ms=6000, heartbeat_interval_ms=300)
    try:
        consumer.subscribe([topic])
        wait_for(lambda: consumer.poll(timeout_ms=50) is not None and consumer.assignment() == {tp0, tp1},
                 "the assignment")
        consumer.commit({tp0: 7, tp1: 3})
        while_active()
    finally:
        consumer.close()
    assert _committed(broker, group) == {(topic, 0): 7, (topic, 1): 3}


def _committed(broker, group: str) -> dict:
    return {(r[0], int(r[1])): int(r[2]) for r in table(eos_cli(broker, "groups", "offsets", group), "TOPIC")}


def _plan(output: str) -> dict:
    return {(r[1], int(r[2])): int(r[3]) for r in table(output, "GROUP")}


def test_groups_reset_offsets_as_kafkas_tool_does(broker):
    topic, group = "resets", "resetters"

    def refused_while_active():
        error = eos_cli(broker, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest", "--execute",
                        expect_code=1)
        assert f"can only be reset if the group '{group}' is inactive, but the current state is Stable" in error
        with eos.Admin(broker.address) as admin, pytest.raises(EosError, match="has active members"):
            admin.alter_group_offsets(group, {TopicPartition(topic, 0): 0})

    _group_of_stopped_members(broker, topic, group, refused_while_active)

    def committed():
        return _committed(broker, group)

    # without --execute: the plan, and nothing changes
    output = eos_cli(broker, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest")
    assert "No action will be performed" in output and _plan(output) == {(topic, 0): 0, (topic, 1): 0}
    output = eos_cli(broker, "groups", "reset-offsets", group, "--all-topics", "--shift-by", "-2", "--dry-run")
    assert "No action" not in output and _plan(output) == {(topic, 0): 5, (topic, 1): 1}
    assert committed() == {(topic, 0): 7, (topic, 1): 3}
    # --execute; offsets are kept within [log start, high watermark], as Kafka's tool keeps them
    output = eos_cli(broker, "groups", "reset-offsets", group, "--topic", f"{topic}:1", "--to-offset", "99",
                     "--execute")
    assert f"New offset (99) is higher than latest offset for topic partition {topic}-1. Value will be set to 10" in output
    assert committed() == {(topic, 0): 7, (topic, 1): 10}
    eos_cli(broker, "groups", "reset-offsets", group, "--all-topics", "--shift-by", "-100", "--execute")
    assert committed() == {(topic, 0): 0, (topic, 1): 0}
    eos_cli(broker, "groups", "reset-offsets", group, "--topic", topic, "--to-latest", "--execute")
    assert committed() == {(topic, 0): 10, (topic, 1): 10}
    eos_cli(broker, "groups", "reset-offsets", group, "--topic", topic, "--to-datetime", "2000-01-01T00:00:00.000",
            "--execute")
    assert committed() == {(topic, 0): 0, (topic, 1): 0}
    eos_cli(broker, "groups", "reset-offsets", group, "--topic", topic, "--to-datetime", "2999-01-01T00:00:00+01:00",
            "--execute")
    assert committed() == {(topic, 0): 10, (topic, 1): 10}
    eos_cli(broker, "groups", "reset-offsets", group, "--topic", topic, "--to-datetime", "2000-01-01T00:00:00",
            "--execute")                                                       # no zone: local time
    assert committed() == {(topic, 0): 0, (topic, 1): 0}
    eos_cli(broker, "groups", "reset-offsets", group, "--topic", topic, "--to-latest", "--execute")
    assert committed() == {(topic, 0): 10, (topic, 1): 10}
    # the group's consumers start where the reset put them
    eos_cli(broker, "groups", "reset-offsets", group, "--topic", f"{topic}:0", "--to-offset", "8", "--execute")
    with eos.Consumer(broker.address, group_id=group, session_timeout_ms=6000, heartbeat_interval_ms=300) as resumed:
        resumed.subscribe([topic])
        seen: list = []
        wait_for(lambda: seen.extend((r.partition, r.value) for r in resumed.poll(timeout_ms=100)) or len(seen) >= 2,
                 "the records after the reset")
        assert sorted(seen) == [(0, b"r8"), (0, b"r9")]
    assert "needs --topic TOPIC" in eos_cli(broker, "groups", "reset-offsets", group, "--to-latest", expect_code=2)
    with eos.Admin(broker.address) as admin:
        admin.create_topic("never-read")
    error = eos_cli(broker, "groups", "reset-offsets", group, "--topic", "never-read", "--shift-by", "1",
                    expect_code=2)
    assert "Cannot shift offset for partition never-read-0 since there is no current committed offset" in error


def test_groups_delete_as_kafkas_tool_does(broker):
    topic, group = "deletions", "deleted-readers"

    def refused_while_active():       # a group with members is not deleted
        assert "NON_EMPTY_GROUP" in eos_cli(broker, "groups", "delete", group, expect_code=1)

    _group_of_stopped_members(broker, topic, group, refused_while_active)
    # delete: the group and its offsets go; deleting it again finds nothing
    output = eos_cli(broker, "groups", "delete", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in output
    assert group not in eos_cli(broker, "groups", "list").split()
    assert _committed(broker, group) == {}
    assert "GROUP_ID_NOT_FOUND" in eos_cli(broker, "groups", "delete", group, expect_code=1)
    # a group that only ever committed offsets (an admin's, a "simple" consumer's) is deleted too
    tp0 = TopicPartition(topic, 0)
    with eos.Admin(broker.address) as admin:
        admin.alter_group_offsets("offsets-only", {tp0: 4})
        assert admin.list_group_offsets("offsets-only") == {tp0: 4}
        assert admin.delete_groups(["offsets-only"]) == {"offsets-only": None}
        assert admin.list_group_offsets("offsets-only") == {}


# ---- transactions ---------------------------------------------------------------------------

def test_txn_list_and_describe_follow_a_real_transaction(broker):
    with eos.Admin(broker.address) as admin:
        admin.create_topic("txn-cli", partitions=2)
    writer = TxnProducer(broker, "cli-writer")
    writer.send("txn-cli", 1, [b"a", b"b"])
    output = eos_cli(broker, "txn", "list")
    assert output.splitlines()[0].split() == KAFKA_TXN_LIST_COLUMNS
    assert ["cli-writer", "0", str(writer.producer_id), "Ongoing"] in table(output, "TransactionalId")
    assert table(eos_cli(broker, "txn", "list", "--duration-filter", "600000"), "TransactionalId") == []
    ongoing = table(eos_cli(broker, "txn", "list", "--state", "Ongoing"), "TransactionalId")
    assert all(row[3] == "Ongoing" for row in ongoing) and "cli-writer" in [row[0] for row in ongoing]
    output = eos_cli(broker, "txn", "describe", "--transactional-id", "cli-writer")
    assert output.splitlines()[0].split() == KAFKA_TXN_DESCRIBE_COLUMNS
    [row] = table(output, "CoordinatorId")
    assert row[:4] == ["0", "cli-writer", str(writer.producer_id), str(writer.epoch)]
    assert row[4] == "Ongoing" and row[5] == "600000" and row[8] == "txn-cli-1"
    assert table(eos_cli(broker, "txn", "describe", "cli-writer"), "CoordinatorId") == [row[:7] + [ANY_CELL] + row[8:]]
    output = eos_cli(broker, "txn", "describe-producers", "--topic", "txn-cli", "--partition", "1")
    assert output.splitlines()[0].split() == KAFKA_TXN_PRODUCERS_COLUMNS
    [producer] = table(output, "ProducerId")
    assert producer[:2] == [str(writer.producer_id), str(writer.epoch)] and producer[3] == "1" and producer[5] == "0"
    writer.end(commit=True)

    def completed():
        [row] = table(eos_cli(broker, "txn", "describe", "--transactional-id", "cli-writer"), "CoordinatorId")
        return row if row[4] == "CompleteCommit" else None

    row = wait_for(completed, "CompleteCommit")
    assert row[6] == "None" and row[7] == "None"             # no transaction open any more, as Kafka prints it
    [producer] = table(eos_cli(broker, "txn", "describe-producers", "--topic", "txn-cli", "--partition", "1"),
                       "ProducerId")
    assert producer[5] == "None"                             # its transaction there is over
    assert "TRANSACTIONAL_ID_NOT_FOUND" in eos_cli(broker, "txn", "describe", "--transactional-id", "nobody",
                                                   expect_code=1)
    assert "needs --transactional-id" in eos_cli(broker, "txn", "describe", expect_code=2)
    assert "unknown transaction state" in eos_cli(broker, "txn", "list", "--state", "Sleeping", expect_code=2)


def test_find_hanging_and_abort_transactions_the_coordinator_lost(broker_factory):
    """A transaction hangs when the coordinator no longer knows it: here its log is taken
    away while the broker is down. find-hanging reports it (and not a live one); aborting it
    by ids or by its start offset moves the last stable offset on."""
    handle = broker_factory()
    with eos.Admin(handle.address) as admin:
        admin.create_topic("hang", partitions=2)
    first, second = TxnProducer(handle, "hang-1"), TxnProducer(handle, "hang-2")
    first.send("hang", 0, [b"a", b"b"])
    second.send("hang", 1, [b"c"])
    tp0, tp1 = TopicPartition("hang", 0), TopicPartition("hang", 1)
    assert last_stable_offset(handle, tp0) == 0 and last_stable_offset(handle, tp1) == 0
    # Live transactions are not hanging, however old; and none is older than the default 15 minutes.
    assert table(eos_cli(handle, "txn", "find-hanging", "--topic", "hang", "--max-transaction-timeout", "0"),
                 "Topic") == []
    assert table(eos_cli(handle, "txn", "find-hanging", "--broker-id", "0"), "Topic") == []
    assert "either --topic or --broker-id" in eos_cli(handle, "txn", "find-hanging", expect_code=2)
    assert "requires --topic" in eos_cli(handle, "txn", "find-hanging", "--broker-id", "0", "--partition", "0",
                                         expect_code=2)

    handle.stop()
    for directory in handle.data_dir.glob("__transaction_state-*"):
        shutil.rmtree(directory)
    handle.start()

    output = eos_cli(handle, "txn", "find-hanging", "--topic", "hang", "--max-transaction-timeout", "0")
    assert output.splitlines()[0].split() == KAFKA_TXN_HANGING_COLUMNS
    hanging = table(output, "Topic")
    assert table(eos_cli(handle, "txn", "find-hanging", "--topic", "hang", "--partition", "1",
                         "--max-transaction-timeout", "0"), "Topic") == hanging[1:]
    assert table(eos_cli(handle, "txn", "find-hanging", "--broker-id", "0", "--max-transaction-timeout", "0"),
                 "Topic") == hanging
    assert table(eos_cli(handle, "txn", "find-hanging", "--broker-id", "7", "--max-transaction-timeout", "0"),
                 "Topic") == []                             # no replica on a broker that does not exist
    assert [row[:4] + row[5:6] for row in hanging] == [
        ["hang", "0", str(first.producer_id), str(first.epoch), "0"],
        ["hang", "1", str(second.producer_id), str(second.epoch), "0"]]
    coordinator_epoch = hanging[0][4]
    assert last_stable_offset(handle, tp0) == 0                     # still held back after the restart

    output = eos_cli(handle, "txn", "abort", "--topic", "hang", "--partition", "0", "--producer-id",
                     str(first.producer_id), "--producer-epoch", str(first.epoch), "--coordinator-epoch",
                     coordinator_epoch)
    assert "Aborted" in output
    eos_cli(handle, "txn", "abort", "--topic", "hang", "--partition", "1", "--start-offset", "0")
    assert last_stable_offset(handle, tp0) == 3 and last_stable_offset(handle, tp1) == 2   # past the markers
    assert table(eos_cli(handle, "txn", "find-hanging", "--broker-id", "0", "--max-transaction-timeout", "0"),
                 "Topic") == []
    with eos.Consumer(handle.address, isolation_level="read_committed", auto_offset_reset="earliest") as reader:
        reader.assign([tp0, tp1])
        assert reader.poll(timeout_ms=500) == []                    # the aborted records are never shown
    error = eos_cli(handle, "txn", "abort", "--topic", "hang", "--partition", "0", "--start-offset", "7",
                    expect_code=1)
    assert "no open transaction starts at offset 7" in error
