"""Transactions in the partition log: markers, the last stable offset, read_committed with
aborted transactions, the transaction index through rolls, retention, crashes and restarts."""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.storage import AbortedTxn, AppendOrigin, Log
from eos.config import TopicConfig
from eos.errors import (
    EosError,
    ErrorCode,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidRequestError,
    InvalidTxnStateError,
    StorageError,
)
from eos.records.codec import decode_records, encode_control_batch
from tests.storage_batches import make_batch
from tests.unit.test_storage_log import dir_state, whole_batches

SMALL_SEGMENTS = TopicConfig(segment_bytes=600, index_interval_bytes=100)


def open_log(path, config: TopicConfig = TopicConfig(), **kw) -> Log:
    return Log.open(str(path), config, now_ms=0, **kw)


def txn(producer_id: int, sequence: int, count: int = 2, *, epoch: int = 0, tag: int = 0) -> bytes:
    return make_batch(count, producer_id=producer_id, producer_epoch=epoch, base_sequence=sequence,
                      transactional=True, tag=tag)


def committed_view(log: Log, start: int = 0, *, max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    """(offset, value) of every record a read_committed consumer sees from `start` up to the
    last stable offset, fetching `max_bytes` at a time and dropping aborted batches with the
    Kafka consumer's algorithm (aborted transactions by first offset; a producer is aborted
    from its transaction's first offset until its ABORT marker)."""
    seen: list[tuple[int, bytes]] = []
    position = start
    while True:
        data = log.read(position, max_bytes, isolation_committed=True)
        if not data.records:
            return seen
        pending = sorted(data.aborted_transactions, key=lambda a: a.first_offset)
        aborted_producers: set[int] = set()
        for header in whole_batches(data.records):
            if header.producer_id >= 0:
                while pending and pending[0].first_offset <= header.last_offset:
                    aborted_producers.add(pending.pop(0).producer_id)
                if header.is_control:
                    marker = decode_records(data.records, header, "t", 0)[0]
                    if marker.key[3] == 0:   # ABORT
                        aborted_producers.discard(header.producer_id)
                elif header.is_transactional and header.producer_id in aborted_producers:
                    position = header.next_offset
                    continue
            if not header.is_control:
                seen.extend((r.offset, r.value) for r in decode_records(data.records, header, "t", 0)
                            if r.offset >= position)
            position = header.next_offset
        if data.records and position >= log.last_stable_offset:
            return seen


def txn_entries(log: Log) -> list[tuple[int, list[AbortedTxn]]]:
    """(segment base offset, its aborted transactions) of every segment that has some."""
    return [(s.base_offset, s.txn_index.all_entries()) for s in log.segments if len(s.txn_index)]


# ---- the last stable offset ------------------------------------------------------------------

def test_lso_stops_at_the_first_open_transaction_and_moves_on_commit_and_abort(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(2), now_ms=0)                     # 0-1 plain
    assert log.last_stable_offset == log.high_watermark == 2
    first = log.append_as_leader(txn(1, 0), now_ms=0)                 # 2-3 producer 1 opens
    assert (log.last_stable_offset, log.high_watermark) == (2, 4)
    log.append_as_leader(txn(2, 0), now_ms=0)                         # 4-5 producer 2 opens
    log.append_as_leader(make_batch(1), now_ms=0)                     # 6 plain
    assert log.last_stable_offset == first.first_offset == 2
    assert log.open_transactions() == [(1, 2), (2, 4)]
    assert log.has_ongoing_transaction(1, 0) and not log.has_ongoing_transaction(1, 1)

    commit = log.append_txn_marker(1, 1, 0, True, now_ms=10)          # 7: producer 1 commits
    assert commit.first_offset == commit.last_offset == 7
    assert commit.completed_txn.producer_id == 1 and not commit.completed_txn.is_aborted
    assert commit.completed_txn.first_offset == 2
    assert log.last_stable_offset == 4                                # producer 2 still open
    assert not log.has_ongoing_transaction(1, 0)

    abort = log.append_txn_marker(2, 1, 0, False, now_ms=11)          # 8: producer 2 aborts
    assert abort.completed_txn.is_aborted and abort.completed_txn.first_offset == 4
    assert log.last_stable_offset == log.high_watermark == 9
    assert log.open_transactions() == []
    assert log.active_segment.txn_index.all_entries() == [AbortedTxn(2, 4, 8, 9)]
    # the aborted transaction's last stable offset is the earliest transaction still open
    log.append_as_leader(txn(3, 0), now_ms=0)                         # 9-10
    log.append_as_leader(txn(4, 0), now_ms=0)                         # 11-12
    log.append_txn_marker(4, 1, 0, False, now_ms=12)                  # 13
    assert log.active_segment.txn_index.all_entries()[-1] == AbortedTxn(4, 11, 13, 9)
    assert log.last_stable_offset == 9


def test_latest_offset_and_offset_for_timestamp_under_read_committed(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(1, timestamp_ms=100), now_ms=0)
    log.append_as_leader(txn(1, 0), now_ms=0)                         # timestamps 1000
    log.append_as_leader(make_batch(1, timestamp_ms=2_000), now_ms=0)
    assert (log.latest_offset(), log.latest_offset(isolation_committed=True)) == (4, 1)
    assert log.offset_for_timestamp(500) == (1, 1_000)
    assert log.offset_for_timestamp(500, isolation_committed=True) is None
    assert log.offset_for_timestamp(50, isolation_committed=True) == (0, 100)
    log.append_txn_marker(1, 1, 0, True, now_ms=3_000)
    assert log.latest_offset(isolation_committed=True) == 5
    assert log.offset_for_timestamp(1_500, isolation_committed=True) == (3, 2_000)


def test_lso_never_falls_below_the_log_start(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn(1, 0), now_ms=0)
    log.append_as_leader(make_batch(3), now_ms=0)
    assert log.last_stable_offset == 0
    log.delete_records_before(4, now_ms=0)
    assert log.last_stable_offset == 4 and log.read(4, 1 << 20, isolation_committed=True).records == b""


# ---- read_committed -----------------------------------------------------------------------------

def test_read_committed_stops_at_the_lso_and_read_uncommitted_does_not(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(2), now_ms=0)
    log.append_as_leader(txn(1, 0), now_ms=0)
    log.append_as_leader(make_batch(2), now_ms=0)
    committed = log.read(0, 1 << 20, isolation_committed=True)
    assert [h.base_offset for h in whole_batches(committed.records)] == [0]
    assert (committed.last_stable_offset, committed.high_watermark, committed.aborted_transactions) == (2, 6, [])
    assert log.read(2, 1 << 20, isolation_committed=True).records == b""   # at the LSO: empty, no error
    uncommitted = log.read(0, 1 << 20)
    assert [h.base_offset for h in whole_batches(uncommitted.records)] == [0, 2, 4]
    assert uncommitted.aborted_transactions == () and uncommitted.last_stable_offset == 2


def test_aborted_transactions_are_listed_committed_ones_not(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn(1, 0, tag=1), now_ms=0)        # 0-1 aborted
    log.append_as_leader(txn(2, 0, tag=2), now_ms=0)        # 2-3 committed
    log.append_txn_marker(1, 1, 0, False, now_ms=0)         # 4
    log.append_txn_marker(2, 1, 0, True, now_ms=0)          # 5
    data = log.read(0, 1 << 20, isolation_committed=True)
    assert data.aborted_transactions == [AbortedTxn(1, 0, 4, 2)]
    assert [offset for offset, _ in committed_view(log)] == [2, 3]


def test_aborted_transactions_are_exactly_those_overlapping_the_returned_range(tmp_path):
    log = open_log(tmp_path / "t-0")
    # three aborted transactions of one producer, each batch alone, with plain batches between
    spans = []
    for epoch in range(3):
        first = log.append_as_leader(txn(7, 0, epoch=epoch), now_ms=0).first_offset
        log.append_as_leader(make_batch(1), now_ms=0)
        marker = log.append_txn_marker(7, epoch + 1, 0, False, now_ms=0).first_offset
        log.append_as_leader(make_batch(1), now_ms=0)
        spans.append((first, marker))
    headers = whole_batches(log.read(0, 1 << 20).records)
    for i, start in enumerate(headers):
        for j in range(i, len(headers)):
            size = sum(h.size_bytes for h in headers[i:j + 1])
            data = log.read(start.base_offset, size, isolation_committed=True)
            returned = whole_batches(data.records)
            assert returned[-1].next_offset == headers[j].next_offset
            low, high = start.base_offset, headers[j].next_offset
            expected = [AbortedTxn(7, first, marker, marker + 1) for first, marker in spans
                        if marker >= low and first < high]
            assert data.aborted_transactions == expected, (low, high)


def test_interleaved_transactions_of_three_producers(tmp_path):
    log = open_log(tmp_path / "t-0", SMALL_SEGMENTS)
    sequences = {1: 0, 2: 0, 3: 0}
    values = {}
    for round_ in range(4):
        for producer_id in (1, 2, 3):
            info = log.append_as_leader(txn(producer_id, sequences[producer_id], tag=10 * producer_id + round_),
                                        now_ms=0)
            sequences[producer_id] += 2
            values.setdefault(producer_id, []).extend(range(info.first_offset, info.last_offset + 1))
    assert log.last_stable_offset == 0
    log.append_txn_marker(2, 1, 0, False, now_ms=0)
    assert log.last_stable_offset == 0                     # producer 1 began first and is still open
    log.append_txn_marker(1, 1, 0, True, now_ms=0)
    assert log.last_stable_offset == values[3][0]          # only producer 3 open
    assert [o for o, _ in committed_view(log)] == [o for o in values[1] if o < values[3][0]]
    log.append_txn_marker(3, 1, 0, True, now_ms=0)
    assert log.last_stable_offset == log.log_end_offset
    assert len(log.segments) > 2
    for max_bytes in (1, 200, 1 << 20):
        assert [o for o, _ in committed_view(log, max_bytes=max_bytes)] == sorted(values[1] + values[3])
    # producer 2's abort is found from any fetch offset inside its transaction, across segments
    for offset in values[2]:
        data = log.read(offset, 1, isolation_committed=True)
        assert [a.producer_id for a in data.aborted_transactions] == [2]


def test_an_abort_marker_in_a_later_segment_is_found_from_the_first(tmp_path):
    log = open_log(tmp_path / "t-0", SMALL_SEGMENTS)
    log.append_as_leader(txn(1, 0), now_ms=0)
    for _ in range(12):
        log.append_as_leader(make_batch(2, value_bytes=40), now_ms=0)
    marker = log.append_txn_marker(1, 1, 0, False, now_ms=0)
    assert len(log.segments) >= 3 and log.segments[0].txn_index.all_entries() == []
    assert log.active_segment.txn_index.all_entries() == [AbortedTxn(1, 0, marker.first_offset,
                                                                     marker.first_offset + 1)]
    assert os.path.exists(log.active_segment.txn_index.path)
    assert not os.path.exists(log.segments[0].txn_index.path)   # created lazily, on the first abort
    data = log.read(0, 1, isolation_committed=True)
    assert data.aborted_transactions == [AbortedTxn(1, 0, marker.first_offset, marker.first_offset + 1)]
    assert all(offset > 1 for offset, _ in committed_view(log))


# ---- markers refused ----------------------------------------------------------------------------

def _state(log: Log):
    return (log.log_end_offset, log.last_stable_offset, log.describe_producers(), txn_entries(log),
            dir_state(log.directory))


@pytest.mark.parametrize("producer_epoch, coordinator_epoch, error", [
    (0, 5, InvalidProducerEpochError),     # not newer than the open transaction's epoch
    (2, 4, EosError),                      # a deposed coordinator
])
def test_stale_markers_are_refused_and_change_nothing(tmp_path, producer_epoch, coordinator_epoch, error):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn(1, 0), now_ms=0)
    log.append_txn_marker(1, 1, 5, False, now_ms=0)     # coordinator epoch 5 wrote a marker
    log.append_as_leader(txn(1, 0, epoch=1), now_ms=0)
    before = _state(log)
    with pytest.raises(error) as raised:
        log.append_txn_marker(1, producer_epoch, coordinator_epoch, False, now_ms=0)
    if error is EosError:
        assert raised.value.code == ErrorCode.TRANSACTION_COORDINATOR_FENCED
    assert _state(log) == before
    assert log.append_txn_marker(1, 2, 5, False, now_ms=0).completed_txn.is_aborted


