"""The pure parts of security on a cluster: the brokers' registrations with every listener
(Kafka's /brokers/ids JSON), which endpoint a client on a listener is given, the ACL znodes
in Kafka's ZooKeeper layout, and the inter-broker TLS settings checked before any handshake."""
from __future__ import annotations

import json

import pytest

from broker.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from broker.metadata.types import BrokerInfo, ListenerEndpoint
from broker.metadata.zk_store import decode_broker, encode_broker
from broker.security import Listener, inter_broker_security
from broker.acl import InvalidAclError
from broker.zk_entity_configs import decode_config, encode_config, entity_of, entity_path
from broker.zk_acls import (change_notification, decode_acls, encode_acls, kafka_name,
                            resource_path)
from eos.errors import InvalidConfigError
from eos.tls_certs import CertificateAuthority


def test_a_registration_lists_every_listener_and_reads_back():
    info = BrokerInfo(3, "10.0.0.3", 9092, "r1", endpoints=(
        ListenerEndpoint("INTERNAL", "PLAINTEXT", "10.0.0.3", 9092), ListenerEndpoint("SSL", "SSL", "::1", 9093)))
    document = json.loads(encode_broker(info, 1234))
    assert document["endpoints"] == ["INTERNAL://10.0.0.3:9092", "SSL://[::1]:9093"]
    assert document["listener_security_protocol_map"] == {"INTERNAL": "PLAINTEXT", "SSL": "SSL"}
    assert (document["host"], document["port"], document["version"]) == ("10.0.0.3", 9092, 5)
    assert decode_broker(3, encode_broker(info, 1234), epoch=7) == BrokerInfo(3, "10.0.0.3", 9092, "r1", 7,
                                                                               info.endpoints)


def test_a_registration_carries_the_socket_port_only_when_there_is_one():
    info = BrokerInfo(2, "h", 9092, socket_port=9192)
    assert json.loads(encode_broker(info, 0))["eos_socket_port"] == 9192
    assert decode_broker(2, encode_broker(info, 0), epoch=3).socket_port == 9192
    plain = BrokerInfo(2, "h", 9092)
    assert "eos_socket_port" not in json.loads(encode_broker(plain, 0))
    assert decode_broker(2, encode_broker(plain, 0), epoch=3).socket_port == 0


def test_a_registration_without_endpoints_is_one_plaintext_listener():
    legacy = json.dumps({"host": "h", "port": 9092, "version": 4}).encode()
    info = decode_broker(1, legacy, epoch=1)
    assert info.endpoints == ()
    assert info.endpoint("SSL") == ("h", 9092) and info.endpoint(None) == ("h", 9092)
    assert json.loads(encode_broker(info, 0))["endpoints"] == ["PLAINTEXT://h:9092"]


