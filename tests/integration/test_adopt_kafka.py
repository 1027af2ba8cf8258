"""`eos topics adopt`: partition directories written by Apache Kafka itself, served by eos.

A real Kafka 4 broker (pinned jars from Maven Central, fetched by the project) writes a
topic with committed and aborted transactions, idempotent and plain producers and every
codec; Kafka's own consumer reads it read_committed; Kafka is stopped cleanly and eos adopts
the directories. eos must serve exactly what Kafka's consumer read, at the same offsets, and
take new appends after it, from producers whose ids are past every id Kafka handed out.
Refusals (a bad CRC, a missing partition, an open transaction, a v0/v1 segment, a running
broker, a topic that exists) change nothing in the eos data directory.
"""
from __future__ import annotations

import shutil
import struct
import time
from pathlib import Path

import pytest

import eos
from bench.kafka import KafkaBroker, resolve_pinned_kafka
from broker.adopt import AdoptionRefused, adopt_topic
from broker.storage import Log
from eos.cli import main as cli_main
from eos.config import TopicConfig
from eos.errors import StorageError
from eos.records.codec import encode_batch
from eos.types import TopicPartition
from tests import legacy_messages
from tests.waits import wait_for

TOPIC = "orders"
PARTITIONS = 2
KAFKA_TIMEOUT_S = 60


