"""The broker's own files in its data directories: meta.properties, the lock, the log dirs
it has used.

Theory of operation
-------------------
Every log dir holds a `meta.properties` in Kafka's format (cluster id, node id), so a
directory from another cluster or node is refused at start, as Kafka refuses it. An
exclusive flock on `<dir>/.lock` keeps two brokers off one directory (the kernel drops it
when the process dies). The first data dir also lists, in `log-dirs.json`, every other log
dir the broker has used: a listed one found without its meta.properties is an unmounted or
replaced disk, not a new directory to format. All writes go through
`eos.files.write_file_atomically`.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import time
import uuid
from pathlib import Path

from eos.errors import StorageError
from eos.files import write_file_atomically

META_PROPERTIES = "meta.properties"
LOCK_FILE_NAME = ".lock"

KNOWN_LOG_DIRS_FILE = "log-dirs.json"   # in the data dir: every other log dir this broker has used


def read_known_log_dirs(data_dir: Path) -> set[str]:
    path = data_dir / KNOWN_LOG_DIRS_FILE
    if not path.exists():
        return set()
    try:
        return set(json.loads(path.read_text(encoding="utf-8"))["log_dirs"])
    except (ValueError, KeyError, TypeError) as exc:
        raise StorageError(f"{path} is unreadable ({exc}): it lists the log dirs this broker has used") from None


def write_known_log_dirs(data_dir: Path, log_dirs: set[str]) -> None:
    if log_dirs or (data_dir / KNOWN_LOG_DIRS_FILE).exists():
        write_file_atomically(data_dir / KNOWN_LOG_DIRS_FILE,
                              json.dumps({"version": 1, "log_dirs": sorted(log_dirs)}).encode("utf-8") + b"\n")


# ---- meta.properties ----------------------------------------------------------------------

def new_cluster_id() -> str:
    """Kafka's form: a random UUID as 22 characters of URL-safe base64."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def read_meta_properties(path: Path) -> dict[str, str]:
    properties = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise StorageError(f"{path}: line {line!r} is not key=value")
        properties[key.strip()] = value.strip()
    return properties


def read_data_dir_cluster_id(data_dir: Path) -> str | None:
    """The cluster id in the data dir's meta.properties, or None for a new data dir."""
    path = data_dir / META_PROPERTIES
    if not path.exists():
        return None
    return read_meta_properties(path).get("cluster.id") or None


def load_or_create_meta_properties(data_dir: Path, node_id: int, cluster_id: str | None = None) -> str:
    """The cluster id of this data dir, creating `meta.properties` on first start (with
    `cluster_id` when given: a cluster's id from ZooKeeper); refuse a data dir that belongs
    to another node (as Kafka does)."""
    path = data_dir / META_PROPERTIES
    if path.exists():
        properties = read_meta_properties(path)
        cluster_id = properties.get("cluster.id", "")
        if properties.get("version") != "1" or not cluster_id:
            raise StorageError(f"{path} is not a version 1 meta.properties with a cluster.id")
        if properties.get("node.id") != str(node_id):
            raise StorageError(f"{path} belongs to node.id {properties.get('node.id')}, "
                               f"this broker is node.id {node_id}")
        return cluster_id
    cluster_id = cluster_id or new_cluster_id()
    text = (f"#\n#{time.strftime('%a %b %d %H:%M:%S UTC %Y', time.gmtime())}\n"
            f"cluster.id={cluster_id}\nnode.id={node_id}\nversion=1\n")
    write_file_atomically(path, text.encode("utf-8"))
    return cluster_id


class DataDirLock:
    """An exclusive flock on `<data_dir>/.lock`: two brokers on one data dir would
    interleave appends and destroy both logs. The kernel drops it when the process dies."""

    def __init__(self, data_dir: Path):
        self._path = data_dir / LOCK_FILE_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageError(f"data dir {self._path.parent} is in use by another broker "
                               f"(lock {self._path} is held)") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
