"""Kafka's leader epoch cache (LeaderEpochFileCache): which leader epoch wrote which offsets.

Theory of operation
-------------------
Every batch carries the leader epoch of the leader that appended it (partitionLeaderEpoch,
byte 12 of the header). The cache keeps, per partition, the offset where each epoch starts:
entries (epoch, start_offset), strictly increasing in both. It answers KIP-279's question
"where does epoch E end in your log?" (`end_offset_for`): for the latest epoch, the log
end; for an older one, the start offset of the first epoch after the largest epoch <= E.
A replica that becomes a follower asks its leader this about its own latest epoch and
truncates where the two logs stop agreeing -- not at its high watermark, which can lose an
acknowledged record or let the two logs fork (KIP-101).

Who calls what (the log owns the cache and calls it under its own lock):

    a batch is written (leader or follower)   assign(batch epoch, batch base offset)
    a replica becomes leader                  assign(leader epoch, log end offset)
    recovery reads batches                    assign(...) for each newer epoch, after truncate_from_end
    the log is cut (follower truncation)      truncate_from_end(new log end)
    the log start moves (retention, ...)      truncate_from_start(new log start)
    the log is emptied                        clear()

`assign` follows Kafka's rules exactly (`assigned_entries`, a pure function): nothing
changes when the epoch is the latest one again at the same or a later offset (every batch
of an epoch calls it); otherwise every entry whose epoch is >= the new epoch or whose start
is >= the new start is removed from the end first (they describe a log that has since been
cut), and the new entry is appended. So the same epoch at an earlier offset replaces the
latest entry, and an older epoch removes the newer entries.

`end_offset_for` answers as this project specifies KIP-279: an undefined epoch (-1), an
epoch below the first entry, an epoch above the latest (this leader never had it) or an
empty cache give (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET); the follower then falls back
to its high watermark. (Kafka 2.x+ answers an epoch below the first entry with that epoch
and the first entry's start offset; the brief asks for "undefined" there.)

The file `leader-epoch-checkpoint` in the partition directory has Kafka's format: a version
line (0), a count line, then one "epoch start_offset" line per entry, each line ending in
"\\n". It is rewritten atomically (temp file, fsync, rename, directory fsync) whenever the
entries change. A file that cannot be read is reported (a warning) and the log rebuilds the
entries from its batches.

Readers (OffsetsForLeaderEpoch, the fetcher) take no lock: mutations build a new list and
swap the reference, so a reader works from one consistent list.
"""
from __future__ import annotations

import logging
import os
import threading
from bisect import bisect_right

from eos.errors import InvariantError, StorageError
from eos.files import write_file_atomically

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1

EpochEntry = tuple[int, int]   # (epoch, start_offset)


# ---- the file format ---------------------------------------------------------------------------

def encode_checkpoint(entries: list[EpochEntry]) -> bytes:
    lines = [str(CHECKPOINT_VERSION), str(len(entries))] + [f"{epoch} {offset}" for epoch, offset in entries]
    return ("\n".join(lines) + "\n").encode("ascii")


def decode_checkpoint(data: bytes) -> list[EpochEntry]:
    """The entries of a checkpoint file; StorageError naming what is wrong otherwise."""
    try:
        lines = data.decode("ascii").splitlines()
    except UnicodeDecodeError as e:
        raise StorageError(f"leader epoch checkpoint: not ASCII text ({e})") from None
    if len(lines) < 2 or lines[0].strip() != str(CHECKPOINT_VERSION):
        raise StorageError(f"leader epoch checkpoint: unknown version line {lines[:1]!r}")
    try:
        count = int(lines[1])
    except ValueError:
        raise StorageError(f"leader epoch checkpoint: entry count {lines[1]!r} is not a number") from None
    if len(lines) - 2 != count:
        raise StorageError(f"leader epoch checkpoint: {count} entries announced, {len(lines) - 2} present")
    entries = []
    for number, line in enumerate(lines[2:], start=3):
        fields = line.split()
        try:
            if len(fields) != 2:
                raise ValueError
            entry = (int(fields[0]), int(fields[1]))
        except ValueError:
            raise StorageError(f"leader epoch checkpoint: line {number}: {line!r} is not 'epoch offset'") from None
        if entry[0] < 0 or entry[1] < 0:
            raise StorageError(f"leader epoch checkpoint: line {number}: negative epoch or offset {entry}")
        entries.append(entry)
    for (e1, o1), (e2, o2) in zip(entries, entries[1:]):
        if not (e2 > e1 and o2 > o1):
            raise StorageError(f"leader epoch checkpoint: entries out of order: {(e1, o1)} then {(e2, o2)}")
    return entries


# ---- the rules, as pure functions ------------------------------------------------------------------

