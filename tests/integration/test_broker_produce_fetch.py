"""Produce, Fetch and ListOffsets over gRPC against a real broker.

Round trips over many partitions and codecs; each kind of bad input refused with its code,
nothing appended and the broker still serving; fetch sizing; the long poll; offsets by
position and by time.
"""
from __future__ import annotations

import struct
import threading
import time

import pytest

from eos.errors import ErrorCode
from eos.records.codec import encode_batch, encode_control_batch, iter_decoded
from eos.records.header import compute_crc
from eos.v1 import broker_pb2, common_pb2


# ---- helpers -------------------------------------------------------------------------------

def create_topic(stub, name, partitions=1, **configs):
    [result] = stub.CreateTopics(broker_pb2.CreateTopicsRequest(topics=[
        broker_pb2.NewTopic(name=name, num_partitions=partitions, configs=configs)]), timeout=30).topics
    assert result.error_code == ErrorCode.NONE, result.error_message


def produce(stub, topic, partition, records, acks=-1):
    [result] = stub.Produce(broker_pb2.ProduceRequest(acks=acks, partitions=[
        broker_pb2.PartitionRecords(topic=topic, partition=partition, records=records)]), timeout=30).partitions
    return result


def fetch(stub, topic, partition, offset, *, max_wait_ms=0, min_bytes=0, max_bytes=0, partition_max_bytes=0,
          isolation=common_pb2.READ_UNCOMMITTED, timeout=30):
    [result] = stub.Fetch(broker_pb2.FetchRequest(
        max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, isolation_level=isolation,
        partitions=[broker_pb2.FetchPartition(topic=topic, partition=partition, fetch_offset=offset,
                                              partition_max_bytes=partition_max_bytes)]),
        timeout=timeout).partitions
    return result


def list_offset(stub, topic, partition, timestamp, isolation=common_pb2.READ_UNCOMMITTED):
    [result] = stub.ListOffsets(broker_pb2.ListOffsetsRequest(isolation_level=isolation, partitions=[
        broker_pb2.ListOffsetsPartition(topic=topic, partition=partition, timestamp=timestamp)]),
        timeout=30).partitions
    return result


def read_values(stub, topic, partition, offset=0):
    """Every value from `offset` to the high watermark, fetching until caught up."""
    values = []
    while True:
        result = fetch(stub, topic, partition, offset)
        assert result.error_code == ErrorCode.NONE, result.error_message
        records = [r for r in iter_decoded(result.records, topic, partition) if r.offset >= offset]
        values += [r.value for r in records]
        if records:
            offset = records[-1].offset + 1
        if offset >= result.high_watermark:
            return values


def with_fixed_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, 17, compute_crc(batch, 0, len(batch)))
    return bytes(batch)


# ---- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_many_partitions(broker, compression):
    stub = broker.broker_stub()
    create_topic(stub, "rt", 6)
    expected = {p: [] for p in range(6)}
    for round_ in range(3):
        request = broker_pb2.ProduceRequest(acks=-1)
        for p in range(6):
            values = [f"p{p}-r{round_}-{i}".encode() * (1 + i % 3) for i in range(50)]
            expected[p] += values
            request.partitions.add(topic="rt", partition=p,
                                   records=encode_batch(values, keys=[b"k%d" % i for i in range(50)],
                                                        compression=compression))
        response = stub.Produce(request, timeout=30)
        assert [(r.partition, r.error_code, r.base_offset) for r in response.partitions] == \
            [(p, ErrorCode.NONE, round_ * 50) for p in range(6)]
        assert all(r.log_append_time_ms == -1 and r.log_start_offset == 0 for r in response.partitions)
    for p in range(6):
        assert read_values(stub, "rt", p) == expected[p]


def test_fetch_many_partitions_in_one_request(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "multi", 4)
    for p in range(4):
        produce(stub, "multi", p, encode_batch([b"x%d" % p]))
    response = stub.Fetch(broker_pb2.FetchRequest(partitions=[
        broker_pb2.FetchPartition(topic="multi", partition=p, fetch_offset=0) for p in range(4)]), timeout=30)
    assert [[r.value for r in iter_decoded(f.records, "multi", f.partition)] for f in response.partitions] == \
        [[b"x0"], [b"x1"], [b"x2"], [b"x3"]]
    assert all(f.high_watermark == 1 and f.last_stable_offset == 1 for f in response.partitions)