def test_a_late_write_of_a_finished_transaction_is_fenced(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn(1, 0), now_ms=0)
    log.append_txn_marker(1, 1, 0, True, now_ms=0)
    before = _state(log)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(txn(1, 2), now_ms=0)
    assert _state(log) == before


@pytest.mark.parametrize("args", [(-1, 0, 0), (1, -1, 0), (1, 0x8000, 0), (1, 0, -1), (1, 0, 2**31)])
def test_marker_fields_out_of_range_are_refused(tmp_path, args):
    log = open_log(tmp_path / "t-0")
    before = _state(log)
    with pytest.raises(InvalidRequestError):
        log.append_txn_marker(*args, True, now_ms=0)
    assert _state(log) == before


def test_control_batches_through_append_as_leader(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn(1, 0), now_ms=0)
    abort = encode_control_batch(committed=False, producer_id=1, producer_epoch=1, coordinator_epoch=0,
                                 timestamp_ms=5)
    before = _state(log)
    with pytest.raises(InvalidRecordError, match="clients may not write control batches"):
        log.append_as_leader(abort, now_ms=0)
    with pytest.raises(InvalidRecordError, match="appended alone"):
        log.append_as_leader(abort + make_batch(1), now_ms=0, origin=AppendOrigin.COORDINATOR)
    assert _state(log) == before
    info = log.append_as_leader(abort, now_ms=0, origin=AppendOrigin.COORDINATOR)
    assert info.completed_txn.is_aborted and log.last_stable_offset == log.log_end_offset == 3
    assert log.active_segment.txn_index.all_entries() == [AbortedTxn(1, 0, 2, 3)]


