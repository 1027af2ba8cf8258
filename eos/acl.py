"""Kafka's ACL vocabulary: resource types, pattern types, operations, permissions, bindings
and filters, shared by the broker (which enforces them, broker/acl.py) and the clients
(eos.Admin, `eos acls`), which build them.

Theory of operation
-------------------
An ACL (Kafka's AclBinding) says: principal P, connecting from host H, is ALLOWed or DENIed
operation O on the resources a pattern names. A pattern is a resource type (TOPIC, GROUP,
TRANSACTIONAL_ID, CLUSTER) and a name that is LITERAL (the name itself, or `*`: every
resource of the type) or PREFIXED (every resource whose name starts with it). Principals
are `User:<name>` or `User:*` (anyone); hosts an IP address or `*`. The numbers of every
enum are Kafka's wire codes, so an ACL reads the same in both systems.

Filters (Kafka's AclBindingFilter, for DescribeAcls and DeleteAcls) match bindings: ANY
types and unset names, principals and hosts match everything; the MATCH pattern type
matches every pattern that covers the named resource, as the authorizer would.

Pure and part of the kernel: it imports nothing of ours. The rule that decides a call is
in broker/acl.py.
"""
from __future__ import annotations

import enum
import ipaddress
from typing import NamedTuple


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1            # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1            # filters only: any pattern type, the name compared as it is
    MATCH = 2          # filters only: every pattern that covers the named resource
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1            # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1            # filters only
    DENY = 2
    ALLOW = 3


WILDCARD_NAME = "*"              # a LITERAL pattern with this name covers every resource of its type
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"
CLUSTER_NAME = "kafka-cluster"   # the one CLUSTER resource, Kafka's name for it
ANONYMOUS = "User:ANONYMOUS"

# What each resource type can be granted (Kafka's AclEntry.supportedOperations); ALL always.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset({Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DESCRIBE,
                                   Operation.DELETE, Operation.ALTER, Operation.DESCRIBE_CONFIGS,
                                   Operation.ALTER_CONFIGS, Operation.ALL}),
    ResourceType.GROUP: frozenset({Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.ALL}),
    ResourceType.CLUSTER: frozenset({Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
                                     Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER,
                                     Operation.DESCRIBE, Operation.ALL}),
    ResourceType.TRANSACTIONAL_ID: frozenset({Operation.DESCRIBE, Operation.WRITE, Operation.ALL}),
}


class InvalidAclError(ValueError):
    """An ACL or filter that cannot be stored or used; the message says which part."""


class AclBinding(NamedTuple):
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def to_json(self) -> dict:
        return {"resource_type": self.resource_type.name, "resource_name": self.resource_name,
                "pattern_type": self.pattern_type.name, "principal": self.principal, "host": self.host,
                "operation": self.operation.name, "permission": self.permission.name}

    @classmethod
    def from_json(cls, item: dict) -> "AclBinding":
        return validate_binding(cls(ResourceType[item["resource_type"]], item["resource_name"],
                                    PatternType[item["pattern_type"]], item["principal"], item["host"],
                                    Operation[item["operation"]], Permission[item["permission"]]))

    def describe(self) -> str:
        """kafka-acls.sh's line for it."""
        return (f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
                f"permissionType={self.permission.name}) on {self.resource_type.name}:"
                f"{self.pattern_type.name}:{self.resource_name}")


class AclFilter(NamedTuple):
    """Kafka's AclBindingFilter: None in a name, principal or host matches any."""
    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY


def _check_principal(principal: str) -> None:
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidAclError(f"principal {principal!r} is not of the form User:<name> (or User:*)")
    if kind != "User":
        raise InvalidAclError(f"principal {principal!r}: eos principals are of type User")


def _check_host(host: str) -> None:
    if host == WILDCARD_HOST:
        return
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise InvalidAclError(f"host {host!r} is neither * nor an IP address (Kafka matches ACL hosts by IP)") from None


def validate_binding(binding: AclBinding) -> AclBinding:
    """The binding, or InvalidAclError naming what is wrong (Kafka's CreateAcls checks)."""
    if binding.resource_type not in SUPPORTED_OPERATIONS:
        raise InvalidAclError(f"resource type {binding.resource_type.name} cannot carry an ACL")
    if binding.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise InvalidAclError(f"pattern type {binding.pattern_type.name}: an ACL is LITERAL or PREFIXED")
    if not binding.resource_name:
        raise InvalidAclError("an ACL needs a resource name")
    if binding.resource_type is ResourceType.CLUSTER and binding.resource_name != CLUSTER_NAME:
        raise InvalidAclError(f"the cluster resource is named {CLUSTER_NAME!r}, not {binding.resource_name!r}")
    if binding.pattern_type is PatternType.PREFIXED and binding.resource_name == WILDCARD_NAME:
        raise InvalidAclError("a PREFIXED pattern of '*' means nothing: use LITERAL '*' for every resource")
    if binding.permission not in (Permission.ALLOW, Permission.DENY):
        raise InvalidAclError(f"permission {binding.permission.name}: an ACL ALLOWs or DENYs")
    if binding.operation not in SUPPORTED_OPERATIONS[binding.resource_type]:
        raise InvalidAclError(f"operation {binding.operation.name} does not apply to a "
                              f"{binding.resource_type.name} (it takes "
                              f"{', '.join(sorted(o.name for o in SUPPORTED_OPERATIONS[binding.resource_type]))})")
    _check_principal(binding.principal)
    _check_host(binding.host)
    return binding


