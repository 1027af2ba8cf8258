"""The record accumulator: batch sealing, sticky partitions, memory bounds, drain order."""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import Future

import pytest

from producer.accumulator import BufferExhaustedError, ProducerClosedError, RecordAccumulator
from producer.batch import BATCH_HEADER_BYTES, _BulkCompletion, record_size_estimate
from producer.partitioner import StickyPartitions


class Clock:
    def __init__(self):
        self.now_ms = 1000

    def __call__(self):
        return self.now_ms


def make(batch_size=1000, buffer_memory=100_000, linger_ms=5, max_block_ms=0, seed=1):
    clock = Clock()
    acc = RecordAccumulator(batch_size=batch_size, buffer_memory=buffer_memory, linger_ms=linger_ms,
                            max_block_ms=max_block_ms, sticky=StickyPartitions(random.Random(seed)),
                            clock=clock)
    return acc, clock


def append(acc, partition, value=b"x" * 84, topic="t", count=4, key=None):
    size = record_size_estimate(value, key, None)
    return acc.append(topic, partition, count, value, key, None, 1, size, None)


def take_all(_batch):
    return True


def test_records_fill_one_batch_until_batch_size():
    acc, _ = make(batch_size=1000)
    futures = [append(acc, 0) for _ in range(9)]   # 100 bytes each after 61 bytes of header
    assert len({f._batch for f in futures}) == 1
    assert [f._index for f in futures] == list(range(9))
    assert not futures[0]._batch.sealed
    tenth = append(acc, 0)
    assert tenth._batch is not futures[0]._batch
    assert futures[0]._batch.sealed


def test_a_record_larger_than_batch_size_gets_a_batch_of_its_own():
    acc, _ = make(batch_size=1000)
    small = append(acc, 0)
    big = append(acc, 0, value=b"x" * 5000)
    after = append(acc, 0)
    assert len({small._batch, big._batch, after._batch}) == 3
    assert big._batch.record_count == 1


def test_keyless_records_stick_to_one_partition_until_a_new_batch():
    acc, _ = make(batch_size=1000)
    futures = [append(acc, None) for _ in range(30)]
    partitions = [f._batch.partition for f in futures]
    # a new batch is where the sticky partition may change, never in the middle of one
    for f, g in zip(futures, futures[1:]):
        if f._batch is g._batch:
            assert f._batch.partition == g._batch.partition
    changes = sum(1 for a, b in zip(partitions, partitions[1:]) if a != b)
    assert changes >= 2


def test_ready_only_after_linger_unless_sealed_or_flushed():
    acc, clock = make(linger_ms=5)
    append(acc, 0)
    taken, next_ready_ms = acc.drain(clock(), take_all)
    assert taken == [] and next_ready_ms == clock() + 5
    clock.now_ms += 5
    taken, _ = acc.drain(clock(), take_all)
    assert len(taken) == 1 and taken[0].sealed
    append(acc, 1)
    acc.begin_flush()
    taken, _ = acc.drain(clock(), take_all)
    assert [b.partition for b in taken] == [1]
    acc.end_flush()


def test_drain_stops_at_the_first_batch_take_refuses_and_keeps_order():
    acc, clock = make(batch_size=200)
    futures = [append(acc, 0) for _ in range(3)]  # 3 sealed-by-size batches
    refused = []
    taken, _ = acc.drain(clock(), lambda b: refused.append(b) and False)
    assert taken == [] and refused == [futures[0]._batch]
    taken, _ = acc.drain(clock() + 10, take_all)
    assert [b.creation_index for b in taken] == sorted(b.creation_index for b in taken)
    assert len(taken) == 3


def test_reenqueue_puts_a_retry_ahead_of_younger_batches():
    acc, clock = make(batch_size=200)
    batches = [append(acc, 0)._batch for _ in range(4)]
    taken, _ = acc.drain(clock() + 10, lambda b: b.creation_index <= batches[2].creation_index)
    assert taken == batches[:3]
    # answers come back in any order; the queue must come out in append order
    for batch in (taken[2], taken[0], taken[1]):
        batch.attempts = 1
        batch.retry_after_ms = 0
        acc.reenqueue(batch)
    again, _ = acc.drain(clock() + 10, take_all)
    assert again == batches


