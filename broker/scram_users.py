"""The SCRAM credentials (a cluster of one's file, or a cluster's ZooKeeper), and the session tokens SASL issues.

Theory of operation
-------------------
`ScramUsers` owns `<data_dir>/scram-credentials.json`: per user and mechanism Kafka's text
form of a `ScramCredential` (salt, StoredKey, ServerKey, iterations; never a password). It
is written atomically (a crash leaves the old file or the new one) and read again when its
mtime or size changed, so `eos users add --data-dir` on a stopped broker and the
AlterUserScramCredentials RPC on a running one keep one store.

`ZkScramUsers` is the same API on a ZooKeeper cluster: the credentials live where Kafka keeps
them, in /config/users/<user> beside the user's quotas (`broker.zk_entity_configs`), so a
user added through any broker can log in at every broker.

`SessionTokens` owns the tokens a successful SCRAM exchange hands out. A token is bound to
the connection it was issued on (gRPC's peer address of the call, `ipv4:127.0.0.1:54321`:
one per TCP connection) and to a lifetime (Kafka's connections.max.reauth.ms when set,
else one hour; the client authenticates again when it is refused). A token presented from
another connection is refused and stays valid on its own connection: a copied token is
worth nothing to whoever copied it. Tokens idle past their lifetime are pruned as new ones
are issued, so the map stays as small as the live connections.
"""
from __future__ import annotations

import secrets
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

from eos.files import read_json_document, write_json_document
from eos.scram import MECHANISMS, ScramCredential, ScramError

SCRAM_FILE_NAME = "scram-credentials.json"
SCRAM_FILE_VERSION = 1
SESSION_LIFETIME_MS_DEFAULT = 3_600_000
PRUNE_INTERVAL_MS = 60_000


def check_alteration(users: dict[str, dict], upsertions: dict[tuple[str, str], ScramCredential],
                     deletions: set[tuple[str, str]]) -> None:
    """Refuse, before anything is written, a deletion of a credential that does not exist
    and an upsertion for a mechanism eos does not offer (users: name -> {mechanism: ...})."""
    for user, mechanism in sorted(deletions):
        if mechanism not in users.get(user, {}):
            raise KeyError(f"user {user!r} has no {mechanism} credential")
    for _, mechanism in upsertions:
        if mechanism not in MECHANISMS:
            raise ScramError(f"unsupported SASL mechanism {mechanism!r}")


class ScramUsers:
    """See the module doc. Thread-safe."""

    def __init__(self, data_dir: Path | str):
        self._path = Path(data_dir) / SCRAM_FILE_NAME
        self._lock = threading.Lock()
        self._users: dict[str, dict[str, ScramCredential]] = {}
        self._stamp: tuple[int, int] | None = None

    def _refresh(self) -> None:
        """Read the file again if it changed (called with the lock held)."""
        try:
            stat = self._path.stat()
        except FileNotFoundError:
            self._users, self._stamp = {}, None
            return
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            document = read_json_document(self._path, SCRAM_FILE_VERSION)
            users = {str(name): {mechanism: ScramCredential.from_text(text) for mechanism, text in entry.items()}
                     for name, entry in document["users"].items()}
        except (OSError, ValueError, KeyError, AttributeError, ScramError) as exc:
            raise ScramError(f"{self._path}: unreadable SCRAM credentials ({exc}); fix or remove the file") from None
        self._users, self._stamp = users, stamp

    def _write(self, users: dict[str, dict[str, ScramCredential]]) -> None:
        # 0600 from its creation: the keys let anyone pose as the broker to its users
        write_json_document(self._path, SCRAM_FILE_VERSION, {
            "users": {name: {m: c.to_text() for m, c in sorted(entry.items())}
                      for name, entry in sorted(users.items()) if entry}}, mode=0o600)
        self._stamp = None
        self._refresh()

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        with self._lock:
            self._refresh()
            return self._users.get(user, {}).get(mechanism)

    def describe(self) -> dict[str, dict[str, int]]:
        """user -> {mechanism: iterations}."""
        with self._lock:
            self._refresh()
            return {name: {m: c.iterations for m, c in entry.items()} for name, entry in self._users.items()}

    def alter(self, upsertions: dict[tuple[str, str], ScramCredential], deletions: set[tuple[str, str]]) -> None:
        """Apply all of them in one write, or none (a deletion of a credential that does not
        exist raises before anything is written)."""
        with self._lock:
            self._refresh()
            users = {name: dict(entry) for name, entry in self._users.items()}
            check_alteration(users, upsertions, deletions)
            for user, mechanism in deletions:
                del users[user][mechanism]
            for (user, mechanism), credential in upsertions.items():
                users.setdefault(user, {})[mechanism] = credential
            self._write(users)


