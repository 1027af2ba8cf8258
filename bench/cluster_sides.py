"""The two 3-broker clusters `python -m bench.cluster` measures, behind one small interface.

Theory of operation
-------------------
`EosSide` and `KafkaSide` start, administer and stop one cluster each (eos: ZooKeeper and
three broker processes, `eos.local_cluster`; Kafka: three KRaft nodes,
`bench.kafka_cluster`), and make the clients the figures use: producers, consumers, a
transactional producer (`EosTxn`, `KafkaTxn`), the broker that coordinates a transactional
id, the transactional copier (`eos_copy`, `kafka_copy`). The figures in `bench.cluster`
call only this interface, so each runs the same steps on
both systems. Both sides run at the same session timeout, SESSION_TIMEOUT_MS.
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

SESSION_TIMEOUT_MS = 6000


# ---- the two systems behind one small interface -------------------------------------------------

class EosSide:
    name = "eos"

    def __init__(self, tmp_dir: str):
        from eos.local_cluster import LocalCluster
        self.cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="eos-bench-cluster-", dir=tmp_dir)), brokers=3,
                                    broker_config={"zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
                                                   "min.insync.replicas": "2",
                                                   "controlled.shutdown.retry.backoff.ms": "500"})

    def start(self):
        self.cluster.start()
        import eos
        self.admin = eos.Admin(bootstrap=self.cluster.bootstrap)

    def stop(self):
        try:
            self.admin.close()
        finally:
            self.cluster.stop()

    @property
    def bootstrap(self):
        return self.cluster.bootstrap

    def brokers(self):
        return sorted(self.cluster.processes)

    def create(self, topic, partitions, rf, config=None):
        self.admin.create_topic(topic, partitions=partitions, replication_factor=rf, config=config or {})

    def partitions(self, topic, broker=None):
        from eos.errors import UnknownTopicOrPartitionError
        try:
            if broker is None:
                return self.admin.describe_topic(topic)["partitions"]
            import eos
            with eos.Admin(bootstrap=self.cluster.processes[broker].address) as one:
                return one.describe_topic(topic)["partitions"]
        except UnknownTopicOrPartitionError:
            return []     # not (yet) in that broker's metadata

    def pid(self, broker):
        return self.cluster.processes[broker].process.pid

    def wait_exit(self, broker):
        self.cluster.processes[broker].process.wait(120)

    def restart(self, broker):
        self.cluster.restart(broker)
        self.cluster.wait_ready(brokers={broker})

    def producer(self, on_ack):
        import eos
        producer = eos.Producer(bootstrap=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=0,
                                delivery_timeout_ms=120_000)

        def send(topic, value):
            future = producer.send(topic, value=value, partition=0)
            future.add_done_callback(lambda f: on_ack(value, f.exception()))
        return send, (lambda: None), (lambda: (producer.flush(120), producer.close()))

    def read_values(self, topic, expected):
        import eos
        consumer = eos.Consumer(bootstrap=self.bootstrap, group_id=None, isolation_level="read_committed")
        consumer.assign([eos.TopicPartition(topic, 0)])
        consumer.seek(eos.TopicPartition(topic, 0), 0)
        values = []
        deadline = time.monotonic() + 60
        while len(values) < expected and time.monotonic() < deadline:
            values.extend(r.value for r in consumer.poll(timeout_ms=500))
        consumer.close()
        return values

    def per_record_produce(self, topic, count, value):
        import eos
        producer = eos.Producer(bootstrap=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
        started = time.perf_counter()
        for _ in range(count):
            producer.send(topic, value=value, partition=0)
        producer.flush(300)
        elapsed = time.perf_counter() - started
        producer.close()
        return elapsed

    def consume_count(self, topic, count):
        import eos
        consumer = eos.Consumer(bootstrap=self.bootstrap, group_id=None, isolation_level="read_committed")
        consumer.assign([eos.TopicPartition(topic, 0)])
        consumer.seek(eos.TopicPartition(topic, 0), 0)
        seen = 0
        started = time.perf_counter()
        deadline = time.monotonic() + 300
        while seen < count and time.monotonic() < deadline:
            seen += len(consumer.poll(timeout_ms=500))
        elapsed = time.perf_counter() - started
        consumer.close()
        return seen, elapsed

    def tail(self, topic, count, stop):
        import eos
        consumer = eos.Consumer(bootstrap=self.bootstrap, group_id=None, isolation_level="read_committed",
                                fetch_max_wait_ms=100)
        consumer.assign([eos.TopicPartition(topic, 0)])
        consumer.seek(eos.TopicPartition(topic, 0), 0)
        seen = 0
        deadline = time.monotonic() + 120
        while seen < count and not stop.is_set() and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=100)
            now = time.perf_counter()
            for r in records:
                seen += 1
                yield r.value, now
        consumer.close()

    def txn(self, transactional_id):
        return EosTxn(self.bootstrap, transactional_id)

    def txn_coordinator(self, transactional_id):
        return eos_txn_coordinator(self, transactional_id)

    def copy(self, source, sink, group, count):
        return eos_copy(self, source, sink, group, count)

    def bulk_produce(self, topic, count, value):
        import eos
        producer = eos.Producer(bootstrap=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
        started = time.perf_counter()
        chunk = 10_000
        for start in range(0, count, chunk):
            producer.send_batch(topic, [value] * min(chunk, count - start), partition=0)
        producer.flush(300)
        elapsed = time.perf_counter() - started
        producer.close()
        return elapsed


class KafkaSide:
    name = "kafka"

    def __init__(self, tmp_dir: str):
        from bench.kafka import resolve_kafka
        from bench.kafka_cluster import KafkaCluster
        self.cluster = KafkaCluster(resolve_kafka(os.environ.get("EOS_BENCH_KAFKA_VERSION", "latest")), brokers=3,
                                    base_dir=tmp_dir, session_timeout_ms=SESSION_TIMEOUT_MS)

    def start(self):
        from confluent_kafka.admin import AdminClient
        self.cluster.start()
        self.admin = AdminClient({"bootstrap.servers": self.cluster.bootstrap, "log_level": 0})

    def stop(self):
        self.cluster.stop(keep_files=True)     # main() removes every side's files at the end

    @property
    def bootstrap(self):
        return self.cluster.bootstrap

    def brokers(self):
        return self.cluster.node_ids

    def create(self, topic, partitions, rf, config=None):
        from confluent_kafka.admin import NewTopic
        futures = self.admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=rf,
                                                     config=config or {})], operation_timeout=60)
        futures[topic].result(timeout=120)

    def partitions(self, topic, broker=None):
        from confluent_kafka.admin import AdminClient
        admin = self.admin if broker is None else AdminClient(
            {"bootstrap.servers": self.cluster.address(broker), "log_level": 0})
        meta = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        return [{"partition": p.id, "leader": p.leader, "replicas": list(p.replicas), "isr": list(p.isrs)}
                for p in sorted(meta.partitions.values(), key=lambda p: p.id)]

    def pid(self, broker):
        return self.cluster.pid(broker)

    def wait_exit(self, broker):
        self.cluster.procs[broker].wait(120)

    def restart(self, broker):
        self.cluster.restart(broker)

    def producer(self, on_ack):
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 0, "delivery.timeout.ms": 120_000})

        def send(topic, value):
            producer.produce(topic, value=value, partition=0, on_delivery=lambda err, msg: on_ack(value, err))
            producer.poll(0)
        return send, (lambda: producer.poll(0)), (lambda: producer.flush(120))

    def read_values(self, topic, expected):
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-{time.time_ns()}",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        values = []
        deadline = time.monotonic() + 60
        while len(values) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is None:
                    values.append(message.value())
        consumer.close()
        return values

    def per_record_produce(self, topic, count, value):
        return self.bulk_produce(topic, count, value)    # librdkafka has no bulk call: the same loop

    def tail(self, topic, count, stop):
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-{time.time_ns()}",
                             "enable.auto.commit": False, "isolation.level": "read_committed",
                             "fetch.wait.max.ms": 100})
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        deadline = time.monotonic() + 120
        while seen < count and not stop.is_set() and time.monotonic() < deadline:
            messages = consumer.consume(1000, timeout=0.1)
            now = time.perf_counter()
            for m in messages:
                if m.error() is None:
                    seen += 1
                    yield m.value(), now
        consumer.close()

    def consume_count(self, topic, count):
        from confluent_kafka import Consumer, TopicPartition
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"bench-{time.time_ns()}",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        consumer.assign([TopicPartition(topic, 0, 0)])
        seen = 0
        started = time.perf_counter()
        deadline = time.monotonic() + 300
        while seen < count and time.monotonic() < deadline:
            seen += sum(1 for m in consumer.consume(10_000, timeout=0.5) if m.error() is None)
        elapsed = time.perf_counter() - started
        consumer.close()
        return seen, elapsed

    def txn(self, transactional_id):
        return KafkaTxn(self.bootstrap, transactional_id)

    def txn_coordinator(self, transactional_id):
        return kafka_txn_coordinator(self, transactional_id)

    def copy(self, source, sink, group, count):
        return kafka_copy(self, source, sink, group, count)

    def bulk_produce(self, topic, count, value):
        from confluent_kafka import Producer
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
        started = time.perf_counter()
        for _ in range(count):
            while True:
                try:
                    producer.produce(topic, value=value, partition=0)
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(300)
        return time.perf_counter() - started


# ---- transactional clients of the two systems ---------------------------------------------------

class EosTxn:
    """One transactional producer of eos behind the interface the transaction figures use."""

    def __init__(self, bootstrap: str, transactional_id: str):
        import eos
        self.producer = eos.Producer(bootstrap=bootstrap, transactional_id=transactional_id, linger_ms=5,
                                     delivery_timeout_ms=120_000)
        self.producer.init_transactions(timeout=120)

    def one_record(self, topic: str, value: bytes) -> float:
        """A transaction of one record; returns the commit call's seconds (raises on failure)."""
        self.producer.begin_transaction()
        try:
            self.producer.send(topic, value=value, partition=0)
            started = time.perf_counter()
            self.producer.commit_transaction(timeout=120)
            return time.perf_counter() - started
        except Exception:
            self._abort()
            raise

    def _abort(self):
        try:
            self.producer.abort_transaction(timeout=120)
        except Exception:
            pass

    def close(self):
        self.producer.close()


