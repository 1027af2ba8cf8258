"""Incremental fetch sessions (KIP-227): the leader's cache (broker/fetch_sessions.py) and
the follower's side (broker/replica/fetcher.FollowerSession), without I/O."""
from __future__ import annotations

import random

import pytest

from broker.fetch_sessions import (EPOCH_MAX, INITIAL_EPOCH, REPORT_ALL_INTERVAL_S, FetchSessionCache,
                                   next_epoch, report_interval_s)
from broker.replica.fetcher import FollowerSession
from eos.errors import EosError, ErrorCode
from eos.v1 import broker_pb2, common_pb2


def _listed(*entries):
    return [broker_pb2.FetchPartition(topic=t, partition=p, fetch_offset=o, partition_max_bytes=1024,
                                      has_leader_epoch=True, current_leader_epoch=e) for t, p, o, e in entries]


# ---- the leader's cache

def test_a_full_fetch_opens_a_session_holding_its_partitions_and_the_next_epoch_is_one():
    cache = FetchSessionCache(random.Random(1))
    session = cache.open(7, _listed(("t", 0, 10, 3), ("t", 1, 0, 3)))
    assert session.session_id != 0 and session.epoch == 1
    assert {k: p.fetch_offset for k, p in session.partitions.items()} == {("t", 0): 10, ("t", 1): 0}
    assert session.partitions[("t", 0)].sent_high_watermark == -1     # nothing told yet


def test_incremental_fetches_must_come_in_epoch_order_and_each_epoch_goes_once():
    cache = FetchSessionCache(random.Random(2))
    session = cache.open(7, _listed(("t", 0, 10, 3)))
    assert cache.resume(session.session_id, 1, 7) is session
    with pytest.raises(EosError) as stale:
        cache.resume(session.session_id, 1, 7)               # the same epoch again (a retry)
    assert stale.value.code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert cache.resume(session.session_id, 2, 7) is session  # a refusal does not move the epoch


def test_an_unknown_id_or_another_brokers_session_is_not_found():
    cache = FetchSessionCache(random.Random(3))
    session = cache.open(7, _listed(("t", 0, 10, 3)))
    for session_id, replica in ((session.session_id + 1, 7), (session.session_id, 8)):
        with pytest.raises(EosError) as missing:
            cache.resume(session_id, 1, replica)
        assert missing.value.code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_a_brokers_new_session_replaces_its_old_one_so_the_cache_holds_one_per_follower():
    cache = FetchSessionCache(random.Random(4))
    old = cache.open(7, _listed(("t", 0, 10, 3)))
    new = cache.open(7, _listed(("t", 0, 12, 3)))
    other = cache.open(8, _listed(("t", 0, 12, 3)))
    assert len(cache) == 2 and new.session_id not in (old.session_id, other.session_id)
    with pytest.raises(EosError):
        cache.resume(old.session_id, 1, 7)
    cache.close(new.session_id)
    assert len(cache) == 1
    with pytest.raises(EosError):
        cache.resume(new.session_id, 1, 7)


def test_apply_updates_listed_partitions_adds_new_ones_and_drops_forgotten_ones():
    cache = FetchSessionCache(random.Random(5))
    session = cache.open(7, _listed(("t", 0, 10, 3), ("t", 1, 0, 3), ("t", 2, 5, 3)))
    session.partitions[("t", 0)].told(10, 0)
    keys = session.apply(_listed(("t", 0, 15, 3), ("u", 0, 0, 1)), [common_pb2.TopicPartition(topic="t", partition=2)])
    assert keys == [("t", 0), ("u", 0)]
    assert set(session.partitions) == {("t", 0), ("t", 1), ("u", 0)}
    moved = session.partitions[("t", 0)]
    assert (moved.fetch_offset, moved.current_leader_epoch) == (15, 3)
    assert moved.sent_high_watermark == 10          # what it was told survives a new offset
    assert session.partitions[("t", 1)].fetch_offset == 0


def test_every_partition_is_reported_on_the_first_incremental_fetch_then_once_an_interval():
    session = FetchSessionCache(random.Random(6)).open(7, _listed(("t", 0, 10, 3)))
    assert session.report_all_due(100.0, 1.0)
    assert not session.report_all_due(100.5, 1.0)
    assert session.report_all_due(101.0, 1.0)


def test_the_report_interval_is_a_quarter_of_the_lag_a_follower_may_have_at_most_a_second():
    assert report_interval_s(30_000) == REPORT_ALL_INTERVAL_S == 1.0
    assert report_interval_s(2_000) == 0.5


def test_a_new_leader_epoch_of_a_partition_tells_the_follower_everything_again():
    session = FetchSessionCache(random.Random(8)).open(7, _listed(("t", 0, 10, 3)))
    held = session.partitions[("t", 0)]
    held.told(10, 0)
    session.apply(_listed(("t", 0, 12, 3)), ())
    assert held.sent_high_watermark == 10            # the same epoch: what it was told stands
    session.apply(_listed(("t", 0, 12, 4)), ())
    assert held.sent_high_watermark == -1            # a new epoch: answered again


def test_a_replaced_or_closed_session_is_no_longer_current():
    cache = FetchSessionCache(random.Random(9))
    first = cache.open(7, _listed(("t", 0, 10, 3)))
    assert cache.is_current(first)
    second = cache.open(7, _listed(("t", 0, 10, 3)))
    assert not cache.is_current(first) and cache.is_current(second)
    cache.close(second.session_id)
    assert not cache.is_current(second)


def test_epochs_wrap_past_int32_to_one_never_to_the_opening_epoch():
    assert next_epoch(INITIAL_EPOCH) == 1 and next_epoch(41) == 42
    assert next_epoch(EPOCH_MAX) == 1


# ---- the follower's side

def test_follower_lists_everything_in_a_full_fetch_then_only_what_moved():
    session = FollowerSession()
    positions = {("t", 0): (10, 3), ("t", 1): (0, 3)}
    assert all(session.needs_listing(tp, pos) for tp, pos in positions.items())
    assert session.forgotten(positions) == []
    session.answered(55, positions)
    assert (session.session_id, session.epoch) == (55, 1)
    moved = {("t", 0): (12, 3), ("t", 1): (0, 3)}
    assert [tp for tp, pos in moved.items() if session.needs_listing(tp, pos)] == [("t", 0)]
    assert session.needs_listing(("t", 1), (0, 4))                  # a new leader epoch is listed too
    session.answered(55, moved)
    assert session.epoch == 2
    assert session.forgotten({("t", 0): (12, 3)}) == [("t", 1)]      # no longer fetched from here


def test_follower_keeps_full_fetches_when_the_leader_made_no_session():
    session = FollowerSession()
    session.answered(0, {("t", 0): (10, 3)})
    assert session.epoch == INITIAL_EPOCH and session.needs_listing(("t", 0), (10, 3))


def test_follower_reset_starts_over_with_a_full_fetch():
    session = FollowerSession()
    session.answered(55, {("t", 0): (10, 3)})
    session.reset()
    assert (session.session_id, session.epoch) == (0, INITIAL_EPOCH)
    assert session.needs_listing(("t", 0), (10, 3)) and session.forgotten({}) == []
