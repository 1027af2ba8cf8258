"""Several log directories (Kafka's `log.dirs`, JBOD): where partitions go, and what a failed
directory takes offline.

Theory of operation
-------------------
Each directory is a `LogManager` of its own: its partitions, its checkpoints, its clean
shutdown marker, exactly as with one directory, so a directory can be moved or lost as a
unit. `LogDirs` puts them behind the one LogManager face the broker uses (`get_log`,
`create_log`, `delete_log`, `all_logs`, housekeeping, shutdown) and owns two things:

- *Placement.* A new partition goes to the online directory holding the fewest partitions
  (Kafka's rule; ties go to the earlier directory in `log.dirs`), except the internal topics'
  (`__consumer_offsets`, `__transaction_state`): they stay in the first directory, the
  broker's own, beside its topic registry and producer ids, so that the coordinators, which
  load every partition of them at start, lose nothing the broker could run without when
  another disk fails (eos's choice; Kafka spreads them too). They are not counted in the
  "fewest". Where a partition lives
  is the directory its files are in; nothing else records it.
- *Failure.* A directory fails when it cannot be created or locked at start, loading it raises, when its housekeeping raises a
  StorageError, or when the probe run at each housekeeping tick finds it gone (removed,
  replaced by another directory, not a directory) or unwritable (a probe file cannot be
  written and fsynced). Its logs are closed without a flush, they leave the routing map, and
  the broker logs once, at ERROR, the directory, the cause and every partition now offline.
  Those partitions answer KAFKA_STORAGE_ERROR (`offline_reason`) and are never created
  again elsewhere: a partition missing at start while a directory is offline may well be on
  that directory, so the broker's start-up sweep leaves it alone (`any_offline`). The other
  directories go on serving. A failed directory comes back only with a restart, as in Kafka.

On a cluster the controller is not told (Kafka's LogDirEventNotification); the partitions
of the failed directory answer errors here until the broker restarts.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Sequence

from broker.storage.log import Log
from broker.storage.log_manager import LogManager
from eos.config import TopicConfig
from eos.errors import StorageError

log = logging.getLogger(__name__)

PROBE_FILE_NAME = ".eos-log-dir-probe"
INTERNAL_TOPIC_PREFIX = "__"


class LogDirs:
    """Partitions over several directories, each a LogManager; see the module doc."""

    def __init__(self, log_dirs: Sequence[str], *, now_ms_fn: Callable[[], int] | None = None,
                 producer_id_expiration_ms: int | None = None, failed: dict[str, str] | None = None):
        """`failed`: directories the broker could not even prepare (create, lock), by the
        cause; they start offline."""
        if not log_dirs:
            raise StorageError("log.dirs names no directory")
        resolved = [os.path.realpath(d) for d in log_dirs]
        if len(set(resolved)) != len(resolved):
            raise StorageError(f"log.dirs names a directory twice: {list(log_dirs)}")
        kwargs = {}
        if now_ms_fn is not None:
            kwargs["now_ms_fn"] = now_ms_fn
        if producer_id_expiration_ms is not None:
            kwargs["producer_id_expiration_ms"] = producer_id_expiration_ms
        self._lock = threading.Lock()       # guards the maps below; one owner: this object
        self._home: dict[tuple[str, int], LogManager] = {}
        self._offline_dirs: dict[str, str] = {}            # dir -> why it failed
        self._offline_partitions: dict[tuple[str, int], str] = {}
        self._lost_homes: dict[tuple[str, int], str] = {}      # partition -> the failed dir it was on
        failed = {os.path.realpath(d): cause for d, cause in (failed or {}).items()}
        self._managers: list[LogManager] = []
        for directory in resolved:
            cause = failed.get(directory)
            if cause is None:
                try:
                    self._managers.append(LogManager(directory, **kwargs))
                    continue
                except OSError as exc:
                    cause = f"cannot create it: {exc}"
            self._offline_dirs[directory] = f"log dir {directory} is offline ({cause})"
            log.error("%s", self._offline_dirs[directory])
        self._inodes = {m.data_dir: _inode(m.data_dir) for m in self._managers}

    @property
    def data_dirs(self) -> list[str]:
        """The directories that were opened (a directory offline from the start is not)."""
        return [m.data_dir for m in self._managers]

    @property
    def offline_dirs(self) -> dict[str, str]:
        with self._lock:
            return dict(self._offline_dirs)

    def any_offline(self) -> bool:
        with self._lock:
            return bool(self._offline_dirs)

    # ---- loading ----------------------------------------------------------------------

    def load(self, configs: dict[str, TopicConfig]) -> None:
        """Open every directory's partitions; a directory that cannot be loaded is offline
        (the others serve). Two directories holding the same partition is an error."""
        for manager in self._managers:
            try:
                manager.load(configs)
            except (StorageError, OSError) as exc:
                self._fail(manager, f"loading it failed: {exc}")
                continue
            for partition_log in manager.all_logs():
                key = (partition_log.topic, partition_log.partition)
                other = self._home.get(key)
                if other is not None:
                    raise StorageError(
                        f"partition {key[0]}-{key[1]} is in two log dirs, {other.data_dir} and {manager.data_dir}: "
                        f"remove the copy that is not wanted")
                self._home[key] = manager
        if not self._online():
            raise StorageError(f"every log dir failed: {self._offline_dirs}")

    # ---- the LogManager face ----------------------------------------------------------

    def get_log(self, topic: str, partition: int) -> Log | None:
        manager = self._home.get((topic, partition))
        return None if manager is None else manager.get_log(topic, partition)

    def log_dir_of(self, topic: str, partition: int) -> str | None:
        """The log dir the partition lives on, or lived on when that dir failed; None if unknown."""
        with self._lock:
            manager = self._home.get((topic, partition))
            return manager.data_dir if manager is not None else self._lost_homes.get((topic, partition))

    def offline_reason(self, topic: str, partition: int) -> str | None:
        """Why the partition cannot be served here (its log dir failed), or None."""
        return self._offline_partitions.get((topic, partition))

    def offline_partition_count(self) -> int:
        """Partitions that cannot be served here because their log dir failed."""
        with self._lock:
            return len(self._offline_partitions)

    def mark_offline(self, partitions, reason: str) -> None:
        """Partitions that may live on a failed directory: never created elsewhere."""
        with self._lock:
            for key in partitions:
                self._offline_partitions.setdefault(tuple(key), reason)

    def all_logs(self) -> list[Log]:
        logs: list[Log] = []
        for manager in self._online():
            logs += manager.all_logs()
        return logs

    def create_log(self, topic: str, partition: int, config: TopicConfig, *,
                   sync_directory: bool = True) -> Log:
        key = (topic, partition)
        with self._lock:
            reason = self._offline_partitions.get(key)
            if reason is not None:
                raise StorageError(f"partition {topic}-{partition} is offline: {reason}")
            home = self._home.get(key)
            if home is None and topic.startswith(INTERNAL_TOPIC_PREFIX):
                home = self._managers[0] if self._managers and self._managers[0].data_dir not in self._offline_dirs \
                    else None
                if home is None:
                    raise StorageError(f"{topic}-{partition} lives in the first log dir, which is offline")
                self._home[key] = home
            if home is None:
                online = [m for m in self._managers if m.data_dir not in self._offline_dirs]
                if not online:
                    raise StorageError(f"no log dir is online: {self._offline_dirs}")
                counts = {m.data_dir: 0 for m in online}
                for (other_topic, _), owner in self._home.items():
                    # the internal topics are pinned to the first dir: they do not count
                    if owner.data_dir in counts and not other_topic.startswith(INTERNAL_TOPIC_PREFIX):
                        counts[owner.data_dir] += 1
                home = min(online, key=lambda m: counts[m.data_dir])     # min keeps the first of ties
                self._home[key] = home
        try:
            created = home.create_log(topic, partition, config, sync_directory=sync_directory)
        except BaseException:
            with self._lock:
                if home.get_log(topic, partition) is None and self._home.get(key) is home:
                    del self._home[key]
            raise
        with self._lock:
            # The directory may have failed while the log was being made: `_fail` closed the
            # logs it saw, not this one, and marked the partition offline. Hand out no log on it.
            reason = self._offline_dirs.get(home.data_dir)
        if reason is not None:
            try:
                created.close(clean=False)
            except Exception:   # the directory is failing: closing may fail too, and is moot
                pass
            raise StorageError(f"partition {topic}-{partition} is offline: {reason}")
        return created

    def delete_log(self, topic: str, partition: int) -> bool:
        key = (topic, partition)
        with self._lock:
            home = self._home.pop(key, None)
            offline = self._offline_partitions.pop(key, None) is not None
        if home is None:
            return offline
        return home.delete_log(topic, partition)

    def update_config(self, topic: str, config: TopicConfig) -> None:
        for manager in self._online():
            manager.update_config(topic, config)

    def sync_directories(self, created=()) -> dict[tuple[str, int], str]:
        """fsync every online directory, after logs were created with
        `sync_directory=False`: one fsync a directory instead of one a log. A directory
        whose fsync fails goes offline, its new logs with it: the partitions of `created`
        (topic, partition) offline now, with the reason."""
        for manager in self._online():
            try:
                manager.sync_directories()
            except OSError as exc:
                self._fail(manager, f"syncing it failed: {exc}")
        return {tp: reason for tp in created if (reason := self.offline_reason(*tp)) is not None}

    # ---- background work --------------------------------------------------------------

    def run_housekeeping(self, now_ms: int | None = None) -> None:
        """Each online directory's housekeeping, after a probe that it is still there and
        writable; a failure takes that directory offline."""
        for manager in self._online():
            problem = self._probe(manager.data_dir)
            if problem is not None:
                self._fail(manager, problem)
                continue
            try:
                manager.run_housekeeping(now_ms)
            except (StorageError, OSError) as exc:
                self._fail(manager, f"housekeeping failed: {exc}")

    def checkpoint(self, *, force: bool = False) -> None:
        for manager in self._online():
            try:
                manager.checkpoint(force=force)
            except (StorageError, OSError) as exc:
                self._fail(manager, f"writing its checkpoints failed: {exc}")

    def shutdown(self) -> None:
        for manager in self._online():
            try:
                manager.shutdown()
            except (StorageError, OSError) as exc:
                log.error("log dir %s did not shut down cleanly: %s", manager.data_dir, exc)

    # ---- failure ----------------------------------------------------------------------

    def _online(self) -> list[LogManager]:
        with self._lock:
            return [m for m in self._managers if m.data_dir not in self._offline_dirs]

    def _probe(self, data_dir: str) -> str | None:
        """None if `data_dir` is the directory we opened and takes an fsynced write."""
        try:
            if _inode(data_dir) != self._inodes.get(data_dir):
                return "it was removed or replaced by another directory"
            path = os.path.join(data_dir, PROBE_FILE_NAME)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, b"probe")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _fail(self, manager: LogManager, cause: str) -> None:
        with self._lock:
            if manager.data_dir in self._offline_dirs:
                return
            reason = f"log dir {manager.data_dir} is offline ({cause})"
            self._offline_dirs[manager.data_dir] = reason
            lost = sorted(key for key, home in self._home.items() if home is manager)
            for key in lost:
                del self._home[key]
                self._offline_partitions[key] = reason
                self._lost_homes[key] = manager.data_dir
        for partition_log in manager.all_logs():
            try:
                partition_log.close(clean=False)
            except Exception:   # the directory is failing: closing may fail too, and is moot
                pass
        names = ", ".join(f"{t}-{p}" for t, p in lost) or "none"
        log.error("%s; %d partition(s) offline on this broker: %s", reason, len(lost), names)


def _inode(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)

