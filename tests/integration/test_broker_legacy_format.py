"""A real broker serving a partition an old Kafka wrote (v0/v1 message sets, then v2 batches):
Fetch answers v2 batches with the same offsets, keys, values and timestamps, the consumer
reads them, and producing a v0/v1 message set is refused with Kafka 4's INVALID_RECORD and
changes nothing."""
from __future__ import annotations

import time

import eos
from eos import TopicPartition
from eos.errors import ErrorCode
from eos.records.header import iter_headers
from tests.integration.test_broker_produce_fetch import create_topic, fetch, list_offset, produce
from tests.legacy_messages import GZIP, LZ4, NONE, SNAPPY
from tests.unit.test_storage_legacy import legacy_run, msgs, old_kafka_partition, rows_of

LATEST = -1
WAIT_S = 30


def test_a_broker_serves_an_old_kafka_partition_as_v2(broker_factory):
    broker = broker_factory()
    create_topic(broker.broker_stub(), "old", 1)
    broker.stop()
    directory = broker.data_dir / "old-0"
    for path in directory.iterdir():          # the new topic's empty segment and indexes
        if path.suffix in (".log", ".index", ".timeindex", ".snapshot"):
            path.unlink()
    rows = old_kafka_partition(directory)      # v0 segment, v1 segment, v1-then-v2 segment
    broker.start()
    stub = broker.broker_stub()
    end = rows[-1][0] + 1
    assert list_offset(stub, "old", 0, LATEST).offset == end

    fetched, offset = b"", 0
    while offset < end:
        result = fetch(stub, "old", 0, offset, partition_max_bytes=300)
        assert result.error_code == ErrorCode.NONE, result.error_message
        headers = list(iter_headers(result.records))
        assert headers and {h.magic for h in headers} == {2}
        fetched += result.records
        offset = headers[-1].next_offset
    assert rows_of(fetched) == rows

    with eos.Consumer(broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("old", 0)])
        records = []
        deadline = time.monotonic() + WAIT_S
        while len(records) < len(rows) and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=200))
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [row[:4] for row in rows]

    # producing a v0/v1 message set: Kafka 4's answer, nothing appended
    for magic in (0, 1):
        for codec in (NONE, GZIP, SNAPPY, LZ4):
            refused = produce(stub, "old", 0, legacy_run(magic, codec, 0, msgs(2, "p")))
            assert refused.error_code == ErrorCode.INVALID_RECORD, refused.error_message
            assert "magic version 2" in refused.error_message
    assert list_offset(stub, "old", 0, LATEST).offset == end
    # v2 goes on after the old data
    with eos.Producer(broker.address) as producer:
        assert producer.send("old", b"new", partition=0).result(WAIT_S).offset == end
    result = fetch(stub, "old", 0, end)
    assert [r[2] for r in rows_of(result.records)] == [b"new"]
