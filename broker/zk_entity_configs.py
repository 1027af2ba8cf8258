"""Users', clients' and brokers' configs on a ZooKeeper cluster: SCRAM credentials, client
quotas and dynamic broker configs.

Theory of operation
-------------------
Kafka keeps both in the same znodes (kafka-configs --entity-type users|clients):

    /config/users/<user>                      {"version":1,"config":{"SCRAM-SHA-256":"salt=...,...",
                                                                      "producer_byte_rate":"1048576"}}
    /config/users/<user>/clients/<client-id>  {"version":1,"config":{"consumer_byte_rate":"..."}}
    /config/clients/<client-id>               {"version":1,"config":{...}}
    /config/brokers/<default> and /<id>       {"version":1,"config":{"log.retention.ms":"..."}}
    /config/changes/config_change_N           (sequential) {"version":2,"entity_path":"users/alice"}

`<default>` is a name like any other; other names are URL-encoded (Kafka's Sanitizer), so a
principal such as `CN=alice,O=Acme` is one znode.

`ZkEntityConfigs` is the one owner of them on a broker. It keeps a snapshot -- entity path
("users/alice", "clients/c1", "users/alice/clients/c1") -> its config -- replaced whole and
handed to its listeners (the SCRAM users, the client quotas) after every reload. A change
from any broker is a read-modify-write of each entity's znode under its version (a
concurrent change makes it read again), then a change notification; every broker follows
/config/changes (`broker.zk_changes.ZkChangeFollower`) and reloads on a notification. A reload reads and hands over under one lock, so the snapshot only moves forward; the
writer reloads before it answers, so a credential it set works on its own broker at once.
"""
from __future__ import annotations

import logging
from typing import Callable, Mapping
from urllib.parse import quote, unquote

from broker.metadata.zk_store import CONFIG_CHANGE_PREFIX, config_change, decode_config, encode_config
from broker.quotas import DEFAULT
from broker.zk_changes import ZkChangeFollower

log = logging.getLogger("eos.broker.zk_entity_configs")

USERS_PATH = "/config/users"
CLIENTS_PATH = "/config/clients"
BROKERS_PATH = "/config/brokers"      # dynamic broker configs (broker/dynamic_config.py)
CHANGES_PATH = "/config/changes"

Snapshot = Mapping[str, Mapping[str, str]]


# ---- entity paths (pure) ------------------------------------------------------------------------

def entity_path(user: str | None, client_id: str | None) -> str:
    """"users/alice", "clients/c1" or "users/alice/clients/c1" (names URL-encoded)."""
    if user is None and client_id is None:
        raise ValueError("an entity names a user, a client id, or both")
    parts = []
    if user is not None:
        parts += ["users", _sanitized(user)]
    if client_id is not None:
        parts += ["clients", _sanitized(client_id)]
    return "/".join(parts)


def _sanitized(name: str) -> str:
    """Kafka's Sanitizer: URL-encoding (Python's quote leaves the same characters as Java's
    URLEncoder after Kafka's fix-ups: letters, digits and "-._~"); `<default>` as it is."""
    return name if name == DEFAULT else quote(name, safe="")     # Kafka's ConfigEntityName.Default as it is


def entity_of(path: str) -> tuple[str | None, str | None]:
    """The inverse of `entity_path`: (user, client id)."""
    parts = path.split("/")
    named = dict(zip(parts[0::2], (unquote(p) for p in parts[1::2])))
    return named.get("users"), named.get("clients")


# ---- the store ------------------------------------------------------------------------------------

class ZkEntityConfigs(ZkChangeFollower):
    """See the module doc. `client` is a started KazooClient (the broker's session)."""

    def __init__(self, client):
        super().__init__(client, (CHANGES_PATH,), "users' and clients' configs")
        self._snapshot: Snapshot = {}
        self._listeners: list[Callable[[Snapshot], None]] = []

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def add_listener(self, listener: Callable[[Snapshot], None]) -> None:
        """`listener(snapshot)` after every reload (and once now)."""
        with self._reload_lock:      # not between a reload's read and its hand-over
            self._listeners.append(listener)
            listener(self._snapshot)

    def _read(self) -> dict[str, dict[str, str]]:
        from kazoo.exceptions import NoNodeError

        configs: dict[str, dict[str, str]] = {}

        def read(path: str) -> None:
            try:
                data, _ = self._client.get(f"/config/{path}")
                config = decode_config(data)
            except NoNodeError:
                return
            except ValueError as exc:   # another tool's bad JSON: skip it, as Kafka's brokers do
                log.error("/config/%s is not a config (%s); ignored", path, exc)
                return
            if config:
                configs[path] = config

        for user in self._children(USERS_PATH):
            read(f"users/{user}")
            for client_id in self._children(f"{USERS_PATH}/{user}/clients"):
                read(f"users/{user}/clients/{client_id}")
        for client_id in self._children(CLIENTS_PATH):
            read(f"clients/{client_id}")
        for broker in self._children(BROKERS_PATH):
            read(f"brokers/{broker}")
        return configs

    def _publish(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        for listener in list(self._listeners):
            try:
                listener(snapshot)
            except Exception:
                log.exception("a listener of users' and clients' configs failed")

    def alter(self, changes: Mapping[str, Mapping[str, str | None]]) -> Snapshot:
        """Set (a value) or remove (None) keys of entities (entity path -> changes), each
        entity's znode under its version; notify every broker; the snapshot after it."""
        writes = []
        for path, entity_changes in changes.items():
            def update(data: bytes | None, entity_changes=entity_changes) -> bytes | None:
                current = decode_config(data or b"")
                wanted = dict(current)
                for key, value in entity_changes.items():
                    if value is None:
                        wanted.pop(key, None)
                    else:
                        wanted[key] = value
                # An emptied znode stays (as Kafka's does): users/<u> may hold clients/ below it.
                return data if wanted == current else encode_config(wanted)
            writes.append((f"/config/{path}", update, (CHANGES_PATH, config_change(path))))
        return self._write(writes, CONFIG_CHANGE_PREFIX)