def test_retry_backoff_holds_the_partition():
    acc, clock = make(batch_size=200)
    first = append(acc, 0)._batch
    second = append(acc, 0)._batch
    taken, _ = acc.drain(clock() + 10, lambda b: b is first)
    first.attempts, first.retry_after_ms = 1, clock() + 100
    acc.reenqueue(first)
    taken, next_ready_ms = acc.drain(clock() + 10, take_all)
    assert taken == [] and next_ready_ms == clock() + 100   # second waits behind the retry
    taken, _ = acc.drain(clock() + 100, take_all)
    assert taken == [first, second]


def test_buffer_memory_bounds_queued_batches():
    acc, _ = make(batch_size=1000, buffer_memory=3000, max_block_ms=0)
    batches = [append(acc, p)._batch for p in range(3)]
    with pytest.raises(BufferExhaustedError, match="buffer.memory"):
        append(acc, 3)
    batches[0].complete(0)
    acc.deallocate(batches[0])
    append(acc, 3)  # the memory came back


def test_sealed_batches_not_taken_are_the_backlog_and_taking_one_leaves_it():
    # batch.size 1000, buffer 64,000: the backlog bound is 4,000 bytes (a sixteenth)
    acc, clock = make(batch_size=1000, buffer_memory=64_000, max_block_ms=0)
    assert acc.backlog_bytes_max == 4000
    first = [append(acc, 0)._batch for _ in range(37)][0]   # 4 sealed batches of 9, one open
    assert acc.backlog_bytes() == 4 * 961
    taken, _ = acc.drain(clock() + 1, lambda b: b is first)   # in flight: not backlog
    assert taken == [first] and acc.backlog_bytes() == 3 * 961
    taken, _ = acc.drain(clock() + 10, take_all)   # the open batch too (linger is over)
    assert len(taken) == 4 and acc.backlog_bytes() == 0


def test_the_backlog_never_fails_an_append_nor_holds_one_at_max_block_ms_zero():
    acc, clock = make(batch_size=1000, buffer_memory=64_000, max_block_ms=0)
    batches = [append(acc, 0)._batch for _ in range(5 * 9 + 1)]
    acc.drain(clock(), lambda b: b is batches[0])           # the sender is taking batches
    for _ in range(2 * 9):
        append(acc, 0)                                       # past the bound: no wait, no error
    assert acc.backlog_bytes() == 6 * 961


def test_a_sender_held_up_for_the_stall_time_paces_nobody():
    acc, clock = make(batch_size=1000, buffer_memory=64_000, max_block_ms=60_000)
    batches = [append(acc, 0)._batch for _ in range(5 * 9 + 1)]
    acc.drain(clock(), lambda b: b is batches[0])
    clock.now_ms += acc.backlog_stall_ms                      # nothing taken since
    appended = threading.Event()

    def appender():
        for _ in range(2 * 9):
            append(acc, 0)
        appended.set()

    thread = threading.Thread(target=appender, daemon=True)
    thread.start()
    assert appended.wait(10)                                  # went on: the buffer takes them
    thread.join(10)
    assert acc.backlog_bytes() == 6 * 961


def test_open_batches_and_batches_in_flight_are_not_backlog():
    acc, clock = make(batch_size=1000, buffer_memory=64_000, max_block_ms=0)
    for partition in range(40):             # one open batch in each of 40 partitions
        append(acc, partition, count=40)
    assert acc.backlog_bytes() == 0
    taken, _ = acc.drain(clock() + 10, take_all)
    assert len(taken) == 40
    for _ in range(4 * 9 + 1):              # 4 sealed batches and an open one
        append(acc, 0, count=40)
    assert acc.backlog_bytes() == 4 * 961