# ---- filters (DescribeAcls, DeleteAcls) -------------------------------------------------------

def validate_filter(acl_filter: AclFilter, *, for_delete: bool = False) -> AclFilter:
    if acl_filter.resource_type is ResourceType.UNKNOWN or acl_filter.pattern_type is PatternType.UNKNOWN \
            or acl_filter.operation is Operation.UNKNOWN or acl_filter.permission is Permission.UNKNOWN:
        raise InvalidAclError("a filter with an UNKNOWN field matches nothing; use ANY")
    if acl_filter.pattern_type is PatternType.MATCH and not acl_filter.resource_name:
        raise InvalidAclError("the MATCH pattern type needs a resource name")
    return acl_filter


def filter_matches(acl_filter: AclFilter, binding: AclBinding) -> bool:
    f = acl_filter
    if f.resource_type is not ResourceType.ANY and f.resource_type != binding.resource_type:
        return False
    if f.pattern_type is PatternType.MATCH:
        name = f.resource_name
        covered = (binding.resource_name == name if binding.pattern_type is PatternType.LITERAL else
                   name.startswith(binding.resource_name))
        if not (covered or (binding.pattern_type is PatternType.LITERAL and binding.resource_name == WILDCARD_NAME)):
            return False
    else:
        if f.pattern_type is not PatternType.ANY and f.pattern_type != binding.pattern_type:
            return False
        if f.resource_name is not None and f.resource_name != binding.resource_name:
            return False
    return ((f.principal is None or f.principal == binding.principal)
            and (f.host is None or f.host == binding.host)
            and (f.operation is Operation.ANY or f.operation == binding.operation)
            and (f.permission is Permission.ANY or f.permission == binding.permission))


def parse_super_users(text: str) -> frozenset[str]:
    """`super.users`: "User:alice;User:bob" (Kafka separates them with semicolons)."""
    users = set()
    for item in (text or "").split(";"):
        item = item.strip()
        if item:
            _check_principal(item)
            users.add(item)
    return frozenset(users)


# The spellings kafka-acls.sh takes for --operation (CamelCase) and the enum names.
def parse_operation(text: str) -> Operation:
    key = text.strip().replace("-", "").replace("_", "").lower()
    for operation in Operation:
        if operation.name.replace("_", "").lower() == key and operation not in (Operation.UNKNOWN,):
            return operation
    raise InvalidAclError(f"unknown operation {text!r} (Read, Write, Create, Delete, Alter, Describe, "
                          f"ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, All)")


# ---- the wire form (eos.v1 AclBinding / AclBindingFilter messages) ----------------------------

def _enum(kind, value: int):
    try:
        return kind(value)
    except ValueError:
        return kind.UNKNOWN


def binding_from_proto(message) -> AclBinding:
    return AclBinding(_enum(ResourceType, message.resource_type), message.resource_name,
                      _enum(PatternType, message.pattern_type), message.principal, message.host,
                      _enum(Operation, message.operation), _enum(Permission, message.permission))


def binding_to_proto(binding: AclBinding):
    from eos.v1 import broker_pb2
    return broker_pb2.AclBinding(resource_type=binding.resource_type, resource_name=binding.resource_name,
                                 pattern_type=binding.pattern_type, principal=binding.principal, host=binding.host,
                                 operation=binding.operation, permission=binding.permission)


def filter_from_proto(message) -> AclFilter:
    return AclFilter(_enum(ResourceType, message.resource_type),
                     message.resource_name if message.HasField("resource_name") else None,
                     _enum(PatternType, message.pattern_type),
                     message.principal if message.HasField("principal") else None,
                     message.host if message.HasField("host") else None,
                     _enum(Operation, message.operation), _enum(Permission, message.permission))


def filter_to_proto(acl_filter: AclFilter):
    from eos.v1 import broker_pb2
    message = broker_pb2.AclBindingFilter(resource_type=acl_filter.resource_type,
                                          pattern_type=acl_filter.pattern_type, operation=acl_filter.operation,
                                          permission=acl_filter.permission)
    for field in ("resource_name", "principal", "host"):
        value = getattr(acl_filter, field)
        if value is not None:
            setattr(message, field, value)
    return message
