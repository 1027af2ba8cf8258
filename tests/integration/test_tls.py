"""TLS and mutual TLS listeners on an in-process broker (127.0.0.1), with certificates made
at run time (tests/certs.py): produce, consume and admin over SSL; refused clients append
nothing; the principal the broker sees; certificates reloaded without a restart."""
from __future__ import annotations

import os

import pytest

import eos
from broker.server import BrokerServer
from eos.errors import EosError, InvalidConfigError
from tests.certs import CertificateAuthority
from tests.waits import wait_for

# Refused clients give up quickly: their failure is what the test checks.
FAIL_FAST = {"request.timeout.ms": 2000, "default.api.timeout.ms": 3000, "retry.backoff.ms": 50}


@pytest.fixture
def pki(tmp_path):
    """A CA, a server certificate for 127.0.0.1, client certificates, and strangers."""
    ca = CertificateAuthority("eos test CA")
    other_ca = CertificateAuthority("some other CA")
    directory = tmp_path / "pki"
    directory.mkdir()
    return {
        "ca": ca, "dir": directory,
        "ca_path": ca.write_ca(directory / "ca.pem"),
        "other_ca_path": other_ca.write_ca(directory / "other-ca.pem"),
        "server": ca.issue_server(directory, "server"),
        "alice": ca.issue_client(directory, "alice", {"CN": "alice", "OU": "eng", "O": "Acme"}),
        "stranger": other_ca.issue_client(directory, "stranger", {"CN": "mallory"}),
        "expired": ca.issue_client(directory, "expired", {"CN": "old"}, expired=True),
    }


def _start(tmp_path, pki, *, client_auth: str = "required", rules: str | None = None) -> BrokerServer:
    config = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "ssl.certificate.location": str(pki["server"].certificate_path),
        "ssl.key.location": str(pki["server"].key_path),
        "ssl.ca.location": str(pki["ca_path"]),
        "ssl.client.auth": client_auth,
    }
    if rules is not None:
        config["ssl.principal.mapping.rules"] = rules
    return BrokerServer(tmp_path / "data", port=0, config=config).start()


def _ssl(pki, client: str | None = None, ca: str = "ca_path", **extra) -> dict:
    config = {"security.protocol": "SSL", "ssl.ca.location": str(pki[ca]), **extra}
    if client is not None:
        config["ssl.certificate.location"] = str(pki[client].certificate_path)
        config["ssl.key.location"] = str(pki[client].key_path)
    return config


def _end_offset(broker: BrokerServer, topic: str) -> int:
    with eos.Admin(broker.address_of("PLAINTEXT")) as admin:
        return admin.list_offsets({(topic, 0): "latest"})[(topic, 0)]


@pytest.fixture
def mtls_broker(tmp_path, pki):
    broker = _start(tmp_path, pki)
    yield broker
    broker.stop()


def test_produce_consume_admin_over_mutual_tls(mtls_broker, pki):
    address = mtls_broker.address_of("SSL")
    alice = _ssl(pki, "alice")
    with eos.Admin(address, config=alice) as admin:
        admin.create_topic("secure", partitions=1)
        brokers = admin.describe_cluster()["brokers"]
    # Metadata answers with the listener the request came in on (Kafka's rule).
    assert list(brokers.values()) == [address]
    with eos.Producer(address, config=alice) as producer:
        for i in range(10):
            producer.send("secure", value=f"v{i}".encode())
        producer.flush()
    with eos.Consumer(address, config={**alice, "auto.offset.reset": "earliest"}) as consumer:
        consumer.assign([("secure", 0)])
        values = []
        wait_for(lambda: values.extend(r.value for r in consumer.poll(0.2)) or len(values) >= 10,
                 "the records over mutual TLS")
    assert values == [f"v{i}".encode() for i in range(10)]
    assert _end_offset(mtls_broker, "secure") == 10


def test_metadata_names_the_listener_the_request_came_in_on(mtls_broker, pki):
    from eos import client_config, net
    for listener, security in (("PLAINTEXT", client_config.PLAINTEXT_SECURITY),
                               ("SSL", client_config.channel_security({**client_config.resolve_config(
                                   "test", client_config.CLIENT_SECURITY_CONFIG, _ssl(pki, "alice"), {})[0]}))):
        metadata = net.ClusterMetadata(mtls_broker.address_of(listener), security=security)
        try:
            response = metadata.fetch([])
        finally:
            metadata.close()
        assert [(b.host, b.port) for b in response.brokers] == [("127.0.0.1", mtls_broker.bound_ports[listener])]


