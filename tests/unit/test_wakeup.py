"""eos.wakeup.Wakeup: an Event whose waiter may also sleep on sockets (the producer's sender
and the consumer's poll() read their own connections)."""
import os
import socket
import threading

import pytest

from eos.wakeup import Wakeup
from tests.waits import wait_for


@pytest.fixture
def sockets():
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def _wait_in_thread(wakeup: Wakeup, fds, timeout_s=60):
    returned = []
    waiter = threading.Thread(target=lambda: returned.append(wakeup.wait(timeout_s, fds)), daemon=True)
    waiter.start()
    if fds:
        wait_for(lambda: wakeup._armed, "the waiter asleep in poll()", timeout_s=10)
    return waiter, returned


def test_a_readable_socket_wakes_the_waiter_without_setting_the_flag(sockets):
    ours, theirs = sockets
    wakeup = Wakeup()
    waiter, returned = _wait_in_thread(wakeup, [ours.fileno()])
    theirs.send(b"answer")
    waiter.join(10)
    assert not waiter.is_alive() and returned == [False]
    assert not wakeup._armed


def test_set_wakes_a_waiter_on_sockets_and_leaves_no_byte_behind(sockets):
    ours, _ = sockets
    wakeup = Wakeup()
    for _ in range(3):
        waiter, returned = _wait_in_thread(wakeup, [ours.fileno()])
        wakeup.set()
        waiter.join(10)
        assert not waiter.is_alive() and returned == [True]
        wakeup.clear()
    with pytest.raises(BlockingIOError):       # every wake's byte was read back
        os.read(wakeup._pipe[0], 1)
    assert wakeup.wait(0.01, [ours.fileno()]) is False     # so the next sleep does sleep


def test_it_keeps_events_semantics(sockets):
    ours, _ = sockets
    wakeup = Wakeup()
    assert wakeup.wait(0.01) is False and not wakeup.is_set()
    wakeup.set()
    assert wakeup.is_set()
    assert wakeup.wait(60) is True and wakeup.wait(60, [ours.fileno()]) is True   # at once, set stays set
    wakeup.clear()
    waiter, returned = _wait_in_thread(wakeup, ())
    wakeup.set()
    waiter.join(10)
    assert not waiter.is_alive() and returned == [True]


def test_close_releases_the_pipe(sockets):
    ours, _ = sockets
    wakeup = Wakeup()
    wakeup.wait(0.01, [ours.fileno()])
    read_end, write_end = wakeup._pipe
    wakeup.close()
    assert wakeup._pipe is None
    for fd in (read_end, write_end):
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_signal_that_interrupts_the_sleep_leaves_it_disarmed(sockets):
    """An exception from a signal handler inside poll(): without the disarm, the next set()
    would write a byte nobody reads and every later sleep on sockets return at once."""
    import signal

    class Interrupted(Exception):
        pass

    def interrupt(*_):
        raise Interrupted()

    ours, _ = sockets
    wakeup = Wakeup()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(Interrupted):
            wakeup.wait(30, [ours.fileno()])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not wakeup._armed
    wakeup.set()
    with pytest.raises(BlockingIOError):      # no byte was written for a sleeper that is gone
        os.read(wakeup._pipe[0], 1)


def test_close_during_a_sleep_releases_the_pipe_when_the_sleeper_leaves(sockets):
    ours, _ = sockets
    wakeup = Wakeup()
    waiter, returned = _wait_in_thread(wakeup, [ours.fileno()])
    read_end, _ = wakeup._pipe
    wakeup.close()                         # the waiter is still in poll() on the pipe
    assert wakeup._pipe is not None
    wakeup.set()
    waiter.join(10)
    assert not waiter.is_alive() and returned == [True]
    assert wakeup._pipe is None
    with pytest.raises(OSError):
        os.fstat(read_end)
