"""The broker's authorizer: ACLs kept in the data dir or in ZooKeeper, checked for the call being served.

Theory of operation
-------------------
`Authorizer` is the shell around the pure rule of `broker/acl.py`. It holds the `AclIndex`
in force; where the ACLs are kept is its store's business:

- a cluster of one: `FileAclStore`, `<data_dir>/acls.json`, written atomically (a crash
  leaves the old file or the new one, whole) before the index is swapped, so an ACL change
  that was answered survives a restart, and one that failed to write is not in force;
- a ZooKeeper cluster: `broker.zk_acls.ZkAclStore`, Kafka's /kafka-acl znodes, which every
  broker follows through change notifications, so all brokers decide alike.

Either store hands the whole set of ACLs to `_install` after every change it makes or
sees; readers take no lock: the `AclIndex` is immutable and replaced whole (ACLs change
rarely; every call reads them).

A handler asks `allowed(operation, resource_type, name)`. The principal and host are the
current gRPC call's (`broker.security.current_call()`, put there by the identity
interceptor, which a broker with an authorizer always installs). No call identity means an
in-process call -- the broker's own transaction or group coordinator writing through the
Broker service's handlers -- which acts as the broker itself and is not checked.

A broker without `authorizer.class.name` has no Authorizer at all: the servicers hold None
and skip every check, so an RPC costs nothing more than before ACLs existed.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable, Iterable

from broker.acl import (CLUSTER_NAME, AclBinding, AclFilter, AclIndex, InvalidAclError, Operation, ResourceType,
                        authorize, authorize_any, filter_matches, validate_binding, validate_filter)
from broker.security import current_call
from eos.errors import StorageError
from eos.files import read_json_document, write_json_document

log = logging.getLogger("eos.broker.authorizer")

ACL_FILE_NAME = "acls.json"
ACL_FILE_VERSION = 1
# The names authorizer.class.name accepts: Kafka's two authorizers and eos's short name.
AUTHORIZER_CLASS_NAMES = frozenset({
    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "kafka.security.authorizer.AclAuthorizer",
    "kafka.security.auth.SimpleAclAuthorizer",
    "eos.AclAuthorizer",
})


class FileAclStore:
    """A cluster of one's ACLs: `<data_dir>/acls.json` (see the module doc)."""

    def __init__(self, data_dir: Path | str):
        self._path = Path(data_dir) / ACL_FILE_NAME
        self._bindings: frozenset[AclBinding] = frozenset()
        self.on_change: Callable[[frozenset[AclBinding]], None] | None = None

    def start(self) -> frozenset[AclBinding]:
        """Read the ACL file (none: no ACLs)."""
        if self._path.exists():
            try:
                document = read_json_document(self._path, ACL_FILE_VERSION)
                bindings = [AclBinding.from_json(item) for item in document["acls"]]
            except (ValueError, KeyError, TypeError, InvalidAclError) as exc:
                # Refusing to start beats starting with fewer DENY rules than the operator wrote.
                raise StorageError(f"{self._path}: not a readable ACL file ({exc}); the broker will not start "
                                   f"without its ACLs") from None
            self._bindings = frozenset(bindings)
        self.on_change(self._bindings)
        return self._bindings

    def stop(self) -> None:
        pass

    def check(self, binding: AclBinding) -> None:
        """Any ACL the model accepts can be stored in the file."""

    def reload(self) -> frozenset[AclBinding]:
        return self._bindings

    def change(self, added: Iterable[AclBinding], removed: Iterable[AclBinding]) -> frozenset[AclBinding]:
        wanted = (self._bindings | set(added)) - set(removed)
        if wanted != self._bindings:
            ordered = sorted(wanted, key=lambda b: (b.resource_type, b.resource_name, b.pattern_type, b.principal,
                                                    b.host, b.operation, b.permission))
            write_json_document(self._path, ACL_FILE_VERSION, {"acls": [b.to_json() for b in ordered]})
            self._bindings = frozenset(wanted)
            self.on_change(self._bindings)
        return self._bindings


