"""SCRAM's two state machines (eos/scram.py) against RFC 7677's test vector, each other, and
the ways an exchange goes wrong."""
from __future__ import annotations

import base64

import pytest

from eos.scram import (ScramClient, ScramCredential, ScramError, ScramServer, check_iterations, escape_username,
                       make_credential, unescape_username)

# RFC 7677 section 3: user "user", password "pencil", SCRAM-SHA-256.
RFC_NONCE = "rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_FIRST = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
RFC_SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_the_client_follows_rfc_7677():
    client = ScramClient("SCRAM-SHA-256", "user", "pencil", nonce=RFC_NONCE)
    assert client.first() == f"n,,n=user,r={RFC_NONCE}"
    assert client.final(RFC_SERVER_FIRST) == RFC_CLIENT_FINAL
    client.check_server_final(RFC_SERVER_FINAL)
    with pytest.raises(ScramError, match="signature does not match"):
        client.check_server_final("v=" + base64.b64encode(b"x" * 32).decode())


def test_the_server_follows_rfc_7677(monkeypatch):
    import eos.scram
    credential = make_credential("SCRAM-SHA-256", "pencil", 4096, salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = ScramServer("SCRAM-SHA-256", lambda user: credential if user == "user" else None)
    monkeypatch.setattr(eos.scram.secrets, "token_urlsafe", lambda _n: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")  # RFC's nonce
    assert server.first(f"n,,n=user,r={RFC_NONCE}") == RFC_SERVER_FIRST
    assert server.final(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert server.authenticated and server.username == "user"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_full_exchange_and_a_wrong_password(mechanism):
    credential = make_credential(mechanism, "secret ä,=", 4096)
    lookup = {"al,ice=": credential}.get
    for password, accepted in (("secret ä,=", True), ("wrong", False)):
        client = ScramClient(mechanism, "al,ice=", password)
        server = ScramServer(mechanism, lookup)
        client_final = client.final(server.first(client.first()))
        if accepted:
            client.check_server_final(server.final(client_final))
            assert server.authenticated and server.username == "al,ice="
        else:
            with pytest.raises(ScramError, match="authentication failed"):
                server.final(client_final)
            assert not server.authenticated


def test_an_unknown_user_looks_like_a_known_one_until_the_proof():
    server = ScramServer("SCRAM-SHA-512", lambda user: None)
    first = server.first("n,,n=nobody,r=abc")
    assert first.startswith("r=abc") and ",s=" in first and first.endswith(",i=4096")
    again = ScramServer("SCRAM-SHA-512", lambda user: None).first("n,,n=nobody,r=abc")
    assert again.split(",")[1] == first.split(",")[1]       # the same salt every time: nothing to compare
    client = ScramClient("SCRAM-SHA-512", "nobody", "x", nonce="abc")
    with pytest.raises(ScramError, match="authentication failed"):
        server.final(client.final(first))


@pytest.mark.parametrize("message, why", [
    ("y,,n=user,r=abc", "gs2 header"),
    ("n,a=admin,n=user,r=abc", "gs2 header"),
    ("n,,n=user", "needs n= and r="),
    ("n,,m=ext,n=user,r=abc", "needs n= and r="),
    ("n,,n=us=er,r=abc", "malformed user name"),
    ("n,,garbage", "malformed SCRAM attribute"),
])
def test_a_malformed_client_first_is_refused(message, why):
    with pytest.raises(ScramError, match=why):
        ScramServer("SCRAM-SHA-256", lambda user: None).first(message)


def test_a_client_final_out_of_order_or_for_another_exchange_is_refused():
    credential = make_credential("SCRAM-SHA-256", "pw")
    server = ScramServer("SCRAM-SHA-256", lambda user: credential)
    with pytest.raises(ScramError, match="out of order"):
        server.final("c=biws,r=x,p=AAAA")
    server.first("n,,n=u,r=abc")
    with pytest.raises(ScramError, match="does not continue"):
        server.final("c=biws,r=abcOTHER,p=AAAA")
    with pytest.raises(ScramError, match="came twice"):
        server.first("n,,n=u,r=abc")


def test_credentials_keep_kafkas_text_form_and_iteration_bounds():
    credential = make_credential("SCRAM-SHA-512", "pw", 8192)
    text = credential.to_text()
    assert text.startswith("salt=") and ",stored_key=" in text and ",server_key=" in text and text.endswith(",iterations=8192")
    assert ScramCredential.from_text(text) == credential
    with pytest.raises(ScramError, match="not a SCRAM credential"):
        ScramCredential.from_text("salt=AAAA,iterations=4096")
    with pytest.raises(ScramError, match="between 4096 and 16384"):
        check_iterations(1000)
    with pytest.raises(ScramError, match="unsupported SASL mechanism"):
        make_credential("PLAIN", "pw")
    assert unescape_username(escape_username("a=b,c")) == "a=b,c"


@pytest.mark.parametrize("server_first, why", [
    ("r=abc,s=QUJD,i=4096", "does not continue"),               # no nonce part of the server's own
    ("r=abcdef,s=QUJD,i=100000000", "outside 4096..16384"),     # a hostile server's cost
    ("r=abcdef,s=not base64!,i=4096", "malformed salt"),
])
def test_the_client_refuses_a_server_first_it_should_not_trust(server_first, why):
    with pytest.raises(ScramError, match=why):
        ScramClient("SCRAM-SHA-256", "u", "pw", nonce="abc").final(server_first)


def test_a_server_final_that_is_not_base64_is_refused():
    client = ScramClient("SCRAM-SHA-256", "u", "pw", nonce="abc")
    client.final("r=abcdef,s=QUJD,i=4096")
    with pytest.raises(ScramError, match="not base64"):
        client.check_server_final("v=%%%")


def test_only_well_formed_escapes_are_taken_in_user_names():
    with pytest.raises(ScramError, match="malformed user name"):
        unescape_username("=2=3DC")
    with pytest.raises(ScramError, match="malformed user name"):
        unescape_username("a,b")
    assert unescape_username("=3D=2C") == "=,"