# ---- coordinator-origin appends --------------------------------------------------------------

def test_coordinator_appends_skip_sequences_but_open_the_transaction(tmp_path):
    log = open_log(tmp_path / "t-0")
    offsets_commit = make_batch(1, producer_id=5, producer_epoch=3, base_sequence=-1, transactional=True)
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(offsets_commit, now_ms=0)                 # a client needs sequences
    first = log.append_as_leader(offsets_commit, now_ms=0, origin=AppendOrigin.COORDINATOR)
    second = log.append_as_leader(offsets_commit, now_ms=0, origin=AppendOrigin.COORDINATOR)
    assert (first.first_offset, second.first_offset, second.duplicate) == (0, 1, False)
    assert log.last_stable_offset == 0 and log.has_ongoing_transaction(5, 3)
    stale = make_batch(1, producer_id=5, producer_epoch=2, base_sequence=-1, transactional=True)
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(stale, now_ms=0, origin=AppendOrigin.COORDINATOR)
    with pytest.raises(InvalidTxnStateError):
        log.append_as_leader(make_batch(1, producer_id=5, producer_epoch=3, base_sequence=0), now_ms=0)
    done = log.append_txn_marker(5, 4, 0, True, now_ms=0)
    assert (done.completed_txn.first_offset, log.last_stable_offset) == (0, 3)


