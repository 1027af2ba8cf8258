"""Kafka's authorization rule (broker/acl.py) and the ACL vocabulary (eos/acl.py), table by table."""
from __future__ import annotations

import pytest

from broker.acl import (AclBinding, AclFilter, AclIndex, InvalidAclError, Operation, PatternType, Permission,
                        ResourceType, authorize, authorize_any, filter_matches, parse_operation, parse_super_users,
                        validate_binding)

T, G, C, X = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
O = Operation


def acl(resource_type=T, name="orders", operation=O.WRITE, permission=ALLOW, principal="User:alice", host="*",
        pattern=LIT) -> AclBinding:
    return AclBinding(resource_type, name, pattern, principal, host, operation, permission)


def check(acls, operation, name="orders", *, principal="User:alice", host="10.0.0.1", resource_type=T,
          super_users=frozenset(), allow_if_no_acl=False) -> bool:
    return authorize(AclIndex(acls), principal, host, operation, resource_type, name,
                     super_users=super_users, allow_if_no_acl=allow_if_no_acl)


@pytest.mark.parametrize("acls, operation, expected, why", [
    ([acl()], O.WRITE, True, "a literal ALLOW for the principal"),
    ([acl()], O.READ, False, "ALLOW WRITE does not allow READ"),
    ([acl(), acl(permission=DENY)], O.WRITE, False, "DENY wins over ALLOW"),
    ([acl(), acl(permission=DENY, principal="User:*")], O.WRITE, False, "a DENY for everyone wins"),
    ([acl(), acl(permission=DENY, operation=O.ALL)], O.WRITE, False, "DENY ALL denies WRITE"),
    ([acl(operation=O.ALL)], O.READ, True, "ALLOW ALL allows every operation"),
    ([acl(operation=O.READ)], O.DESCRIBE, True, "READ implies DESCRIBE"),
    ([acl(operation=O.WRITE)], O.DESCRIBE, True, "WRITE implies DESCRIBE"),
    ([acl(operation=O.DELETE)], O.DESCRIBE, True, "DELETE implies DESCRIBE"),
    ([acl(operation=O.ALTER)], O.DESCRIBE, True, "ALTER implies DESCRIBE"),
    ([acl(operation=O.CREATE)], O.DESCRIBE, False, "CREATE does not imply DESCRIBE"),
    ([acl(operation=O.ALTER_CONFIGS)], O.DESCRIBE_CONFIGS, True, "ALTER_CONFIGS implies DESCRIBE_CONFIGS"),
    ([acl(operation=O.DESCRIBE)], O.READ, False, "DESCRIBE does not imply READ"),
    ([acl(operation=O.READ), acl(operation=O.READ, permission=DENY)], O.DESCRIBE, True,
     "a DENY of READ does not deny the DESCRIBE an ALLOW of READ implies"),
    ([acl(operation=O.READ), acl(operation=O.DESCRIBE, permission=DENY)], O.DESCRIBE, False,
     "a DENY of DESCRIBE denies it"),
    ([acl(name="*")], O.WRITE, True, "the literal wildcard name covers every topic"),
    ([acl(name="ord", pattern=PRE)], O.WRITE, True, "a prefix of the name covers it"),
    ([acl(name="orders", pattern=PRE)], O.WRITE, True, "the whole name is a prefix of itself"),
    ([acl(name="orx", pattern=PRE)], O.WRITE, False, "another prefix does not"),
    ([acl(name="ordersx", pattern=PRE)], O.WRITE, False, "a longer prefix does not"),
    ([acl(name="ord")], O.WRITE, False, "a LITERAL ACL is not a prefix"),
    ([acl(name="ord", pattern=PRE), acl(permission=DENY)], O.WRITE, False, "a literal DENY beats a prefixed ALLOW"),
    ([acl(), acl(name="o", pattern=PRE, permission=DENY)], O.WRITE, False, "a prefixed DENY beats a literal ALLOW"),
    ([acl(principal="User:*")], O.WRITE, True, "User:* matches anyone"),
    ([acl(principal="User:bob")], O.WRITE, False, "another principal's ALLOW does not"),
    ([acl(host="10.0.0.1")], O.WRITE, True, "the ACL's host is the caller's"),
    ([acl(host="10.0.0.2")], O.WRITE, False, "another host's ALLOW does not"),
    ([acl(), acl(permission=DENY, host="10.0.0.2")], O.WRITE, True, "another host's DENY does not apply"),
    ([acl(resource_type=G)], O.WRITE, False, "an ACL on a group with the name does not cover the topic"),
    ([acl(principal="User:bob")], O.READ, False, "ACLs exist on the resource (for others): no fallback"),
])
def test_rule(acls, operation, expected, why):
    assert check(acls, operation) is expected, why


@pytest.mark.parametrize("acls, allow_if_no_acl, expected", [
    ([], False, False),                               # Kafka's default once an authorizer is on
    ([], True, True),                                 # no ACL on the resource: everyone
    ([acl(name="other")], True, True),                # ACLs elsewhere do not count
    ([acl(principal="User:bob")], True, False),       # an ACL on it (for someone else): the ACLs decide
    ([acl(name="o", pattern=PRE, principal="User:bob")], True, False),   # covered by a prefix counts too
    ([acl(name="*", principal="User:bob")], True, False),                # and by the wildcard
])
def test_allow_everyone_if_no_acl_found(acls, allow_if_no_acl, expected):
    assert check(acls, O.WRITE, allow_if_no_acl=allow_if_no_acl) is expected