def test_acks_zero_one_all(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "acks")
    offsets = [produce(stub, "acks", 0, encode_batch([b"v"]), acks=acks).base_offset for acks in (0, 1, -1)]
    assert offsets == [0, 1, 2]
    assert read_values(stub, "acks", 0) == [b"v"] * 3


def test_log_append_time_topic(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "lat", **{"message.timestamp.type": "LogAppendTime"})
    result = produce(stub, "lat", 0, encode_batch([b"v"], timestamps_ms=[5]))
    assert result.error_code == ErrorCode.NONE and result.log_append_time_ms > 5
    [record] = iter_decoded(fetch(stub, "lat", 0, 0).records, "lat", 0)
    assert record.timestamp == result.log_append_time_ms


# ---- bad input: refused, nothing appended, still serving -----------------------------------

def _good():
    return bytearray(encode_batch([b"a", b"b", b"c"]))


def _bad_crc():
    batch = _good()
    batch[-1] ^= 0xFF
    return bytes(batch)


def _bad_magic():
    batch = _good()
    batch[16] = 3           # no such format: Kafka's reader calls it corrupt
    return bytes(batch)


def _legacy_magic():
    batch = _good()
    batch[16] = 1           # a v1 message set: Kafka 4 refuses to produce it (INVALID_RECORD)
    return bytes(batch)


def _count_mismatch():
    batch = _good()
    struct.pack_into(">i", batch, 57, 7)  # recordsCount 7, lastOffsetDelta says 3 records
    return with_fixed_crc(batch)


def _length(value):
    def make():
        batch = _good()
        struct.pack_into(">i", batch, 8, value)
        return bytes(batch)
    return make


def _trailing_garbage():
    return bytes(_good()) + b"\x00\x01\x02"


def _attributes(value):
    """A good batch whose attributes claim a codec its body is not in (or none at all)."""
    def make():
        batch = _good()
        struct.pack_into(">h", batch, 21, value)
        return with_fixed_crc(batch)
    return make


def _body(fill):
    """A good batch whose records section is rewritten by `fill`, with a valid CRC."""
    def make():
        batch = _good()
        batch[61:] = fill(bytes(batch[61:]))
        return with_fixed_crc(batch)
    return make


def _gzip_of_noise():
    import gzip
    batch = bytearray(encode_batch([b"a", b"b", b"c"]))
    noise = gzip.compress(bytes(range(256)) * 4)
    batch[61:] = noise
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">h", batch, 21, 1)
    return with_fixed_crc(batch)


def _control_batch():
    return encode_control_batch(committed=True, producer_id=1, producer_epoch=0, coordinator_epoch=0,
                                timestamp_ms=1)


BAD_INPUTS = {
    "wrong CRC": (_bad_crc, ErrorCode.CORRUPT_MESSAGE, "CRC"),
    "bad magic": (_bad_magic, ErrorCode.CORRUPT_MESSAGE, "magic"),
    "legacy magic": (_legacy_magic, ErrorCode.INVALID_RECORD, "magic version 2"),
    "truncated": (lambda: bytes(_good())[:-5], ErrorCode.CORRUPT_MESSAGE, "truncated"),
    "header only half there": (lambda: bytes(_good())[:30], ErrorCode.CORRUPT_MESSAGE, "truncated"),
    "trailing garbage": (_trailing_garbage, ErrorCode.CORRUPT_MESSAGE, "truncated"),
    "negative length": (_length(-1), ErrorCode.CORRUPT_MESSAGE, "length"),
    "absurd length": (_length(2**31 - 1), ErrorCode.CORRUPT_MESSAGE, "length"),
    "record count does not add up": (_count_mismatch, ErrorCode.INVALID_RECORD, "recordsCount"),
    "empty": (lambda: b"", ErrorCode.INVALID_RECORD, "no record batches"),
    "control batch from a client": (_control_batch, ErrorCode.INVALID_RECORD, "control"),
    "over max.message.bytes": (lambda: encode_batch([b"x" * 3000]), ErrorCode.MESSAGE_TOO_LARGE,
                               "max.message.bytes"),
    # a good CRC over a body that is not records: stored, it stopped every consumer of the
    # partition (found by an exploratory run; Kafka parses each record and refuses)
    "gzip flag over plain records": (_attributes(1), ErrorCode.CORRUPT_MESSAGE, "gzip"),
    "zstd flag over plain records": (_attributes(4), ErrorCode.CORRUPT_MESSAGE, "zstd"),
    "unknown codec 7": (_attributes(7), ErrorCode.CORRUPT_MESSAGE, "codec"),
    "records section zeroed": (_body(lambda b: bytes(len(b))), ErrorCode.CORRUPT_MESSAGE, "record 0"),
    "records section of 0xff": (_body(lambda b: b"\xff" * len(b)), ErrorCode.CORRUPT_MESSAGE, "batch"),
    "a record longer than the batch": (_body(lambda b: b"\x7e" + b[1:]), ErrorCode.CORRUPT_MESSAGE, "record 0"),
    "gzip of noise": (_gzip_of_noise, ErrorCode.CORRUPT_MESSAGE, "record"),
}


