"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), as Kafka uses them. Pure.

Theory of operation
-------------------
A password never crosses the wire, and the broker never stores it. What the broker keeps per
user and mechanism is Kafka's `ScramCredential`: a salt, an iteration count, StoredKey =
H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword, "Server Key"),
where SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations). Kafka writes it as
`salt=<base64>,stored_key=<base64>,server_key=<base64>,iterations=<n>`; so does eos.

The exchange is three messages after the client picks a mechanism:

    client-first  n,,n=<user>,r=<client nonce>
    server-first  r=<client nonce + server nonce>,s=<salt>,i=<iterations>
    client-final  c=biws,r=<nonce>,p=<ClientKey XOR HMAC(StoredKey, AuthMessage)>
    server-final  v=<HMAC(ServerKey, AuthMessage)>        (or e=<error>)

The server checks the proof by recovering ClientKey and hashing it to StoredKey; the client
checks the server's signature, so each side proves it knows the credential. `ScramServer`
and `ScramClient` are the two state machines, one message in, one out, no I/O; a wrong step
raises `ScramError`. An unknown user is answered with a salt derived from the user name and
a per-process secret and fails at the proof like a wrong password, so the first message does
not tell whether a user exists.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from typing import NamedTuple

MECHANISMS = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096          # Kafka's minimum for both mechanisms
MAX_ITERATIONS = 16384         # and its maximum (also what a client computes at most for a
DEFAULT_ITERATIONS = 4096      # server's asking: a hostile server could ask millions)
_GS2_HEADER = "n,,"            # no channel binding, no authorization identity
_CHANNEL_BINDING = base64.b64encode(_GS2_HEADER.encode()).decode()   # "biws"
_UNKNOWN_USER_SECRET = secrets.token_bytes(32)


class ScramError(Exception):
    """The exchange failed: a malformed message, a wrong proof, an unknown mechanism."""


class ScramCredential(NamedTuple):
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_text(self) -> str:
        """Kafka's form (what kafka-configs and ZooKeeper's /config/users hold)."""
        b64 = lambda value: base64.b64encode(value).decode("ascii")
        return (f"salt={b64(self.salt)},stored_key={b64(self.stored_key)},"
                f"server_key={b64(self.server_key)},iterations={self.iterations}")

    @classmethod
    def from_text(cls, text: str) -> "ScramCredential":
        fields = _attributes(text)
        try:
            return cls(base64.b64decode(fields["salt"], validate=True),
                       base64.b64decode(fields["stored_key"], validate=True),
                       base64.b64decode(fields["server_key"], validate=True), int(fields["iterations"]))
        except (KeyError, ValueError) as exc:
            raise ScramError(f"not a SCRAM credential: {exc}") from None


def hash_name(mechanism: str) -> str:
    try:
        return MECHANISMS[mechanism]
    except KeyError:
        raise ScramError(f"unsupported SASL mechanism {mechanism!r}; eos supports "
                         f"{', '.join(sorted(MECHANISMS))}") from None


