"""The storage side of replication: leader epochs, follower appends, truncation (KIP-101/279),
the replicated high watermark."""
from __future__ import annotations

import os

import pytest

from broker.storage.leader_epoch import (LEADER_EPOCH_CHECKPOINT, LeaderEpochCache, decode_checkpoint,
                                         encode_checkpoint)
from broker.storage.log import Log
from eos.config import TopicConfig
from eos.errors import InvalidRecordError
from tests.storage_batches import make_batch

CONFIG = TopicConfig(segment_bytes=4096, file_delete_delay_ms=0)


def open_log(path, **kwargs) -> Log:
    return Log.open(str(path), CONFIG, now_ms=1_000, **kwargs)


def log_bytes(log: Log) -> bytes:
    return b"".join(open(s.log_path, "rb").read()[:s.size_bytes] for s in log.segments)


def copy_all(leader: Log, follower: Log) -> None:
    while follower.log_end_offset < leader.log_end_offset:
        data = leader.read(follower.log_end_offset, 1 << 20, max_offset_exclusive=leader.log_end_offset)
        follower.append_as_follower(data.records, 2_000)


# ---- the leader epoch checkpoint ----------------------------------------------------------------

def test_checkpoint_has_kafkas_format(tmp_path):
    cache = LeaderEpochCache(str(tmp_path))
    cache.assign(0, 0)
    cache.assign(3, 120)
    assert (tmp_path / LEADER_EPOCH_CHECKPOINT).read_bytes() == b"0\n2\n0 0\n3 120\n"
    assert decode_checkpoint(encode_checkpoint([(1, 5), (4, 9)])) == [(1, 5), (4, 9)]
    loaded, ok = LeaderEpochCache.load(str(tmp_path))
    assert ok and loaded.entries == [(0, 0), (3, 120)]


@pytest.mark.parametrize("requested, expected", [
    (-1, (-1, -1)),      # undefined
    (0, (0, 10)),        # ends where epoch 2 starts
    (1, (0, 10)),        # unknown epoch between entries: the largest one below it
    (2, (2, 30)),
    (4, (4, 55)),        # the latest: the log end
    (9, (4, 55)),
])
def test_end_offset_for_follows_kip_279(tmp_path, requested, expected):
    cache = LeaderEpochCache(None, [(0, 0), (2, 10), (4, 30)])
    assert cache.end_offset_for(requested, 55) == expected


def test_end_offset_for_an_epoch_below_the_first_is_undefined():
    assert LeaderEpochCache(None, [(3, 100)]).end_offset_for(2, 150) == (-1, -1)


def test_assign_ignores_older_epochs_and_drops_entries_past_a_new_start():
    cache = LeaderEpochCache(None, [(1, 0), (2, 50)])
    assert not cache.assign(2, 60) and not cache.assign(1, 70)
    assert cache.assign(3, 40)
    assert cache.entries == [(1, 0), (3, 40)]


# ---- follower appends ------------------------------------------------------------------------

def test_follower_copy_is_byte_identical_with_the_same_producer_and_transaction_state(tmp_path):
    leader = open_log(tmp_path / "t-0")
    follower = open_log(tmp_path / "f" / "t-0")
    leader.append_as_leader(make_batch(3, producer_id=7, producer_epoch=0, base_sequence=0), 1_000, leader_epoch=1)
    leader.append_as_leader(make_batch(2, producer_id=8, producer_epoch=0, base_sequence=0, transactional=True),
                            1_000, leader_epoch=1)
    leader.append_as_leader(make_batch(1, producer_id=9, producer_epoch=0, base_sequence=0, transactional=True),
                            1_000, leader_epoch=2)
    leader.append_txn_marker(8, 1, 5, False, 1_100, leader_epoch=2)     # abort 8
    leader.append_txn_marker(9, 1, 5, True, 1_100, leader_epoch=2)      # commit 9
    leader.append_as_leader(make_batch(4, tag=3), 1_200, leader_epoch=3)
    copy_all(leader, follower)
    assert log_bytes(follower) == log_bytes(leader)
    assert follower.leader_epoch_cache.entries == leader.leader_epoch_cache.entries == [(1, 0), (2, 5), (3, 8)]
    assert follower.last_stable_offset == leader.last_stable_offset
    assert ([e.producer_id for e in follower.describe_producers()]
            == [e.producer_id for e in leader.describe_producers()])
    lead_aborted = leader.read(0, 1 << 20, isolation_committed=True).aborted_transactions
    follow_aborted = follower.read(0, 1 << 20, isolation_committed=True).aborted_transactions
    assert follow_aborted == lead_aborted and [a.producer_id for a in lead_aborted] == [8]
    # the follower, now leader, rejects a duplicate of producer 7's batch
    promoted = follower.append_as_leader(make_batch(3, producer_id=7, producer_epoch=0, base_sequence=0), 3_000,
                                         leader_epoch=4)
    assert promoted.duplicate and promoted.first_offset == 0


def test_follower_append_refuses_a_gap_and_changes_nothing(tmp_path):
    leader = open_log(tmp_path / "t-0")
    follower = open_log(tmp_path / "f" / "t-0")
    leader.append_as_leader(make_batch(2), 1_000, leader_epoch=1)
    leader.append_as_leader(make_batch(2), 1_000, leader_epoch=1)
    second = leader.read(2, 1 << 20, max_offset_exclusive=leader.log_end_offset).records
    before = sorted(os.listdir(follower.directory))
    with pytest.raises(InvalidRecordError, match="continue at offset 0"):
        follower.append_as_follower(second, 2_000)
    assert follower.log_end_offset == 0 and sorted(os.listdir(follower.directory)) == before


