"""Kafka's LogLoader: a partition directory read back into segments, after a clean shutdown
or a crash.

Theory of operation
-------------------
`broker.storage.log.Log` opens its directory through this module and owns what it returns.
The steps, in order (the Log's module doc says what recovery guarantees):

1. `scan_directory`: a cleaner's `.swap` that a crash left is finished first
   (`complete_swaps`: the segments it covers go, it becomes the `.log`); leftover
   `.deleted`/`.cleaned` files and indexes without a `.log` are removed; files that are not
   ours are left alone with a warning. Returns the base offsets of the `.log` files.
2. `load_segments`: each segment opened; those from the one holding the recovery point on
   (all of them after an unclean shutdown's recovery point, none after a clean shutdown)
   are checked batch by batch and cut after the last valid batch, later segments deleted;
   the others are trusted and only inconsistent indexes rebuilt. Decides from which segment
   on the transaction indexes must be rebuilt (`txn_rebuild_from`) and reconciles the log
   start offset from the checkpoint with what the files hold.
3. `replay_producer_state`: the producer state loaded from its newest usable snapshot (no
   later than `txn_rebuild_from`) and brought up to date from the batch headers after it;
   the ABORT markers replayed refill the transaction indexes being rebuilt, each with the
   entry the original append wrote. A truncation replays the same way.
4. `rebuild_leader_epochs`: the leader epoch cache trimmed to the recovered log, or rebuilt
   from every batch's partitionLeaderEpoch when its file was missing or unreadable.

Only files are touched here, never the Log's own fields: the Log seals, publishes and
flushes what these functions give back.
"""
from __future__ import annotations

import logging
import os
import re
from bisect import bisect_right
from typing import NamedTuple

from eos.config import TopicConfig
from eos.errors import CorruptRecordError, StorageError
from eos.files import fsync_directory
from eos.records.codec import decode_control_record
from eos.records.header import NO_PRODUCER_ID, BatchHeader, iter_headers
from broker.storage.index import IndexCorruptError
from broker.storage.leader_epoch import LeaderEpochCache
from broker.storage.producer_state import ProducerStateManager
from broker.storage.segment import DELETED_SUFFIX, LOG_SUFFIX, LogSegment, segment_file_name

log = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"   # a cleaner's output being written (not committed)
SWAP_SUFFIX = ".swap"         # a cleaned segment whose pass committed, not yet live
_LEFTOVER_SUFFIXES = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX)
_SEGMENT_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)$")
_SNAPSHOT_FILE = re.compile(r"^\d{20}\.snapshot(\.tmp)?$")
_KNOWN_FILES = frozenset({"leader-epoch-checkpoint", "leader-epoch-checkpoint.tmp", "partition.metadata"})
_SWAP_FILE = re.compile(r"^(\d{20})\.log\.swap$")


class LoadedSegments(NamedTuple):
    """What `load_segments` recovered: the segments to keep, in offset order (the last one
    active), the offsets they span, from which segment's base offset the transaction
    indexes are to be rebuilt (None: none), and the index of the first segment whose
    recovery may live only in the page cache."""

    segments: list[LogSegment]
    log_start_offset: int
    log_end_offset: int
    txn_rebuild_from: int | None
    first_unflushed: int


def new_segment(directory: str, config: TopicConfig, base_offset: int, now_ms: int) -> LogSegment:
    return LogSegment.create(directory, base_offset, index_interval_bytes=config.index_interval_bytes,
                             max_index_bytes=config.segment_index_bytes, now_ms=now_ms)