def test_expired_aborted_and_absorbed_batches_leave_the_backlog_count():
    acc, clock = make(batch_size=1000, buffer_memory=64_000, max_block_ms=0)
    for _ in range(3 * 9 + 1):
        append(acc, 0)
    assert acc.backlog_bytes() == 3 * 961
    taken, _ = acc.drain(clock() + 1, lambda b: False, lambda topic: 10_000)   # absorbs, takes none
    assert acc.backlog_bytes() == 3 * 961
    expired = acc.expire(clock() + 100, 100)
    assert len(expired) == 2 and acc.backlog_bytes() == 0      # head (with 2 followers), open one
    for _ in range(2 * 9 + 1):
        append(acc, 1)
    assert acc.backlog_bytes() == 2 * 961
    aborted = acc.abort_queued(RuntimeError("closing"))
    assert len(aborted) == 3 and acc.backlog_bytes() == 0


def test_an_appender_blocked_on_the_backlog_resumes_once_the_sender_takes_half():
    acc, clock = make(batch_size=1000, buffer_memory=64_000, max_block_ms=60_000)
    clock.now_ms = 0

    class RealClock:               # max.block.ms measured for real while the thread waits
        def __call__(self):
            return int(time.monotonic() * 1000)

    acc._clock = RealClock()
    acc.backlog_stall_ms = 600_000     # the sender below is never taken for held up
    for _ in range(5 * 9 + 1):
        append(acc, 0)             # 5 sealed batches and an open one
    head = acc._deques[("t", 0)][0]
    acc.drain(acc._clock(), lambda b: b is head)   # the sender takes one: 4 left
    appended = threading.Event()

    def appender():
        for _ in range(9):
            append(acc, 0)         # fills the open batch; the ninth seals it and must wait
        appended.set()

    thread = threading.Thread(target=appender, daemon=True)
    thread.start()
    assert not appended.wait(0.3)                      # held by the backlog
    batches = list(acc._deques[("t", 0)])
    assert len(batches) == 5 and acc.backlog_bytes() == 5 * 961
    acc.drain(acc._clock(), lambda b: b is batches[0])
    assert not appended.wait(0.3)                      # 4 left: under the bound, not half
    acc.drain(acc._clock(), lambda b: b in batches[1:3])
    assert appended.wait(10)                           # 2 left: under half, it goes on
    thread.join(10)


def test_a_record_larger_than_buffer_memory_is_refused():
    acc, _ = make(batch_size=100, buffer_memory=1000)
    with pytest.raises(Exception, match="buffer.memory"):
        append(acc, 0, value=b"x" * 2000)


def test_no_appends_after_close():
    acc, _ = make()
    acc.begin_close()
    with pytest.raises(ProducerClosedError):
        append(acc, 0)


def test_expire_pops_old_queued_batches():
    acc, clock = make()
    batch = append(acc, 0)._batch
    assert acc.expire(clock() + 99, 100) == []
    assert acc.expire(clock() + 100, 100) == [batch]
    assert not acc.has_queued()


def test_bulk_append_splits_by_batch_size_and_maps_results_back():
    acc, clock = make(batch_size=1000)
    values = [b"v" * 84] * 25
    sizes = [record_size_estimate(v, None, None) for v in values]
    future: Future = Future()
    bulk = _BulkCompletion(future, len(values))
    acc.append_many("t", 0, 4, values, None, [7] * 25, None, sizes, None, bulk, 7)
    bulk.sealed()
    batches, _ = acc.drain(clock() + 10, take_all)
    assert [b.record_count for b in batches] == [9, 9, 7]
    assert all(b.size_estimate_bytes <= 1000 for b in batches)
    assert all(b.single_timestamp_ms == 7 for b in batches)
    assert not future.done()
    for i, batch in enumerate(batches):
        batch.complete(100 * i)
    result = future.result(0)
    assert len(result) == 25
    assert [m.offset for m in result] == list(range(9)) + list(range(100, 109)) + list(range(200, 207))
    assert result[-1].timestamp == 7 and result[3:5] == [result[3], result[4]]
    assert result.offsets_by_partition() == {("t", 0): [(0, 9), (100, 9), (200, 7)]}