def test_replicated_log_holds_the_high_watermark_until_told(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.set_replicated(True)
    log.append_as_leader(make_batch(5), 1_000, leader_epoch=1)
    assert log.log_end_offset == 5 and log.high_watermark == 0
    assert log.read(0, 1 << 20).records == b""           # readers stop at the HW
    assert log.update_high_watermark(3) == 3
    assert log.update_high_watermark(99) == 5             # clamped to the log end
    assert len(log.read(0, 1 << 20).records) > 0


# ---- truncation ---------------------------------------------------------------------------------

def test_truncate_then_append_again(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(2, producer_id=5, producer_epoch=0, base_sequence=0), 1_000, leader_epoch=1)
    for i in range(30):      # several segments
        log.append_as_leader(make_batch(10, value_bytes=40, tag=i), 1_000, leader_epoch=2)
    log.append_as_leader(make_batch(2, producer_id=5, producer_epoch=0, base_sequence=2), 1_000, leader_epoch=3)
    assert len(log.segments) > 2
    end = log.truncate_to(12)
    assert end == 12 and log.log_end_offset == 12
    assert log.leader_epoch_cache.entries == [(1, 0), (2, 2)]
    # producer 5's second batch (sequence 2) was cut: sending it again is not a duplicate
    again = log.append_as_leader(make_batch(2, producer_id=5, producer_epoch=0, base_sequence=2), 1_000,
                                 leader_epoch=4)
    assert not again.duplicate and again.first_offset == 12
    # its first batch is still below the cut and still a duplicate
    assert log.append_as_leader(make_batch(2, producer_id=5, producer_epoch=0, base_sequence=0), 1_000,
                                leader_epoch=4).duplicate
    log.close()
    reopened = open_log(tmp_path / "t-0")
    assert reopened.log_end_offset == 14
    assert reopened.leader_epoch_cache.entries == [(1, 0), (2, 2), (4, 12)]


def test_truncation_removes_aborted_transactions_past_the_cut(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(1, producer_id=3, producer_epoch=0, base_sequence=0, transactional=True), 1_000)
    log.append_txn_marker(3, 1, 1, False, 1_000)            # abort at offset 1
    assert len(log.read(0, 1 << 20, isolation_committed=True).aborted_transactions) == 1
    log.truncate_to(1)
    assert list(log.read(0, 1 << 20, isolation_committed=True).aborted_transactions) == []
    assert log.open_transactions() == [(3, 0)]             # the transaction is open again


def _diverged(tmp_path, name, epochs_and_batches):
    log = open_log(tmp_path / name / "t-0")
    for epoch, tag in epochs_and_batches:
        log.append_as_leader(make_batch(1, tag=tag), 1_000, leader_epoch=epoch)
    return log


def _truncate_like_a_follower(follower: Log, leader: Log) -> None:
    """KIP-279: ask the leader where our latest epoch ends, cut there, copy the rest."""
    epoch, end = leader.leader_epoch_cache.end_offset_for(follower.leader_epoch_cache.latest_epoch,
                                                          leader.log_end_offset)
    own_epoch, own_end = follower.leader_epoch_cache.end_offset_for(epoch, follower.log_end_offset)
    follower.truncate_to(min(end, own_end if own_epoch == epoch else end))
    copy_all(leader, follower)


def test_kip_101_scenario_1_no_acknowledged_record_is_lost(tmp_path):
    # A (leader) and B both have m0, m1 at epoch 0; B's HW is 1 when it restarts. HW-based
    # truncation would cut m1 and, if A then died, lose it. With epochs, B keeps m1.
    a = _diverged(tmp_path, "a", [(0, 0), (0, 1)])
    b = _diverged(tmp_path, "b", [(0, 0), (0, 1)])
    b.update_high_watermark(1)
    _truncate_like_a_follower(b, a)
    assert b.log_end_offset == 2
    assert log_bytes(a) == log_bytes(b)


def test_kip_101_scenario_2_logs_do_not_fork(tmp_path):
    # A wrote m1 at epoch 0 and died before B had it; B became leader (epoch 1) and wrote
    # m2 at offset 1. A comes back as a follower: its offset 1 differs and must go.
    a = _diverged(tmp_path, "a", [(0, 0), (0, 1)])
    b = _diverged(tmp_path, "b", [(0, 0), (1, 2)])
    _truncate_like_a_follower(a, b)
    assert log_bytes(a) == log_bytes(b)
    assert a.leader_epoch_cache.entries == b.leader_epoch_cache.entries == [(0, 0), (1, 1)]


def test_high_watermark_survives_a_restart_in_the_replication_checkpoint(tmp_path):
    from broker.storage.log_manager import LogManager

    manager = LogManager(str(tmp_path), now_ms_fn=lambda: 1_000)
    manager.load({})
    log = manager.create_log("t", 0, CONFIG)
    log.set_replicated(True)
    log.append_as_leader(make_batch(6), 1_000, leader_epoch=1)
    log.update_high_watermark(4)
    manager.shutdown()
    assert b"t 0 4" in (tmp_path / "replication-offset-checkpoint").read_bytes()
    again = LogManager(str(tmp_path), now_ms_fn=lambda: 2_000)
    again.load({"t": CONFIG})
    reopened = again.get_log("t", 0)
    reopened.set_replicated(True)
    assert (reopened.log_end_offset, reopened.high_watermark) == (6, 4)
    again.shutdown()