def remove_file(path: str) -> None:
    """Remove `path` if it is there (a directory is left, with a warning)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        log.warning("not removing directory %s", path)


def scan_directory(directory: str, name: str) -> list[int]:
    """Clean leftovers, warn about strays; the base offsets of the `.log` files, sorted."""
    complete_swaps(directory, name)
    logs: set[int] = set()
    indexes: list[tuple[int, str]] = []
    for file_name in sorted(os.listdir(directory)):
        path = os.path.join(directory, file_name)
        if file_name.endswith(_LEFTOVER_SUFFIXES):
            log.info("%s: removing leftover %s", name, file_name)
            remove_file(path)
            continue
        match = _SEGMENT_FILE.match(file_name)
        if match:
            base_offset = int(match.group(1))
            if match.group(2) == "log":
                logs.add(base_offset)
            else:
                indexes.append((base_offset, path))
            continue
        if _SNAPSHOT_FILE.match(file_name) or file_name in _KNOWN_FILES:
            continue  # the producer state's files / metadata we do not own
        log.warning("%s: ignoring stray file %s, which is not part of a log", name, file_name)
    for base_offset, path in indexes:
        if base_offset not in logs:
            log.info("%s: removing index %s, which has no .log", name, os.path.basename(path))
            remove_file(path)
    return sorted(logs)


def complete_swaps(directory: str, name: str) -> None:
    """Finish a cleaner's swap that a crash cut short (see `Log.swap_in_cleaned`): a
    `<base>.log.swap` is a cleaned segment whose swap had begun; the live segments it
    replaces -- those whose base offset lies in [base, the swap's end) -- are deleted
    and it takes the live name. (The `.cleaned` output of a pass that never reached its
    swap is removed with the other leftovers.)"""
    file_names = sorted(os.listdir(directory))
    for file_name in file_names:
        match = _SWAP_FILE.match(file_name)
        if match is None:
            continue
        base_offset = int(match.group(1))
        swap_path = os.path.join(directory, file_name)
        try:
            with open(swap_path, "rb") as swap_file:
                end_offset = base_offset
                for header in iter_headers(swap_file.read()):
                    end_offset = header.next_offset
        except CorruptRecordError as e:
            # fsynced before it was renamed to .swap, so this is damage, not a torn write:
            # keep the segments it would replace, which are whole
            log.warning("%s: dropping unreadable cleaned segment %s: %s", name, file_name, e)
            remove_file(swap_path)
            continue
        for other in file_names:
            live = _SEGMENT_FILE.match(other)
            if live and (int(live.group(1)) == base_offset or base_offset <= int(live.group(1)) < end_offset):
                remove_file(os.path.join(directory, other))
        os.rename(swap_path, os.path.join(directory, segment_file_name(base_offset, LOG_SUFFIX)))
        fsync_directory(directory)
        log.info("%s: finished swapping in the cleaned segment %d (offsets up to %d)", name, base_offset,
                 end_offset)


def load_segments(directory: str, name: str, config: TopicConfig, *, recovery_point: int, log_start_offset: int,
                  clean_shutdown: bool, now_ms: int) -> LoadedSegments:
    """Open, check and cut the segments of `directory` (step 2 of the module doc)."""
    base_offsets = scan_directory(directory, name)
    segments = [LogSegment.open_existing(directory, base, index_interval_bytes=config.index_interval_bytes,
                                         max_index_bytes=config.segment_index_bytes, now_ms=now_ms)
                for base in base_offsets]
    # Everything from the segment holding the recovery point on is checked batch by
    # batch after a crash; before it, and everywhere after a clean shutdown, the files
    # are trusted and only inconsistent indexes are rebuilt.
    if clean_shutdown:
        first_checked = len(segments)
    else:
        first_checked = max(0, bisect_right(base_offsets, recovery_point) - 1)
    kept: list[LogSegment] = []
    # The first segment whose transaction index is rebuilt by replaying the producer
    # state: a checked one (its tail may be cut, its index lag the log), one whose
    # indexes were inconsistent, or one whose .txnindex was torn or corrupt. Every
    # later segment is rebuilt too, from one replay.
    txn_rebuild_from: int | None = None
    for i, segment in enumerate(segments):
        successor_base = base_offsets[i + 1] if i + 1 < len(segments) else None
        rebuild = i >= first_checked or segment.txn_index_needs_rebuild
        if i >= first_checked:
            cut_bytes = segment.recover(verify_crc=True)
        else:
            cut_bytes = 0
            try:
                segment.load(successor_base)
            except (IndexCorruptError, CorruptRecordError, StorageError) as e:
                log.warning("%s: rebuilding the indexes of segment %d: %s", name, segment.base_offset, e)
                cut_bytes = segment.recover(verify_crc=False)
                rebuild = True
        if rebuild and txn_rebuild_from is None:
            txn_rebuild_from = segment.base_offset
        kept.append(segment)
        overlaps = successor_base is not None and segment.next_offset > successor_base
        if (cut_bytes or overlaps) and successor_base is not None:
            dropped = segments[i + 1:]
            log.warning("%s: log cut at offset %d in segment %d; deleting %d later segment(s)",
                        name, segment.next_offset, segment.base_offset, len(dropped))
            for later in dropped:
                later.mark_deleted()
                later.destroy()
            break
    if not kept:
        kept.append(new_segment(directory, config, max(0, log_start_offset), now_ms))
    log_end_offset = kept[-1].next_offset
    log_start_offset = max(log_start_offset, kept[0].base_offset)
    if log_start_offset > log_end_offset:
        # The checkpoint says records up to log_start_offset were deleted, yet the log
        # ends before it: nothing here is readable, start afresh at log_start_offset.
        log.warning("%s: log start offset %d is past the log end %d; starting an empty log there",
                    name, log_start_offset, log_end_offset)
        for segment in kept:
            segment.mark_deleted()
            segment.destroy()
        kept = [new_segment(directory, config, log_start_offset, now_ms)]
        log_end_offset = log_start_offset
        txn_rebuild_from = None
    return LoadedSegments(kept, log_start_offset, log_end_offset, txn_rebuild_from,
                          len(kept) if clean_shutdown else first_checked)


def replay_producer_state(state: ProducerStateManager, segments: tuple[LogSegment, ...],
                          base_offsets: tuple[int, ...], *, log_start_offset: int, log_end_offset: int,
                          high_watermark: int, txn_rebuild_from: int | None, now_ms: int, name: str) -> None:
    """Load the newest usable snapshot and replay the batches after it. With
    `txn_rebuild_from`, the snapshot is at most that offset, and the ABORT markers
    replayed from there on refill the (emptied) transaction indexes of their segments:
    the replay gives each completed transaction exactly the first offset and last stable
    offset the original append gave it."""
    replay_from = state.load(log_start_offset, log_end_offset, now_ms=now_ms, snapshot_at_most=txn_rebuild_from)
    replayed = rebuilt = 0
    first = max(0, bisect_right(base_offsets, replay_from) - 1)
    for i in range(first, len(segments)):
        segment = segments[i]
        rebuilding = txn_rebuild_from is not None and segment.base_offset >= txn_rebuild_from
        _, start = segment.offset_index.lookup(replay_from) if i == first else (0, 0)
        for header in segment.iter_batches(start, segment.size_bytes):
            if header.producer_id == NO_PRODUCER_ID or header.base_offset < replay_from:
                continue
            replayed += 1
            if not header.is_control:
                state.update_from_replay(header)
                continue
            marker = _read_marker(segment, header, name)
            if marker is None:
                continue
            completed = state.update_from_replay(header, control_marker=marker)
            if completed is not None:
                # one node: the marker is below the high watermark once it is in the log
                state.on_high_watermark_updated(header.next_offset)
                if completed.is_aborted and rebuilding:
                    segment.txn_index.append(completed.to_aborted_txn())
                    rebuilt += 1
    state.on_high_watermark_updated(high_watermark)
    if replayed:
        log.info("%s: producer state replayed %d batch(es) from offset %d%s", name, replayed, replay_from,
                 "" if txn_rebuild_from is None else
                 f"; transaction indexes from offset {txn_rebuild_from} rebuilt ({rebuilt} aborted)")


def _read_marker(segment: LogSegment, header: BatchHeader, name: str) -> tuple[int, int] | None:
    """(marker type, coordinator epoch) of a control batch in the log; None (with a
    warning) for one that is not a transaction marker, which replay skips."""
    data = segment.read_bytes(header.position, header.size_bytes)
    try:
        return decode_control_record(data, header._replace(position=0))
    except CorruptRecordError as e:
        log.warning("%s: skipping control batch at offset %d in replay: %s", name, header.base_offset, e)
        return None


def rebuild_leader_epochs(cache: LeaderEpochCache, segments: tuple[LogSegment, ...], *, file_ok: bool,
                          log_start_offset: int, log_end_offset: int) -> None:
    """The epoch cache agrees with the recovered log: entries past its end go; a
    missing or unreadable file is rebuilt from every batch's partitionLeaderEpoch (Kafka
    assigns each batch's epoch as recovery reads it)."""
    if not file_ok:
        for segment in segments:
            for header in segment.iter_batches(0, segment.size_bytes):
                if header.partition_leader_epoch > cache.latest_epoch:
                    cache.assign(header.partition_leader_epoch, header.base_offset, flush=False)
        if cache.entries:      # an empty log has nothing to record (a new partition: no write)
            cache.flush()
    cache.truncate_from_end(log_end_offset)
    cache.truncate_from_start(log_start_offset)


__all__ = ["CLEANED_SUFFIX", "SWAP_SUFFIX", "LoadedSegments", "complete_swaps", "load_segments", "new_segment",
           "rebuild_leader_epochs", "remove_file", "replay_producer_state", "scan_directory"]