def _kafka_write(bootstrap: str) -> None:
    """Every kind of batch a Kafka user's topic may hold."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)])[TOPIC].result(
        KAFKA_TIMEOUT_S)
    for codec in ("none", "gzip", "snappy", "lz4", "zstd"):          # idempotent, one per codec
        producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                             "compression.type": codec, "linger.ms": 5})
        for i in range(40):
            producer.produce(TOPIC, key=f"{codec}-{i}".encode(), value=f"idempotent {codec} {i}".encode() * 3,
                             partition=i % PARTITIONS)
        assert producer.flush(KAFKA_TIMEOUT_S) == 0
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": False, "acks": "1"})
    for i in range(10):
        plain.produce(TOPIC, value=f"plain {i}".encode(), partition=i % PARTITIONS)
    assert plain.flush(KAFKA_TIMEOUT_S) == 0
    for codec, outcome in (("lz4", "commit"), ("gzip", "abort"), ("zstd", "commit"), ("snappy", "abort"),
                           ("none", "commit")):
        txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"copier-{codec}",
                        "compression.type": codec, "linger.ms": 5})
        txn.init_transactions(KAFKA_TIMEOUT_S)
        txn.begin_transaction()
        for i in range(25):
            txn.produce(TOPIC, key=f"t{i}".encode(), value=f"txn {codec} {outcome} {i}".encode(),
                        partition=i % PARTITIONS)
        (txn.commit_transaction if outcome == "commit" else txn.abort_transaction)(KAFKA_TIMEOUT_S)


def _kafka_read_committed(bootstrap: str) -> list[tuple[int, int, bytes | None, bytes]]:
    from confluent_kafka import Consumer, TopicPartition as KafkaTp

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "adopt-check", "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    try:
        ends = {p: consumer.get_watermark_offsets(KafkaTp(TOPIC, p), timeout=KAFKA_TIMEOUT_S)[1]
                for p in range(PARTITIONS)}
        consumer.assign([KafkaTp(TOPIC, p, 0) for p in range(PARTITIONS)])
        records = []
        deadline = time.monotonic() + KAFKA_TIMEOUT_S
        while any(p.offset < ends[p.partition] for p in consumer.position(
                [KafkaTp(TOPIC, p) for p in range(PARTITIONS)])):
            assert time.monotonic() < deadline, "Kafka's consumer did not reach the end of the topic"
            for message in consumer.consume(500, timeout=0.5):
                assert message.error() is None, message.error()
                records.append((message.partition(), message.offset(), message.key(), message.value()))
        return sorted(records)
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def kafka_topic(tmp_path_factory):
    """(a copy of the log dir of a cleanly stopped Kafka holding TOPIC, what Kafka's consumer read)."""
    kafka = KafkaBroker(resolve_pinned_kafka(), heap="-Xmx512m",
                        base_dir=str(tmp_path_factory.mktemp("kafka"))).start()
    try:
        _kafka_write(kafka.bootstrap)
        expected = _kafka_read_committed(kafka.bootstrap)
        kafka.stop(keep_files=True)
        log_dir = tmp_path_factory.mktemp("kafka-logs")
        for p in range(PARTITIONS):
            shutil.copytree(kafka.log_dir / f"{TOPIC}-{p}", log_dir / f"{TOPIC}-{p}")
    finally:
        kafka.stop()
    return log_dir, expected


def _eos_read_committed(bootstrap: str) -> list[tuple[int, int, bytes | None, bytes]]:
    with eos.Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest") as consumer:
        partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        records = []
        deadline = time.monotonic() + KAFKA_TIMEOUT_S
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, "eos's consumer did not reach the end of the topic"
            records += [(r.partition, r.offset, r.key, r.value) for r in consumer.poll(timeout_ms=500)]
        return sorted(records)


def _producer_ids(bootstrap: str) -> set[int]:
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    with eos.Admin(bootstrap) as admin:
        return {entry["producer_id"] for entries in admin.describe_producers(partitions).values()
                for entry in entries}


def _data_dir_state(data_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(data_dir)): p.read_bytes() for p in sorted(data_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_eos_serves_what_kafkas_consumer_read_and_appends_after_it(kafka_topic, broker_factory, tmp_path):
    log_dir, expected = kafka_topic
    assert {r[0] for r in expected} == {0, 1} and any(r[2] is None for r in expected)
    assert not any(b"abort" in r[3] for r in expected)            # Kafka hid the aborted ones
    data_dir = tmp_path / "eos-data"
    data_dir.mkdir()
    code = cli_main(["topics", "adopt", "--topic", TOPIC, "--from", str(log_dir), "--data-dir", str(data_dir)])
    assert code == 0
    broker = broker_factory(data_dir=data_dir)
    assert _eos_read_committed(broker.address) == expected

    kafka_producer_ids = _producer_ids(broker.address)
    assert kafka_producer_ids, "Kafka's producers are known to eos's producer state"
    with eos.Producer(broker.address, transactional_id="after-adoption") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        sent = [producer.send(TOPIC, b"eos %d" % i, partition=i % PARTITIONS) for i in range(10)]
        producer.commit_transaction()
        written = [f.result(30) for f in sent]
    with eos.Producer(broker.address, enable_idempotence=True) as producer:
        written.append(producer.send(TOPIC, b"eos idempotent", partition=0).result(30))
    ends = {p: max(o for q, o, _, _ in expected if q == p) for p in range(PARTITIONS)}
    assert all(m.offset > ends[m.partition] for m in written)
    after = _eos_read_committed(broker.address)
    assert min(_producer_ids(broker.address) - kafka_producer_ids) > max(kafka_producer_ids)
    assert [r for r in after if r[3].startswith(b"eos")] == sorted(
        (m.partition, m.offset, None, v) for m, v in zip(written, [b"eos %d" % i for i in range(10)] + [b"eos idempotent"]))
    assert [r for r in after if not r[3].startswith(b"eos")] == expected


def test_adopted_producer_ids_are_never_handed_out_again(kafka_topic, broker_factory, tmp_path):
    log_dir, _ = kafka_topic
    data_dir = tmp_path / "eos-data"
    data_dir.mkdir()
    adopted = adopt_topic(log_dir, TOPIC, data_dir, now_ms=int(time.time() * 1000))
    highest = max(c.max_producer_id for c in adopted.partitions)
    assert highest >= 0 and adopted.next_producer_id == highest + 1
    broker = broker_factory(data_dir=data_dir)
    before = _producer_ids(broker.address)
    with eos.Producer(broker.address, enable_idempotence=True) as producer:
        producer.send(TOPIC, b"x", partition=1).result(30)
    [new_id] = _producer_ids(broker.address) - before
    assert new_id > highest


# ---- refusals change nothing -----------------------------------------------------------------

def _eos_written_dir(root: Path, *, open_transaction: bool = False) -> Path:
    """A Kafka-format partition directory (eos writes Kafka's formats) of TOPIC-0 and TOPIC-1."""
    for p in range(PARTITIONS):
        log = Log.open(str(root / f"{TOPIC}-{p}"), TopicConfig(), now_ms=0)
        log.append_as_leader(encode_batch([b"a", b"b"], timestamps_ms=[1, 2]), now_ms=0)
        if open_transaction and p == 1:
            log.append_as_leader(encode_batch([b"t"], timestamps_ms=[3], producer_id=4, producer_epoch=0,
                                              base_sequence=0, transactional=True), now_ms=0)
        log.close()
    return root


@pytest.mark.parametrize("damage, words", [
    ("crc", "CRC"),
    ("missing partition", "lacks partition"),
    ("open transaction", "transaction open"),
    ("stray file", "cleanly shut down"),
    ("torn index", "entries"),
    ("torn tail", "truncated batch"),
    ("v1 segment", "v1 message set at byte 0 .* v2 segments only"),
])
def test_a_directory_that_does_not_verify_is_refused_and_changes_nothing(tmp_path, damage, words):
    source = _eos_written_dir(tmp_path / "kafka", open_transaction=damage == "open transaction")
    segment = source / f"{TOPIC}-1" / f"{0:020d}.log"
    if damage == "crc":
        data = bytearray(segment.read_bytes())
        data[-1] ^= 0xFF
        segment.write_bytes(bytes(data))
    elif damage == "missing partition":
        shutil.rmtree(source / f"{TOPIC}-0")
    elif damage == "stray file":
        (source / f"{TOPIC}-1" / f"{0:020d}.log.deleted").write_bytes(b"")
    elif damage == "torn index":
        (source / f"{TOPIC}-1" / f"{0:020d}.index").write_bytes(struct.pack(">II", 5, 0) * 2)
    elif damage == "torn tail":         # a crash mid-write: the last batch cut short
        segment.write_bytes(segment.read_bytes()[:-1])
    elif damage == "v1 segment":        # an old Kafka's message set: whole and with good CRCs
        segment.write_bytes(legacy_messages.plain_entries(1, 0, [legacy_messages.Msg(b"k", b"a", 1),
                                                                 legacy_messages.Msg(b"k", b"b", 2)]))
    data_dir = tmp_path / "eos-data"
    data_dir.mkdir()
    (data_dir / "kept").write_text("something of the broker's")
    before = _data_dir_state(data_dir)
    with pytest.raises(AdoptionRefused, match=words):
        adopt_topic(source, TOPIC, data_dir, now_ms=0)
    assert _data_dir_state(data_dir) == before
    assert sorted(p.name for p in data_dir.iterdir()) == sorted(["kept", ".lock"])


def test_adoption_refuses_a_running_broker_and_an_existing_topic(tmp_path, broker_factory):
    source = _eos_written_dir(tmp_path / "kafka")
    data_dir = tmp_path / "eos-data"
    broker = broker_factory(data_dir=data_dir)
    with pytest.raises(StorageError, match="in use by another broker"):
        adopt_topic(source, TOPIC, data_dir, now_ms=0)
    with eos.Admin(broker.address) as admin:
        admin.create_topic(TOPIC, partitions=1)
    broker.stop()
    before = _data_dir_state(data_dir)
    with pytest.raises(AdoptionRefused, match="already exists"):
        adopt_topic(source, TOPIC, data_dir, now_ms=0)
    assert _data_dir_state(data_dir) == before


def test_an_adopted_eos_written_topic_is_served_after_a_restart(tmp_path, broker_factory):
    source = _eos_written_dir(tmp_path / "kafka")
    data_dir = tmp_path / "eos-data"
    data_dir.mkdir()
    adopt_topic(source, TOPIC, data_dir, config={"retention.ms": "-1"}, now_ms=0)
    broker = broker_factory(data_dir=data_dir)
    assert [r[3] for r in _eos_read_committed(broker.address)] == [b"a", b"b", b"a", b"b"]
    with eos.Admin(broker.address) as admin:
        assert admin.describe_topic(TOPIC)["configs"]["retention.ms"] == "-1"
    broker.stop()
    broker.start()
    wait_for(lambda: len(_eos_read_committed(broker.address)) == 4, "the adopted topic after a restart", 30)