class KafkaTxn:
    """The same with librdkafka's transactional producer."""

    def __init__(self, bootstrap: str, transactional_id: str):
        from confluent_kafka import Producer
        self.producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                                  "linger.ms": 5, "transaction.timeout.ms": 60_000, "log_level": 0})
        self.producer.init_transactions(120)

    def one_record(self, topic: str, value: bytes) -> float:
        from confluent_kafka import KafkaException
        self.producer.begin_transaction()
        self.producer.produce(topic, value=value, partition=0)
        started = time.perf_counter()
        while True:
            try:
                self.producer.commit_transaction(120)
                return time.perf_counter() - started
            except KafkaException as exc:
                error = exc.args[0]
                if error.retriable():
                    continue
                if error.txn_requires_abort():
                    self.producer.abort_transaction(120)
                raise

    def close(self):
        self.producer.flush(10)


def _java_string_hash(text: str) -> int:
    """Java's String.hashCode (over UTF-16 code units), as an unsigned 32-bit value."""
    data = text.encode("utf-16-be")
    value = 0
    for i in range(0, len(data), 2):
        value = (31 * value + (data[i] << 8 | data[i + 1])) & 0xFFFFFFFF
    return value


def eos_txn_coordinator(side, transactional_id: str) -> int:
    from eos.net import ClusterMetadata
    metadata = ClusterMetadata(side.bootstrap)
    try:
        address = metadata.coordinator_address(transactional_id, 30.0)
    finally:
        metadata.close()
    return next(b for b, p in side.cluster.processes.items() if p.address == address)