def test_describe_producers(tmp_path):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(make_batch(2, producer_id=3, producer_epoch=0, base_sequence=0), now_ms=0)
    log.append_as_leader(txn(4, 0), now_ms=0)
    described = {e.producer_id: (e.producer_epoch, e.last_sequence, e.current_txn_first_offset)
                 for e in log.describe_producers()}
    assert described == {3: (0, 1, -1), 4: (0, 1, 2)}


# ---- write failures change nothing ------------------------------------------------------------

def test_a_failing_txn_index_write_changes_nothing(tmp_path, monkeypatch):
    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn(1, 0), now_ms=0)
    before = _state(log)
    index = log.active_segment.txn_index

    def broken(aborted):
        with open(index.path, "ab") as f:
            f.write(b"\x00" * 10)   # a partial entry reached the file
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(index, "append", broken)
    with pytest.raises(StorageError, match="No space left"):
        log.append_txn_marker(1, 1, 0, False, now_ms=0)
    monkeypatch.undo()
    assert os.path.getsize(index.path) == 0
    os.unlink(index.path)
    assert _state(log) == before
    assert log.append_txn_marker(1, 1, 0, False, now_ms=0).completed_txn.is_aborted


def test_a_failing_log_write_takes_the_txn_index_entry_back(tmp_path, monkeypatch):
    import broker.storage.segment as segment_module

    log = open_log(tmp_path / "t-0")
    log.append_as_leader(txn(1, 0), now_ms=0)
    log.append_as_leader(txn(2, 0), now_ms=0)
    log.append_txn_marker(2, 1, 0, False, now_ms=0)
    before = _state(log)

    def broken(fd, data):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(segment_module, "_write_all", broken)
    with pytest.raises(StorageError):
        log.append_txn_marker(1, 1, 0, False, now_ms=0)
    monkeypatch.undo()
    assert _state(log) == before
    assert log.append_txn_marker(1, 1, 0, False, now_ms=0).completed_txn.first_offset == 0


# ---- retention, restarts and recovery -----------------------------------------------------------