class ZkScramUsers:
    """A cluster's SCRAM credentials, in ZooKeeper (see the module doc). Thread-safe: the
    snapshot is replaced whole by `ZkEntityConfigs`."""

    def __init__(self, configs, sessions: "SessionTokens | None" = None):
        self._configs = configs      # broker.zk_entity_configs.ZkEntityConfigs
        self._sessions = sessions
        self._known: set[str] = set()
        if sessions is not None:
            configs.add_listener(self._end_sessions_of_deleted_users)

    def _end_sessions_of_deleted_users(self, _snapshot) -> None:
        """A user deleted through any broker loses its sessions on this one too (the broker
        that served the deletion revoked its own at once)."""
        users = set(self._user_entries())
        for user in self._known - users:
            self._sessions.revoke(f"User:{user}")
        self._known = users

    def _user_entries(self) -> dict[str, dict[str, str]]:
        from broker.zk_entity_configs import entity_of
        users = {}
        for path, config in self._configs.snapshot.items():
            user, client_id = entity_of(path)
            if user is not None and client_id is None:
                found = {m: text for m, text in config.items() if m in MECHANISMS}
                if found:
                    users[user] = found
        return users

    def credential(self, user: str, mechanism: str) -> ScramCredential | None:
        from broker.zk_entity_configs import entity_path
        text = self._configs.snapshot.get(entity_path(user, None), {}).get(mechanism)
        try:
            return None if text is None else ScramCredential.from_text(text)
        except ScramError:
            return None      # a malformed entry logs in no one

    def describe(self) -> dict[str, dict[str, int]]:
        described = {}
        for user, entries in self._user_entries().items():
            try:
                described[user] = {m: ScramCredential.from_text(text).iterations for m, text in entries.items()}
            except ScramError:
                continue
        return described

    def alter(self, upsertions: dict[tuple[str, str], ScramCredential], deletions: set[tuple[str, str]]) -> None:
        """All or none, as ScramUsers.alter (each user's znode is one atomic write)."""
        from broker.zk_entity_configs import entity_path
        check_alteration(self._user_entries(), upsertions, deletions)
        changes: dict[str, dict[str, str | None]] = {}
        for user, mechanism in deletions:
            changes.setdefault(entity_path(user, None), {})[mechanism] = None
        for (user, mechanism), credential in upsertions.items():
            changes.setdefault(entity_path(user, None), {})[mechanism] = credential.to_text()
        self._configs.alter(changes)


class Session(NamedTuple):
    principal: str
    peer: str
    expires_at_ms: int


class SessionTokens:
    """See the module doc. Thread-safe."""

    def __init__(self, lifetime_ms: int = SESSION_LIFETIME_MS_DEFAULT, now_ms_fn: Callable[[], int] | None = None):
        self.lifetime_ms = lifetime_ms
        self._now_ms = now_ms_fn or (lambda: time.time_ns() // 1_000_000)
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self._pruned_at_ms = 0

    def issue(self, principal: str, peer: str) -> str:
        now_ms = self._now_ms()
        token = secrets.token_urlsafe(32)
        with self._lock:
            # expired sessions go now and then (a pass over all of them), not at every login
            if now_ms - self._pruned_at_ms >= min(self.lifetime_ms, PRUNE_INTERVAL_MS):
                self._sessions = {t: s for t, s in self._sessions.items() if s.expires_at_ms > now_ms}
                self._pruned_at_ms = now_ms
            self._sessions[token] = Session(principal, peer, now_ms + self.lifetime_ms)
        return token

    def revoke(self, principal: str) -> int:
        """End every session of `principal` (its user was deleted); how many there were."""
        with self._lock:
            kept = {t: s for t, s in self._sessions.items() if s.principal != principal}
            ended = len(self._sessions) - len(kept)
            self._sessions = kept
        return ended

    def principal_of(self, token: str, peer: str) -> str | None:
        """The token's principal if it was issued on this connection and has not expired."""
        session = self._sessions.get(token)
        if session is None or session.peer != peer or session.expires_at_ms <= self._now_ms():
            return None
        return session.principal