def test_bulk_batches_grow_to_batch_bytes_max_and_reserve_what_they_hold():
    acc, clock = make(batch_size=1000, buffer_memory=1_000_000)   # a backlog bound over 3 x 4000
    values = [b"v" * 84] * 100                       # 100 bytes each by the estimate
    sizes = [record_size_estimate(v, None, None) for v in values]
    bulk = _BulkCompletion(Future(), len(values))
    acc.append_many("t", 0, 4, values, None, [7] * 100, None, sizes, None, bulk, 7, batch_bytes_max=4000)
    bulk.sealed()
    batches, _ = acc.drain(clock() + 10, take_all)
    # 4000 bytes hold the 61-byte header and 39 records; the last batch holds the rest
    assert [b.record_count for b in batches] == [39, 39, 22]
    assert all(b.size_estimate_bytes <= b.reserved_bytes <= 4000 for b in batches)
    assert [b.reserved_bytes for b in batches] == [4000, 4000, 22 * 100 + 61]
    assert acc._available_bytes == 1_000_000 - sum(b.reserved_bytes for b in batches)


def test_bulk_records_fill_an_open_send_batch_only_up_to_its_reservation():
    acc, clock = make(batch_size=1000)
    first = append(acc, 0)._batch                     # send(): reserves batch.size
    values = [b"v" * 84] * 30
    bulk = _BulkCompletion(Future(), len(values))
    acc.append_many("t", 0, 4, values, None, [7] * 30, None,
                    [record_size_estimate(v, None, None) for v in values], None, bulk, 7,
                    batch_bytes_max=100_000)
    bulk.sealed()
    batches, _ = acc.drain(clock() + 10, take_all)
    assert batches[0] is first and first.size_estimate_bytes <= first.reserved_bytes == 1000
    assert sum(b.record_count for b in batches) == 31 and len(batches) == 2


def test_bulk_future_fails_with_the_first_error():
    from eos.errors import NetworkError
    acc, clock = make(batch_size=1000)
    values = [b"v" * 84] * 12
    future: Future = Future()
    bulk = _BulkCompletion(future, len(values))
    acc.append_many("t", 0, 4, values, None, [1] * 12, None,
                    [record_size_estimate(v, None, None) for v in values], None, bulk)
    bulk.sealed()
    first, second = acc.drain(clock() + 10, take_all)[0]
    error = NetworkError("x")
    second.fail(error)
    assert not future.done()
    first.complete(0)
    assert future.exception(0) is error


def test_bulk_keyed_positions_map_back_to_call_order():
    acc, clock = make(batch_size=10_000)
    future: Future = Future()
    bulk = _BulkCompletion(future, 4)
    size = record_size_estimate(b"v", b"k", None)
    acc.append_many("t", 1, 2, [b"a", b"c"], [b"k", b"k"], [1, 1], None, [size, size], [0, 2], bulk)
    acc.append_many("t", 0, 2, [b"b", b"d"], [b"k", b"k"], [1, 1], None, [size, size], [1, 3], bulk)
    bulk.sealed()
    batches, _ = acc.drain(clock() + 10, take_all)
    for batch in batches:
        batch.complete(10 * (batch.partition + 1))
    result = future.result(0)
    assert [(m.partition, m.offset) for m in result] == [(1, 20), (0, 10), (1, 21), (0, 11)]


def test_header_overhead_counts():
    assert record_size_estimate(b"x" * 10, b"k", [("h", b"vv")]) > record_size_estimate(b"x" * 10, b"k", None)
    assert BATCH_HEADER_BYTES == 61


# ---- a backlog goes out as fewer, larger batches -----------------------------------------

def test_an_unsent_head_absorbs_the_sealed_batches_behind_it_up_to_the_limit():
    acc, clock = make(batch_size=200, buffer_memory=100_000)
    futures = [append(acc, 0) for _ in range(10)]     # 100 bytes each: 10 batches of 1
    batches_before = {f._batch for f in futures}
    assert len(batches_before) == 10
    refused = []
    taken, _ = acc.drain(clock() + 10, lambda b: refused.append(b) and False, lambda topic: 461)
    assert taken == [] and len(refused) == 1
    head = refused[0]
    # the head holds its own record and 3 more: 61 + 4 * 100 <= 461 < 61 + 5 * 100
    assert head.record_count == 4 and head.size_estimate_bytes == 61 + 400
    taken, _ = acc.drain(clock() + 10, take_all, lambda topic: 461)
    # the last batch is still open (lingered out, not sealed): it goes, but as itself
    assert [b.record_count for b in taken] == [4, 4, 1, 1]
    for i, batch in enumerate(taken):
        batch.complete(100 * i)
        acc.deallocate(batch)
    assert [f.result(0).offset for f in futures] == [0, 1, 2, 3, 100, 101, 102, 103, 200, 300]
    assert acc._available_bytes == 100_000 and not acc.has_incomplete


