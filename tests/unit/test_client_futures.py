"""RecordFuture and batch completion: a real concurrent.futures.Future without a Condition each."""
from __future__ import annotations

import concurrent.futures
import threading

import pytest

from eos.errors import NetworkError
from producer.batch import ProducerBatch, RecordFuture, RecordMetadata


def batch_with(count: int, timestamps=None) -> ProducerBatch:
    batch = ProducerBatch("t", 2, creation_index=0, created_ms=0, reserved_bytes=0)
    for i in range(count):
        batch.values.append(b"v%d" % i)
        batch.timestamps_ms.append(1000 + i if timestamps is None else timestamps[i])
    return batch


def test_is_a_future_and_pending_until_the_batch_completes():
    batch = batch_with(2)
    future = RecordFuture(batch, 1)
    assert isinstance(future, concurrent.futures.Future)
    assert not future.done() and future.running() and not future.cancelled()
    assert future.cancel() is False
    with pytest.raises(TimeoutError):
        future.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        future.exception(timeout=0)
    batch.complete(base_offset=40)
    assert future.done() and not future.running()
    assert future.result() == RecordMetadata("t", 2, 41, 1001)
    assert future.exception() is None


def test_log_append_time_replaces_the_create_time():
    batch = batch_with(1)
    batch.complete(base_offset=0, log_append_time_ms=5555)
    assert RecordFuture(batch, 0).result().timestamp == 5555


def test_unknown_offset_stays_minus_one():
    batch = batch_with(3)
    batch.complete(base_offset=-1)
    assert RecordFuture(batch, 2).result().offset == -1


def test_failure_raises_the_batch_error_for_every_record():
    batch = batch_with(3)
    futures = [RecordFuture(batch, i) for i in range(3)]
    error = NetworkError("gone")
    batch.fail(error)
    for future in futures:
        assert future.exception() is error
        with pytest.raises(NetworkError):
            future.result()


def test_result_wakes_up_a_waiting_thread():
    batch = batch_with(1)
    future = RecordFuture(batch, 0)
    results = []
    waiter = threading.Thread(target=lambda: results.append(future.result(timeout=10)))
    waiter.start()
    batch.complete(base_offset=7)
    waiter.join(10)
    assert results == [RecordMetadata("t", 2, 7, 1000)]


def test_done_callbacks_run_once_with_the_future_and_at_once_when_done():
    batch = batch_with(2)
    future = RecordFuture(batch, 0)
    seen = []
    future.add_done_callback(lambda f: seen.append(("early", f.result().offset)))
    batch.complete(base_offset=10)
    future.add_done_callback(lambda f: seen.append(("late", f.result().offset)))
    assert seen == [("early", 10), ("late", 10)]


def test_record_callbacks_get_metadata_and_exception():
    batch = batch_with(2)
    seen = []
    batch.add_record_callback(0, lambda md, exc: seen.append((md.offset, exc)))
    batch.add_record_callback(1, lambda md, exc: seen.append((md.offset, exc)))
    batch.complete(base_offset=100)
    assert seen == [(100, None), (101, None)]
    failed = batch_with(1)
    error = NetworkError("x")
    failed.add_record_callback(0, lambda md, exc: seen.append((md.offset, exc)))
    failed.fail(error)
    assert seen[-1] == (-1, error)


def test_a_raising_callback_does_not_stop_the_others():
    batch = batch_with(1)
    seen = []
    future = RecordFuture(batch, 0)
    future.add_done_callback(lambda f: 1 / 0)
    future.add_done_callback(lambda f: seen.append(True))
    batch.complete(base_offset=0)
    assert seen == [True]


def test_concurrent_futures_wait_and_as_completed():
    first, second = batch_with(2), batch_with(1)
    futures = [RecordFuture(first, 0), RecordFuture(first, 1), RecordFuture(second, 0)]
    done, not_done = concurrent.futures.wait(futures, timeout=0)
    assert not done and len(not_done) == 3
    threading.Timer(0.05, lambda: first.complete(base_offset=0)).start()
    done, not_done = concurrent.futures.wait(futures, timeout=10,
                                             return_when=concurrent.futures.FIRST_COMPLETED)
    assert done == {futures[0], futures[1]} and not_done == {futures[2]}
    threading.Timer(0.05, lambda: second.fail(NetworkError("x"))).start()
    completed = list(concurrent.futures.as_completed(futures, timeout=10))
    assert set(completed) == set(futures)
    done, _ = concurrent.futures.wait(futures, timeout=10, return_when=concurrent.futures.FIRST_EXCEPTION)
    assert futures[2] in done


def test_completion_is_final():
    from eos.errors import InvariantError
    batch = batch_with(1)
    batch.complete(base_offset=0)
    with pytest.raises(InvariantError):
        batch.fail(NetworkError("late"))
    with pytest.raises(RuntimeError):
        RecordFuture(batch, 0).set_result(None)


def test_delivered_batches_let_go_of_the_record_bytes():
    batch = batch_with(3)
    future = RecordFuture(batch, 2)
    batch.complete(base_offset=0)
    assert batch.values is None and batch.payload is None
    assert future.result().offset == 2
