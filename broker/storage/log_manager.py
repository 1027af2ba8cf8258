"""Every partition log under one data directory, with the files that span them.

Theory of operation
-------------------
The data directory holds one `<topic>-<partition>` directory per partition plus three
files of its own, all as Kafka lays them out:

    recovery-point-offset-checkpoint   per partition, the offset below which data is fsynced
    log-start-offset-checkpoint        per partition, the first offset still readable
    .kafka_cleanshutdown               present only while the broker is cleanly stopped

`load` reads the checkpoints and the marker, opens every partition directory (checking the
tail of each log batch by batch unless the marker says the last shutdown was clean), then
removes the marker: from here on a crash must look unclean. `shutdown` does the reverse:
flushes every log, snapshots producer state, writes the checkpoints (now at the log ends)
and only then writes the marker.

`run_housekeeping(now_ms)`, called by the broker every few seconds, applies retention,
flushes by flush.ms / flush.messages (and fsyncs segments that rolled), expires idle
producers and rewrites the checkpoints when an offset in them moved.

Other directories are left alone: those named `__<something>` without a partition number
belong to the broker (its topic registry keeps `__topics/`); anything else gets a warning.

Deleting a partition renames its directory to `<topic>-<partition>.<uuid>-delete` first,
so a crash mid-delete leaves a name `load` recognises and finishes removing. Topic names
follow Kafka's rules (letters, digits, '.', '_', '-'), which keeps directory names and the
checkpoints' space-separated lines unambiguous.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
import uuid
from typing import Callable

from eos.config import TopicConfig
from eos.errors import InvalidTopicError, StorageError
from eos.files import fsync_directory
from broker.storage.checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    OffsetCheckpointFile,
)
from broker.storage.log import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    Log,
    parse_partition_dir_name,
    partition_dir_name,
)

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
DELETE_DIR_SUFFIX = "-delete"
# Directories of the broker's own (the topic registry's `__topics`): not partitions, not strays.
BROKER_DIR_PREFIX = "__"
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


def check_topic_name(topic: str) -> None:
    if not _LEGAL_TOPIC.match(topic) or topic in (".", ".."):
        raise InvalidTopicError(
            f"invalid topic name {topic!r}: use 1-249 of a-z, A-Z, 0-9, '.', '_', '-' (not '.' or '..')")


class LogManager:
    """Owns the map (topic, partition) -> Log for one data directory."""

    def __init__(self, data_dir: str, *, now_ms_fn: Callable[[], int] = _wall_clock_ms,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS):
        self.data_dir = data_dir
        self._now_ms = now_ms_fn
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._logs: dict[tuple[str, int], Log] = {}
        self._lock = threading.Lock()   # guards _logs and the checkpoint files
        self._recovery_checkpoint = OffsetCheckpointFile(os.path.join(data_dir, RECOVERY_POINT_CHECKPOINT))
        self._start_checkpoint = OffsetCheckpointFile(os.path.join(data_dir, LOG_START_OFFSET_CHECKPOINT))
        self._hw_checkpoint = OffsetCheckpointFile(os.path.join(data_dir, REPLICATION_OFFSET_CHECKPOINT))
        self._checkpointed: tuple[dict, dict, dict] | None = None
        self.had_clean_shutdown = False
        os.makedirs(data_dir, exist_ok=True)

    # ---- loading ----------------------------------------------------------------------

    def load(self, configs: dict[str, TopicConfig]) -> None:
        """Open every partition directory; `configs` maps topic -> its config (topics not
        in it get TopicConfig()). Removes the clean-shutdown marker once all are open."""
        marker = os.path.join(self.data_dir, CLEAN_SHUTDOWN_FILE)
        clean = os.path.exists(marker)
        self.had_clean_shutdown = clean
        recovery_points = self._read_checkpoint(self._recovery_checkpoint)
        start_offsets = self._read_checkpoint(self._start_checkpoint)
        high_watermarks = self._read_checkpoint(self._hw_checkpoint)
        now_ms = self._now_ms()
        loaded = 0
        for name in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, name)
            if not os.path.isdir(path):
                continue
            if name.endswith(DELETE_DIR_SUFFIX):
                log.info("finishing the deletion of %s", name)
                shutil.rmtree(path, ignore_errors=True)
                continue
            parsed = parse_partition_dir_name(name)
            if parsed is None:
                if name.startswith(BROKER_DIR_PREFIX):
                    log.debug("leaving %s to the broker: not a partition directory", name)
                else:
                    log.warning("ignoring %s in the data directory: not a <topic>-<partition> directory", name)
                continue
            topic, partition = parsed
            config = configs.get(topic)
            if config is None:
                log.warning("partition %s has no topic config; using the defaults", name)
                config = TopicConfig()
            # Without a checkpoint entry nothing is known to be fsynced: check everything.
            opened = Log.open(path, config, recovery_point=recovery_points.get((topic, partition), 0),
                              log_start_offset=start_offsets.get((topic, partition), 0),
                              clean_shutdown=clean, now_ms=now_ms,
                              producer_id_expiration_ms=self.producer_id_expiration_ms,
                              high_watermark=high_watermarks.get((topic, partition)))
            with self._lock:
                self._logs[(topic, partition)] = opened
            loaded += 1
        self.checkpoint(force=True)
        if clean:
            os.unlink(marker)
            fsync_directory(self.data_dir)
        log.info("loaded %d partition(s) from %s (%s shutdown)", loaded, self.data_dir,
                 "clean" if clean else "unclean")

    def _read_checkpoint(self, checkpoint: OffsetCheckpointFile) -> dict[tuple[str, int], int]:
        try:
            return checkpoint.read()
        except StorageError as e:
            log.warning("ignoring unreadable checkpoint: %s", e)
            return {}

    # ---- partitions -------------------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    def offline_reason(self, topic: str, partition: int) -> str | None:
        """Always None: one directory's failure is handled by broker.storage.log_dirs."""
        return None

    def all_logs(self) -> list[Log]:
        with self._lock:
            return list(self._logs.values())

    def create_log(self, topic: str, partition: int, config: TopicConfig, *,
                   sync_directory: bool = True) -> Log:
        """The partition's log, created empty if it does not exist yet. The data directory
        is fsynced so that the new log's entry survives a crash; a caller creating many at
        once passes `sync_directory=False` and calls `sync_directories()` once after them."""
        check_topic_name(topic)
        if partition < 0:
            raise StorageError(f"partition {partition} of {topic!r} is negative")
        with self._lock:
            existing = self._logs.get((topic, partition))
            if existing is not None:
                return existing
            path = os.path.join(self.data_dir, partition_dir_name(topic, partition))
            created = Log.open(path, config, now_ms=self._now_ms(),
                               producer_id_expiration_ms=self.producer_id_expiration_ms)
            self._logs[(topic, partition)] = created
        if sync_directory:
            fsync_directory(self.data_dir)
        return created

    def sync_directories(self, created=()) -> dict[tuple[str, int], str]:
        """fsync the data directory: the logs created in it since are durable entries.
        None of `created` goes offline here (one directory: a failed fsync raises)."""
        fsync_directory(self.data_dir)
        return {}

    def delete_log(self, topic: str, partition: int) -> bool:
        """Close and remove the partition's files; False when there was no such log."""
        with self._lock:
            removed = self._logs.pop((topic, partition), None)
        if removed is None:
            return False
        removed.close(clean=False)
        doomed = f"{removed.directory}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
        os.rename(removed.directory, doomed)
        fsync_directory(self.data_dir)
        shutil.rmtree(doomed, ignore_errors=True)
        self.checkpoint(force=True)
        return True

    def update_config(self, topic: str, config: TopicConfig) -> None:
        for log_ in self.all_logs():
            if log_.topic == topic:
                log_.update_config(config)

    # ---- background work --------------------------------------------------------------

    def run_housekeeping(self, now_ms: int | None = None) -> None:
        """Retention, flushes, producer expiry and checkpoints for every log."""
        now_ms = self._now_ms() if now_ms is None else now_ms
        for log_ in self.all_logs():
            try:
                log_.delete_old_segments(now_ms)
                log_.maybe_flush(now_ms)
                log_.remove_expired_producers(now_ms)
            except StorageError as e:
                # A log closed by a concurrent delete_log, or a failing disk: the other
                # partitions carry on; the broker sees the error on that partition's next use.
                log.warning("housekeeping of %s failed: %s", log_.name, e)
        self.checkpoint()

    def checkpoint(self, *, force: bool = False) -> None:
        """Write both checkpoint files if an offset in them moved (or when forced)."""
        with self._lock:
            logs = list(self._logs.items())
            recovery_points = {key: log_.recovery_point for key, log_ in logs}
            start_offsets = {key: log_.log_start_offset for key, log_ in logs}
            high_watermarks = {key: log_.high_watermark for key, log_ in logs}
            if not force and self._checkpointed == (recovery_points, start_offsets, high_watermarks):
                return
            self._recovery_checkpoint.write(recovery_points)
            self._start_checkpoint.write(start_offsets)
            self._hw_checkpoint.write(high_watermarks)
            self._checkpointed = (recovery_points, start_offsets, high_watermarks)

    def shutdown(self) -> None:
        """Clean shutdown: flush and close every log, write the checkpoints, then the marker."""
        for log_ in self.all_logs():
            log_.close(clean=True)
        self.checkpoint(force=True)
        marker = os.path.join(self.data_dir, CLEAN_SHUTDOWN_FILE)
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_directory(self.data_dir)
        with self._lock:
            self._logs.clear()
        log.info("storage in %s shut down cleanly", self.data_dir)