def _transactional_history(log: Log, rounds: int = 8) -> None:
    """Interleaved transactions of three producers, aborts and commits, over several segments,
    ending with transactions open."""
    epochs = {1: 0, 2: 0, 3: 0}
    sequences = {1: 0, 2: 0, 3: 0}
    for round_ in range(rounds):
        for producer_id in (1, 2, 3):
            log.append_as_leader(txn(producer_id, sequences[producer_id], epoch=epochs[producer_id],
                                     tag=round_), now_ms=0)
            sequences[producer_id] += 2
        log.append_as_leader(make_batch(1, value_bytes=30), now_ms=0)
        ender = 1 + round_ % 3
        if round_ < rounds - 1 or ender == 1:
            epochs[ender] += 1
            sequences[ender] = 0
            log.append_txn_marker(ender, epochs[ender], 0, round_ % 2 == 0, now_ms=0)


def _observed(log: Log):
    return (log.log_end_offset, log.last_stable_offset, log.open_transactions(), txn_entries(log),
            committed_view(log), committed_view(log, max_bytes=150))


def test_retention_deletes_txn_index_files(tmp_path):
    log = open_log(tmp_path / "t-0", TopicConfig(segment_bytes=600, index_interval_bytes=100, retention_bytes=0,
                                                 file_delete_delay_ms=0))
    _transactional_history(log)
    with_index = [s.txn_index.path for s in log.segments[:-1] if s.txn_index.all_entries()]
    assert with_index and all(os.path.exists(p) for p in with_index)
    log.delete_old_segments(now_ms=1)
    assert len(log.segments) == 1
    assert not [p for p in with_index if os.path.exists(p) or os.path.exists(p + ".deleted")]


@pytest.mark.parametrize("clean", [True, False])
def test_restart_gives_the_same_txn_indexes_and_lso(tmp_path, clean):
    reference = open_log(tmp_path / "ref-0", SMALL_SEGMENTS)
    _transactional_history(reference)
    log = open_log(tmp_path / "t-0", SMALL_SEGMENTS)
    _transactional_history(log)
    assert _observed(log) == _observed(reference) and log.open_transactions()
    log.close(clean=clean)
    again = open_log(tmp_path / "t-0", SMALL_SEGMENTS, clean_shutdown=clean,
                     recovery_point=log.recovery_point if clean else 0)
    assert _observed(again) == _observed(reference)
    # the open transactions carry on: both end as in the reference
    for target in (again, reference):
        for producer_id in (2, 3):
            entry = next(e for e in target.describe_producers() if e.producer_id == producer_id)
            target.append_txn_marker(producer_id, entry.producer_epoch + 1, 0, False, now_ms=0)
    assert _observed(again) == _observed(reference)


@pytest.mark.parametrize("damage", ["delete", "torn", "garbage"])
def test_a_damaged_txn_index_is_rebuilt(tmp_path, damage):
    reference = open_log(tmp_path / "ref-0", SMALL_SEGMENTS)
    _transactional_history(reference)
    log = open_log(tmp_path / "t-0", SMALL_SEGMENTS)
    _transactional_history(log)
    log.flush()
    recovery_point = log.recovery_point
    log.close(clean=False)
    paths = sorted(os.path.join(log.directory, n) for n in os.listdir(log.directory) if n.endswith(".txnindex"))
    assert len(paths) >= 2
    victim = paths[0]
    if damage == "delete":
        os.unlink(victim)       # below the recovery point a missing file is undetectable; recovery redoes it
        recovery_point = 0
    elif damage == "torn":
        with open(victim, "ab") as f:
            f.write(b"\x00\x00\x01")
    else:
        with open(victim, "r+b") as f:
            f.write(b"\x07\x07")   # an unknown version
    again = open_log(tmp_path / "t-0", SMALL_SEGMENTS, recovery_point=recovery_point)
    assert _observed(again) == _observed(reference)
    if os.path.isdir("/proc/self/fd"):   # the rebuild leaves no descriptor open on sealed segments' indexes
        sealed = {s.txn_index.path for s in again.segments[:-1]}
        open_paths = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                open_paths.add(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        assert not sealed & open_paths


def test_a_torn_abort_marker_is_cut_with_its_txn_index_entry(tmp_path):
    """kill -9 while the ABORT marker was being written: recovery cuts the torn marker and
    the index entry that went ahead of it; the log equals one that never got the marker."""
    reference = open_log(tmp_path / "ref-0", SMALL_SEGMENTS)
    _transactional_history(reference)
    log = open_log(tmp_path / "t-0", SMALL_SEGMENTS)
    _transactional_history(log)
    marker = log.append_txn_marker(2, 99, 0, False, now_ms=0)
    assert log.active_segment.txn_index.all_entries()[-1].last_offset == marker.first_offset
    log.close(clean=False)
    log_path = os.path.join(log.directory, f"{log.segments[-1].base_offset:020d}.log")
    size = os.path.getsize(log_path)
    os.truncate(log_path, size - 5)
    again = open_log(tmp_path / "t-0", SMALL_SEGMENTS, recovery_point=0)
    assert _observed(again) == _observed(reference)
    # and producer 2 can still end its transaction
    assert again.append_txn_marker(2, 99, 0, False, now_ms=0).completed_txn.is_aborted


def test_kill_with_snapshots_restores_open_transactions(tmp_path):
    reference = open_log(tmp_path / "ref-0", SMALL_SEGMENTS)
    _transactional_history(reference, rounds=12)
    log = open_log(tmp_path / "t-0", SMALL_SEGMENTS)
    _transactional_history(log, rounds=12)
    log.flush()
    log.close(clean=False)
    again = open_log(tmp_path / "t-0", SMALL_SEGMENTS, recovery_point=log.recovery_point)
    assert _observed(again) == _observed(reference)


# ---- property: read_committed shows exactly the committed records ---------------------------------

_PRODUCERS = (1, 2, 3)
_operation = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(_PRODUCERS), st.integers(1, 3)),
    st.tuples(st.just("plain"), st.integers(1, 2)),
    st.tuples(st.just("commit"), st.sampled_from(_PRODUCERS)),
    st.tuples(st.just("abort"), st.sampled_from(_PRODUCERS)),
    st.tuples(st.just("restart"), st.sampled_from(["clean", "kill", "kill-flushed"])),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=st.lists(_operation, min_size=1, max_size=40), max_bytes=st.sampled_from([1, 180, 1 << 20]))
