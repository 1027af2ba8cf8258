"""The transaction index (broker.storage.txn_index): Kafka's file layout, torn tails and damage,
collecting aborted transactions for a fetch range within and across segments, truncation;
and, end to end with the producer state, that collecting over the indexes of a simulated
partition finds exactly the aborted transactions overlapping any fetch range."""
from __future__ import annotations

import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.storage.producer_state import ProducerStateManager
from broker.storage.txn_index import (
    ENTRY_BYTES,
    AbortedTxn,
    TransactionIndex,
    TxnIndexCorruptError,
    collect_aborted_transactions,
    read_txn_index_file,
    txn_index_path,
)
from eos.errors import InvariantError
from eos.records.header import TRANSACTIONAL_FLAG, BatchHeader


def entry_bytes(version: int, producer_id: int, first: int, last: int, lso: int) -> bytes:
    return (version.to_bytes(2, "big", signed=True) + producer_id.to_bytes(8, "big", signed=True)
            + first.to_bytes(8, "big", signed=True) + last.to_bytes(8, "big", signed=True)
            + lso.to_bytes(8, "big", signed=True))


def test_path_and_byte_layout(tmp_path):
    path = txn_index_path(str(tmp_path), 1234)
    assert os.path.basename(path) == "00000000000000001234.txnindex"
    index = TransactionIndex.for_segment(str(tmp_path), 1234)
    assert not os.path.exists(path), "the file is created with the first entry, as in Kafka"
    assert index.all_entries() == [] and index.last_offset is None and len(index) == 0
    index.append(AbortedTxn(7, 1_000, 1_300, 1_250))
    index.append(AbortedTxn(2**40, 1_301, 1_400, 1_401))
    index.close()
    data = open(path, "rb").read()
    assert ENTRY_BYTES == 34 and len(data) == 68
    assert data == entry_bytes(0, 7, 1_000, 1_300, 1_250) + entry_bytes(0, 2**40, 1_301, 1_400, 1_401)
    reopened = TransactionIndex(path, 1234)
    assert reopened.all_entries() == [AbortedTxn(7, 1_000, 1_300, 1_250), AbortedTxn(2**40, 1_301, 1_400, 1_401)]
    assert reopened.last_offset == 1_400 and reopened.cut_bytes == 0
    assert read_txn_index_file(path) == reopened.all_entries()


def test_append_refuses_entries_out_of_order_and_writes_nothing(tmp_path):
    index = TransactionIndex(str(tmp_path / "00000000000000000100.txnindex"), 100)
    index.append(AbortedTxn(1, 100, 110, 111))
    for bad in [AbortedTxn(2, 105, 110, 111),     # same last offset
                AbortedTxn(2, 100, 109, 111),     # earlier last offset
                AbortedTxn(2, 120, 115, 116),     # first after last
                AbortedTxn(2, 0, 99, 100),        # marker below the segment's base
                AbortedTxn(-1, 111, 120, 121)]:   # negative producer id
        with pytest.raises(InvariantError):
            index.append(bad)
    assert index.all_entries() == [AbortedTxn(1, 100, 110, 111)]
    assert os.path.getsize(index.path) == ENTRY_BYTES


def test_torn_tail_is_cut_with_a_warning(tmp_path, caplog):
    path = str(tmp_path / "00000000000000000000.txnindex")
    whole = entry_bytes(0, 1, 0, 5, 6) + entry_bytes(0, 2, 3, 9, 10)
    open(path, "wb").write(whole + entry_bytes(0, 3, 10, 12, 13)[:20])
    with caplog.at_level(logging.WARNING, logger="broker.storage.txn_index"):
        index = TransactionIndex(path, 0)
    assert index.cut_bytes == 20
    assert "torn" in caplog.text and path in caplog.text
    assert os.path.getsize(path) == 68
    assert index.all_entries() == [AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 9, 10)]
    index.append(AbortedTxn(3, 10, 12, 13))   # appends after the cut, not after the torn bytes
    assert TransactionIndex(path, 0).all_entries()[-1] == AbortedTxn(3, 10, 12, 13)


@pytest.mark.parametrize("bad_entry, problem", [
    (entry_bytes(1, 2, 6, 9, 10), "version 1"),
    (entry_bytes(0, 2, 3, 5, 10), "does not increase"),
    (entry_bytes(0, 2, 9, 7, 10), "first offset 9 is after last offset 7"),
    (entry_bytes(0, -5, 6, 9, 10), "negative"),
    (entry_bytes(0, 2, 6, 9, -1), "negative"),
], ids=["version", "not increasing", "first after last", "negative producer", "negative lso"])
def test_damaged_entries_raise_and_leave_the_file_alone(tmp_path, bad_entry, problem):
    path = str(tmp_path / "00000000000000000000.txnindex")
    data = entry_bytes(0, 1, 0, 5, 6) + bad_entry
    open(path, "wb").write(data)
    with pytest.raises(TxnIndexCorruptError, match=problem):
        TransactionIndex(path, 0)
    assert open(path, "rb").read() == data


