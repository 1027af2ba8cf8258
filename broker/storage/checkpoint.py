"""Offset checkpoint files in Kafka's text format, written atomically.

Theory of operation
-------------------
A data directory holds small files mapping each partition to an offset:
`recovery-point-offset-checkpoint` (everything below it is fsynced, so recovery after a
crash checks only what lies past it) and `log-start-offset-checkpoint`. The format is
Kafka's:

    0                  version
    2                  number of entries
    orders 0 1200      topic, partition, offset
    orders 1 980

A write goes to `<name>.tmp`, is fsynced, renamed over the old file, and the directory is
fsynced, so a crash leaves either the old file or the new one, never a mix. A file that
does not parse raises StorageError naming the line; the caller decides what to trust
instead (for a recovery point: nothing, so the whole log is checked).
"""
from __future__ import annotations

from eos.errors import StorageError
from eos.files import write_file_atomically

CHECKPOINT_VERSION = 0
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
# Each partition's high watermark (Kafka's name and format), so a restarted replica does not
# count records as committed that its ISR never confirmed.
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"


class OffsetCheckpointFile:
    """One checkpoint file: {(topic, partition): offset}."""

    def __init__(self, path: str):
        self.path = path

    def write(self, offsets: dict[tuple[str, int], int]) -> None:
        lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
        for (topic, partition), offset in sorted(offsets.items()):
            if not topic or any(c.isspace() for c in topic):
                raise StorageError(f"{self.path}: topic name {topic!r} cannot be written to a checkpoint")
            lines.append(f"{topic} {partition} {offset}")
        data = ("\n".join(lines) + "\n").encode()
        write_file_atomically(self.path, data)

    def read(self) -> dict[tuple[str, int], int]:
        """The entries; {} when the file does not exist; StorageError when it is malformed."""
        try:
            with open(self.path, "rb") as f:
                text = f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return {}
        lines = text.splitlines()
        if len(lines) < 2:
            raise StorageError(f"{self.path}: {len(lines)} lines, a checkpoint needs a version and a count")
        if lines[0].strip() != str(CHECKPOINT_VERSION):
            raise StorageError(f"{self.path}: unsupported version {lines[0]!r} (expected {CHECKPOINT_VERSION})")
        try:
            expected = int(lines[1])
        except ValueError:
            raise StorageError(f"{self.path}: line 2: entry count {lines[1]!r} is not a number") from None
        entries = [line for line in lines[2:] if line.strip()]
        if len(entries) != expected:
            raise StorageError(f"{self.path}: declares {expected} entries, holds {len(entries)}")
        offsets: dict[tuple[str, int], int] = {}
        for number, line in enumerate(entries, start=3):
            fields = line.split()
            try:
                topic, partition, offset = fields[0], int(fields[1]), int(fields[2])
                if len(fields) != 3:
                    raise ValueError
            except (ValueError, IndexError):
                raise StorageError(f"{self.path}: line {number}: {line!r} is not 'topic partition offset'") from None
            offsets[(topic, partition)] = offset
        return offsets