def test_read_committed_equals_the_committed_records_of_a_model(tmp_path_factory, operations, max_bytes):
    path = tmp_path_factory.mktemp("txn") / "t-0"
    config = TopicConfig(segment_bytes=500, index_interval_bytes=64)
    log = Log.open(str(path), config, now_ms=0)
    epochs = {p: 0 for p in _PRODUCERS}
    sequences = {p: 0 for p in _PRODUCERS}
    open_records: dict[int, list[tuple[int, bytes]]] = {}
    open_first: dict[int, int] = {}
    committed: list[tuple[int, bytes]] = []
    tag = 0
    try:
        for operation in operations:
            kind = operation[0]
            if kind == "send":
                _, producer_id, count = operation
                tag += 1
                batch = txn(producer_id, sequences[producer_id], count, epoch=epochs[producer_id], tag=tag)
                info = log.append_as_leader(batch, now_ms=0)
                sequences[producer_id] += count
                open_first.setdefault(producer_id, info.first_offset)
                values = [bytes([(tag + i) % 256]) * 10 for i in range(count)]
                open_records.setdefault(producer_id, []).extend(
                    zip(range(info.first_offset, info.last_offset + 1), values))
            elif kind == "plain":
                tag += 1
                info = log.append_as_leader(make_batch(operation[1], tag=tag), now_ms=0)
                committed.extend(zip(range(info.first_offset, info.last_offset + 1),
                                     [bytes([(tag + i) % 256]) * 10 for i in range(operation[1])]))
            elif kind in ("commit", "abort"):
                producer_id = operation[1]
                epochs[producer_id] += 1
                sequences[producer_id] = 0
                info = log.append_txn_marker(producer_id, epochs[producer_id], 0, kind == "commit", now_ms=0)
                had_open = producer_id in open_first
                assert (info.completed_txn is not None) == had_open
                if had_open:
                    assert info.completed_txn.first_offset == open_first.pop(producer_id)
                    records = open_records.pop(producer_id)
                    if kind == "commit":
                        committed.extend(records)
            else:
                how = operation[1]
                before = (log.last_stable_offset, txn_entries(log))
                if how == "kill-flushed":
                    log.flush()
                recovery_point = log.recovery_point if how != "kill" else 0
                log.close(clean=how == "clean")
                log = Log.open(str(path), config, now_ms=0, clean_shutdown=how == "clean",
                               recovery_point=recovery_point)
                assert (log.last_stable_offset, txn_entries(log)) == before
            expected_lso = min(open_first.values(), default=log.log_end_offset)
            assert log.last_stable_offset == expected_lso
        assert committed_view(log, max_bytes=max_bytes) == sorted(o for o in committed if o[0] < expected_lso)
    finally:
        log.close(clean=False)