def test_entry_below_the_segment_base_is_damage(tmp_path):
    path = str(tmp_path / "00000000000000000050.txnindex")
    open(path, "wb").write(entry_bytes(0, 1, 10, 40, 41))
    with pytest.raises(TxnIndexCorruptError, match="below the segment's base offset 50"):
        TransactionIndex(path, 50)


# ---- collecting ------------------------------------------------------------------------------

def kafka_collect(entries: list[AbortedTxn], fetch_offset: int, upper_bound_offset: int):
    """Kafka's TransactionIndex.collectAbortedTxns, as a plain linear scan (the reference)."""
    found = []
    for txn in entries:
        if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound_offset:
            found.append(txn)
        if txn.last_stable_offset >= upper_bound_offset:
            return found, True
    return found, False


A = AbortedTxn(1, 10, 20, 15)    # lso 15: another transaction, from 15, was still open
B = AbortedTxn(2, 15, 30, 31)    # nothing open after it
C = AbortedTxn(3, 40, 50, 45)
D = AbortedTxn(4, 45, 60, 61)


@pytest.mark.parametrize("fetch_offset, upper_bound, expected", [
    (0, 5, ([], True)),                   # nothing overlaps; A's lso 15 >= 5 ends the search
    (0, 16, ([A, B], True)),              # both overlap; B's lso 31 >= 16 ends the search
    (21, 25, ([B], True)),                # A ends before the range
    (25, 35, ([B], True)),                # C does not overlap but its lso 45 >= 35 ends the search
    (31, 41, ([C], True)),
    (51, 55, ([D], True)),                # D began at 45 and spans the range
    (61, 70, ([], False)),                # after every marker: later segments may hold more
    (10, 10, ([], True)),                 # an empty range
])
def test_collect_within_one_index(tmp_path, fetch_offset, upper_bound, expected):
    index = TransactionIndex(str(tmp_path / "x.txnindex"))
    for txn in (A, B, C, D):
        index.append(txn)
    assert index.collect_aborted(fetch_offset, upper_bound) == expected
    assert kafka_collect([A, B, C, D], fetch_offset, upper_bound) == expected


@settings(max_examples=150, deadline=None)
@given(raw=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 20), st.integers(0, 40)), max_size=12),
       fetch_offset=st.integers(0, 400), length=st.integers(0, 120))
def test_collect_equals_kafkas_linear_scan_on_any_index(tmp_path_factory, raw, fetch_offset, length):
    """Arbitrary (even inconsistent) entries with increasing last offsets: the bisecting
    implementation answers exactly what Kafka's linear scan answers."""
    entries, last = [], -1
    for gap, span, lso_back in raw:
        last_offset = last + 1 + gap
        first_offset = max(0, last_offset - span)
        entries.append(AbortedTxn(9, first_offset, last_offset, max(0, last_offset + 1 - lso_back)))
        last = last_offset
    index = TransactionIndex(str(tmp_path_factory.mktemp("idx") / "x.txnindex"))
    for txn in entries:
        index.append(txn)
    upper_bound = fetch_offset + length
    assert index.collect_aborted(fetch_offset, upper_bound) == kafka_collect(entries, fetch_offset, upper_bound)


def test_collect_across_indexes_stops_at_the_first_complete_one(tmp_path):
    segment_0 = TransactionIndex.for_segment(str(tmp_path), 0)
    segment_100 = TransactionIndex.for_segment(str(tmp_path), 100)
    segment_200 = TransactionIndex.for_segment(str(tmp_path), 200)
    segment_0.append(AbortedTxn(1, 5, 50, 51))
    # producer 2's transaction starts in segment 0 and is aborted in segment 100: its entry
    # is in the marker's segment; producer 3 was still open from 90 then
    segment_100.append(AbortedTxn(2, 60, 120, 90))
    segment_100.append(AbortedTxn(3, 90, 150, 151))
    segment_200.append(AbortedTxn(4, 210, 220, 221))
    indexes = [segment_0, segment_100, segment_200]
    assert collect_aborted_transactions(indexes, 0, 40) == [AbortedTxn(1, 5, 50, 51)]
    # from 55: the fetch starts in segment 0; producer 2's transaction overlaps although its
    # entry is in the next segment, and the walk must go on to find it
    assert collect_aborted_transactions(indexes, 55, 95) == [AbortedTxn(2, 60, 120, 90),
                                                            AbortedTxn(3, 90, 150, 151)]
    assert collect_aborted_transactions(indexes, 55, 80) == [AbortedTxn(2, 60, 120, 90)]
    assert collect_aborted_transactions(indexes[1:], 130, 160) == [AbortedTxn(3, 90, 150, 151)]
    assert collect_aborted_transactions(indexes[2:], 205, 230) == [AbortedTxn(4, 210, 220, 221)]
    assert collect_aborted_transactions(indexes[2:], 221, 300) == []
    assert collect_aborted_transactions([], 0, 10) == []

    class Exploding:
        def collect_aborted(self, fetch_offset, upper_bound_offset):
            raise AssertionError("the walk went past a complete index")

    assert collect_aborted_transactions([segment_0, Exploding()], 0, 40) == [AbortedTxn(1, 5, 50, 51)]