def test_super_users_may_do_anything_even_against_a_deny():
    deny = [acl(permission=DENY, principal="User:*", operation=O.ALL)]
    assert check(deny, O.DELETE, super_users=frozenset({"User:alice"}))
    assert not check(deny, O.DELETE, super_users=frozenset({"User:bob"}))
    assert check([], O.ALTER, resource_type=C, name="kafka-cluster", super_users=frozenset({"User:alice"}))


def test_the_index_finds_each_covering_acl_once_without_scanning():
    acls = [acl(name=f"t{i}") for i in range(1000)] + [acl(name="t1", pattern=PRE), acl(name="*")]
    index = AclIndex(acls)
    assert sorted(b.resource_name for b in index.covering(T, "t10")) == ["*", "t1", "t10"]
    assert index.covering(G, "t10") == []
    assert sorted(b.resource_name for b in index.covering(T, "*")) == ["*"]


@pytest.mark.parametrize("acls, expected, why", [
    ([], False, "no ACL at all"),
    ([acl(name="a")], True, "WRITE on one topic"),
    ([acl(name="a", pattern=PRE)], True, "WRITE on a prefix"),
    ([acl(name="a"), acl(name="*", permission=DENY)], False, "a DENY of every topic takes it away"),
    ([acl(name="ab", pattern=PRE), acl(name="a", pattern=PRE, permission=DENY)], False,
     "a DENY of a shorter prefix takes the longer one away"),
    ([acl(name="ab"), acl(name="a", pattern=PRE, permission=DENY)], False, "and a literal beneath it"),
    ([acl(name="a"), acl(name="b", permission=DENY)], True, "a DENY elsewhere leaves it"),
    ([acl(name="a", operation=O.READ)], False, "READ is not WRITE"),
    ([acl(name="a", principal="User:bob")], False, "another principal's WRITE"),
])
def test_authorize_any_topic(acls, expected, why):
    assert authorize_any(AclIndex(acls), "User:alice", "10.0.0.1", O.WRITE, T) is expected, why


def test_authorize_any_with_allow_everyone_only_when_the_type_has_no_acl():
    assert authorize_any(AclIndex([]), "User:alice", "h", O.WRITE, T, allow_if_no_acl=True)
    assert not authorize_any(AclIndex([acl(principal="User:bob")]), "User:alice", "h", O.WRITE, T,
                             allow_if_no_acl=True)


@pytest.mark.parametrize("binding, problem", [
    (acl(operation=O.IDEMPOTENT_WRITE), "does not apply to a TOPIC"),
    (acl(resource_type=G, operation=O.WRITE), "does not apply to a GROUP"),
    (acl(resource_type=C, name="orders", operation=O.ALTER), "the cluster resource is named"),
    (acl(pattern=PatternType.MATCH), "LITERAL or PREFIXED"),
    (acl(name="*", pattern=PRE), "PREFIXED pattern of '*'"),
    (acl(principal="alice"), "User:<name>"),
    (acl(principal="Group:x"), "of type User"),
    (acl(host="example.com"), "IP address"),
    (acl(permission=Permission.ANY), "ALLOWs or DENYs"),
    (acl(name=""), "resource name"),
])
def test_invalid_bindings_are_refused(binding, problem):
    with pytest.raises(InvalidAclError, match=problem):
        validate_binding(binding)


def test_valid_bindings_and_the_json_round_trip():
    for binding in (acl(), acl(resource_type=C, name="kafka-cluster", operation=O.IDEMPOTENT_WRITE),
                    acl(resource_type=X, name="tx-", pattern=PRE, host="::1"), acl(principal="User:*")):
        assert AclBinding.from_json(validate_binding(binding).to_json()) == binding


@pytest.mark.parametrize("acl_filter, binding, expected", [
    (AclFilter(), acl(), True),
    (AclFilter(T, "orders", LIT), acl(), True),
    (AclFilter(T, "orders", PRE), acl(), False),
    (AclFilter(T, "orders", PatternType.ANY), acl(name="orders", pattern=PRE), True),
    (AclFilter(G), acl(), False),
    (AclFilter(T, "orders-eu", PatternType.MATCH), acl(name="orders", pattern=PRE), True),
    (AclFilter(T, "orders-eu", PatternType.MATCH), acl(name="*"), True),
    (AclFilter(T, "orders-eu", PatternType.MATCH), acl(name="orders"), False),
    (AclFilter(principal="User:bob"), acl(), False),
    (AclFilter(operation=O.WRITE, permission=DENY), acl(), False),
    (AclFilter(operation=O.WRITE, permission=ALLOW, host="*"), acl(), True),
])
def test_filters(acl_filter, binding, expected):
    assert filter_matches(acl_filter, binding) is expected


def test_parsers():
    assert parse_super_users(" User:a;User:b ;") == {"User:a", "User:b"}
    with pytest.raises(InvalidAclError):
        parse_super_users("alice")
    assert parse_operation("IdempotentWrite") is O.IDEMPOTENT_WRITE
    assert parse_operation("cluster_action") is O.CLUSTER_ACTION
    assert parse_operation("Write") is O.WRITE
    with pytest.raises(InvalidAclError):
        parse_operation("Fly")