def check_iterations(iterations: int) -> int:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ScramError(f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, got {iterations}")
    return iterations


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(hash_name(mechanism), password.encode("utf-8"), salt, iterations)


def credential_from_salted(mechanism: str, salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """What the broker stores, from the salted password a client computed (Kafka's
    AlterUserScramCredentials sends the salt and the salted password, never the password)."""
    name = hash_name(mechanism)
    client_key = hmac.digest(salted, b"Client Key", name)
    return ScramCredential(salt, hashlib.new(name, client_key).digest(), hmac.digest(salted, b"Server Key", name),
                           check_iterations(iterations))


def make_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                    salt: bytes | None = None) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(32)
    return credential_from_salted(mechanism, salted_password(mechanism, password, salt, check_iterations(iterations)),
                                  salt, iterations)


# ---- messages --------------------------------------------------------------------------------

def _attributes(text: str) -> dict[str, str]:
    found = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key:
            raise ScramError(f"malformed SCRAM attribute {part!r}")
        found.setdefault(key, value)
    return found


def escape_username(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


_ESCAPED_NAME = re.compile(r"(?:[^=,]|=3D|=2C)*")


def unescape_username(text: str) -> str:
    if not _ESCAPED_NAME.fullmatch(text):
        raise ScramError("malformed user name in the SCRAM message")
    return text.replace("=2C", ",").replace("=3D", "=")


def _xor(left: bytes, right: bytes) -> bytes:
    return bytes(a ^ b for a, b in zip(left, right))


class ScramServer:
    """The broker's side of one exchange. `lookup(username)` gives the user's credential
    for this mechanism, or None."""

    def __init__(self, mechanism: str, lookup):
        self.mechanism = mechanism
        self._hash = hash_name(mechanism)
        self._lookup = lookup
        self._credential: ScramCredential | None = None
        self._client_first_bare = self._server_first = self._nonce = ""
        self.username: str | None = None
        self.authenticated = False

    def first(self, client_first: str) -> str:
        if self._server_first:
            raise ScramError("the client-first message came twice")
        if not client_first.startswith(_GS2_HEADER):
            raise ScramError("only the gs2 header 'n,,' is supported (no channel binding, no authzid)")
        self._client_first_bare = client_first[len(_GS2_HEADER):]
        fields = _attributes(self._client_first_bare)
        if "m" in fields or "n" not in fields or not fields.get("r"):
            raise ScramError("the client-first message needs n= and r= and no extensions")
        self.username = unescape_username(fields["n"])
        self._credential = self._lookup(self.username)
        salt, iterations = ((self._credential.salt, self._credential.iterations) if self._credential is not None
                            else (hmac.digest(_UNKNOWN_USER_SECRET, self.username.encode(), "sha256"),
                                  DEFAULT_ITERATIONS))
        self._nonce = fields["r"] + secrets.token_urlsafe(24)
        self._server_first = f"r={self._nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        return self._server_first

    def final(self, client_final: str) -> str:
        if not self._server_first or self.authenticated:
            raise ScramError("the client-final message came out of order")
        fields = _attributes(client_final)
        if fields.get("c") != _CHANNEL_BINDING or fields.get("r") != self._nonce or "p" not in fields:
            raise ScramError("the client-final message does not continue this exchange")
        without_proof = client_final[:client_final.rindex(",p=")]
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        try:
            proof = base64.b64decode(fields["p"], validate=True)
        except ValueError:
            raise ScramError("the client proof is not base64") from None
        credential = self._credential
        if credential is None:
            raise ScramError(f"authentication failed for user {self.username!r}")
        client_key = _xor(proof, hmac.digest(credential.stored_key, auth_message, self._hash))
        if len(proof) != len(credential.stored_key) or not hmac.compare_digest(
                hashlib.new(self._hash, client_key).digest(), credential.stored_key):
            raise ScramError(f"authentication failed for user {self.username!r}")
        self.authenticated = True
        return "v=" + base64.b64encode(hmac.digest(credential.server_key, auth_message, self._hash)).decode()


class ScramClient:
    """The client's side of one exchange."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None):
        self._mechanism = mechanism
        self._hash = hash_name(mechanism)
        self._password = password
        self._client_first_bare = f"n={escape_username(username)},r={nonce or secrets.token_urlsafe(24)}"
        self._server_signature: bytes | None = None

    def first(self) -> str:
        return _GS2_HEADER + self._client_first_bare

    def final(self, server_first: str) -> str:
        fields = _attributes(server_first)
        client_nonce = _attributes(self._client_first_bare)["r"]
        nonce = fields.get("r", "")
        # the server's nonce extends ours with its own part (RFC 5802 5.1)
        if not nonce.startswith(client_nonce) or len(nonce) <= len(client_nonce) or "s" not in fields \
                or "i" not in fields:
            raise ScramError("the server-first message does not continue this exchange")
        try:
            salt, iterations = base64.b64decode(fields["s"], validate=True), int(fields["i"])
        except ValueError:
            raise ScramError("malformed salt or iteration count in the server-first message") from None
        if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
            raise ScramError(f"the server asks for {iterations} iterations, outside "
                             f"{MIN_ITERATIONS}..{MAX_ITERATIONS}")
        salted = salted_password(self._mechanism, self._password, salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", self._hash)
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c={_CHANNEL_BINDING},r={fields['r']}"
        auth_message = f"{self._client_first_bare},{server_first},{without_proof}".encode()
        proof = _xor(client_key, hmac.digest(stored_key, auth_message, self._hash))
        self._server_signature = hmac.digest(hmac.digest(salted, b"Server Key", self._hash), auth_message, self._hash)
        return f"{without_proof},p={base64.b64encode(proof).decode()}"

    def check_server_final(self, server_final: str) -> None:
        fields = _attributes(server_final)
        if "e" in fields:
            raise ScramError(f"the broker refused the authentication: {fields['e']}")
        try:
            signature = base64.b64decode(fields.get("v", ""), validate=True)
        except ValueError:
            raise ScramError("the broker's signature is not base64") from None
        if self._server_signature is None or not hmac.compare_digest(signature, self._server_signature):
            raise ScramError("the broker's signature does not match: it does not hold this user's credential")
