"""Kafka's leader epoch cache: which leader epoch wrote which offsets, and the checkpoint file.

Theory of operation
-------------------
Every batch carries the leader epoch of the leader that appended it (partitionLeaderEpoch).
The cache keeps, per partition, the start offset of each epoch: entries (epoch,
start_offset), strictly increasing in both. It answers KIP-279's question "where does epoch
E end in your log?" (`end_offset_for`): the start offset of the first epoch after the
largest epoch <= E, or the log end if that is the latest epoch. A follower that becomes a
follower asks its leader this for its own latest epoch and truncates where the two logs
stop agreeing -- not at the high watermark, which loses or forks data (KIP-101).

The file `leader-epoch-checkpoint` has Kafka's format: a version line (0), a count line,
then one "epoch start_offset" line per entry; it is written atomically (temp file, fsync,
rename) whenever the entries change. A file that cannot be read is reported and the log
rebuilds the entries from its batches.
"""
from __future__ import annotations

import logging
import os
import threading
from bisect import bisect_right

from eos.errors import StorageError
from eos.files import write_file_atomically

log = logging.getLogger(__name__)

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


def encode_checkpoint(entries: list[tuple[int, int]]) -> bytes:
    lines = [str(CHECKPOINT_VERSION), str(len(entries))] + [f"{epoch} {offset}" for epoch, offset in entries]
    return ("\n".join(lines) + "\n").encode("ascii")


def decode_checkpoint(data: bytes) -> list[tuple[int, int]]:
    lines = data.decode("ascii").splitlines()
    if len(lines) < 2 or lines[0].strip() != str(CHECKPOINT_VERSION):
        raise StorageError(f"leader epoch checkpoint: unknown version line {lines[:1]!r}")
    count = int(lines[1])
    if len(lines) - 2 != count:
        raise StorageError(f"leader epoch checkpoint: {count} entries announced, {len(lines) - 2} present")
    entries = []
    for line in lines[2:]:
        epoch, offset = line.split()
        entries.append((int(epoch), int(offset)))
    for (e1, o1), (e2, o2) in zip(entries, entries[1:]):
        if not (e2 > e1 and o2 >= o1):
            raise StorageError(f"leader epoch checkpoint: entries out of order: {(e1, o1)} then {(e2, o2)}")
    return entries


class LeaderEpochCache:
    """The (epoch, start offset) entries of one partition; thread-safe."""

    def __init__(self, directory: str | None, entries: list[tuple[int, int]] | None = None):
        self._path = None if directory is None else os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        self._entries: list[tuple[int, int]] = list(entries or [])
        self._lock = threading.Lock()

    @classmethod
    def load(cls, directory: str) -> tuple["LeaderEpochCache", bool]:
        """(cache, ok): ok is False when the file was missing or unreadable (the caller
        rebuilds the entries from the log's batches)."""
        path = os.path.join(directory, LEADER_EPOCH_CHECKPOINT)
        try:
            with open(path, "rb") as f:
                return cls(directory, decode_checkpoint(f.read())), True
        except FileNotFoundError:
            return cls(directory), False
        except (ValueError, StorageError, OSError) as exc:
            log.warning("%s: unreadable (%s); rebuilding it from the log", path, exc)
            return cls(directory), False

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        entries = self._entries
        return entries[-1][0] if entries else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int, *, flush: bool = True) -> bool:
        """Record that `epoch` starts at `start_offset` (Kafka's assign): ignored unless the
        epoch is newer than the latest; entries of older epochs that start at or after the
        new one's start are dropped (they can only be from a log since truncated)."""
        if epoch < 0:
            return False
        with self._lock:
            if self._entries and epoch <= self._entries[-1][0]:
                return False
            while self._entries and self._entries[-1][1] >= start_offset:
                self._entries.pop()
            self._entries.append((epoch, start_offset))
            if flush:
                self._write_locked()
            return True

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """KIP-279: (the largest epoch <= requested, the offset where it ends)."""
        entries = self._entries
        if not entries or requested_epoch < entries[0][0] or requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if requested_epoch >= entries[-1][0]:
            return entries[-1][0], log_end_offset
        index = bisect_right([e for e, _ in entries], requested_epoch) - 1
        return entries[index][0], entries[index + 1][1]

    def epoch_for_offset(self, offset: int) -> int:
        entries = self._entries
        index = bisect_right([o for _, o in entries], offset) - 1
        return entries[index][0] if index >= 0 else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> None:
        """The log now ends at `end_offset`: forget epochs that start at or after it."""
        with self._lock:
            kept = [(e, o) for e, o in self._entries if o < end_offset]
            if kept != self._entries:
                self._entries = kept
                self._write_locked()

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: the epoch covering it starts there."""
        with self._lock:
            later = [(e, o) for e, o in self._entries if o > start_offset]
            covering = [(e, o) for e, o in self._entries if o <= start_offset]
            kept = ([(covering[-1][0], start_offset)] if covering else []) + later
            if kept != self._entries:
                self._entries = kept
                self._write_locked()

    def clear(self) -> None:
        with self._lock:
            self._entries = []
            self._write_locked()

    def flush(self) -> None:
        with self._lock:
            self._write_locked()

    def _write_locked(self) -> None:
        if self._path is not None:
            write_file_atomically(self._path, encode_checkpoint(self._entries))
