"""bench/: the storage append workload's batches and run checks, the profile summariser."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench.profile import summarize
from bench.workloads import RecordsLost
from bench.workloads.append_storage import (
    IDEMPOTENT_PRODUCER_ID,
    StorageVariant,
    append_once,
    build_batches,
    records_per_batch,
)
from eos.records.codec import encode_batch
from eos.records.header import iter_headers


@pytest.mark.parametrize("batch_bytes", [4096, 16 * 1024, 1 << 20])
def test_records_per_batch_is_the_most_that_fit(batch_bytes):
    value = b"v" * 100
    count = records_per_batch(value, batch_bytes)
    assert len(encode_batch([value] * count)) <= batch_bytes
    assert len(encode_batch([value] * (count + 1))) > batch_bytes


def test_idempotent_batches_carry_consecutive_sequences():
    variant = StorageVariant("t", "test", 4096, idempotent=True)
    batches, per_batch = build_batches(b"v" * 100, variant, 10 * 4096)
    assert len(batches) == 10
    headers = [next(iter_headers(b)) for b in batches]
    assert [h.base_sequence for h in headers] == [i * per_batch for i in range(10)]
    assert {h.producer_id for h in headers} == {IDEMPOTENT_PRODUCER_ID}
    assert all(h.records_count == per_batch for h in headers)


def test_plain_batches_are_distinct_objects_without_producer(tmp_path):
    variant = StorageVariant("t", "test", 4096, idempotent=False)
    batches, _ = build_batches(b"v" * 100, variant, 3 * 4096)
    assert len({id(b) for b in batches}) == len(batches) == 3
    assert all(next(iter_headers(b)).producer_id == -1 for b in batches)


@pytest.mark.parametrize("idempotent", [False, True])
def test_append_once_appends_everything_and_cleans_up(tmp_path, idempotent):
    variant = StorageVariant("t", "test", 16 * 1024, idempotent)
    batches, per_batch = build_batches(b"v" * 100, variant, 64 * 1024)
    run = append_once(str(tmp_path), batches, per_batch)
    assert run.records == len(batches) * per_batch
    assert run.log_bytes == sum(len(b) for b in batches)
    assert run.batches == len(batches)
    assert 0 < run.append_s <= run.append_fsync_s
    assert list(tmp_path.iterdir()) == []


def test_append_once_reports_a_refused_duplicate_as_lost(tmp_path):
    # The same idempotent batch twice: the log answers the retry as a duplicate and
    # appends nothing, so the records counted as appended are not all there.
    variant = StorageVariant("t", "test", 4096, idempotent=True)
    batches, per_batch = build_batches(b"v" * 100, variant, 4096)
    with pytest.raises(RecordsLost):
        append_once(str(tmp_path), batches * 2, per_batch)


def test_summarize_counts_threads_self_and_inclusive(tmp_path):
    raw = tmp_path / "stacks.txt"
    raw.write_text(
        "thread (1): MainThread;main (/x/app.py:1);work (/x/app.py:5);write (/x/io.py:9) 6\n"
        "thread (1): MainThread;main (/x/app.py:1);work (/x/app.py:6) 2\n"
        "thread (2): eos-broker-rpc_3;serve (/x/srv.py:2) 1\n"
        "thread (3): eos-broker-rpc_12;serve (/x/srv.py:2) 1\n")
    text = summarize(raw, top=5)
    assert "MainThread 8 (80%)" in text
    assert "eos-broker-rpc_N 2 (20%)" in text      # numbered pool threads counted as one
    assert " 60.0%  write (/x/io.py)" in text      # self
    assert " 80.0%  work (/x/app.py)" in text      # inclusive
    only_rpc = summarize(raw, top=5, thread_filter="rpc")
    assert "100.0%  serve (/x/srv.py)" in only_rpc
    focused = summarize(raw, top=5, focus="write (")
    assert "100.0%  write (/x/io.py)" in focused
    by_line = summarize(raw, top=5, with_line=True)
    assert "write (/x/io.py:9)" in by_line
