"""A cluster's ACLs in ZooKeeper, in Kafka's ZooKeeper-mode layout, watched by every broker.

Theory of operation
-------------------
On a ZooKeeper cluster every broker must decide the same way, so the ACLs live in
ZooKeeper, where Kafka's AclAuthorizer kept them:

    /kafka-acl/<Type>/<name>                      LITERAL patterns (Type: Topic, Group,
                                                  Cluster, TransactionalId)
    /kafka-acl-extended/prefixed/<Type>/<name>    PREFIXED patterns
        {"version":1,"acls":[{"principal":"User:alice","permissionType":"Allow",
                              "operation":"Read","host":"*"}]}
    /kafka-acl-changes/acl_changes_N              (sequential) "Topic:LITERAL:orders"
    /kafka-acl-extended-changes/acl_changes_N     (sequential) {"version":1,"resourceType":
                                                  "Topic","name":"or","patternType":"PREFIXED"}

The codecs are pure functions. `ZkAclStore` does the I/O. A change (CreateAcls, DeleteAcls
on any broker) is a read-modify-write of each touched resource's znode, guarded by the
znode's version (a concurrent change from another broker makes it read again, so neither
is lost), then a change notification. Every broker follows the two change paths
(`broker.zk_changes.ZkChangeFollower`): a notification makes it read all ACLs again and hand
the whole set to `on_change` (the authorizer swaps its index). A reload happens under one
lock, read and hand-over together, so a later hand-over always comes from a later read, and
the set only moves forward. The writer reloads before it answers, so an ACL it created is
in force on its own broker when the client hears back; the other brokers follow within a
ZooKeeper round trip.
"""
from __future__ import annotations

import json
import logging
from typing import Callable, Iterable

from broker.acl import AclBinding, InvalidAclError, Operation, PatternType, Permission, ResourceType
from broker.zk_changes import ZkChangeFollower

log = logging.getLogger("eos.broker.zk_acls")

LITERAL_ROOT = "/kafka-acl"
PREFIXED_ROOT = "/kafka-acl-extended/prefixed"
LITERAL_CHANGES = "/kafka-acl-changes"
EXTENDED_CHANGES = "/kafka-acl-extended-changes"
CHANGE_PREFIX = "acl_changes_"
ZNODE_VERSION = 1

_STORED_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID)


# ---- codecs (pure) ------------------------------------------------------------------------------

def kafka_name(member) -> str:
    """TRANSACTIONAL_ID -> TransactionalId, CLUSTER_ACTION -> ClusterAction (Kafka's spelling)."""
    return "".join(word.capitalize() for word in member.name.split("_"))


def _from_kafka_name(enum_type, text: str):
    for member in enum_type:
        if kafka_name(member) == text:
            return member
    raise InvalidAclError(f"unknown {enum_type.__name__} {text!r} in ZooKeeper")


def resource_path(resource_type: ResourceType, pattern_type: PatternType, name: str) -> str:
    if "/" in name or name in ("", ".", ".."):
        raise InvalidAclError(f"resource name {name!r} cannot be a ZooKeeper node name (no '/', '.' or '..')")
    root = PREFIXED_ROOT if pattern_type is PatternType.PREFIXED else LITERAL_ROOT
    return f"{root}/{kafka_name(resource_type)}/{name}"


def encode_acls(bindings: Iterable[AclBinding]) -> bytes:
    """One resource's znode: its ACLs in Kafka's JSON (in a stable order)."""
    entries = sorted({(b.principal, kafka_name(b.permission), kafka_name(b.operation), b.host) for b in bindings})
    return json.dumps({"version": ZNODE_VERSION, "acls": [
        {"principal": principal, "permissionType": permission, "operation": operation, "host": host}
        for principal, permission, operation, host in entries]}, separators=(",", ":")).encode()


def decode_acls(resource_type: ResourceType, pattern_type: PatternType, name: str, data: bytes) -> list[AclBinding]:
    document = json.loads(data.decode("utf-8")) if data else {"acls": []}
    return [AclBinding(resource_type, name, pattern_type, item["principal"], item["host"],
                       _from_kafka_name(Operation, item["operation"]),
                       _from_kafka_name(Permission, item["permissionType"]))
            for item in document.get("acls", ())]


def change_notification(resource_type: ResourceType, pattern_type: PatternType, name: str) -> tuple[str, bytes]:
    """(change path, data) of the notification for one changed resource."""
    if pattern_type is PatternType.PREFIXED:
        return EXTENDED_CHANGES, json.dumps({"version": 1, "resourceType": kafka_name(resource_type), "name": name,
                                             "patternType": "PREFIXED"}).encode()
    return LITERAL_CHANGES, f"{kafka_name(resource_type)}:LITERAL:{name}".encode()


# ---- the store ------------------------------------------------------------------------------------

class ZkAclStore(ZkChangeFollower):
    """See the module doc. `client` is a started KazooClient (the broker's session)."""

    def __init__(self, client, *, on_change: Callable[[frozenset[AclBinding]], None] | None = None):
        super().__init__(client, (LITERAL_CHANGES, EXTENDED_CHANGES), "ACLs")
        self.on_change = on_change

    def check(self, binding: AclBinding) -> None:
        """Refuse, before anything is written, an ACL whose resource name cannot be a znode."""
        resource_path(binding.resource_type, binding.pattern_type, binding.resource_name)

    def _read(self) -> frozenset[AclBinding]:
        from kazoo.exceptions import NoNodeError

        bindings: list[AclBinding] = []
        for pattern_type, root in ((PatternType.LITERAL, LITERAL_ROOT), (PatternType.PREFIXED, PREFIXED_ROOT)):
            for resource_type in _STORED_TYPES:
                type_path = f"{root}/{kafka_name(resource_type)}"
                for name in self._children(type_path):
                    try:
                        data, _ = self._client.get(f"{type_path}/{name}")
                        bindings.extend(decode_acls(resource_type, pattern_type, name, data))
                    except NoNodeError:
                        continue    # deleted between the listing and the read
                    except (ValueError, KeyError, TypeError) as exc:
                        # Another tool's bad entry: skipped and said, as Kafka's authorizer does,
                        # rather than stop following every other ACL.
                        log.error("%s/%s holds no readable ACLs (%s); ignored", type_path, name, exc)
        return frozenset(bindings)

    def _publish(self, bindings: frozenset[AclBinding]) -> None:
        if self.on_change is not None:
            self.on_change(bindings)

    def change(self, added: Iterable[AclBinding], removed: Iterable[AclBinding]) -> frozenset[AclBinding]:
        """Add and remove ACLs (each touched resource's znode read, changed and written under
        its version), notify every broker, and return the ACLs in force after it."""
        by_resource: dict[tuple, tuple[set, set]] = {}
        for binding, adding in [(b, True) for b in added] + [(b, False) for b in removed]:
            key = (binding.resource_type, binding.pattern_type, binding.resource_name)
            by_resource.setdefault(key, (set(), set()))[0 if adding else 1].add(binding)
        changes = []
        for (resource_type, pattern_type, name), (adds, removes) in by_resource.items():
            def update(data: bytes | None, adds=adds, removes=removes, resource_type=resource_type,
                       pattern_type=pattern_type, name=name) -> bytes | None:
                current = set(decode_acls(resource_type, pattern_type, name, data or b""))
                wanted = (current | adds) - removes
                if wanted == current:
                    return data
                return encode_acls(wanted) if wanted else None
            changes.append((resource_path(resource_type, pattern_type, name), update,
                            change_notification(resource_type, pattern_type, name)))
        return self._write(changes, CHANGE_PREFIX)