@pytest.mark.parametrize("kind", list(BAD_INPUTS))
def test_bad_input_is_refused_and_changes_nothing(broker, kind):
    make, code, words = BAD_INPUTS[kind]
    stub = broker.broker_stub()
    create_topic(stub, "t", 2, **{"max.message.bytes": "2048"})
    assert produce(stub, "t", 0, encode_batch([b"before"])).error_code == ErrorCode.NONE

    response = stub.Produce(broker_pb2.ProduceRequest(acks=-1, partitions=[
        broker_pb2.PartitionRecords(topic="t", partition=0, records=make()),
        broker_pb2.PartitionRecords(topic="t", partition=1, records=encode_batch([b"neighbour"]))]), timeout=30)
    bad, neighbour = response.partitions
    assert bad.error_code == code, bad.error_message
    assert words in bad.error_message
    assert bad.base_offset == -1
    assert neighbour.error_code == ErrorCode.NONE  # only the bad partition is refused

    assert list_offset(stub, "t", 0, -1).offset == 1
    assert produce(stub, "t", 0, encode_batch([b"after"])).base_offset == 1
    assert read_values(stub, "t", 0) == [b"before", b"after"]


def test_a_clients_produce_to_an_internal_topic_is_refused(broker):
    # Kafka refuses it to every client but its admin client id: one stray keyed record in
    # __transaction_state made every later load of the partition fail (the broker's own
    # coordinators write there without a Produce).
    import eos
    stub = broker.broker_stub()
    producer = eos.Producer(bootstrap=broker.address, transactional_id="internal-check")
    producer.init_transactions()          # __transaction_state exists, with records
    end_before = [list_offset(stub, "__transaction_state", p, -1).offset for p in range(50)]
    for topic in ("__transaction_state", "__consumer_offsets"):
        result = produce(stub, topic, 0, encode_batch([b"junk"], keys=[b"junk key"]))
        assert result.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION, result.error_message
        assert "internal topic" in result.error_message and result.base_offset == -1
    assert [list_offset(stub, "__transaction_state", p, -1).offset for p in range(50)] == end_before
    create_topic(stub, "after")
    producer.begin_transaction()          # the coordinator still answers
    producer.send("after", value=b"committed")
    producer.commit_transaction()
    producer.close()
    # the record and its COMMIT marker, written by the coordinator
    assert list_offset(stub, "after", 0, -1, common_pb2.READ_COMMITTED).offset == 2


