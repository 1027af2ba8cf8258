"""The consumer against a real broker process: positions, seeks, resets, pipelined polling."""
from __future__ import annotations

import time

import pytest

import eos
from consumer import NoOffsetForPartitionError
from eos.errors import EosError, ErrorCode, OffsetOutOfRangeError
from eos.types import TopicPartition

TP0 = TopicPartition("c", 0)
TP1 = TopicPartition("c", 1)
WAIT_S = 30


@pytest.fixture
def filled(broker):
    """Topic "c" with 2 partitions, 100 records each (values b"p<partition>-<i>")."""
    with eos.Admin(broker.address) as admin:
        admin.create_topic("c", partitions=2)
    with eos.Producer(broker.address) as producer:
        for p in (0, 1):
            producer.send_batch("c", [b"p%d-%d" % (p, i) for i in range(100)], partition=p).result(WAIT_S)
    return broker


def poll_until(consumer, count: int, timeout_s: float = WAIT_S) -> list:
    records = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and time.monotonic() < deadline:
        records.extend(consumer.poll(timeout_ms=200))
    return records


def test_auto_offset_reset_latest_is_the_default(filled):
    with eos.Consumer(filled.address, fetch_max_wait_ms=50) as consumer:
        consumer.assign([TP0])
        assert consumer.position(TP0) == 100
        assert consumer.poll(timeout_ms=200) == []
        with eos.Producer(filled.address) as producer:
            producer.send("c", b"new", partition=0).result(WAIT_S)
        records = poll_until(consumer, 1)
        assert [(r.offset, r.value) for r in records] == [(100, b"new")]
        assert consumer.position(TP0) == 101


def test_earliest_reads_everything_in_order(filled):
    with eos.Consumer(filled.address, auto_offset_reset="earliest", max_poll_records=37) as consumer:
        consumer.assign([TP0, TP1])
        assert consumer.assignment() == {TP0, TP1}
        records, sizes = [], []
        deadline = time.monotonic() + WAIT_S
        while len(records) < 200 and time.monotonic() < deadline:
            polled = consumer.poll(timeout_ms=200)
            sizes.append(len(polled))
            records.extend(polled)
        assert max(sizes) == 37     # max.poll.records bounds each poll
        assert len(records) == 200
        for p in (0, 1):
            mine = [r for r in records if r.partition == p]
            assert [r.value for r in mine] == [b"p%d-%d" % (p, i) for i in range(100)]
            assert [r.offset for r in mine] == list(range(100))
        assert consumer.position(TP0) == consumer.position(TP1) == 100


def test_poll_respects_max_records(filled):
    with eos.Consumer(filled.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP0])
        first = []
        deadline = time.monotonic() + WAIT_S
        while not first and time.monotonic() < deadline:
            first = consumer.poll(timeout_ms=200, max_records=7)
        assert [r.offset for r in first] == list(range(7))
        assert consumer.position(TP0) == 7
        rest = poll_until(consumer, 93)
        assert [r.offset for r in rest] == list(range(7, 100))


def test_seek_position_and_seek_to(filled):
    with eos.Consumer(filled.address) as consumer:
        consumer.assign([TP0, TP1])
        consumer.seek(TP0, 42)
        assert consumer.position(TP0) == 42
        records = poll_until(consumer, 58)
        assert [r.offset for r in records if r.partition == 0][:3] == [42, 43, 44]
        consumer.seek_to_beginning(TP0)
        assert consumer.position(TP0) == 0
        consumer.seek_to_end()
        assert consumer.position(TP0) == 100 and consumer.position(TP1) == 100
        consumer.seek(TP1, 99)
        records = poll_until(consumer, 1)
        assert [(r.partition, r.offset) for r in records] == [(1, 99)]
        with pytest.raises(ValueError):
            consumer.seek(TP0, -1)
        with pytest.raises(ValueError, match="not assigned"):
            consumer.seek(TopicPartition("c", 5), 0)


def test_seek_while_a_fetch_is_in_flight_returns_nothing_from_before(filled):
    with eos.Consumer(filled.address, auto_offset_reset="earliest", max_poll_records=10) as consumer:
        consumer.assign([TP0])
        first = poll_until(consumer, 1)
        assert first[0].offset == 0
        consumer.seek(TP0, 90)      # the next response, already requested, is stale now
        records = poll_until(consumer, 10)
        assert [r.offset for r in records] == list(range(90, 100))


def test_out_of_range_resets_by_policy(filled):
    with eos.Consumer(filled.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TP0])
        consumer.seek(TP0, 5000)
        records = poll_until(consumer, 100)
        assert [r.offset for r in records] == list(range(100))
    with eos.Consumer(filled.address, auto_offset_reset="none") as consumer:
        consumer.assign([TP0])
        with pytest.raises(NoOffsetForPartitionError):
            consumer.position(TP0)
        consumer.seek(TP0, 5000)
        with pytest.raises(OffsetOutOfRangeError):
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                consumer.poll(timeout_ms=200)


def test_offset_lookups(filled):
    with eos.Consumer(filled.address) as consumer:
        assert consumer.beginning_offsets([TP0, TP1]) == {TP0: 0, TP1: 0}
        assert consumer.end_offsets([TP0, TP1]) == {TP0: 100, TP1: 100}
        assert consumer.offsets_for_times({TP0: 0}) == {TP0: 0}


