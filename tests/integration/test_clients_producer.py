"""The producer against a real broker process: round trips, partitioning, acks, bulk, threads."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

import eos
from eos.errors import ErrorCode, MessageTooLargeError, UnknownTopicOrPartitionError
from eos.types import TopicPartition
from producer import ProducerClosedError, RecordMetadata
from producer.partitioner import partition_for_key
from tests.waits import wait_for

WAIT_S = 30


def consume_all(address: str, topic: str, partitions: int, expected: int, *,
                isolation_level: str = "read_uncommitted", timeout_s: float = WAIT_S) -> list:
    """Every record of the topic from the beginning, polling until `expected` arrived."""
    with eos.Consumer(address, auto_offset_reset="earliest", isolation_level=isolation_level,
                      fetch_max_wait_ms=100) as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        records = []
        deadline = time.monotonic() + timeout_s
        while len(records) < expected and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=200))
        # anything beyond `expected` (a duplicate) would show up here
        records.extend(consumer.poll(timeout_ms=300))
        return records


def by_partition(records) -> dict[int, list]:
    out: dict[int, list] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r)
    return out


@pytest.fixture
def admin(broker):
    with eos.Admin(broker.address) as admin:
        yield admin


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_over_three_partitions(broker, admin, compression):
    admin.create_topic("rt", partitions=3)
    sent = []
    with eos.Producer(broker.address, compression_type=compression, linger_ms=1) as producer:
        futures = []
        for i in range(600):
            key = None if i % 3 == 0 else b"key-%d" % (i % 17)
            headers = [("n", str(i).encode()), ("none", None)] if i % 5 == 0 else None
            value = None if i == 7 else (b"value-%d-" % i) * (1 + i % 4)
            futures.append(producer.send("rt", value, key=key, headers=headers, timestamp_ms=1_700_000_000_000 + i))
            sent.append((key, value, headers or []))
        metadata = [f.result(WAIT_S) for f in futures]
    assert all(isinstance(m, RecordMetadata) and m.offset >= 0 for m in metadata)
    records = consume_all(broker.address, "rt", 3, len(sent))
    assert len(records) == len(sent)
    got = {(r.partition, r.offset): r for r in records}
    for (key, value, headers), md, i in zip(sent, metadata, range(len(sent))):
        record = got[(md.partition, md.offset)]
        assert (record.key, record.value, record.headers) == (key, value, headers)
        assert record.timestamp == md.timestamp == 1_700_000_000_000 + i
    for recs in by_partition(records).values():
        assert [r.offset for r in recs] == list(range(len(recs)))


def test_keys_land_on_murmur2_partition(broker, admin):
    admin.create_topic("keyed", partitions=5)
    keys = [b"user-%d" % i for i in range(200)]
    with eos.Producer(broker.address) as producer:
        futures = [producer.send("keyed", b"v", key=k) for k in keys]
        partitions = [f.result(WAIT_S).partition for f in futures]
    assert partitions == [partition_for_key(k, 5) for k in keys]
    records = consume_all(broker.address, "keyed", 5, len(keys))
    assert sorted((r.key, r.partition) for r in records) == sorted(zip(keys, partitions))


def test_keyless_records_are_spread_by_sticky_batches(broker, admin):
    admin.create_topic("sticky", partitions=3)
    with eos.Producer(broker.address, batch_size=2000) as producer:
        futures = [producer.send("sticky", b"x" * 100) for _ in range(600)]
        partitions = {f.result(WAIT_S).partition for f in futures}
    assert len(partitions) > 1


def test_ignore_keys_sends_keyed_records_to_the_sticky_partition_not_by_hash(broker, admin):
    admin.create_topic("ignored-keys", partitions=5)
    keys = [b"user-%d" % i for i in range(200)]
    assert len({partition_for_key(k, 5) for k in keys}) == 5      # by hash they would spread
    # One batch that only flush() sends: every record goes to the one sticky partition.
    with eos.Producer(broker.address, partitioner_ignore_keys=True, linger_ms=60_000,
                      batch_size=1024 * 1024) as producer:
        futures = [producer.send("ignored-keys", b"v", key=k) for k in keys]
        producer.flush(WAIT_S)
        partitions = [f.result(WAIT_S).partition for f in futures]
    assert len(set(partitions)) == 1
    records = consume_all(broker.address, "ignored-keys", 5, len(keys))
    assert sorted(r.key for r in records) == sorted(keys)         # the keys are still written
    assert {r.partition for r in records} == set(partitions)


def test_ignore_keys_spreads_one_key_over_partitions_batch_by_batch(broker, admin):
    admin.create_topic("ignored-key", partitions=3)
    with eos.Producer(broker.address, config={"partitioner.ignore.keys": "true"}, batch_size=2000) as producer:
        futures = [producer.send("ignored-key", b"x" * 100, key=b"one-key") for _ in range(600)]
        per_record = {f.result(WAIT_S).partition for f in futures}
        bulk = producer.send_batch("ignored-key", [b"y" * 100] * 20_000, keys=[b"one-key"] * 20_000).result(WAIT_S)
    # By hash every record would be on partition_for_key(b"one-key", 3); sticky moves on
    # with each new batch.
    assert len(per_record) > 1
    assert len({m.partition for m in bulk}) > 1


def test_round_robin_partitioner_puts_record_n_on_the_next_partition(broker, admin):
    admin.create_topic("rr", partitions=4)
    with eos.Producer(broker.address, partitioner_class="org.apache.kafka.clients.producer.RoundRobinPartitioner",
                      linger_ms=20) as producer:
        futures = [producer.send("rr", b"%d" % i, key=b"same-key") for i in range(12)]
        assert [f.result(WAIT_S).partition for f in futures] == [i % 4 for i in range(12)]
        bulk = producer.send_batch("rr", [b"%d" % i for i in range(12, 20)]).result(WAIT_S)
        assert [m.partition for m in bulk] == [i % 4 for i in range(12, 20)]   # the same counter
    records = consume_all(broker.address, "rr", 4, 20)
    assert sorted((int(r.value), r.partition) for r in records) == [(i, i % 4) for i in range(20)]


PARTITIONER_CALLS: list[tuple] = []


def partition_by_value(topic, key, value, partition_count):
    """A user partitioner (also reached by its dotted name): the value's number modulo the
    partition count, so that where each record must land is known."""
    PARTITIONER_CALLS.append((topic, key, value, partition_count))
    return int(value) % partition_count


class ClosablePartitioner:
    closed = 0

    def partition(self, topic, key, value, partition_count):
        return partition_by_value(topic, key, value, partition_count)

    def close(self):
        ClosablePartitioner.closed += 1


@pytest.mark.parametrize("partitioner_class", [
    partition_by_value,
    "tests.integration.test_clients_producer.partition_by_value",
    "tests.integration.test_clients_producer:ClosablePartitioner",
])
def test_a_user_partitioner_chooses_where_records_land(broker, admin, partitioner_class):
    admin.create_topic("chosen", partitions=3)
    PARTITIONER_CALLS.clear()
    ClosablePartitioner.closed = 0
    seen = []

    def key_of(i: int) -> bytes | None:
        return b"k%d" % i if i % 2 else None      # keyed and keyless records alike

    with eos.Producer(broker.address, partitioner_class=partitioner_class) as producer:
        futures = [producer.send("chosen", b"%d" % i, key=key_of(i)) for i in range(30)]
        for i in range(30, 40):
            producer.produce("chosen", b"%d" % i, key=key_of(i),
                             on_delivery=lambda md, exc: seen.append(md.partition))
        bulk = producer.send_batch("chosen", [b"%d" % i for i in range(40, 50)],
                                   keys=[key_of(i) for i in range(40, 50)]).result(WAIT_S)
        # an explicit partition wins: the partitioner is not asked
        explicit = producer.send("chosen", b"51", partition=0).result(WAIT_S)
        assert [f.result(WAIT_S).partition for f in futures] == [i % 3 for i in range(30)]
        producer.flush(WAIT_S)
        assert sorted(seen) == sorted(i % 3 for i in range(30, 40))
        assert [m.partition for m in bulk] == [i % 3 for i in range(40, 50)]
        assert explicit.partition == 0
        assert ClosablePartitioner.closed == 0
    assert PARTITIONER_CALLS == [("chosen", key_of(i), b"%d" % i, 3) for i in range(50)]
    assert ClosablePartitioner.closed == (1 if "ClosablePartitioner" in str(partitioner_class) else 0)
    records = consume_all(broker.address, "chosen", 3, 51)
    assert sorted((int(r.value), r.partition) for r in records) == sorted(
        [(i, i % 3) for i in range(50)] + [(51, 0)])


def test_a_partitioner_answer_out_of_range_raises_from_send(broker, admin):
    admin.create_topic("out-of-range", partitions=2)
    with eos.Producer(broker.address, partitioner_class=lambda topic, key, value, count: count) as producer:
        with pytest.raises(ValueError, match="partitioner.class .* chose partition 2 for topic 'out-of-range'"):
            producer.send("out-of-range", b"x")
        with pytest.raises(ValueError, match="chose partition 2"):
            producer.produce("out-of-range", b"x")
        with pytest.raises(ValueError, match="chose partition 2"):
            producer.send_batch("out-of-range", [b"x", b"y"])
        producer.flush(WAIT_S)
    assert consume_all(broker.address, "out-of-range", 2, 0, timeout_s=1) == []     # nothing was queued


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks(broker, admin, acks):
    admin.create_topic("acks", partitions=2)
    with eos.Producer(broker.address, acks=acks) as producer:
        futures = [producer.send("acks", b"%d" % i, key=b"%d" % i) for i in range(300)]
        producer.flush(WAIT_S)
        assert all(f.done() for f in futures)
        offsets = [f.result().offset for f in futures]
    if acks == 0:
        assert offsets == [-1] * 300        # fire and forget: where it landed is unknown
    else:
        assert all(o >= 0 for o in offsets)
    records = consume_all(broker.address, "acks", 2, 300)
    assert sorted(int(r.value) for r in records) == list(range(300))


@pytest.mark.parametrize("acks", [1, "all"])
def test_bulk_path(broker, admin, acks):
    admin.create_topic("bulk", partitions=3)
    values = [b"%06d" % i + b"x" * 94 for i in range(20_000)]
    with eos.Producer(broker.address, acks=acks) as producer:
        result = producer.send_batch("bulk", values, partition=1).result(WAIT_S)
        assert len(result) == len(values)
        assert [m.offset for m in result] == list(range(20_000))
        assert {m.partition for m in result} == {1}
        keys = [b"k%d" % (i % 50) for i in range(3000)]
        keyed = producer.send_batch("bulk", values[:3000], keys=keys, timestamps_ms=1234).result(WAIT_S)
        assert [m.partition for m in keyed] == [partition_for_key(k, 3) for k in keys]
        assert {m.timestamp for m in keyed} == {1234}
        # bulk batches hold up to 1 MiB: 20,000 records of ~116 bytes make three of them,
        # and each new batch moves to another sticky partition
        sticky = producer.send_batch("bulk", values).result(WAIT_S)
        assert len({m.partition for m in sticky}) > 1
        assert producer.send_batch("bulk", []).result(WAIT_S) == [] or len(producer.send_batch("bulk", []).result()) == 0
    records = consume_all(broker.address, "bulk", 3, 43_000)
    assert len(records) == 43_000
    part1 = [r for r in by_partition(records)[1] if r.key is None]
    assert [r.value for r in part1[:20_000]] == values
    # keyed records keep their call order within each partition
    for partition, recs in by_partition([r for r in records if r.key is not None]).items():
        expected = [(keys[i], values[i]) for i in range(3000) if partition_for_key(keys[i], 3) == partition]
        assert [(r.key, r.value) for r in recs] == expected


def test_callbacks_run_with_metadata(broker, admin):
    admin.create_topic("cb", partitions=1)
    seen = []
    done = threading.Event()
    with eos.Producer(broker.address) as producer:
        futures = [producer.send("cb", b"%d" % i, on_delivery=lambda md, exc: seen.append((md.offset, exc)))
                   for i in range(50)]
        futures[-1].add_done_callback(lambda f: done.set())
        completed, _ = concurrent.futures.wait(futures, timeout=WAIT_S)
        assert len(completed) == 50
        assert done.wait(WAIT_S)
    assert sorted(seen) == [(i, None) for i in range(50)]


def test_produce_returns_nothing_and_reports_through_on_delivery(broker, admin):
    """produce(): confluent-kafka's per-record call. No future; every record's outcome
    reaches on_delivery; what is wrong before sending raises at once and queues nothing."""
    admin.create_topic("produced", partitions=2)
    seen = []
    with eos.Producer(broker.address, max_block_ms=300, max_request_size=10_000) as producer:
        results = [producer.produce("produced", b"%d" % i, key=b"k%d" % (i % 5),
                                    on_delivery=lambda md, exc: seen.append((md.partition, md.offset, exc)))
                   for i in range(200)]
        assert results == [None] * 200
        with pytest.raises(MessageTooLargeError, match="max.request.size"):
            producer.produce("produced", b"x" * 20_000, on_delivery=lambda md, exc: seen.append(exc))
        with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
            producer.produce("no-such-topic", b"x")
        with pytest.raises(ValueError, match="partition"):
            producer.produce("produced", b"x", partition=2)
        producer.flush(WAIT_S)
        assert len(seen) == 200 and all(exc is None and offset >= 0 for _, offset, exc in seen)
    assert sorted(r.value for r in consume_all(broker.address, "produced", 2, 200)) == sorted(
        b"%d" % i for i in range(200))
    assert sorted((p, o) for p, o, _ in seen) == sorted(set((p, o) for p, o, _ in seen))   # one offset each


def test_produce_of_bare_values_shares_an_open_batch_with_keyed_and_headed_records(broker, admin):
    """produce()'s shortest path (a bytes value, nothing else) appends to the topic's open
    sticky batch; a record with headers, or a key under partitioner.ignore.keys, in the same
    batch must keep every record's own key, headers, order, timestamp and callback."""
    admin.create_topic("bare", partitions=1)
    reports: dict[bytes, list] = {}

    def reporter(tag):
        return lambda md, exc: reports.setdefault(tag, []).append((md.offset, md.timestamp, exc))

    before_ms = time.time_ns() // 1_000_000
    # One open batch that only flush() sends.
    with eos.Producer(broker.address, linger_ms=60_000, batch_size=1024 * 1024,
                      partitioner_ignore_keys=True) as producer:
        plan = [(b"a0", None, None, "first"), (b"a1", None, None, "first"), (b"h", None, [("n", b"1")], "first"),
                (b"b0", None, None, "second"), (b"k", b"key", None, "second"), (b"b1", None, None, "first"),
                (b"b2", None, None, None)]
        for value, key, headers, tag in plan:
            producer.produce("bare", value, key=key, headers=headers,
                             on_delivery=None if tag is None else reporter(tag))
        producer.flush(WAIT_S)
        after_ms = time.time_ns() // 1_000_000
        producer.close()
        with pytest.raises(ProducerClosedError):
            producer.produce("bare", b"late")
    records = sorted(consume_all(broker.address, "bare", 1, len(plan)), key=lambda r: r.offset)
    assert [(r.value, r.key, r.headers) for r in records] == [(v, k, h or []) for v, k, h, _ in plan]
    assert all(before_ms <= r.timestamp <= after_ms for r in records)
    assert [r.timestamp for r in records] == sorted(r.timestamp for r in records)
    stamps = {r.offset: r.timestamp for r in records}
    assert sorted(reports) == ["first", "second"]
    assert [offset for offset, _, _ in reports["first"]] == [0, 1, 2, 5]
    assert [offset for offset, _, _ in reports["second"]] == [3, 4]
    assert all(exc is None and stamps[offset] == ts for tag in reports for offset, ts, exc in reports[tag])