def kafka_txn_coordinator(side, transactional_id: str) -> int:
    """Kafka's rule: Utils.abs(transactionalId.hashCode) % 50, and that partition's leader."""
    partition = (_java_string_hash(transactional_id) & 0x7FFFFFFF) % 50
    return side.partitions("__transaction_state")[partition]["leader"]


# ---- the transactional copier of each side ------------------------------------------------------

COPIER_TXN_RECORDS = 5000
COPIER_TXN_S = 0.1


def _copy_loop(count: int, poll, commit) -> float:
    """The copier's loop: transactions of up to COPIER_TXN_RECORDS records or COPIER_TXN_S."""
    copied = 0
    started = time.perf_counter()
    deadline = time.monotonic() + 600
    while copied < count and time.monotonic() < deadline:
        in_txn, offset = 0, None
        txn_end = time.perf_counter() + COPIER_TXN_S
        while time.perf_counter() < txn_end and in_txn < COPIER_TXN_RECORDS and copied + in_txn < count:
            got, next_offset = poll()
            if got:
                in_txn += got
                offset = next_offset
        if offset is not None:
            commit(offset)
            copied += in_txn
    return time.perf_counter() - started


def eos_copy(side, source: str, sink: str, group: str, count: int) -> tuple[float, int]:
    import eos
    consumer = eos.Consumer(bootstrap=side.bootstrap, group_id=group, isolation_level="read_committed",
                            auto_offset_reset="earliest")
    tp = eos.TopicPartition(source, 0)
    consumer.assign([tp])
    producer = eos.Producer(bootstrap=side.bootstrap, transactional_id=f"copier-{source}", linger_ms=5)
    producer.init_transactions(timeout=120)
    in_txn = [False]

    def poll():
        batch = consumer.poll(timeout_ms=100, max_records=1000)
        if not batch:
            return 0, None
        if not in_txn[0]:
            producer.begin_transaction()
            in_txn[0] = True
        producer.send_batch(sink, [r.value for r in batch], partition=0)
        return len(batch), batch[-1].offset + 1

    def commit(offset):
        producer.send_offsets_to_transaction({tp: offset}, consumer.group_metadata(), 120)
        producer.commit_transaction(timeout=120)
        in_txn[0] = False
    try:
        elapsed = _copy_loop(count, poll, commit)
        return elapsed, consumer.committed([tp])[tp]
    finally:
        producer.close()
        consumer.close()


