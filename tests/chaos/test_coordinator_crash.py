"""The transaction coordinator under crashes and hanging transactions, through the clients.

tests/integration/test_broker_txn.py drives the same two situations with raw RPCs; here
they go through `eos.Producer` (transactions with offsets) and `eos.Consumer`
(read_committed), as an application sees them.

- kill -9 right after PrepareCommit: `commit_transaction()` returns once the coordinator
  has written its decision (PrepareCommit) -- the markers follow asynchronously, as in
  Kafka. The broker, with its embedded coordinator, is killed with SIGKILL the moment the
  call returns. Before restarting it, the test reads the `__transaction_state` segments on
  disk to learn what the coordinator had written last for the transactional id; it
  repeats (bounded) until one crash landed with PrepareCommit as the last state, the
  case that matters. After every restart the commit must complete: the records and the
  group offset visible to read_committed readers, and the same transactional id usable.
- A hanging transaction: a producer opens a transaction, writes and disappears. A second
  producer's committed transaction behind it stays invisible to read_committed readers
  (the last stable offset is held at the hanging transaction's first offset) until the
  coordinator aborts the hanging one at its transaction.timeout.ms; then the LSO moves on,
  the committed records appear and the hanging ones never do, and the hanging producer
  is fenced.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

import eos
from eos.errors import EosError, ErrorCode
from eos.records.codec import decode_records
from eos.records.header import iter_headers
from eos.types import TopicPartition
from txn_coordinator import txn_log

WAIT_S = 30.0
CRASH_ATTEMPTS_MAX = 12
# Markers to many partitions take the coordinator longer, so the kill more often lands
# before CompleteCommit.
OUTPUT_PARTITIONS = 24
STATE_TOPIC = "__transaction_state"


def last_state_on_disk(data_dir: Path, transactional_id: str) -> str | None:
    """The state the coordinator last wrote for `transactional_id`, read from the
    `__transaction_state` segments of a stopped broker (a torn tail is ignored)."""
    partition = txn_log.partition_for(transactional_id)
    directory = Path(data_dir) / f"{STATE_TOPIC}-{partition}"
    last = None
    for segment in sorted(directory.glob("*.log")):
        buf = segment.read_bytes()
        try:
            for header in iter_headers(buf):
                if header.is_control:
                    continue
                for record in decode_records(buf, header, STATE_TOPIC, partition):
                    if record.key is not None and txn_log.decode_key(record.key) == transactional_id:
                        metadata = txn_log.decode_value(transactional_id, record.value)
                        last = None if metadata is None else metadata.state.display_name
        except EosError:
            pass   # a torn tail: the broker cuts it on start; what came before stands
    return last


def read_committed(bootstrap: str, topic: str, partitions: int, timeout_s: float = WAIT_S) -> list[bytes]:
    """Every value read_committed readers see in `topic`, once nothing is open any more
    (each partition's position reaches its high watermark, markers included)."""
    with eos.Admin(bootstrap=bootstrap) as admin:
        ends = admin.list_offsets({TopicPartition(topic, p): "latest" for p in range(partitions)})
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    with eos.Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        consumer.assign(list(ends))
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, (
                f"read_committed did not reach the high watermarks {ends} in {timeout_s} s: "
                f"positions {[consumer.position(tp) for tp in ends]}")
            values += [r.value for r in consumer.poll(timeout_ms=200)]
    return values


def committed_offset(bootstrap: str, group_id: str, tp: TopicPartition) -> int | None:
    with eos.Consumer(bootstrap, group_id=group_id, isolation_level="read_committed") as consumer:
        return consumer.committed([tp], timeout_ms=int(WAIT_S * 1000))[tp]


def test_commit_completes_after_kill_9_right_after_prepare_commit(broker):
    with eos.Admin(bootstrap=broker.address) as admin:
        admin.create_topic("out", partitions=OUTPUT_PARTITIONS)
        admin.create_topic("in", partitions=1)
    transactional_id = "crash-after-prepare"
    expected: list[bytes] = []
    states: list[str | None] = []
    for attempt in range(CRASH_ATTEMPTS_MAX):
        producer = eos.Producer(broker.address, transactional_id=transactional_id)
        consumer = eos.Consumer(broker.address, group_id="crash-group", isolation_level="read_committed")
        try:
            producer.init_transactions()   # after a crash: waits for the previous commit to complete
            producer.begin_transaction()
            values = [b"attempt-%d-%d" % (attempt, i) for i in range(2 * OUTPUT_PARTITIONS)]
            for i, value in enumerate(values):
                producer.send("out", value=value, partition=i % OUTPUT_PARTITIONS)
            producer.send_offsets_to_transaction({TopicPartition("in", 0): 100 * (attempt + 1)},
                                                 consumer.group_metadata())
            producer.commit_transaction()
            broker.kill()                   # at once: the markers are probably not out yet
        finally:
            consumer.close()
            producer.close(timeout=0)
        expected += values
        states.append(last_state_on_disk(broker.data_dir, transactional_id))
        assert states[-1] in ("PrepareCommit", "CompleteCommit"), states
        broker.start()

        assert sorted(read_committed(broker.address, "out", OUTPUT_PARTITIONS)) == sorted(expected)
        assert committed_offset(broker.address, "crash-group", TopicPartition("in", 0)) == 100 * (attempt + 1)
        if states[-1] == "PrepareCommit":
            break
    assert "PrepareCommit" in states, (
        f"no crash landed between PrepareCommit and CompleteCommit in {CRASH_ATTEMPTS_MAX} attempts: {states}")

    # The transactional id carries on: its next transaction commits as usual.
    with eos.Producer(broker.address, transactional_id=transactional_id) as producer:
        producer.init_transactions()
        with producer.transaction():
            producer.send("out", value=b"after-the-crashes", partition=0)
    assert sorted(read_committed(broker.address, "out", OUTPUT_PARTITIONS)) == sorted(expected + [b"after-the-crashes"])


def test_hanging_transaction_is_aborted_at_its_timeout_and_the_lso_moves_on(broker_factory):
    broker = broker_factory(config={"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    bootstrap = broker.address
    tp = TopicPartition("t", 0)
    with eos.Admin(bootstrap=bootstrap) as admin:
        admin.create_topic("t", partitions=1)
    with eos.Producer(bootstrap) as plain:
        plain.send("t", value=b"before", partition=0).result(WAIT_S)

    hanging = eos.Producer(bootstrap, transactional_id="hanging", transaction_timeout_ms=2000)
    other = eos.Producer(bootstrap, transactional_id="behind-the-hanging-one")
    reader = eos.Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest")
    try:
        hanging.init_transactions()
        hanging.begin_transaction()
        for i in range(3):
            hanging.send("t", value=b"hanging-%d" % i, partition=0)
        hanging.flush(WAIT_S)               # written to the log, never committed

        other.init_transactions()
        with other.transaction():
            other.send("t", value=b"committed-behind", partition=0)

        reader.assign([tp])
        assert reader.end_offsets([tp])[tp] == 1      # the LSO: held at the hanging transaction
        seen = []
        deadline = time.monotonic() + WAIT_S
        while b"committed-behind" not in seen:
            assert time.monotonic() < deadline, (
                f"the LSO did not move past the hanging transaction within {WAIT_S} s; seen {seen}\n"
                f"{broker.log_tail()}")
            batch = [r.value for r in reader.poll(timeout_ms=200)]
            if b"committed-behind" not in batch:
                assert batch == [] or batch == [b"before"], batch   # nothing past the open transaction
            seen += batch
        assert seen == [b"before", b"committed-behind"]

        with pytest.raises(EosError) as fenced:
            hanging.commit_transaction()
        assert fenced.value.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH,
                                     ErrorCode.INVALID_TXN_STATE), fenced.value
    finally:
        reader.close()
        other.close(timeout=5)
        hanging.close(timeout=0)

    with eos.Consumer(bootstrap, isolation_level="read_uncommitted", auto_offset_reset="earliest") as raw:
        raw.assign([tp])
        values: list[bytes] = []
        deadline = time.monotonic() + WAIT_S
        while len(values) < 5 and time.monotonic() < deadline:
            values += [r.value for r in raw.poll(timeout_ms=200)]
    assert values == [b"before", b"hanging-0", b"hanging-1", b"hanging-2", b"committed-behind"]
    assert read_committed(bootstrap, "t", 1) == [b"before", b"committed-behind"]