@pytest.mark.parametrize("client, ca, why", [
    (None, "ca_path", "no client certificate"),
    ("stranger", "ca_path", "a client certificate from another CA"),
    ("expired", "ca_path", "an expired client certificate"),
    ("alice", "other_ca_path", "a client that does not trust the broker's CA"),
])
def test_refused_clients_append_nothing(mtls_broker, pki, client, ca, why):
    with eos.Admin(mtls_broker.address_of("PLAINTEXT")) as admin:
        admin.create_topic("guarded")
    address = mtls_broker.address_of("SSL")
    with pytest.raises(EosError, match="over SSL this is also how a failed TLS handshake looks"):
        with eos.Admin(address, config=_ssl(pki, client, ca, **FAIL_FAST)) as admin:
            admin.list_topics()
    with pytest.raises(EosError):
        with eos.Producer(address, config=_ssl(pki, client, ca, **{"max.block.ms": 2000, "delivery.timeout.ms": 3000,
                                                                   "request.timeout.ms": 1000, "linger.ms": 0})) as producer:
            producer.send("guarded", value=b"must not land").result(timeout=10)
    assert _end_offset(mtls_broker, "guarded") == 0, why


def test_the_broker_sees_the_principal_of_a_call(tmp_path, pki):
    broker = _start(tmp_path, pki, rules="RULE:^CN=([^,]*),OU=eng,.*$/$1@eng/U,DEFAULT")
    seen = []
    broker.call_identity_observer = lambda method, identity: seen.append((method, identity))
    try:
        with eos.Admin(broker.address_of("SSL"), config=_ssl(pki, "alice")) as admin:
            admin.list_topics()
        with eos.Admin(broker.address_of("PLAINTEXT")) as admin:
            admin.list_topics()
    finally:
        broker.stop()
    by_listener = {identity.listener.name: identity.principal for method, identity in seen
                   if method.endswith("/Metadata")}
    # The DN in RFC 2253 form is "O=Acme,OU=eng,CN=alice" (RDNs in reverse of how the
    # certificate lists them); the rule maps it only when CN comes first, so DEFAULT decides.
    assert by_listener == {"SSL": "User:O=Acme,OU=eng,CN=alice", "PLAINTEXT": "User:ANONYMOUS"}


def test_a_principal_mapping_rule_maps_the_dn(tmp_path, pki):
    broker = _start(tmp_path, pki, rules="RULE:^O=([^,]*),OU=([^,]*),CN=(.*)$/$3@$2/U")
    seen = []
    broker.call_identity_observer = lambda method, identity: seen.append(identity.principal)
    try:
        with eos.Admin(broker.address_of("SSL"), config=_ssl(pki, "alice")) as admin:
            admin.list_topics()
    finally:
        broker.stop()
    assert set(seen) == {"User:ALICE@ENG"}


def test_a_dn_no_rule_maps_is_refused(tmp_path, pki):
    broker = _start(tmp_path, pki, rules="RULE:^CN=nobody$/nobody/")
    try:
        with pytest.raises(EosError, match="UNAUTHENTICATED"):
            with eos.Admin(broker.address_of("SSL"), config=_ssl(pki, "alice", **FAIL_FAST)) as admin:
                admin.list_topics()
    finally:
        broker.stop()


def test_tls_without_client_certificates(tmp_path, pki):
    broker = _start(tmp_path, pki, client_auth="none")
    seen = []
    broker.call_identity_observer = lambda method, identity: seen.append(identity.principal)
    try:
        with eos.Admin(broker.address_of("SSL"), config=_ssl(pki)) as admin:
            admin.create_topic("open")
            assert admin.list_topics() == ["open"]
    finally:
        broker.stop()
    assert set(seen) == {"User:ANONYMOUS"}


def test_a_certificate_replaced_on_disk_serves_new_connections(mtls_broker, pki, tmp_path):
    """New CA, new server pair written over the old files, no restart: a client trusting
    only the new CA connects (the client's certificate from the old CA is still trusted
    because ssl.ca.location is not replaced)."""
    new_ca = CertificateAuthority("renewed CA")
    renewed = new_ca.issue_server(tmp_path / "renewed", "server")
    new_ca_path = new_ca.write_ca(tmp_path / "renewed" / "ca.pem")
    address = mtls_broker.address_of("SSL")
    before = mtls_broker.certificates.loaded_count
    with pytest.raises(EosError):
        with eos.Admin(address, config={**_ssl(pki, "alice", **FAIL_FAST), "ssl.ca.location": str(new_ca_path)}) as admin:
            admin.list_topics()
    # Written as a renewal tool would: each file replaced whole (a rename), key first.
    for source, target in ((renewed.key_path, pki["server"].key_path),
                           (renewed.certificate_path, pki["server"].certificate_path)):
        staged = target.with_suffix(".new")
        staged.write_bytes(source.read_bytes())
        os.replace(staged, target)
    with eos.Admin(address, config={**_ssl(pki, "alice"), "ssl.ca.location": str(new_ca_path)}) as admin:
        assert admin.list_topics() == []
    assert mtls_broker.certificates.loaded_count == before + 1
    # the old CA's clients are refused now: the broker no longer shows the old certificate
    with pytest.raises(EosError):
        with eos.Admin(address, config=_ssl(pki, "alice", **FAIL_FAST)) as admin:
            admin.list_topics()