def assigned_entries(entries: list[EpochEntry], epoch: int,
                     start_offset: int) -> tuple[list[EpochEntry], list[EpochEntry]] | None:
    """Kafka's LeaderEpochFileCache.assign on a list: (new entries, removed entries), or
    None when nothing changes (the epoch is already the latest, at or before this offset)."""
    if epoch < 0 or start_offset < 0:
        raise InvariantError(f"leader epoch entry ({epoch}, {start_offset}) has a negative epoch or offset")
    if entries:
        latest_epoch, latest_start = entries[-1]
        if epoch == latest_epoch and start_offset >= latest_start:
            return None
    kept = list(entries)
    removed: list[EpochEntry] = []
    while kept and (kept[-1][0] >= epoch or kept[-1][1] >= start_offset):
        removed.append(kept.pop())
    kept.append((epoch, start_offset))
    removed.reverse()
    return kept, removed


def end_offset_for(entries: list[EpochEntry], requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
    """KIP-279 on a list: (the largest epoch <= requested, the offset where it ends); see
    the module doc for the undefined cases."""
    if not entries or requested_epoch == UNDEFINED_EPOCH or requested_epoch < entries[0][0] \
            or requested_epoch > entries[-1][0]:
        return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
    if requested_epoch == entries[-1][0]:
        return requested_epoch, log_end_offset
    index = bisect_right([e for e, _ in entries], requested_epoch) - 1
    return entries[index][0], entries[index + 1][1]


# ---- the cache ---------------------------------------------------------------------------------

class LeaderEpochFileCache:
    """The (epoch, start offset) entries of one partition and their checkpoint file.

    `directory` None keeps the entries in memory only (tests, tools)."""

    def __init__(self, directory: str | None, entries: list[EpochEntry] | None = None):
        self._path = None if directory is None else os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        self._entries: list[EpochEntry] = list(entries or [])   # replaced, never mutated
        self._lock = threading.Lock()   # orders writers (and their file writes)

    @classmethod
    def load(cls, directory: str) -> tuple["LeaderEpochFileCache", bool]:
        """(cache, ok): ok is False when the file was missing or unreadable; the caller
        rebuilds the entries from the log's batches."""
        path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        try:
            with open(path, "rb") as f:
                return cls(directory, decode_checkpoint(f.read())), True
        except FileNotFoundError:
            return cls(directory), False
        except (StorageError, OSError) as exc:
            log.warning("%s: unreadable (%s); rebuilding it from the log", path, exc)
            return cls(directory), False

    # ---- queries (lock-free) -----------------------------------------------------------------

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        entries = self._entries
        return entries[-1][0] if entries else UNDEFINED_EPOCH

    @property
    def latest_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[-1] if entries else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """KIP-279: (the largest epoch <= requested, the offset where it ends in this log);
        (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET) when the epoch is undefined, below the
        first entry or above the latest, or the cache is empty."""
        return end_offset_for(self._entries, requested_epoch, log_end_offset)

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch whose range holds `offset` (UNDEFINED_EPOCH below the first entry)."""
        entries = self._entries
        index = bisect_right([o for _, o in entries], offset) - 1
        return entries[index][0] if index >= 0 else UNDEFINED_EPOCH

    # ---- changes ---------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int, *, flush: bool = True) -> bool:
        """Record that `epoch` starts at `start_offset` (Kafka's assign; see the module
        doc). Returns whether the entries changed. `flush=False` leaves the file to a
        later `flush()` (recovery assigns many, then writes once)."""
        with self._lock:
            outcome = assigned_entries(self._entries, epoch, start_offset)
            if outcome is None:
                return False
            self._entries, removed = outcome
            # Removing more than the entry being replaced at the same offset means that
            # entries described a log that has since been cut (Kafka warns likewise).
            if len(removed) > 1 or (removed and removed[0][1] != start_offset):
                log.warning("%s: epoch %d at offset %d removed the conflicting entries %s",
                            self._path or "leader epoch cache", epoch, start_offset, removed)
            if flush:
                self._write_locked()
            return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """The log now ends at `end_offset`: forget the epochs that start at or after it."""
        with self._lock:
            kept = [(e, o) for e, o in self._entries if o < end_offset]
            return self._replace_locked(kept)

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log now starts at `start_offset`: epochs that start at or before it are
        replaced by one entry, the latest of them, starting there."""
        with self._lock:
            entries = self._entries
            covering = [(e, o) for e, o in entries if o <= start_offset]
            later = [(e, o) for e, o in entries if o > start_offset]
            kept = ([(covering[-1][0], start_offset)] if covering else []) + later
            return self._replace_locked(kept)

    def clear(self) -> None:
        with self._lock:
            self._entries = []
            self._write_locked()

    def flush(self) -> None:
        with self._lock:
            self._write_locked()

    def _replace_locked(self, entries: list[EpochEntry]) -> bool:
        if entries == self._entries:
            return False
        self._entries = entries
        self._write_locked()
        return True

    def _write_locked(self) -> None:
        if self._path is not None:
            write_file_atomically(self._path, encode_checkpoint(self._entries))

    def __repr__(self) -> str:
        return f"LeaderEpochFileCache({self._entries})"


# The name the rest of eos first used.
LeaderEpochCache = LeaderEpochFileCache