def test_read_committed_is_passed_and_reads_plain_data(filled):
    with eos.Consumer(filled.address, isolation_level="read_committed",
                      auto_offset_reset="earliest") as consumer:
        assert consumer.isolation_level == "read_committed"
        consumer.assign([TP1])
        assert [r.offset for r in poll_until(consumer, 100)] == list(range(100))


def test_group_calls_need_a_group_id(filled):
    with eos.Consumer(filled.address) as consumer:
        for call in (lambda: consumer.subscribe(["c"]), consumer.commit):
            with pytest.raises(EosError, match="needs a consumer group") as raised:
                call()
            assert raised.value.code is ErrorCode.INVALID_GROUP_ID


def test_a_consumer_waits_out_a_broker_restart(filled):
    with eos.Consumer(filled.address, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer:
        consumer.assign([TP0])
        assert len(poll_until(consumer, 100)) == 100
        filled.kill()
        assert consumer.poll(timeout_ms=300) == []
        filled.start()
        with eos.Producer(filled.address) as producer:
            producer.send("c", b"after", partition=0).result(WAIT_S)
        records = poll_until(consumer, 1)
        assert [(r.offset, r.value) for r in records] == [(100, b"after")]


def test_poll_without_a_position_while_the_broker_is_away(filled):
    with eos.Consumer(filled.address, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                      request_timeout_ms=2000) as consumer:
        consumer.assign([TP1])
        filled.kill()
        assert consumer.poll(timeout_ms=200) == []   # a retriable failure is not raised
        filled.start()
        records = poll_until(consumer, 100)
        assert [r.offset for r in records] == list(range(100))


def test_the_next_fetch_goes_out_before_returning_while_behind_and_at_the_next_poll_once_caught_up(filled):
    # Two more batches after the fixture's one; each Fetch carries one batch (the first
    # whole batch is given whatever partition.max.bytes says), so the reader is behind its
    # log end until the last one.
    with eos.Producer(filled.address) as producer:
        for value in (b"a", b"b"):
            producer.send("c", value, partition=0).result(WAIT_S)
    with eos.Consumer(filled.address, auto_offset_reset="earliest", max_partition_fetch_bytes=1,
                      fetch_max_wait_ms=10_000) as consumer:
        consumer.assign([TP0])
        fetcher = consumer._fetcher
        records = []
        deadline = time.monotonic() + WAIT_S
        while not records and time.monotonic() < deadline:
            records = consumer.poll(timeout_ms=200)
        assert [r.offset for r in records] == list(range(100))
        assert fetcher.has_in_flight       # behind (the log ends at 102): prefetched
        records = poll_until(consumer, 2)
        assert [r.value for r in records] == [b"a", b"b"]
        assert not fetcher.has_in_flight   # caught up: nothing sent before returning ...
        assert consumer.poll(timeout_ms=0) == []
        assert fetcher.has_in_flight       # ... the next poll sent it, and it waits at the broker
        with eos.Producer(filled.address) as producer:
            producer.send("c", b"c", partition=0).result(WAIT_S)
        assert [r.value for r in poll_until(consumer, 1)] == [b"c"]


def test_pause_holds_a_partitions_records_and_resume_gives_them_once_in_order(filled):
    with eos.Consumer(filled.address, auto_offset_reset="earliest", fetch_max_wait_ms=50) as consumer:
        consumer.assign([TP0, TP1])
        with pytest.raises(ValueError, match="not assigned"):
            consumer.pause(TP0, TopicPartition("c", 7))
        assert consumer.paused() == set()            # the refused call paused nothing
        first = consumer.poll(timeout_ms=WAIT_S * 1000, max_records=5)     # a response of each is in hand
        assert len(first) == 5
        consumer.pause([TP0])
        assert consumer.paused() == {TP0}
        held_at = consumer.position(TP0)
        records = []
        deadline = time.monotonic() + WAIT_S
        while sum(r.partition == 1 for r in records + first) < 100 and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=100))
        with eos.Producer(filled.address) as producer:
            producer.send("c", b"p0-late", partition=0).result(WAIT_S)
        fetched_to = consumer._fetcher.state(TP0).fetch_offset
        for _ in range(5):
            records.extend(consumer.poll(timeout_ms=50))
        assert [r for r in records if r.partition == 0] == []
        assert consumer._fetcher.state(TP0).fetch_offset == fetched_to == 100   # no Fetch asked for the new one
        assert sorted(r.offset for r in first + records if r.partition == 1) == list(range(100))
        assert consumer.position(TP0) == held_at
        consumer.resume(TP0)
        assert consumer.paused() == set()
        rest = poll_until(consumer, 101 - held_at)
        zero = [r for r in first + rest if r.partition == 0]
        assert [r.offset for r in zero] == list(range(101))
        assert zero[-1].value == b"p0-late"


def test_partitions_for_and_list_topics_see_partitions_added_since(filled):
    with eos.Consumer(filled.address) as consumer:
        assert consumer.partitions_for("c") == [TP0, TP1]
        assert consumer.list_topics().keys() - {"__consumer_offsets", "__transaction_state"} == {"c"}
        with eos.Admin(filled.address) as admin:
            admin.create_partitions("c", 3)
            admin.create_topic("d", partitions=1)
        assert consumer.partitions_for("c") == [TP0, TP1, TopicPartition("c", 2)]
        listed = consumer.list_topics()
        assert (listed["c"], listed["d"]) == ([TP0, TP1, TopicPartition("c", 2)], [TopicPartition("d", 0)])
        assert "__consumer_offsets" in listed                       # internal topics are listed, as Kafka's
        assert consumer.partitions_for("nowhere") == []             # Kafka's answer for an unknown topic
