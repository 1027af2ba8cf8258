"""broker.storage.log_loader: a partition directory read back into segments (Kafka's LogLoader),
on its own; Log.open goes through it in every recovery test (tests/unit/test_storage_recovery.py)."""
from __future__ import annotations

from broker.storage.log_loader import load_segments
from tests.unit.test_storage_recovery import CONFIG, fill


def _load(path, *, clean: bool, recovery_point: int = 0, log_start_offset: int = 0):
    return load_segments(str(path), path.name, CONFIG, recovery_point=recovery_point,
                         log_start_offset=log_start_offset, clean_shutdown=clean, now_ms=0)


def test_a_clean_shutdown_is_trusted_and_a_crash_is_checked_from_the_recovery_point(tmp_path):
    path = tmp_path / "t-0"
    log, _ = fill(path, 30)
    bases = [s.base_offset for s in log.segments]
    end = log.log_end_offset
    log.close()
    assert len(bases) > 3
    clean = _load(path, clean=True)
    assert [s.base_offset for s in clean.segments] == bases and clean.log_end_offset == end
    assert clean.txn_rebuild_from is None and clean.first_unflushed == len(bases)
    for segment in clean.segments:
        segment.close()
    # After a crash, the segments from the one holding the recovery point on are checked:
    # they may hold what only the page cache had, and their transaction indexes are rebuilt.
    crashed = _load(path, clean=False, recovery_point=bases[2] + 1)
    assert crashed.log_end_offset == end
    assert crashed.first_unflushed == 2 and crashed.txn_rebuild_from == bases[2]
    for segment in crashed.segments:
        segment.close()


def test_a_torn_tail_is_cut_and_the_segments_after_it_deleted(tmp_path):
    path = tmp_path / "t-0"
    log, _ = fill(path, 30)
    bases = [s.base_offset for s in log.segments]
    log.close()
    first_log = path / f"{bases[0]:020d}.log"
    first_log.write_bytes(first_log.read_bytes()[:-7])       # the last batch of segment 0, torn
    loaded = _load(path, clean=False)
    assert [s.base_offset for s in loaded.segments] == [bases[0]]
    assert loaded.log_end_offset < bases[1]
    assert not (path / f"{bases[1]:020d}.log").exists()
    for segment in loaded.segments:
        segment.close()