def test_hostname_verification(tmp_path, pki):
    """A server certificate for another name: https (the default) refuses it, none accepts
    it as long as the CA is trusted."""
    elsewhere = pki["ca"].issue_server(tmp_path / "elsewhere", common_name="db.example", names=("db.example",))
    config = {
        "listeners": "SSL://127.0.0.1:0",
        "ssl.certificate.location": str(elsewhere.certificate_path), "ssl.key.location": str(elsewhere.key_path),
    }
    broker = BrokerServer(tmp_path / "data", port=0, config=config).start()
    try:
        with pytest.raises(EosError):
            with eos.Admin(broker.address, config=_ssl(pki, **FAIL_FAST)) as admin:
                admin.list_topics()
        with eos.Admin(broker.address, config=_ssl(pki, **{"ssl.endpoint.identification.algorithm": "none"})) as admin:
            assert admin.list_topics() == []
    finally:
        broker.stop()


def test_plaintext_on_a_remote_address_is_refused_before_binding(tmp_path):
    with pytest.raises(InvalidConfigError, match="allow.plaintext.remote"):
        BrokerServer(tmp_path / "data", host="0.0.0.0", port=0)
    with pytest.raises(InvalidConfigError, match="allow.plaintext.remote"):
        BrokerServer(tmp_path / "data", port=0, config={"listeners": "PLAINTEXT://10.1.2.3:9092"})
    with pytest.raises(InvalidConfigError, match="allow.plaintext.remote"):
        BrokerServer(tmp_path / "data", port=0, config={"listeners": "PLAINTEXT://:9092"})
    # allowed explicitly: the check passes (the broker is not started, nothing binds)
    BrokerServer(tmp_path / "data", port=0, config={"listeners": "PLAINTEXT://10.1.2.3:9092",
                                                    "allow.plaintext.remote": "true"})
    # the safe default never binds: the data dir was not even created
    assert not (tmp_path / "data").exists()


def test_client_security_settings_are_checked(pki):
    with pytest.raises(ValueError, match="needs sasl.username and sasl.password"):
        eos.Admin("127.0.0.1:9", config={"security.protocol": "SASL_SSL"})
    with pytest.raises(ValueError, match="SASL_PLAINTEXT is not offered"):
        eos.Admin("127.0.0.1:9", config={"security.protocol": "SASL_PLAINTEXT"})
    with pytest.raises(ValueError, match="security.protocol=SSL"):
        eos.Admin("127.0.0.1:9", config={"ssl.ca.location": str(pki["ca_path"])})
    with pytest.raises(ValueError, match="go together"):
        eos.Producer("127.0.0.1:9", config={"security.protocol": "SSL",
                                            "ssl.certificate.location": str(pki["alice"].certificate_path)})
    with pytest.raises(ValueError, match="cannot read"):
        eos.Consumer("127.0.0.1:9", config={"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"})
    with pytest.raises(ValueError, match="https"):
        eos.Admin("127.0.0.1:9", config={"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "x"})


def test_without_hostname_checks_an_unreachable_broker_is_retried_not_cached(pki):
    # ssl.endpoint.identification.algorithm=none learns the name from the broker's
    # certificate; a broker that is down then must not leave a channel behind that checks
    # the address's host for good (every later handshake would fail).
    from bench.kafka import free_port
    from eos import client_config, net
    from eos.errors import NetworkError

    security = client_config.ChannelSecurity(client_config.SSL, ca_pem=pki["ca"].pem, verify_hostname=False)
    metadata = net.ClusterMetadata(f"127.0.0.1:{free_port()}", security=security)
    address = metadata.bootstrap_addresses[0]
    with pytest.raises(NetworkError, match="will retry"):
        metadata.channel(address)
    assert address not in metadata._channels
    metadata.close()


def test_a_plaintext_client_at_an_ssl_listener_is_told_what_it_lacks(tmp_path, pki):
    broker = _start(tmp_path, pki, client_auth="none")
    try:
        with eos.Admin(broker.address_of("SSL"), config={"default.api.timeout.ms": 3000}) as admin:
            with pytest.raises(EosError, match="security.protocol=SSL and ssl.ca.location"):
                admin.list_topics()
        with eos.Admin(broker.address_of("SSL"), config=_ssl(pki)) as admin:
            admin.list_topics()       # the same address with the TLS settings
    finally:
        broker.stop()
