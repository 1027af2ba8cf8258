"""Compaction in a running broker: `__consumer_offsets` is compacted, so a broker that has
stored a million offset commits replays about as much at start as one that stored a few,
and the offsets read back are the last ones; a user topic with cleanup.policy=compact is
cleaned by the broker's own cleaner thread and refuses records without a key."""
from __future__ import annotations

import pytest

import eos
from eos.errors import InvalidRecordError
from tests.waits import wait_for

PARTITIONS = 500
ROUNDS = 2_000         # 500 offsets per commit x 2,000 commits = 1,000,000 offset commits
SEGMENT_BYTES = 1 << 20


def value_of(n: int) -> bytes:
    return b"v%d" % n + bytes(100)


def test_a_million_offset_commits_replay_as_a_few_after_compaction(inprocess_broker_factory):
    broker = inprocess_broker_factory({"offsets.topic.num.partitions": "1", "log.cleaner.enable": "false",
                                       "offsets.topic.segment.bytes": str(SEGMENT_BYTES)})
    with eos.Admin(bootstrap=broker.address) as admin:
        admin.create_topic("in", partitions=PARTITIONS)
    partitions = [eos.TopicPartition("in", p) for p in range(PARTITIONS)]
    with eos.Consumer(bootstrap=broker.address, group_id="many-commits") as consumer:
        for round_ in range(1, ROUNDS + 1):
            consumer.commit({tp: round_ * 10 + tp.partition for tp in partitions})
    last = {tp: ROUNDS * 10 + tp.partition for tp in partitions}

    # without the cleaner a restart replays every commit ever made
    broker.restart()
    assert broker.server.group_coordinator.loaded_records >= PARTITIONS * ROUNDS

    # with it, the log shrinks to about one record per partition (plus the active segment,
    # which is never cleaned) and the next restart replays that much
    size_before = broker.server.log_manager.get_log("__consumer_offsets", 0).size_bytes
    broker.config.update({"log.cleaner.enable": "true", "log.cleaner.backoff.ms": "100"})
    broker.restart()
    offsets_log = broker.server.log_manager.get_log("__consumer_offsets", 0)
    # Everything below the active segment cleaned: the first pass keeps the segments it
    # rewrote (Kafka groups segments by their size before cleaning), now nearly empty.
    wait_for(lambda: broker.server.log_cleaner.first_dirty_offset("__consumer_offsets", 0)
             == offsets_log.active_segment.base_offset, "the cleaner to compact __consumer_offsets", timeout_s=240)
    assert offsets_log.size_bytes - offsets_log.active_segment.size_bytes < size_before / 100
    broker.restart()
    records_per_segment = SEGMENT_BYTES // 40      # an offset commit record takes more than 40 bytes
    assert broker.server.group_coordinator.loaded_records < PARTITIONS + 2 * records_per_segment
    with eos.Consumer(bootstrap=broker.address, group_id="many-commits") as consumer:
        assert consumer.committed(partitions) == last


def test_a_compacted_user_topic_is_cleaned_by_the_broker_and_needs_keys(inprocess_broker_factory):
    broker = inprocess_broker_factory({"log.cleaner.backoff.ms": "100"})
    with eos.Admin(bootstrap=broker.address) as admin:
        admin.create_topic("latest", partitions=1, config={"cleanup.policy": "compact", "segment.bytes": "262144",
                                                            "min.cleanable.dirty.ratio": "0.1"})
    with eos.Producer(bootstrap=broker.address, linger_ms=5) as producer:
        # (queued batches are joined into batches that must still fit a 256 KiB segment)
        futures = [producer.send("latest", value_of(n), key=b"k%d" % (n % 50), partition=0) for n in range(20_000)]
        producer.flush()
        assert [f.exception() for f in futures] == [None] * len(futures)
        with pytest.raises(InvalidRecordError, match="no key"):
            producer.send("latest", b"keyless", partition=0).result(timeout=30)
    log = broker.server.log_manager.get_log("latest", 0)
    size_before = log.size_bytes
    wait_for(lambda: broker.server.log_cleaner.first_dirty_offset("latest", 0) == log.active_segment.base_offset,
             "the broker's cleaner to compact the topic", timeout_s=120)
    assert log.size_bytes - log.active_segment.size_bytes < size_before / 20
    assert log.log_end_offset == 20_000
    with eos.Consumer(bootstrap=broker.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([eos.TopicPartition("latest", 0)])
        latest: dict[bytes, tuple[int, bytes]] = {}
        while True:
            records = consumer.poll(timeout_ms=2_000)
            if not records:
                break
            for record in records:
                assert record.offset > latest.get(record.key, (-1, b""))[0]
                latest[record.key] = (record.offset, record.value)
    # every key's last value is there (the active segment may still hold older ones too)
    assert {k: v for k, (_, v) in latest.items()} == {b"k%d" % k: value_of(19_950 + k) for k in range(50)}
