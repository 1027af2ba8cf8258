"""FetchPurgatory: wake-ups by key, the bound on waiters, close."""
from __future__ import annotations

import threading

from broker.purgatory import FetchPurgatory


def test_notify_wakes_only_waiters_on_the_key():
    purgatory = FetchPurgatory(max_waiters=4)
    on_a = purgatory.watch(["a"])
    on_b = purgatory.watch(["b", "c"])
    assert purgatory.notify("a") == 1
    assert on_a.wait(0) is True
    assert on_b.wait(0) is False
    assert purgatory.notify("c") == 1 and on_b.wait(0)
    assert purgatory.notify("zzz") == 0


def test_waiter_limit_and_unwatch_frees_a_place():
    purgatory = FetchPurgatory(max_waiters=2)
    first = purgatory.watch(["a"])
    second = purgatory.watch(["a"])
    assert purgatory.watch(["a"]) is None
    assert purgatory.waiter_count == 2
    purgatory.unwatch(first)
    purgatory.unwatch(first)  # twice is harmless
    assert purgatory.waiter_count == 1
    assert purgatory.watch(["b"]) is not None
    assert purgatory.notify("a") == 1 and second.wait(0)


def test_close_cancels_everyone_and_refuses_new_waiters():
    purgatory = FetchPurgatory(max_waiters=2)
    waiter = purgatory.watch(["a"])
    woke = []
    thread = threading.Thread(target=lambda: woke.append(waiter.wait(30)))
    thread.start()
    purgatory.close()
    thread.join(10)
    assert woke == [True] and waiter.cancelled
    assert purgatory.watch(["a"]) is None


def test_empty_key_set_does_not_wait():
    assert FetchPurgatory(max_waiters=2).watch([]) is None


def test_rewatch_moves_a_waiter_to_other_keys_and_an_empty_set_unwatches_it():
    purgatory = FetchPurgatory(max_waiters=2)
    waiter = purgatory.watch(["a", "b"])
    assert purgatory.rewatch(waiter, ["b", "c"])
    assert purgatory.waiter_count == 1
    assert (purgatory.notify("a"), purgatory.notify("b"), purgatory.notify("c")) == (0, 1, 1)
    assert not purgatory.rewatch(waiter, [])
    assert purgatory.waiter_count == 0 and purgatory.notify("b") == 0
    assert not purgatory.rewatch(waiter, ["a"])        # no longer registered: nothing comes back
    assert purgatory.notify("a") == 0


def test_a_tracking_waiter_collects_the_keys_notified_until_they_are_taken():
    purgatory = FetchPurgatory(max_waiters=2)
    tracking = purgatory.watch(["a", "b"], tracking=True)
    plain = purgatory.watch(["a"])
    for key in ("a", "b", "a", "zzz"):
        purgatory.notify(key)
    assert purgatory.take_touched(tracking) == {"a", "b"}
    assert purgatory.take_touched(tracking) == set()
    assert plain.touched is None and plain.wait(0)