def test_absorbed_batches_fail_with_their_head():
    from eos.errors import NetworkError
    acc, clock = make(batch_size=200)
    futures = [append(acc, 0) for _ in range(4)]
    [head, tail], _ = acc.drain(clock() + 10, take_all, lambda topic: 10_000)
    assert (head.record_count, tail.record_count) == (3, 1)
    error = NetworkError("gone")
    head.fail(error)
    assert [f.exception(0) for f in futures[:3]] == [error] * 3
    assert not futures[3].done()


def test_each_record_reports_to_its_own_on_delivery_through_runs_absorption_and_bulk_calls():
    # Callbacks are kept as runs (one entry per change, not per record): records with
    # none between, a callback coming back, a bulk call's records in the same batch and a
    # batch absorbed behind another must each still report once, to their own callback.
    acc, clock = make(batch_size=300, buffer_memory=100_000)
    seen = []

    def reporter(name):
        return lambda metadata, exc: seen.append((name, metadata.offset))

    a, b = reporter("a"), reporter("b")
    value = b"x" * 20
    size = record_size_estimate(value, None, None)
    for on_delivery in (a, a, None, b, a):       # 36 bytes each: 6 records fill 61 + 216 of 300
        acc.append("t", 0, 1, value, None, None, 1, size, on_delivery, False)
    bulk_future = Future()
    bulk = _BulkCompletion(bulk_future, 1)
    acc.append_many("t", 0, 1, [value], None, [1], None, [size], None, bulk)
    bulk.sealed()
    first = acc._deques[("t", 0)][0]
    assert first.record_count == 6 and not first.sealed
    big = b"y" * 300                             # does not fit: a batch of its own, sealed full
    acc.append("t", 0, 1, big, None, None, 1, record_size_estimate(big, None, None), a, False)
    assert first.sealed and len(acc._deques[("t", 0)]) == 2
    head, = acc.drain(clock() + 10, take_all, lambda topic: 10_000)[0]
    assert head is first and head.record_count == 7       # it absorbed the second batch
    head.complete(base_offset=10)
    assert seen == [("a", 10), ("a", 11), ("b", 13), ("a", 14), ("a", 16)]
    assert [m.offset for m in bulk_future.result(0)] == [15]


def test_sent_or_open_batches_are_never_absorbed():
    acc, clock = make(batch_size=200, linger_ms=0)
    first = append(acc, 0)._batch
    second = append(acc, 0)._batch
    first.base_sequence = 0            # sequenced: its bytes are fixed
    [taken], _ = acc.drain(clock(), lambda b: b is first, lambda topic: 10_000)
    assert taken is first and first.record_count == 1
    acc.reenqueue(first)               # a retry goes back ahead of `second`
    first.attempts = 1
    taken, _ = acc.drain(clock(), take_all, lambda topic: 10_000)
    assert taken == [first, second] and first.record_count == 1
    open_tail = acc.append("t", 1, 4, b"x", None, None, 1, 20, None)._batch   # open, not sealed
    head = append(acc, 2)._batch
    assert not open_tail.sealed and head.record_count == 1


