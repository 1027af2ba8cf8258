"""broker/security.py's pure parts: listeners, the PLAINTEXT-remote check, Kafka's
ssl.principal.mapping.rules and the principal of a call, by table."""
from __future__ import annotations

import pytest

from broker.security import (ANONYMOUS, Listener, NoMatchingRule, check_plaintext_binds, map_distinguished_name,
                             parse_advertised, parse_listeners, parse_principal_mapping_rules, parse_protocol_map,
                             principal_for)
from broker.config import BrokerConfig
from eos.errors import InvalidConfigError

DN = "CN=alice,OU=Eng,O=Acme\\, Inc,C=US"


@pytest.mark.parametrize("rules, expected", [
    ("DEFAULT", DN),
    (None, DN),                                                               # the default is DEFAULT
    ("RULE:^CN=(.*?),OU=(.*?),.*$/$1/", "alice"),
    ("RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/L", "alice@eng"),
    ("RULE:^CN=(.*?),OU=(.*?),.*$/$1@$2/U", "ALICE@ENG"),
    ("RULE:^CN=bob,.*$/bob/, RULE:^CN=(.*?),.*$/user-$1/", "user-alice"),    # the first that matches
    ("RULE:^CN=bob,.*$/bob/,DEFAULT", DN),                                   # DEFAULT as the fallback
    ("RULE:^CN=(.*?),OU=Eng,O=Acme.*,C=US$/$1 of acme/", "alice of acme"),  # commas in the pattern
    ("RULE:^CN=(.*?),.*$/a\\/$1/", "a/alice"),                               # an escaped slash
    ("RULE:.*O=Acme.*/acme-member/U", "ACME-MEMBER"),
])
def test_principal_mapping_rules(rules, expected):
    assert map_distinguished_name(DN, parse_principal_mapping_rules(rules)) == expected


def test_no_rule_matching_is_an_error_as_in_kafka():
    with pytest.raises(NoMatchingRule, match="no ssl.principal.mapping.rules rule applies"):
        map_distinguished_name(DN, parse_principal_mapping_rules("RULE:^CN=bob,.*$/bob/"))


@pytest.mark.parametrize("rules", ["RULE:^CN=(.*)$", "NOTARULE", "RULE:^CN=([$/x/"])
def test_bad_rules_are_refused(rules):
    with pytest.raises(InvalidConfigError, match="ssl.principal.mapping.rules"):
        parse_principal_mapping_rules(rules)


SSL_LISTENER = Listener("SSL", "SSL", "127.0.0.1", 9093)
PLAINTEXT_LISTENER = Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)
WITH_CERTIFICATE = {"transport_security_type": [b"ssl"], "x509_subject": [b"O=Acme,OU=eng,CN=alice"],
                    "x509_common_name": [b"alice"]}


@pytest.mark.parametrize("auth_context, listener, rules, expected", [
    ({"transport_security_type": [b"insecure"]}, PLAINTEXT_LISTENER, "DEFAULT", ANONYMOUS),
    ({"transport_security_type": [b"ssl"]}, SSL_LISTENER, "DEFAULT", ANONYMOUS),        # TLS, no client cert
    (WITH_CERTIFICATE, SSL_LISTENER, "DEFAULT", "User:O=Acme,OU=eng,CN=alice"),
    (WITH_CERTIFICATE, SSL_LISTENER, "RULE:^.*CN=(.*)$/$1/", "User:alice"),
    (WITH_CERTIFICATE, PLAINTEXT_LISTENER, "DEFAULT", ANONYMOUS),    # a certificate counts on SSL only
])
def test_principal_for(auth_context, listener, rules, expected):
    assert principal_for(auth_context, listener, parse_principal_mapping_rules(rules)) == expected


def test_listeners_parse_with_kafkas_names():
    assert parse_listeners("PLAINTEXT://127.0.0.1:9092, SSL://[::1]:9093", parse_protocol_map(None)) == (
        Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092), Listener("SSL", "SSL", "::1", 9093))
    mapped = parse_listeners("INTERNAL://127.0.0.1:9092,EXTERNAL://:9093",
                             parse_protocol_map("INTERNAL:PLAINTEXT,EXTERNAL:SSL"))
    assert [(l.name, l.security_protocol, l.host) for l in mapped] == [
        ("INTERNAL", "PLAINTEXT", "127.0.0.1"), ("EXTERNAL", "SSL", "")]
    assert parse_advertised("EXTERNAL://broker.example:19093", mapped) == {"EXTERNAL": ("broker.example", 19093)}