def test_a_client_is_given_the_endpoint_of_its_own_listener_or_none():
    info = BrokerInfo(1, "127.0.0.1", 9092, endpoints=(ListenerEndpoint("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092),
                                                       ListenerEndpoint("SSL", "SSL", "broker1.example", 9093)))
    assert info.endpoint("SSL") == ("broker1.example", 9093)
    assert info.endpoint("PLAINTEXT") == ("127.0.0.1", 9092)
    assert info.endpoint(None) == ("127.0.0.1", 9092)          # the inter-broker listener's
    assert info.endpoint("SASL_SSL") is None                     # left out, as Kafka leaves it out


def test_acl_znodes_use_kafkas_names_and_read_back():
    bindings = [AclBinding(ResourceType.TRANSACTIONAL_ID, "tx", PatternType.LITERAL, "User:alice", "*",
                           Operation.WRITE, Permission.ALLOW),
                AclBinding(ResourceType.TRANSACTIONAL_ID, "tx", PatternType.LITERAL, "User:bob", "10.0.0.1",
                           Operation.ALL, Permission.DENY)]
    data = encode_acls(bindings)
    assert json.loads(data) == {"version": 1, "acls": [
        {"principal": "User:alice", "permissionType": "Allow", "operation": "Write", "host": "*"},
        {"principal": "User:bob", "permissionType": "Deny", "operation": "All", "host": "10.0.0.1"}]}
    assert sorted(decode_acls(ResourceType.TRANSACTIONAL_ID, PatternType.LITERAL, "tx", data)) == sorted(bindings)
    assert kafka_name(Operation.CLUSTER_ACTION) == "ClusterAction"
    assert kafka_name(Operation.IDEMPOTENT_WRITE) == "IdempotentWrite"
    assert resource_path(ResourceType.TRANSACTIONAL_ID, PatternType.LITERAL, "tx") == "/kafka-acl/TransactionalId/tx"
    assert resource_path(ResourceType.TOPIC, PatternType.PREFIXED, "or") == "/kafka-acl-extended/prefixed/Topic/or"
    assert change_notification(ResourceType.TOPIC, PatternType.LITERAL, "orders") == (
        "/kafka-acl-changes", b"Topic:LITERAL:orders")
    path, data = change_notification(ResourceType.GROUP, PatternType.PREFIXED, "g")
    assert path == "/kafka-acl-extended-changes" and json.loads(data)["patternType"] == "PREFIXED"


@pytest.mark.parametrize("name", ["a/b", "", ".", ".."])
def test_a_name_that_cannot_be_a_znode_is_refused(name):
    with pytest.raises(InvalidAclError, match="ZooKeeper node name"):
        resource_path(ResourceType.GROUP, PatternType.LITERAL, name)


def test_an_unknown_operation_in_zookeeper_is_an_error_not_a_guess():
    data = json.dumps({"version": 1, "acls": [{"principal": "User:a", "permissionType": "Allow",
                                               "operation": "Teleport", "host": "*"}]}).encode()
    with pytest.raises(InvalidAclError, match="Teleport"):
        decode_acls(ResourceType.TOPIC, PatternType.LITERAL, "t", data)


def test_inter_broker_tls_needs_a_certificate_good_for_client_authentication(tmp_path):
    ca = CertificateAuthority()
    ca_path = ca.write_ca(tmp_path / "ca.pem")
    listener = Listener("SSL", "SSL", "127.0.0.1", 0)
    server_only = ca.issue_server(tmp_path, "server-only")
    with pytest.raises(InvalidConfigError, match="clientAuth"):
        inter_broker_security(listener, certificate_location=str(server_only.certificate_path),
                              key_location=str(server_only.key_path), ca_location=str(ca_path))
    both = ca.issue_server(tmp_path, "broker", client_auth=True)
    security = inter_broker_security(listener, certificate_location=str(both.certificate_path),
                                     key_location=str(both.key_path), ca_location=str(ca_path))
    assert security.is_tls and security.certificate_pem == both.certificate_path.read_bytes()
    assert inter_broker_security(Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0), certificate_location="",
                                 key_location="", ca_location="").protocol == "PLAINTEXT"


@pytest.mark.parametrize("user, client_id, path", [
    ("alice", None, "users/alice"),
    (None, "c1", "clients/c1"),
    ("alice", "c1", "users/alice/clients/c1"),
    ("<default>", None, "users/<default>"),
    ("CN=alice,O=Acme", None, "users/CN%3Dalice%2CO%3DAcme"),     # one znode, as Kafka's Sanitizer makes it
    ("a/b", "x y", "users/a%2Fb/clients/x%20y"),
])
def test_entity_paths_are_kafkas_and_read_back(user, client_id, path):
    assert entity_path(user, client_id) == path
    assert entity_of(path) == (user, client_id)


def test_entity_configs_are_kafkas_json():
    data = encode_config({"producer_byte_rate": "1024", "SCRAM-SHA-256": "salt=AA==,stored_key=AA==,"
                                                                        "server_key=AA==,iterations=4096"})
    assert json.loads(data)["version"] == 1
    assert decode_config(data)["producer_byte_rate"] == "1024"
    assert decode_config(b"") == {}
    with pytest.raises(ValueError):
        entity_path(None, None)