class Authorizer:
    def __init__(self, store, *, super_users: frozenset[str], allow_if_no_acl: bool):
        """`store`: a FileAclStore or a broker.zk_acls.ZkAclStore."""
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        self._index = AclIndex()
        self._store = store
        store.on_change = self._install
        self._write_lock = threading.Lock()    # one change at a time from this broker

    # ---- storage -------------------------------------------------------------------------------

    def load(self) -> int:
        """Read the ACLs and follow their changes; return how many are in force."""
        return len(self._store.start())

    def close(self) -> None:
        self._store.stop()

    def _install(self, bindings: frozenset[AclBinding]) -> None:
        if bindings != self._index.bindings:
            self._index = AclIndex(bindings)

    @property
    def acls(self) -> frozenset[AclBinding]:
        return self._index.bindings

    # ---- changes (CreateAcls, DeleteAcls) and DescribeAcls -------------------------------------

    def create(self, bindings: list[AclBinding]) -> list[str | None]:
        """Add the valid bindings (one write for all); per binding None or why it was refused."""
        results: list[str | None] = []
        valid: list[AclBinding] = []
        for binding in bindings:
            try:
                checked = validate_binding(binding)
                self._store.check(checked)            # e.g. a name ZooKeeper cannot hold
            except InvalidAclError as exc:
                results.append(str(exc))
                continue
            valid.append(checked)
            results.append(None)
        if valid:
            self._change(valid, ())
            log.info("ACLs added: %s", "; ".join(b.describe() for b in valid))
        return results

    def _change(self, added, removed) -> None:
        """The store's change; a failure to store (ZooKeeper away, a disk error) is a
        StorageError after the index is read again, so it shows whatever part was stored."""
        with self._write_lock:
            try:
                self._store.change(added, removed)
            except Exception as exc:
                log.warning("changing the ACLs failed: %s", exc)
                try:
                    self._store.reload()
                except Exception as reload_exc:
                    log.warning("reading the ACLs again failed too: %s", reload_exc)
                raise StorageError(f"the ACLs could not be stored ({exc}); list them to see what is in force") \
                    from None

    def delete(self, filters: list[AclFilter]) -> list[tuple[str | None, list[AclBinding]]]:
        """Remove every ACL a valid filter matches (one write); per filter (None or why it was
        refused, the ACLs it removed)."""
        results: list[tuple[str | None, list[AclBinding]]] = []
        current = self._index.bindings
        removed: set[AclBinding] = set()
        for acl_filter in filters:
            try:
                validate_filter(acl_filter, for_delete=True)
            except InvalidAclError as exc:
                results.append((str(exc), []))
                continue
            matched = [b for b in current if filter_matches(acl_filter, b)]
            removed.update(matched)
            results.append((None, matched))
        if removed:
            self._change((), removed)
            log.info("ACLs removed: %s", "; ".join(b.describe() for b in removed))
        return results

    def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        validate_filter(acl_filter)
        return [b for b in self._index.bindings if filter_matches(acl_filter, b)]

    # ---- checks for the call being served ------------------------------------------------------

    def allowed(self, operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
        call = current_call()
        if call is None:
            return True     # in-process: the broker's own coordinators act as the broker
        return authorize(self._index, call.principal, call.host, operation, resource_type, name,
                         super_users=self.super_users, allow_if_no_acl=self.allow_if_no_acl)

    def allowed_on_any(self, operation: Operation, resource_type: ResourceType) -> bool:
        call = current_call()
        if call is None:
            return True
        return authorize_any(self._index, call.principal, call.host, operation, resource_type,
                             super_users=self.super_users, allow_if_no_acl=self.allow_if_no_acl)

    def refusal(self, operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME) -> str | None:
        """Why the current call may not `operation` the resource (the one wording every
        service answers with), or None when it may."""
        if self.allowed(operation, resource_type, name):
            return None
        return self.denial(operation, resource_type, name)

    def denial(self, operation: Operation, resource_type: ResourceType, name: str = CLUSTER_NAME) -> str:
        what = "the cluster" if resource_type is ResourceType.CLUSTER else \
            f"{resource_type.name.lower().replace('_', ' ')} {name!r}"
        return f"{self.principal()} is not authorized to {operation.name} {what}"

    def principal(self) -> str:
        call = current_call()
        return "the broker" if call is None else call.principal
