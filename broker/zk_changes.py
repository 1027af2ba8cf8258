"""Following Kafka's change notifications in ZooKeeper: reload on each, write and expire them.

Theory of operation
-------------------
Kafka's brokers learn of a change to ACLs or to users' and clients' configs through
sequential znodes under a change path (/kafka-acl-changes/acl_changes_N,
/config/changes/config_change_N): a writer changes the data, then creates a notification;
every broker keeps a children watch on the path. `ZkChangeFollower` is that loop for one
store: a watch only wakes its thread (kazoo's thread must not do I/O), the thread sets a
new watch and reloads, reading the whole state again (a few znodes: users, ACL
resources). It also reloads every RELOAD_INTERVAL_S, so a watch lost with an expired
session cannot leave a broker behind for good, and then deletes notifications older than
NOTIFICATION_EXPIRY_MS (Kafka keeps them 15 minutes). Writes go through `_write`: a
read-modify-write of each znode under its version, its notification, then a reload.
"""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("eos.broker.zk_changes")

NOTIFICATION_EXPIRY_MS = 15 * 60 * 1000
RELOAD_INTERVAL_S = 30.0
CAS_ATTEMPTS = 20          # a read-modify-write that keeps losing to other brokers gives up


class ZkChangeFollower:
    """One store's state read from ZooKeeper whole and followed (see the module doc).
    Subclasses give `_read()` (the whole state) and `_publish(state)` (hand it over); a
    reload does both under one lock, so a later hand-over always comes from a later read
    and the state only moves forward."""

    def __init__(self, client, change_paths: tuple[str, ...], what: str):
        self._client = client
        self._change_paths = change_paths
        self._what = what
        self._reload_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self):
        raise NotImplementedError

    def _publish(self, state) -> None:
        raise NotImplementedError

    def start(self):
        """Read the state and follow its changes from now on; the state read. (The paths are
        ZkStore.ensure_paths' PERSISTENT_PATHS, made when the broker joined.)"""
        state = self.reload()
        self._thread = threading.Thread(target=self._follow, name=f"eos-{self._what}-changes", daemon=True)
        self._thread.start()
        return state

    def reload(self):
        with self._reload_lock:
            state = self._read()
            self._publish(state)
            return state

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _watch(self, _event) -> None:
        self._wake.set()      # kazoo's thread: only hand over

    def _follow(self) -> None:
        expired_at = time.monotonic()
        while not self._stopping.is_set():
            try:
                for path in self._change_paths:
                    self._client.get_children(path, watch=self._watch)
                self.reload()
                if time.monotonic() - expired_at >= RELOAD_INTERVAL_S:
                    # here, not on the request that wrote a notification: at most once an interval
                    expired_at = time.monotonic()
                    self._expire_notifications()
            except Exception as exc:    # ZooKeeper away: the next wake or interval tries again
                log.warning("reading the %s from ZooKeeper failed: %s", self._what, exc)
            self._wake.wait(RELOAD_INTERVAL_S)
            self._wake.clear()

    def _children(self, path: str) -> list[str]:
        from kazoo.exceptions import NoNodeError
        try:
            return self._client.get_children(path)
        except NoNodeError:
            return []

    def _write(self, changes, prefix: str):
        """Apply (znode, update, (change path, notification data)) changes, each a
        read-modify-write under the znode's version followed by its notification when the
        znode changed; the state after them (read again before the caller answers)."""
        for znode, update, (change_path, data) in changes:
            if read_modify_write(self._client, znode, update):
                self._client.create(f"{change_path}/{prefix}", data, sequence=True, makepath=True)
        return self.reload()

    def _expire_notifications(self) -> None:
        """Best effort: a failure only leaves old notifications for the next interval."""
        from kazoo.exceptions import NoNodeError

        cutoff_ms = time.time() * 1000 - NOTIFICATION_EXPIRY_MS
        try:
            for path in self._change_paths:
                for child in self._children(path):
                    try:
                        _, stat = self._client.get(f"{path}/{child}")
                        if stat.ctime < cutoff_ms:
                            self._client.delete(f"{path}/{child}")
                    except NoNodeError:
                        pass
        except Exception as exc:
            log.info("expiring old %s change notifications: %s", self._what, exc)


def read_modify_write(client, znode: str, update) -> bool:
    """Change one znode under its version: `update(data or None)` gives the new data (None:
    delete it); another broker's write in between makes it read again. True when the znode
    changed."""
    from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

    for _ in range(CAS_ATTEMPTS):
        try:
            data, stat = client.get(znode)
            version = stat.version
        except NoNodeError:
            data, version = None, None
        wanted = update(data)
        if wanted == data or (wanted is None and version is None):
            return False
        try:
            if version is None:
                client.create(znode, wanted, makepath=True)
            elif wanted is None:
                client.delete(znode, version=version)
            else:
                client.set(znode, wanted, version=version)
            return True
        except (BadVersionError, NodeExistsError, NoNodeError):
            continue
    raise RuntimeError(f"{znode} kept changing under {CAS_ATTEMPTS} attempts; try again")
