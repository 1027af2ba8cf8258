"""The consumer's fetcher without a broker: positions, skipping, read_committed filtering."""
from __future__ import annotations

import threading
from concurrent import futures
from types import SimpleNamespace

import pytest

from consumer.fetcher import Fetcher, _FetchInFlight
from eos.calls import CallThreads
from eos import net
from eos.records.codec import encode_batch, encode_control_batch
from eos.types import TopicPartition
from eos.v1.common_pb2 import IsolationLevel

TP = TopicPartition("t", 0)


def data(base_offset, values, *, producer_id=-1, transactional=False):
    return encode_batch([v.encode() for v in values], timestamps_ms=1, base_offset=base_offset,
                        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
                        base_sequence=0 if producer_id >= 0 else -1, transactional=transactional)


def marker(offset, producer_id, committed):
    return encode_control_batch(committed=committed, producer_id=producer_id, producer_epoch=0,
                                coordinator_epoch=0, timestamp_ms=1, base_offset=offset)


def fetcher(isolation=IsolationLevel.READ_UNCOMMITTED) -> Fetcher:
    f = Fetcher(None, isolation_level=isolation, auto_offset_reset="earliest", fetch_min_bytes=1,
                fetch_max_wait_ms=0, fetch_max_bytes=1 << 20, max_partition_fetch_bytes=1 << 20,
                check_crcs=True, request_timeout_ms=1000, backoff=net.Backoff(1, 1))
    f.assign([TP])
    return f


def receive(f: Fetcher, buf: bytes, aborted=()):
    fetched = SimpleNamespace(records=buf, aborted_transactions=[
        SimpleNamespace(producer_id=pid, first_offset=first) for pid, first in aborted])
    f._receive(f.state(TP), fetched)


def values(records):
    return [r.value.decode() for r in records]


def test_records_before_the_position_are_skipped_and_position_advances():
    f = fetcher()
    f.state(TP).seek(3)
    receive(f, data(0, ["a", "b", "c", "d", "e"]) + data(5, ["f", "g"]))
    assert f.state(TP).fetch_offset == 7
    first = f.collect(2)
    assert values(first) == ["d", "e"] and [r.offset for r in first] == [3, 4]
    assert f.state(TP).position == 5
    assert values(f.collect(10)) == ["f", "g"]
    assert f.state(TP).position == 7
    assert f.collect(10) == []


def test_a_seek_drops_data_fetched_before_it():
    f = fetcher()
    f.state(TP).seek(0)
    receive(f, data(0, ["a", "b"]))
    f.state(TP).seek(1)
    assert f.collect(10) == []           # stale: fetched for the old position
    receive(f, data(0, ["a", "b"]))
    assert values(f.collect(10)) == ["b"]


def test_read_uncommitted_shows_aborted_data_but_never_markers():
    f = fetcher()
    f.state(TP).seek(0)
    receive(f, data(0, ["x1", "x2"], producer_id=7, transactional=True) + marker(2, 7, committed=False)
            + data(3, ["y"]))
    records = f.collect(10)
    assert values(records) == ["x1", "x2", "y"]
    assert f.state(TP).position == 4


def test_read_committed_drops_aborted_transactions_only():
    f = fetcher(IsolationLevel.READ_COMMITTED)
    f.state(TP).seek(0)
    buf = (data(0, ["a1", "a2"], producer_id=1, transactional=True)      # aborted later
           + data(2, ["c1"], producer_id=2, transactional=True)          # committed later
           + data(3, ["plain"])                                           # not transactional
           + marker(4, 1, committed=False)
           + data(5, ["c2"], producer_id=2, transactional=True)
           + marker(6, 2, committed=True)
           + data(7, ["a3"], producer_id=1, transactional=True)          # a second, committed txn of 1
           + marker(8, 1, committed=True))
    receive(f, buf, aborted=[(1, 0)])
    records = f.collect(100)
    assert values(records) == ["c1", "plain", "c2", "a3"]
    assert f.state(TP).position == 9


def test_read_committed_abort_listed_in_a_later_range():
    # the transaction of producer 5 starts at offset 2; the first batch is someone else's
    f = fetcher(IsolationLevel.READ_COMMITTED)
    f.state(TP).seek(0)
    buf = (data(0, ["p1", "p2"], producer_id=4, transactional=True)
           + data(2, ["gone"], producer_id=5, transactional=True)
           + marker(3, 4, committed=True) + marker(4, 5, committed=False))
    receive(f, buf, aborted=[(5, 2)])
    assert values(f.collect(100)) == ["p1", "p2"]