# ---- truncation and lifecycle ------------------------------------------------------------------

def test_truncate_to_drops_transactions_whose_marker_is_cut(tmp_path):
    index = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"))
    for txn in (A, B, C, D):
        index.append(txn)
    before = index.collect_aborted(0, 100)
    index.truncate_to(51)                      # keeps markers below 51: A, B, C
    assert index.all_entries() == [A, B, C]
    assert os.path.getsize(index.path) == 3 * ENTRY_BYTES
    index.truncate_to(50)                      # C's marker is at 50: gone
    assert index.all_entries() == [A, B] and index.last_offset == 30
    index.truncate_to(1_000)                   # nothing past: nothing changes
    assert index.all_entries() == [A, B]
    index.append(AbortedTxn(5, 31, 35, 36))    # the new tail may reuse cut offsets
    assert TransactionIndex(index.path).all_entries() == [A, B, AbortedTxn(5, 31, 35, 36)]
    assert before[0] == [A, B, C, D]


def test_readers_keep_their_view_across_truncation(tmp_path):
    index = TransactionIndex(str(tmp_path / "x.txnindex"))
    for txn in (A, B, C):
        index.append(txn)
    view = index._view                         # what a reader took before the truncation
    index.truncate_to(0)
    index.append(AbortedTxn(9, 0, 3, 4))
    assert view.count == 3 and list(view.last_offsets[:view.count]) == [20, 30, 50]
    assert index.all_entries() == [AbortedTxn(9, 0, 3, 4)]


def test_reset_delete_flush_close(tmp_path):
    path = str(tmp_path / "00000000000000000000.txnindex")
    index = TransactionIndex(path)
    index.flush()                              # nothing written: no file to sync, no error
    index.append(A)
    index.flush()
    index.close()
    assert index.all_entries() == [A], "closing keeps the entries readable"
    index.append(B)                            # reopens its descriptor
    index.reset()
    assert index.all_entries() == [] and os.path.getsize(path) == 0
    index.append(C)
    assert TransactionIndex(path).all_entries() == [C]
    assert index.delete() is True and not os.path.exists(path) and index.all_entries() == []
    assert index.delete() is False
    TransactionIndex(str(tmp_path / "missing.txnindex")).reset()   # a missing file stays missing
    assert not os.path.exists(tmp_path / "missing.txnindex")


# ---- end to end with the producer state ----------------------------------------------------

def txn_batch(producer_id: int, epoch: int, sequence: int, count: int, offset: int) -> BatchHeader:
    return BatchHeader(base_offset=offset, batch_length=49 + 10 * count, partition_leader_epoch=0, magic=2, crc=0,
                       attributes=TRANSACTIONAL_FLAG, last_offset_delta=count - 1, base_timestamp=offset,
                       max_timestamp=offset, producer_id=producer_id, producer_epoch=epoch,
                       base_sequence=sequence, records_count=count, position=0)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["data", "commit", "abort", "roll"]), st.integers(0, 3),
                                st.integers(1, 3)), max_size=45),
       fetch=st.data())
def test_indexes_built_from_markers_find_every_overlapping_abort(tmp_path_factory, steps, fetch):
    """Drive the producer state with random transactions of four producers, index the aborted
    ones in the segment holding their marker, then check that collecting over the segments
    from the one holding the fetch offset returns exactly the aborted transactions that
    overlap the range, for many ranges."""
    directory = str(tmp_path_factory.mktemp("partition"))
    manager = ProducerStateManager(directory)
    epochs, sequences = [0] * 4, [0] * 4
    segments = [TransactionIndex.for_segment(directory, 0)]
    aborted: list[AbortedTxn] = []
    offset = 0
    for kind, producer, count in steps:
        if kind == "roll":
            if segments[-1].base_offset != offset:
                segments.append(TransactionIndex.for_segment(directory, offset))
        elif kind == "data":
            append = manager.prepare_append(txn_batch(producer, epochs[producer], sequences[producer], count, 0), 0)
            manager.apply(append, offset, offset + count - 1)
            sequences[producer] += count
            offset += count
        else:
            marker = manager.prepare_marker(producer, epochs[producer] + 1, 0, kind == "commit", 0)
            completed = manager.apply_marker(marker, offset)
            epochs[producer] += 1
            sequences[producer] = 0
            if completed is not None and completed.is_aborted:
                segments[-1].append(completed.to_aborted_txn())
                aborted.append(completed.to_aborted_txn())
            offset += 1
    end = offset + 1
    for _ in range(8):
        fetch_offset = fetch.draw(st.integers(0, end))
        upper_bound = fetch.draw(st.integers(fetch_offset, end + 2))
        first = max(i for i, s in enumerate(segments) if s.base_offset <= fetch_offset)
        got = collect_aborted_transactions(segments[first:], fetch_offset, upper_bound)
        expected = [t for t in aborted if t.last_offset >= fetch_offset and t.first_offset < upper_bound]
        assert got == expected, (fetch_offset, upper_bound)
