"""eos/tls_certs.py: the throwaway CA and `make_local_tls`, checked with real TLS handshakes
(Python's ssl module over a socket pair: OpenSSL verifies the chain, the names and the
extended key usages the way the broker's and clients' TLS stacks do)."""
from __future__ import annotations

import os
import socket
import ssl
import stat
import threading

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker.config import BrokerConfig
from eos.client_config import security_of
from eos.tls_certs import CertificateAuthority, Issued, make_local_tls

HANDSHAKE_TIMEOUT_S = 5.0
SERVER_AUTH, CLIENT_AUTH = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH


def _server_context(ca_path, served: Issued) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(served.certificate_path, served.key_path)
    context.load_verify_locations(ca_path)
    context.verify_mode = ssl.CERT_REQUIRED          # as the broker's ssl.client.auth=required
    return context


def _client_context(ca_path, presented: Issued) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)   # verifies the chain and the host name
    context.load_verify_locations(ca_path)
    context.load_cert_chain(presented.certificate_path, presented.key_path)
    return context


def _handshake(server_context, client_context, server_hostname="localhost"):
    """One mutual-TLS handshake over a socket pair; (the client's subject as the server saw it,
    the server's subject as the client saw it). Raises the client side's ssl error on failure."""
    server_socket, client_socket = socket.socketpair()
    server_socket.settimeout(HANDSHAKE_TIMEOUT_S)
    client_socket.settimeout(HANDSHAKE_TIMEOUT_S)
    server_result: dict = {}

    def serve():
        try:
            with server_context.wrap_socket(server_socket, server_side=True) as tls:
                server_result["peer"] = tls.getpeercert()
                tls.sendall(b"x")                     # TLS 1.3: the client learns of a refusal on read
        except (ssl.SSLError, OSError) as error:
            server_result["error"] = error
            server_socket.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client_context.wrap_socket(client_socket, server_hostname=server_hostname) as tls:
            server_seen = tls.getpeercert()
            tls.recv(1)
    finally:
        thread.join(HANDSHAKE_TIMEOUT_S)
    assert not thread.is_alive()
    if "error" in server_result:
        raise server_result["error"]
    return _common_name(server_result["peer"]), _common_name(server_seen)


def _common_name(peer_certificate: dict) -> str:
    return dict(attribute for rdn in peer_certificate["subject"] for attribute in rdn)["commonName"]