def test_produce_of_a_transactional_producer_checks_the_transaction(broker, admin):
    from producer import IllegalStateError
    admin.create_topic("bare-tx", partitions=1)
    with eos.Producer(broker.address, transactional_id="bare-tx") as producer:
        producer.init_transactions()
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            producer.produce("bare-tx", b"x")
        producer.begin_transaction()
        producer.produce("bare-tx", b"y")
        producer.commit_transaction()
    records = consume_all(broker.address, "bare-tx", 1, 1, isolation_level="read_committed")
    assert [r.value for r in records] == [b"y"]


def test_flush_and_close(broker, admin):
    admin.create_topic("fc", partitions=1)
    producer = eos.Producer(broker.address, linger_ms=60_000)   # only flush() sends
    wait_for(lambda: producer.producer_id >= 0, "the producer id", WAIT_S)   # nothing holds sends back
    futures = [producer.send("fc", b"a") for _ in range(10)]
    # Let the sender look at the queue after the records are in it: a drain that starts
    # after the sends (it holds the accumulator lock throughout) must leave the lingering
    # batch queued.
    accumulator = producer._accumulator
    passes = accumulator.drain_passes
    producer._sender.wake()
    wait_for(lambda: accumulator.drain_passes > passes, "the sender to drain once more", WAIT_S)
    assert futures[0]._batch in accumulator.queued_batches()
    assert not any(f.done() for f in futures)
    producer.flush(WAIT_S)
    assert [f.result().offset for f in futures] == list(range(10))
    late = producer.send("fc", b"b")
    producer.close(WAIT_S)                 # close delivers what is queued
    assert late.result(0).offset == 10
    producer.close()                       # idempotent
    with pytest.raises(ProducerClosedError):
        producer.send("fc", b"c")
    with pytest.raises(ProducerClosedError):
        producer.send_batch("fc", [b"c"])