def test_partial_last_batch_is_left_for_the_next_fetch():
    f = fetcher()
    f.state(TP).seek(0)
    whole = data(0, ["a"])
    cut = data(1, ["b", "c"])[:-3]
    receive(f, whole + cut)
    assert f.state(TP).fetch_offset == 1
    assert values(f.collect(10)) == ["a"]


def test_corrupt_data_is_reported_by_poll():
    from eos.errors import CorruptRecordError
    f = fetcher()
    f.state(TP).seek(0)
    buf = bytearray(data(0, ["a", "b"]))
    buf[-1] ^= 0xFF
    receive(f, bytes(buf))
    with pytest.raises(CorruptRecordError):
        f.collect(10)


def test_unassigned_partition_is_refused():
    f = fetcher()
    with pytest.raises(ValueError, match="not assigned"):
        f.state(TopicPartition("other", 0))


# ---- the threads that make the Fetch calls -------------------------------------------------

def test_fetch_callers_run_a_brokers_calls_in_order_on_one_reused_thread():
    callers = CallThreads("eos-consumer-fetch")
    try:
        def where(tag, *, timeout):
            return tag, timeout, threading.current_thread().name

        first = callers.submit(7, where, "a", timeout=1.5)
        second = callers.submit(7, where, "b", timeout=2.5)
        other = callers.submit(8, where, "c", timeout=0.5)
        assert first.result(timeout=10) == ("a", 1.5, "eos-consumer-fetch-7")
        assert second.result(timeout=10) == ("b", 2.5, "eos-consumer-fetch-7")
        assert other.result(timeout=10) == ("c", 0.5, "eos-consumer-fetch-8")
    finally:
        callers.close()


def test_fetch_callers_hand_an_exception_to_the_future_and_go_on():
    callers = CallThreads("eos-consumer-fetch")
    try:
        def fail():
            raise ValueError("Cannot invoke RPC on closed channel!")

        failed = callers.submit(1, fail)
        with pytest.raises(ValueError, match="closed channel"):
            failed.result(timeout=10)
        assert callers.submit(1, lambda: "next").result(timeout=10) == "next"
    finally:
        callers.close()


def test_fetch_callers_after_close_cancel_instead_of_calling():
    callers = CallThreads("eos-consumer-fetch")
    callers.close()
    calls = []
    late = callers.submit(1, lambda: calls.append("called"))
    assert late.cancelled()
    with pytest.raises(futures.CancelledError):
        late.result(timeout=0)
    assert calls == []


def test_a_fetch_whose_channel_was_closed_is_retried_not_fatal():
    f = fetcher()
    state = f.state(TP)
    state.seek(0)
    state.in_flight = True
    call: futures.Future = futures.Future()
    call.set_exception(ValueError("Cannot invoke RPC on closed channel!"))
    stale = []
    f._metadata = SimpleNamespace(mark_stale=stale.append)
    f._handle_response(_FetchInFlight(0, {TP: (state.fetch_epoch, 0)}, call))
    assert not f.has_pending_error
    assert not state.in_flight
    assert state.retry_at_ms > 0
    assert stale == ["t"]


def test_a_fetcher_dropped_without_close_stops_its_fetch_threads():
    import gc

    f = fetcher()
    assert f._callers.submit(5, lambda: "done").result(timeout=10) == "done"
    # This fetcher's own thread (another fetcher not yet collected may have a node 5 too).
    thread = f._callers.submit(5, threading.current_thread).result(timeout=10)
    assert thread.name == "eos-consumer-fetch-5"
    del f
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


def test_a_stale_topic_is_refreshed_even_while_metadata_still_names_its_old_leader():
    """A leader that died is still in the metadata until the controller moves it; the fetcher
    must ask again (not only when a leader is missing), or it fetches from the dead one forever."""
    f = fetcher()
    f.state(TP).seek(0)
    refreshed = []
    f._metadata = SimpleNamespace(
        leader=lambda topic, partition: 7, address_of=lambda node: "127.0.0.1:1",
        mark_stale=lambda topic: None, stale_topics=lambda: {"t"},
        refresh_topics=lambda topics: refreshed.append(sorted(topics)),
        broker_stub=lambda node: None)
    f.send_fetches()
    assert refreshed == [["t"]]