def test_unknown_topic_partition_and_bad_acks(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t", 2)
    for topic, partition in (("missing", 0), ("t", 2), ("t", -1)):
        result = produce(stub, topic, partition, encode_batch([b"x"]))
        assert result.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, result.error_message
        assert fetch(stub, topic, partition, 0).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert list_offset(stub, topic, partition, -1).error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    for acks in (2, -2, 5):
        result = produce(stub, "t", 0, encode_batch([b"x"]), acks=acks)
        assert result.error_code == ErrorCode.INVALID_REQUIRED_ACKS and str(acks) in result.error_message
    assert list_offset(stub, "t", 0, -1).offset == 0
    # the topic was not invented by the produce to "missing"
    [missing] = stub.Metadata(broker_pb2.MetadataRequest(topics=["missing"]), timeout=30).topics
    assert missing.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_acks_all_with_min_insync_replicas_above_one(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "strict", **{"min.insync.replicas": "2"})
    assert produce(stub, "strict", 0, encode_batch([b"x"]), acks=-1).error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert produce(stub, "strict", 0, encode_batch([b"x"]), acks=1).base_offset == 0


def test_fetch_offset_out_of_range(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t")
    produce(stub, "t", 0, encode_batch([b"a", b"b"]))
    at_end = fetch(stub, "t", 0, 2)
    assert at_end.error_code == ErrorCode.NONE and at_end.records == b""
    for offset in (3, -1, 10**12):
        result = fetch(stub, "t", 0, offset)
        assert result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE, offset
        assert str(offset) in result.error_message
        assert (result.log_start_offset, result.high_watermark) == (0, 2)


def test_request_over_socket_request_max_bytes_is_refused(inprocess_broker_factory):
    import grpc
    handle = inprocess_broker_factory(config={"socket.request.max.bytes": "65536"})
    stub = handle.broker_stub()
    create_topic(stub, "t")
    with pytest.raises(grpc.RpcError) as info:
        produce(stub, "t", 0, encode_batch([b"x" * 100_000]))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert produce(stub, "t", 0, encode_batch([b"small"])).base_offset == 0


# ---- fetch sizing ------------------------------------------------------------------------------

def test_fetch_sizes(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "t", 2)
    batches = [encode_batch([bytes([i]) * 1000]) for i in range(5)]
    for batch in batches:
        for p in (0, 1):
            produce(stub, "t", p, batch)
    size = len(batches[0])
    # partition_max_bytes smaller than one batch: the first batch still comes back whole
    assert len(fetch(stub, "t", 0, 0, partition_max_bytes=10).records) == size
    assert len(fetch(stub, "t", 0, 0, partition_max_bytes=2 * size + 10).records) == 2 * size
    # max_bytes over the request: the second partition gets what is left, at batch granularity
    response = stub.Fetch(broker_pb2.FetchRequest(max_bytes=3 * size, partitions=[
        broker_pb2.FetchPartition(topic="t", partition=p, fetch_offset=0, partition_max_bytes=2 * size)
        for p in (0, 1)]), timeout=30)
    assert [len(f.records) for f in response.partitions] == [2 * size, size]
    # fetching from the middle of the log returns the batch holding that offset onwards
    records = list(iter_decoded(fetch(stub, "t", 1, 3).records, "t", 1))
    assert [r.offset for r in records] == [3, 4]


# ---- long poll ------------------------------------------------------------------------------

def _wait_until_parked(handle, count=1):
    """Bounded wait until `count` fetches sit in the broker's purgatory."""
    deadline = time.monotonic() + 20
    while handle.server.fetch_waiter_count < count:
        assert time.monotonic() < deadline, "the fetch never started waiting"
        time.sleep(0.01)


@pytest.mark.parametrize("data_partition", [0, 1])
def test_long_poll_returns_data_produced_after_it_started(inprocess_broker, data_partition):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "lp", 2)
    results = []
    # The poll may wait 30 s but the client gives up after 15: only a poll woken by the
    # append answers in time (an expiring one would re-read and find the data too, late).
    request = broker_pb2.FetchRequest(max_wait_ms=30000, min_bytes=1, partitions=[
        broker_pb2.FetchPartition(topic="lp", partition=p, fetch_offset=0) for p in (0, 1)])
    fetcher = threading.Thread(target=lambda: results.append(stub.Fetch(request, timeout=15)))
    fetcher.start()
    _wait_until_parked(inprocess_broker)  # the fetch found nothing and is waiting
    assert produce(stub, "lp", data_partition, encode_batch([b"arrived"])).error_code == ErrorCode.NONE
    fetcher.join(60)
    assert not fetcher.is_alive()
    [response] = results
    values = {f.partition: [r.value for r in iter_decoded(f.records, "lp", f.partition)]
              for f in response.partitions}
    assert values == {data_partition: [b"arrived"], 1 - data_partition: []}
    assert inprocess_broker.server.fetch_waiter_count == 0


def test_long_poll_across_processes(broker):
    """The same against a broker subprocess; the produce may land before or while the
    fetch waits, and either way the fetch must come back with it, not empty."""
    stub = broker.broker_stub()
    create_topic(stub, "lp")
    results = []
    fetcher = threading.Thread(target=lambda: results.append(
        fetch(stub, "lp", 0, 0, max_wait_ms=25000, min_bytes=1, timeout=60)))
    fetcher.start()
    assert produce(broker.broker_stub(), "lp", 0, encode_batch([b"arrived"])).error_code == ErrorCode.NONE
    fetcher.join(60)
    [result] = results
    assert [r.value for r in iter_decoded(result.records, "lp", 0)] == [b"arrived"]


def test_shutdown_answers_parked_long_polls(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "lp")
    results = []
    fetcher = threading.Thread(target=lambda: results.append(
        fetch(stub, "lp", 0, 0, max_wait_ms=25000, min_bytes=1, timeout=60)))
    fetcher.start()
    _wait_until_parked(inprocess_broker)
    inprocess_broker.server.stop()
    fetcher.join(60)
    # answered normally (empty), not cancelled at the end of the stop grace period
    [result] = results
    assert result.error_code == ErrorCode.NONE and result.records == b""


def test_long_poll_expires_empty_and_min_bytes_zero_answers_at_once(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "lp")
    result = fetch(stub, "lp", 0, 0, max_wait_ms=50, min_bytes=1)
    assert result.error_code == ErrorCode.NONE and result.records == b""
    assert fetch(stub, "lp", 0, 0, max_wait_ms=25000, min_bytes=0).records == b""


def test_long_poll_on_an_error_answers_at_once(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "lp")
    result = fetch(stub, "lp", 0, 99, max_wait_ms=25000, min_bytes=1, timeout=10)
    assert result.error_code == ErrorCode.OFFSET_OUT_OF_RANGE


# ---- ListOffsets ----------------------------------------------------------------------------

def test_list_offsets(inprocess_broker):
    stub = inprocess_broker.broker_stub()
    create_topic(stub, "lo")
    empty = [list_offset(stub, "lo", 0, ts).offset for ts in (-2, -1, -3, 0)]
    assert empty == [0, 0, -1, -1]
    produce(stub, "lo", 0, encode_batch([b"a", b"b"], timestamps_ms=[1000, 2000]))
    produce(stub, "lo", 0, encode_batch([b"c", b"d"], timestamps_ms=[3000, 2500]))
    produce(stub, "lo", 0, encode_batch([b"e"], timestamps_ms=[2800]))
    assert list_offset(stub, "lo", 0, -2).offset == 0
    assert list_offset(stub, "lo", 0, -1).offset == 5
    assert list_offset(stub, "lo", 0, -1, common_pb2.READ_COMMITTED).offset == 5
    by_time = {ts: (r.offset, r.timestamp) for ts in (0, 1000, 1500, 2000, 2600, 3000)
               for r in [list_offset(stub, "lo", 0, ts)]}
    assert by_time == {0: (0, 1000), 1000: (0, 1000), 1500: (1, 2000), 2000: (1, 2000),
                       2600: (2, 3000), 3000: (2, 3000)}
    assert (list_offset(stub, "lo", 0, 3001).offset, list_offset(stub, "lo", 0, 3001).timestamp) == (-1, -1)
    max_ts = list_offset(stub, "lo", 0, -3)
    assert (max_ts.offset, max_ts.timestamp) == (2, 3000)
    bad = list_offset(stub, "lo", 0, -9)
    assert bad.error_code == ErrorCode.INVALID_REQUEST and "-9" in bad.error_message


# ---- compression.type: the topic's codec, not the producer's --------------------------------

def test_topic_and_broker_compression_type_recompress_on_append(broker_factory):
    import eos
    from eos.records import compression
    from eos.records.header import iter_headers
    broker = broker_factory({"compression.type": "lz4"})          # the broker's default
    stub = broker.broker_stub()
    create_topic(stub, "zstd_topic", **{"compression.type": "zstd"})
    create_topic(stub, "default_topic")
    create_topic(stub, "kept", **{"compression.type": "producer"})
    sent = [f"order-{i}".encode() * 20 for i in range(200)]
    with eos.Producer(broker.address, compression_type="gzip", enable_idempotence=True, linger_ms=5) as producer:
        offsets = {topic: [producer.send(topic, value, partition=0) for value in sent]
                   for topic in ("zstd_topic", "default_topic", "kept")}
        offsets = {topic: [f.result(30).offset for f in futures] for topic, futures in offsets.items()}
    for topic, codec in (("zstd_topic", compression.ZSTD), ("default_topic", compression.LZ4),
                         ("kept", compression.GZIP)):
        result = fetch(stub, topic, 0, 0, max_bytes=1 << 24, partition_max_bytes=1 << 24)
        headers = list(iter_headers(result.records))
        assert headers and {h.compression for h in headers} == {codec}, topic
        assert all(h.producer_id >= 0 for h in headers)              # idempotent batches stay so
        records = list(iter_decoded(result.records, topic, 0))
        assert [r.value for r in records] == sent
        assert [r.offset for r in records] == offsets[topic] == list(range(len(sent)))