def test_close_with_timeout_fails_what_cannot_be_delivered(broker, admin):
    admin.create_topic("gone", partitions=1)
    producer = eos.Producer(broker.address, acks=1)
    producer.send("gone", b"x").result(WAIT_S)
    broker.kill()
    future = producer.send("gone", b"y")
    producer.close(timeout=1)
    with pytest.raises(Exception) as info:
        future.result(0)
    assert "closed" in str(info.value) or "Expiring" in str(info.value)


def test_producer_shared_by_four_threads_loses_nothing(broker, admin):
    admin.create_topic("shared", partitions=3)
    per_thread = 3000
    with eos.Producer(broker.address) as producer:
        failures = []

        def work(thread_id: int):
            futures = [producer.send("shared", b"%d:%d" % (thread_id, i), key=b"t%d" % thread_id)
                       for i in range(per_thread)]
            failures.extend(f for f in futures if f.exception(WAIT_S) is not None)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT_S * 2)
        assert not failures
    records = consume_all(broker.address, "shared", 3, 4 * per_thread)
    assert len(records) == 4 * per_thread
    for thread_id in range(4):
        mine = [int(r.value.split(b":")[1]) for r in records if r.key == b"t%d" % thread_id]
        assert mine == list(range(per_thread))    # one key, one partition: in send order