def kafka_copy(side, source: str, sink: str, group: str, count: int) -> tuple[float, int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    consumer = Consumer({"bootstrap.servers": side.bootstrap, "group.id": group, "enable.auto.commit": False,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(source, 0, OFFSET_BEGINNING)])
    producer = Producer({"bootstrap.servers": side.bootstrap, "transactional.id": f"copier-{source}",
                         "linger.ms": 5, "log_level": 0})
    producer.init_transactions(120)
    in_txn = [False]

    def poll():
        batch = [m for m in consumer.consume(num_messages=1000, timeout=0.1) if m.error() is None]
        if not batch:
            return 0, None
        if not in_txn[0]:
            producer.begin_transaction()
            in_txn[0] = True
        producer.produce_batch(sink, [{"value": m.value(), "partition": 0} for m in batch])
        producer.poll(0)
        return len(batch), batch[-1].offset() + 1

    def commit(offset):
        producer.send_offsets_to_transaction([TopicPartition(source, 0, offset)],
                                             consumer.consumer_group_metadata(), 120)
        producer.commit_transaction(120)
        in_txn[0] = False
    try:
        elapsed = _copy_loop(count, poll, commit)
        return elapsed, consumer.committed([TopicPartition(source, 0)], timeout=30)[0].offset
    finally:
        producer.flush(30)
        consumer.close()