@pytest.mark.parametrize("text, protocol_map, message", [
    ("PLAINTEXT://127.0.0.1", None, "NAME://host:port"),
    ("FOO://127.0.0.1:1", None, "no security protocol"),
    ("SASL_PLAINTEXT://127.0.0.1:1", None, "does not offer SASL_PLAINTEXT"),
    ("PLAINTEXT://127.0.0.1:1,PLAINTEXT://127.0.0.1:2", None, "more than one listener with name"),
    ("PLAINTEXT://127.0.0.1:1,SSL://127.0.0.1:1", None, "two listeners on one port"),
    ("PLAINTEXT://127.0.0.1:70000", None, "outside"),
])
def test_bad_listeners_are_refused(text, protocol_map, message):
    with pytest.raises(InvalidConfigError, match=message):
        parse_listeners(text, parse_protocol_map(protocol_map))


@pytest.mark.parametrize("host, refused", [
    ("127.0.0.1", False), ("127.0.0.2", False), ("::1", False), ("localhost", False),
    ("", True), ("0.0.0.0", True), ("::", True), ("10.0.0.5", True), ("broker.example", True),
])
def test_plaintext_listener_on_a_remote_address_needs_consent(host, refused):
    listeners = (Listener("PLAINTEXT", "PLAINTEXT", host, 9092), SSL_LISTENER)
    if refused:
        with pytest.raises(InvalidConfigError, match="allow.plaintext.remote=true"):
            check_plaintext_binds(listeners, allow_plaintext_remote=False)
    else:
        check_plaintext_binds(listeners, allow_plaintext_remote=False)
    check_plaintext_binds(listeners, allow_plaintext_remote=True)
    # an SSL listener anywhere is fine
    check_plaintext_binds((Listener("SSL", "SSL", host, 9093),), allow_plaintext_remote=False)


@pytest.mark.parametrize("config, message", [
    ({"listeners": "SSL://127.0.0.1:9093"}, "needs ssl.certificate.location and ssl.key.location"),
    ({"listeners": "SSL://127.0.0.1:9093", "ssl.certificate.location": "c", "ssl.key.location": "k",
      "ssl.client.auth": "required"}, "needs ssl.ca.location"),
    ({"ssl.client.auth": "requested"}, "requested is not available"),
    ({"ssl.client.auth": "always"}, "must be one of"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092", "inter.broker.listener.name": "SSL"}, "not one of the listeners"),
    ({"listeners": "SSL://127.0.0.1:9093", "ssl.certificate.location": "c", "ssl.key.location": "k",
      "zookeeper.connect": "127.0.0.1:2181"}, "inter-broker listener needs ssl.ca.location"),
    ({"listeners": "PLAINTEXT://127.0.0.1:9092,SASL_SSL://127.0.0.1:9093", "ssl.certificate.location": "c",
      "ssl.key.location": "k", "inter.broker.listener.name": "SASL_SSL", "zookeeper.connect": "127.0.0.1:2181"},
     "PLAINTEXT or an SSL"),
    ({"allow.plaintext.remote": "yes"}, "true or false"),
])
def test_broker_security_config_is_checked(config, message):
    with pytest.raises(InvalidConfigError, match=message):
        BrokerConfig.from_dict(config)


def test_broker_security_config_defaults():
    config = BrokerConfig.from_dict({})
    assert config.listeners == () and config.ssl_client_auth == "none" and not config.allow_plaintext_remote
    config = BrokerConfig.from_dict({"listeners": "PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093",
                                     "ssl.certificate.location": "c", "ssl.key.location": "k",
                                     "inter.broker.listener.name": "plaintext"})
    assert [l.name for l in config.listeners] == ["PLAINTEXT", "SSL"]
    assert config.inter_broker_listener_name == "PLAINTEXT"


def test_listeners_of_one_transport_get_servers_of_their_own():
    from broker.listener_servers import group_listeners
    plain, ssl, sasl = (Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 1), Listener("SSL", "SSL", "127.0.0.1", 2),
                        Listener("SASL_SSL", "SASL_SSL", "127.0.0.1", 3))
    assert group_listeners([plain]) == [(plain,)]
    assert group_listeners([plain, ssl]) == [(plain, ssl)]              # one server, as before
    assert group_listeners([plain, ssl, sasl]) == [(plain, ssl), (sasl,)]
    internal, external = Listener("INTERNAL", "SSL", "", 4), Listener("EXTERNAL", "SSL", "", 5)
    assert group_listeners([internal, plain, external]) == [(internal, plain), (external,)]
    assert parse_listeners("A://127.0.0.1:1,B://127.0.0.1:2", {"A": "SSL", "B": "SSL"}) == (
        Listener("A", "SSL", "127.0.0.1", 1), Listener("B", "SSL", "127.0.0.1", 2))
