"""Kafka's authorization rule over an index of ACLs: pure functions, no I/O.

Theory of operation
-------------------
The vocabulary (ResourceType, PatternType, Operation, Permission, AclBinding, AclFilter) is
in `eos/acl.py`, shared with the clients; this module holds what only the broker does with
it, and re-exports the vocabulary so broker code imports one module.

`authorize(index, principal, host, operation, resource_type, name, super_users,
allow_if_no_acl)` follows Kafka's AclAuthorizer / StandardAuthorizer, in this order:

1. a super user (`super.users`) may do anything;
2. a resource that no ACL at all covers (for any principal) is allowed only when
   `allow.everyone.if.no.acl.found` is true (false by default);
3. any covering DENY that matches the principal, host and operation wins;
4. else any covering ALLOW that matches them allows;
5. else the call is denied.

An ACL matches a principal when it names it or `User:*`, a host when it names it or `*`.
Operation matching is Kafka's: ALL matches every operation. An ALLOW of READ, WRITE, DELETE
or ALTER also allows DESCRIBE, and an ALLOW of ALTER_CONFIGS allows DESCRIBE_CONFIGS; a DENY
matches only its own operation or ALL (a DENY of READ does not deny DESCRIBE).

`AclIndex` is what a call is checked against: built once each time the ACLs change (they
change rarely, calls come all the time), it keys the LITERAL ACLs by (type, name) and the
PREFIXED ones by (type, prefix), so finding the ACLs that cover one resource is one dict
lookup for the name, one for `*`, and one per distinct prefix length some ACL has -- never
a scan of every ACL. `authorize_any(index, ..., resource_type)` is Kafka's
authorizeByResourceType (KIP-679: an idempotent producer needs WRITE on *some* topic, not
IDEMPOTENT_WRITE on the cluster).
"""
from __future__ import annotations

from typing import Iterable

from eos.acl import (ANONYMOUS, CLUSTER_NAME, SUPPORTED_OPERATIONS, WILDCARD_HOST, WILDCARD_NAME,  # noqa: F401
                     WILDCARD_PRINCIPAL, AclBinding, AclFilter, InvalidAclError, Operation, PatternType,
                     Permission, ResourceType, filter_matches, parse_operation, parse_super_users,
                     validate_binding, validate_filter)

__all__ = ["ANONYMOUS", "CLUSTER_NAME", "SUPPORTED_OPERATIONS", "WILDCARD_HOST", "WILDCARD_NAME",
           "WILDCARD_PRINCIPAL", "AclBinding", "AclFilter", "AclIndex", "InvalidAclError", "Operation",
           "PatternType", "Permission", "ResourceType", "authorize", "authorize_any", "filter_matches",
           "parse_operation", "parse_super_users", "validate_binding", "validate_filter"]

# An ALLOW of one of these also allows the operation it maps to (Kafka's implied operations).
_ALLOWED_BY: dict[Operation, frozenset[Operation]] = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                                   Operation.ALTER, Operation.ALL}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.ALL}),
}


# ---- the index and the rule ------------------------------------------------------------------

class AclIndex:
    """The ACLs, indexed by what they cover. Immutable: build a new one on every change."""

    __slots__ = ("bindings", "_literal", "_prefixed", "_prefix_lengths", "_by_type")

    def __init__(self, bindings: Iterable[AclBinding] = ()):
        self.bindings: frozenset[AclBinding] = frozenset(bindings)
        literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        prefixed: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        lengths: dict[ResourceType, set[int]] = {}
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for binding in self.bindings:
            key = (binding.resource_type, binding.resource_name)
            if binding.pattern_type is PatternType.LITERAL:
                literal.setdefault(key, []).append(binding)
            else:
                prefixed.setdefault(key, []).append(binding)
                lengths.setdefault(binding.resource_type, set()).add(len(binding.resource_name))
            by_type.setdefault(binding.resource_type, []).append(binding)
        self._literal = {key: tuple(value) for key, value in literal.items()}
        self._prefixed = {key: tuple(value) for key, value in prefixed.items()}
        # Only the prefix lengths some ACL has are looked up: a name's prefixes of other
        # lengths cannot be keys.
        self._prefix_lengths = {rt: tuple(sorted(ls)) for rt, ls in lengths.items()}
        self._by_type = {rt: tuple(value) for rt, value in by_type.items()}

    def __len__(self) -> int:
        return len(self.bindings)

    def covering(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """Every ACL whose pattern covers the resource: its literal name, the wildcard, and
        each prefix of its name."""
        found: list[AclBinding] = []
        found.extend(self._literal.get((resource_type, name), ()))
        if name != WILDCARD_NAME:
            found.extend(self._literal.get((resource_type, WILDCARD_NAME), ()))
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            found.extend(self._prefixed.get((resource_type, name[:length]), ()))
        return found

    def of_type(self, resource_type: ResourceType) -> tuple[AclBinding, ...]:
        return self._by_type.get(resource_type, ())


def _matches_identity(binding: AclBinding, principal: str, host: str) -> bool:
    return (binding.principal == principal or binding.principal == WILDCARD_PRINCIPAL) and (
        binding.host == host or binding.host == WILDCARD_HOST)


def _denies(binding: AclBinding, operation: Operation) -> bool:
    return binding.permission is Permission.DENY and binding.operation in (operation, Operation.ALL)


def _allows(binding: AclBinding, operation: Operation) -> bool:
    if binding.permission is not Permission.ALLOW:
        return False
    implied = _ALLOWED_BY.get(operation)
    if implied is not None:
        return binding.operation in implied
    return binding.operation in (operation, Operation.ALL)


def authorize(index: AclIndex, principal: str, host: str, operation: Operation, resource_type: ResourceType,
              name: str, *, super_users: frozenset[str] = frozenset(), allow_if_no_acl: bool = False) -> bool:
    """May `principal` from `host` do `operation` on the resource? (the module doc's rule)"""
    if principal in super_users:
        return True
    acls = index.covering(resource_type, name)
    if not acls:
        return allow_if_no_acl
    matching = [b for b in acls if _matches_identity(b, principal, host)]
    if any(_denies(b, operation) for b in matching):
        return False
    return any(_allows(b, operation) for b in matching)


def _pattern_covers(outer: AclBinding, inner: AclBinding) -> bool:
    """Does `outer`'s pattern cover every resource `inner`'s pattern covers?"""
    if outer.resource_name == WILDCARD_NAME and outer.pattern_type is PatternType.LITERAL:
        return True
    if outer.pattern_type is PatternType.LITERAL:
        return inner.pattern_type is PatternType.LITERAL and inner.resource_name == outer.resource_name
    return inner.resource_name.startswith(outer.resource_name) and inner.resource_name != WILDCARD_NAME


def authorize_any(index: AclIndex, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                  *, super_users: frozenset[str] = frozenset(), allow_if_no_acl: bool = False) -> bool:
    """Kafka's authorizeByResourceType: may the principal do `operation` on at least one
    resource of the type? True when some ALLOW pattern for it is not covered by a DENY (a
    DENY of `*` or of a shorter prefix takes away everything beneath it)."""
    if principal in super_users:
        return True
    acls = [b for b in index.of_type(resource_type) if _matches_identity(b, principal, host)]
    denies = [b for b in acls if _denies(b, operation)]
    allows = [b for b in acls if _allows(b, operation)]
    if any(not any(_pattern_covers(deny, allow) for deny in denies) for allow in allows):
        return True
    # Kafka: with allow.everyone.if.no.acl.found, a type without any ACL at all allows.
    return allow_if_no_acl and not index.of_type(resource_type)