def test_the_encoders_fast_paths_write_the_bytes_of_the_general_path():
    # The producer's batches (null keys, no headers, values of one length, timestamps in
    # runs) take BatchBuilder's table-driven paths; every byte must be what the general
    # record-by-record path writes, across varint widths and offsets past the tables.
    from eos.records.codec import BatchBuilder
    rng = random.Random(7)
    base_ms = 1_700_000_000_000
    for _ in range(300):
        count = rng.randrange(1, 400)
        first = rng.choice([0, 1, 127, 128, 8191, 16_300, 20_000])
        length = rng.choice([0, 1, 63, 64, 100, 8192])
        values = [bytes([rng.randrange(256)]) * length for _ in range(count)]
        if rng.random() < 0.2:
            values[rng.randrange(count)] = rng.choice([None, b"odd"])
        steps = rng.choice([(0,), (0, 1), (0, 0, 0, 1), (0, 9000), (0, -5)])
        timestamps = [base_ms]
        for _ in range(count - 1):
            timestamps.append(timestamps[-1] + rng.choice(steps))
        general = BatchBuilder._encode_general(values, None, timestamps, False, None, first, base_ms)
        runs = BatchBuilder._encode_timestamp_runs(values, first, timestamps, base_ms)
        assert runs is None or runs == general
        one = BatchBuilder._encode_uniform(values, first, timestamps[0] - base_ms, timestamps[0])
        assert one == BatchBuilder._encode_general(values, None, timestamps[0], True, None, first, base_ms)


@pytest.mark.parametrize("partition", [None, 2])
def test_a_drained_open_batch_takes_no_more_records(partition):
    # append() remembers the open batch it used last; once the sender has taken that batch
    # (lingered out, still open) the next record must go to a new batch, not into the one
    # being sent.
    acc, clock = make(linger_ms=5)
    first = append(acc, partition)
    clock.now_ms += 5
    taken, _ = acc.drain(clock(), take_all)
    assert taken == [first._batch]
    second = append(acc, partition)
    assert second._batch is not first._batch and second._index == 0
    assert first._batch.record_count == 1
    assert acc.queued_batches() == [second._batch]


def test_keys_and_headers_lists_appear_with_the_first_record_that_has_one():
    acc, _ = make(batch_size=10_000)
    append(acc, 0)
    append(acc, 0, key=b"k")
    size = record_size_estimate(b"v", None, [("h", b"x")])
    acc.append("t", 0, 4, b"v", None, [("h", b"x")], 1, size, None)
    append(acc, 0)
    batch = acc.queued_batches()[0]
    assert batch.values == [b"x" * 84, b"x" * 84, b"v", b"x" * 84]
    assert batch.keys == [None, b"k", None, None]
    assert batch.headers == [None, None, [("h", b"x")], None]


@pytest.mark.parametrize("report_only_errors", [False, True])
def test_delivery_report_only_error_calls_back_failed_records_only(report_only_errors):
    clock = Clock()
    acc = RecordAccumulator(batch_size=1000, buffer_memory=100_000, linger_ms=0, max_block_ms=0,
                            sticky=StickyPartitions(random.Random(1)), clock=clock,
                            report_only_errors=report_only_errors)
    seen = []
    size = record_size_estimate(b"v", None, None)
    for partition in (0, 1):
        for _ in range(3):
            assert acc.append("t", partition, 2, b"v", None, None, 1, size,
                              lambda md, exc: seen.append((md.partition, exc)), False) is None
    ok, bad = sorted(acc.drain(clock(), take_all)[0], key=lambda b: b.partition)
    ok.complete(0)
    failure = RuntimeError("lost")
    bad.fail(failure)
    expected_failed = [(1, failure)] * 3
    assert seen == (expected_failed if report_only_errors else [(0, None)] * 3 + expected_failed)



def test_a_sender_asleep_on_sockets_wakes_for_a_post_and_for_a_new_batch():
    """wait_for_work with sockets (a sender that reads its produce streams itself) still
    wakes for work from other threads; the Wakeup underneath is tested in test_wakeup."""
    import socket
    import threading
    from tests.waits import wait_for
    acc, _ = make(linger_ms=0)
    ours, theirs = socket.socketpair()
    try:
        for wake, expected in ((lambda: acc.post(("request", "answer")), [("request", "answer")]),
                               (lambda: append(acc, 0), [])):
            returned = []
            waiter = threading.Thread(target=lambda: returned.append(acc.wait_for_work(60, [ours.fileno()])),
                                      daemon=True)
            waiter.start()
            wait_for(lambda: acc.wakeup._armed, "the sender asleep on its sockets", timeout_s=10)
            wake()
            waiter.join(10)
            assert not waiter.is_alive() and returned == [expected]
        assert acc.drain(1000, take_all)[0]            # the batch that woke it is there to drain
    finally:
        ours.close()
        theirs.close()