def _certificate(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _usages(certificate: x509.Certificate) -> set:
    return set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _all_bytes(tls) -> dict:
    paths = [tls.ca_path, *tls.broker, *(path for issued in tls.clients.values() for path in issued)]
    return {path.name: path.read_bytes() for path in paths}


def test_a_client_and_the_broker_authenticate_each_other(tmp_path):
    tls = make_local_tls(tmp_path / "tls")
    client_seen, broker_seen = _handshake(_server_context(tls.ca_path, tls.broker),
                                          _client_context(tls.ca_path, tls.clients["admin"]))
    assert (client_seen, broker_seen) == ("admin", "broker")
    # the broker certificate names 127.0.0.1 as well (an IP SAN, checked by OpenSSL)
    _handshake(_server_context(tls.ca_path, tls.broker), _client_context(tls.ca_path, tls.clients["admin"]),
               server_hostname="127.0.0.1")


def test_the_broker_certificate_is_also_a_client_certificate_for_its_peers(tmp_path):
    """Inter-broker mTLS: a broker dials another presenting the same broker certificate."""
    tls = make_local_tls(tmp_path / "tls")
    assert _handshake(_server_context(tls.ca_path, tls.broker),
                      _client_context(tls.ca_path, tls.broker)) == ("broker", "broker")


def test_a_server_only_certificate_is_refused_as_a_client_certificate(tmp_path):
    """The control for the test above: OpenSSL does check the clientAuth usage, and
    issue_server keeps giving serverAuth only unless asked."""
    ca = CertificateAuthority()
    ca_path = ca.write_ca(tmp_path / "ca.pem")
    server = ca.issue_server(tmp_path, "server")
    with pytest.raises((ssl.SSLError, OSError)):
        _handshake(_server_context(ca_path, server), _client_context(ca_path, server))
    both = ca.issue_server(tmp_path, "both", client_auth=True)
    assert _handshake(_server_context(ca_path, server), _client_context(ca_path, both)) == ("localhost", "localhost")


def test_a_client_certificate_of_another_ca_is_refused(tmp_path):
    tls = make_local_tls(tmp_path / "tls")
    other = make_local_tls(tmp_path / "other")
    with pytest.raises((ssl.SSLError, OSError)):
        _handshake(_server_context(tls.ca_path, tls.broker), _client_context(tls.ca_path, other.clients["admin"]))


def test_extended_key_usages_and_names(tmp_path):
    ca = CertificateAuthority()
    assert _usages(_certificate(ca.issue_server(tmp_path, "server").certificate_path)) == {SERVER_AUTH}
    assert _usages(_certificate(ca.issue_client(tmp_path, "alice", "alice").certificate_path)) == {CLIENT_AUTH}

    tls = make_local_tls(tmp_path / "tls", broker_names=("localhost", "127.0.0.1", "eos.test"))
    broker = _certificate(tls.broker.certificate_path)
    broker.verify_directly_issued_by(_certificate(tls.ca_path))
    assert _usages(broker) == {SERVER_AUTH, CLIENT_AUTH}
    assert broker.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "broker"
    sans = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["localhost", "eos.test"]
    assert [str(address) for address in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    admin = _certificate(tls.clients["admin"].certificate_path)
    assert _usages(admin) == {CLIENT_AUTH}
    assert admin.subject.rfc4514_string() == "CN=admin"


def test_keys_are_0600_and_the_directory_0700_whatever_the_umask(tmp_path):
    (tmp_path / "old").mkdir()
    stale_key = tmp_path / "old" / "server.key"
    stale_key.write_bytes(b"stale")
    os.chmod(stale_key, 0o666)                        # a world-readable file in the key's place
    previous_umask = os.umask(0)                      # the mode must not come from the umask
    try:
        tls = make_local_tls(tmp_path / "tls", clients={"admin": "admin", "alice": "alice"})
        server = CertificateAuthority().issue_server(tmp_path / "old", "server")
    finally:
        os.umask(previous_umask)
    for key_path in [tls.broker.key_path, *(issued.key_path for issued in tls.clients.values()), server.key_path]:
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600, key_path
    assert server.key_path.read_bytes() != b"stale"
    assert stat.S_IMODE((tmp_path / "tls").stat().st_mode) == 0o700
    assert stat.S_IMODE(tls.ca_path.stat().st_mode) == 0o644


def test_a_complete_set_is_reused_as_it_is(tmp_path):
    first = make_local_tls(tmp_path / "tls", clients={"admin": "admin", "alice": "alice"})
    before = _all_bytes(first)
    second = make_local_tls(tmp_path / "tls", clients={"admin": "admin", "alice": "alice"})
    assert second == first
    assert _all_bytes(second) == before


@pytest.mark.parametrize("change", ["missing key", "other CA's certificate", "new client", "client renamed",
                                    "other broker names"])
def test_an_incomplete_or_different_set_is_made_anew(tmp_path, change):
    directory = tmp_path / "tls"
    first = make_local_tls(directory)
    first_ca = first.ca_path.read_bytes()
    kwargs = {}
    if change == "missing key":
        first.clients["admin"].key_path.unlink()
    elif change == "other CA's certificate":
        make_local_tls(tmp_path / "other").clients["admin"].certificate_path.replace(
            first.clients["admin"].certificate_path)
    elif change == "new client":
        kwargs = {"clients": {"admin": "admin", "bob": "bob"}}
    elif change == "client renamed":
        kwargs = {"clients": {"admin": "root"}}
    else:
        kwargs = {"broker_names": ("localhost", "127.0.0.1", "eos.test")}
    second = make_local_tls(directory, **kwargs)
    assert second.ca_path.read_bytes() != first_ca
    ca = _certificate(second.ca_path)
    for issued in [second.broker, *second.clients.values()]:
        _certificate(issued.certificate_path).verify_directly_issued_by(ca)    # one consistent set
    _handshake(_server_context(second.ca_path, second.broker), _client_context(second.ca_path, second.clients["admin"]))
    made = _all_bytes(second)
    assert _all_bytes(make_local_tls(directory, **kwargs)) == made      # and the new set is kept in turn


def test_client_and_broker_settings(tmp_path):
    tls = make_local_tls(tmp_path / "tls", clients={"admin": "admin", "alice": "Alice Example"})
    config = tls.client_config("alice")
    assert config == {"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "tls" / "ca.pem"),
                      "ssl.certificate.location": str(tmp_path / "tls" / "alice.crt"),
                      "ssl.key.location": str(tmp_path / "tls" / "alice.key")}
    security = security_of(config)                    # eos's own client reads them as meant
    assert security.ca_pem == tls.ca_path.read_bytes()
    assert security.certificate_pem == tls.clients["alice"].certificate_path.read_bytes()
    assert _certificate(tls.clients["alice"].certificate_path).subject.rfc4514_string() == "CN=Alice Example"
    with pytest.raises(KeyError):
        tls.client_config("mallory")

    assert tls.broker_config() == {"ssl.certificate.location": str(tls.broker.certificate_path),
                                   "ssl.key.location": str(tls.broker.key_path),
                                   "ssl.ca.location": str(tls.ca_path), "ssl.client.auth": "required"}
    broker = BrokerConfig.from_dict({"listeners": "SSL://127.0.0.1:9093", **tls.broker_config()})
    assert broker.ssl_client_auth == "required"


@pytest.mark.parametrize("stem", ["broker", "../escape", "", "a/b"])
def test_client_names_that_are_not_plain_file_stems_are_refused(tmp_path, stem):
    with pytest.raises(ValueError):
        make_local_tls(tmp_path / "tls", clients={stem: "x"})
    assert not (tmp_path / "tls").exists()