def test_errors_come_back_as_failed_futures_or_raise(broker, admin):
    admin.create_topic("small", partitions=2)
    with eos.Producer(broker.address, max_block_ms=300, max_request_size=10_000) as producer:
        missing = producer.send("no-such-topic", b"x")
        with pytest.raises(UnknownTopicOrPartitionError, match="no-such-topic"):
            missing.result(WAIT_S)
        seen = []
        big = producer.send("small", b"x" * 20_000, on_delivery=lambda md, exc: seen.append(exc))
        with pytest.raises(MessageTooLargeError, match="max.request.size"):
            big.result(WAIT_S)
        assert isinstance(seen[0], MessageTooLargeError)
        with pytest.raises(ValueError, match="partition"):
            producer.send("small", b"x", partition=2)
        with pytest.raises(TypeError):
            producer.send("small", 12345)
        assert producer.send("small", "text é").result(WAIT_S).offset >= 0   # str is UTF-8
        assert producer.partitions_for("small") == [0, 1]


def test_topic_created_after_the_producer_started(broker, admin):
    with eos.Producer(broker.address, max_block_ms=20_000) as producer:
        # Record every metadata answer the producer gets, to know when send() has asked
        # for the topic and been told it does not exist yet.
        answers = []
        real_fetch = producer._metadata.fetch

        def recording_fetch(names, *args, **kwargs):
            response = real_fetch(names, *args, **kwargs)
            answers.append({t.name: t.error_code for t in response.topics})
            return response

        producer._metadata.fetch = recording_fetch
        result = {}
        sender = threading.Thread(target=lambda: result.setdefault("f", producer.send("later", b"x")))
        sender.start()
        wait_for(lambda: any(a.get("later", ErrorCode.NONE) != ErrorCode.NONE for a in answers),
                 "send() to be told the topic does not exist", WAIT_S)
        assert sender.is_alive() and "f" not in result     # send() blocks, waiting for the topic
        admin.create_topic("later", partitions=1)
        sender.join(WAIT_S)
        assert not sender.is_alive()
        assert result["f"].result(WAIT_S).offset == 0


def test_transactional_calls_need_a_transactional_producer_and_the_right_state(broker, admin):
    from producer import IllegalStateError
    admin.create_topic("tx-state", partitions=1)
    with eos.Producer(broker.address) as plain:
        with pytest.raises(IllegalStateError, match="transactional_id"):
            plain.begin_transaction()
    with eos.Producer(broker.address, transactional_id="tx-state") as producer:
        with pytest.raises(IllegalStateError, match="UNINITIALIZED"):
            producer.send("tx-state", b"x")
        producer.init_transactions()
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            producer.send("tx-state", b"x")
        with pytest.raises(IllegalStateError, match="READY"):
            producer.commit_transaction()
        assert producer.transaction_state == "READY"
