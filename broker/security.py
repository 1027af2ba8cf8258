"""Listeners, TLS server credentials and the principal of a call.

Theory of operation
-------------------
A broker listens on one or more *listeners*, Kafka's `listeners=NAME://host:port,...`. Each
listener has a security protocol (`listener.security.protocol.map`, by default the name
itself: PLAINTEXT, SSL). All listeners are ports of one gRPC server: PLAINTEXT ports are
`add_insecure_port`, SSL ports `add_secure_port` with TLS credentials. `parse_listeners`,
`check_plaintext_binds` and `parse_principal_mapping_rules` are pure: they turn settings
into values or refuse them with an InvalidConfigError naming the setting, before anything
binds.

Which listener a call came in on: gRPC does not tell a handler which port took the call,
but it tells the transport security of the connection (`auth_context()["transport_security_type"]`,
"insecure" or "ssl"). So each gRPC server holds at most one listener per transport, and the
transport names the listener among that server's; listeners of one transport (SSL and
SASL_SSL, or Kafka's INTERNAL and EXTERNAL both SSL) are served by servers of their own
(broker/listener_servers.py), each with an interceptor that knows its own listeners.

The principal of a call (Kafka's `KafkaPrincipal`): on an SSL connection with a client
certificate, `User:<name>` where name is the certificate's subject DN in RFC 2253 form
(`CN=alice,OU=eng,O=Acme`, Java's X500Principal.getName()) mapped through
`ssl.principal.mapping.rules`; on PLAINTEXT, and on SSL without a client certificate,
`User:ANONYMOUS`. `principal_for(auth_context, listener, rules)` is the pure function that
decides it; `CallIdentityInterceptor` is the one place that computes it for a call: it
wraps every handler, puts the call's `CallIdentity` (listener and principal) in a context
variable the handler can read (`current_call()`; the ACL checks of a later part read it
there), and reports it to an optional observer (tests, audit logging). A DN no rule maps
fails the call with UNAUTHENTICATED, as Kafka fails the authentication.

Certificate reload: `ReloadingServerCertificates` gives `grpc.dynamic_ssl_server_credentials`
a fetcher that gRPC calls before each new TLS handshake. It compares the files' mtimes and
sizes with the ones loaded (a stat, no read) and re-reads them when they changed, so a
renewed certificate serves new connections without a restart; connections already open
keep the old one, as with Kafka's dynamic keystore update. A certificate and key that do
not belong together (the files replaced one at a time, the handshake falling between the
two writes) are not taken: the old pair stays until the new pair is whole.
"""
from __future__ import annotations

import contextvars
import ipaddress
import logging
import os
import re
import socket
import threading
from typing import Callable, NamedTuple

import grpc

from eos.errors import InvalidConfigError
from eos.net import CLIENT_ID_METADATA_KEY
from eos.sasl import REAUTHENTICATE_MARK, SASL_TOKEN_KEY

log = logging.getLogger("eos.broker.security")

ANONYMOUS = "User:ANONYMOUS"
PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL = "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
DEFAULT_PROTOCOL_MAP = {name: name for name in SECURITY_PROTOCOLS}
# auth_context()["transport_security_type"] -> the security protocol of the connection
_TRANSPORT_PROTOCOL = {b"insecure": PLAINTEXT, b"ssl": SSL}
CLIENT_AUTH_VALUES = ("none", "requested", "required")
SASL_AUTHENTICATE_METHOD = "/eos.v1.Security/SaslAuthenticate"
# REAUTHENTICATE_MARK starts the UNAUTHENTICATED message of a call whose token this connection
# does not know (a reconnect, an expired session): the client authenticates again and retries.
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


class Listener(NamedTuple):
    name: str                 # PLAINTEXT, SSL, or a name mapped by listener.security.protocol.map
    security_protocol: str    # PLAINTEXT or SSL
    host: str                 # the bind host; "" = every interface
    port: int                 # 0 = a free port


# ---- listeners (pure) ------------------------------------------------------------------------

def parse_protocol_map(text: str | None) -> dict[str, str]:
    """`listener.security.protocol.map`: "NAME:PROTOCOL,..." over Kafka's default
    (each protocol name maps to itself)."""
    mapping = dict(DEFAULT_PROTOCOL_MAP)
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        name, protocol = name.strip().upper(), protocol.strip().upper()
        if not sep or not name or protocol not in SECURITY_PROTOCOLS:
            raise InvalidConfigError(f"invalid listener.security.protocol.map entry {item!r}: "
                                     f"expected NAME:PROTOCOL with PROTOCOL one of {', '.join(SECURITY_PROTOCOLS)}")
        mapping[name] = protocol
    return mapping


def _split_endpoint(setting: str, item: str) -> tuple[str, str, int]:
    """"NAME://host:port" -> (NAME, host, port); IPv6 hosts in brackets."""
    match = re.fullmatch(r"([A-Za-z0-9_]+)://(\[[^\]]*\]|[^:/\[\]]*):(\d+)", item.strip())
    if match is None:
        raise InvalidConfigError(f"invalid {setting} entry {item!r}: expected NAME://host:port "
                                 f"(e.g. SSL://127.0.0.1:9093)")
    name, host, port_text = match.groups()
    port = int(port_text)
    if port > 65535:
        raise InvalidConfigError(f"invalid {setting} entry {item!r}: port {port} is outside 0..65535")
    return name.upper(), host.strip("[]"), port


def parse_listeners(text: str, protocol_map: dict[str, str]) -> tuple[Listener, ...]:
    """`listeners=PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9093` -> Listeners, checked:
    names and ports unique, a known protocol (SASL_PLAINTEXT refused: a session token must
    not travel in clear). Several listeners of one transport get gRPC servers of their own
    (broker/listener_servers.py)."""
    listeners: list[Listener] = []
    for item in text.split(","):
        if not item.strip():
            continue
        name, host, port = _split_endpoint("listeners", item)
        protocol = protocol_map.get(name)
        if protocol is None:
            raise InvalidConfigError(f"listener {name} has no security protocol: name it PLAINTEXT or SSL, "
                                     f"or map it in listener.security.protocol.map")
        if protocol == SASL_PLAINTEXT:
            raise InvalidConfigError(f"listener {name}: eos does not offer SASL_PLAINTEXT: its session token "
                                     f"would cross the network in clear; use SASL_SSL")
        listeners.append(Listener(name, protocol, host, port))
    if not listeners:
        raise InvalidConfigError(f"listeners names no listener: {text!r}")
    names = [listener.name for listener in listeners]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InvalidConfigError(f"listeners: more than one listener with name {', '.join(repeated)}")
    ports = [listener.port for listener in listeners if listener.port]
    if len(ports) != len(set(ports)):
        raise InvalidConfigError(f"listeners: two listeners on one port in {text!r}")
    return tuple(listeners)


def parse_advertised(text: str | None, listeners: tuple[Listener, ...]) -> dict[str, tuple[str, int]]:
    """`advertised.listeners` -> {listener name: (host, port)}; a listener not named is
    advertised at the address it binds (its bound port when 0)."""
    names = {listener.name for listener in listeners}
    advertised: dict[str, tuple[str, int]] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, host, port = _split_endpoint("advertised.listeners", item)
        if name not in names:
            raise InvalidConfigError(f"advertised.listeners names {name}, which is not in listeners")
        if not host:
            raise InvalidConfigError(f"advertised.listeners {item!r}: an advertised address needs a host")
        advertised[name] = (host, port)
    return advertised


def is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext_binds(listeners: tuple[Listener, ...], allow_plaintext_remote: bool) -> None:
    """Refuse a PLAINTEXT listener reachable from other machines unless asked for: data and
    (later) credentials would cross the network in clear. Checked before anything binds."""
    if allow_plaintext_remote:
        return
    for listener in listeners:
        if listener.security_protocol == PLAINTEXT and not is_loopback(listener.host):
            where = listener.host or "every interface"
            raise InvalidConfigError(
                f"listener {listener.name} would accept PLAINTEXT connections on {where}:{listener.port}, "
                f"which other machines can reach: use an SSL listener, bind it to 127.0.0.1, or allow it "
                f"with allow.plaintext.remote=true (eos broker start --allow-plaintext-remote)")


# ---- principal mapping (pure): Kafka's ssl.principal.mapping.rules ----------------------------

class NotAuthenticated(Exception):
    """A call on a SASL_SSL listener without a valid session token of its connection."""


class NoMatchingRule(Exception):
    """No ssl.principal.mapping.rules rule maps the DN (Kafka's NoMatchingRule)."""


class PrincipalRule(NamedTuple):
    pattern: re.Pattern | None     # None: DEFAULT (the DN as it is)
    replacement: str               # a Python re template (\g<1> for Java's $1)
    case: str                      # "", "L" (to lower case) or "U" (to upper case)
    text: str                      # the rule as written, for messages

    def apply(self, distinguished_name: str) -> str | None:
        """The mapped name, or None when the rule does not match (Java's matcher.matches():
        the whole DN)."""
        if self.pattern is None:
            return distinguished_name
        if self.pattern.fullmatch(distinguished_name) is None:
            return None
        # Kafka: distinguishedName.replaceAll(pattern, replacement) once the pattern matches
        # the whole DN; re.sub replaces as replaceAll does (empty matches included).
        name = self.pattern.sub(self.replacement, distinguished_name)
        return name.lower() if self.case == "L" else name.upper() if self.case == "U" else name


# Kafka's SslPrincipalMapper RULE_SPLITTER: DEFAULT, or RULE:pattern/replacement/[LU], where
# pattern and replacement may contain commas and backslash-escaped characters (\/ for a slash).
_RULE = re.compile(r"\s*(DEFAULT|RULE:((?:\\.|[^\\/])*)/((?:\\.|[^\\/])*)/([LU]?)[^,]*?|[^,]*?)\s*(?:,\s*|$)")


def _java_replacement(replacement: str) -> str:
    """Java's Matcher replacement ($1, \\$ for a dollar) as a Python re template."""
    out = []
    index = 0
    while index < len(replacement):
        char = replacement[index]
        if char == "\\" and index + 1 < len(replacement):
            literal = replacement[index + 1]
            out.append("\\\\" if literal == "\\" else literal)
            index += 2
        elif char == "$" and index + 1 < len(replacement) and replacement[index + 1].isdigit():
            digits = re.match(r"\d+", replacement[index + 1:]).group()
            out.append(f"\\g<{digits}>")
            index += 1 + len(digits)
        else:
            out.append(char)
            index += 1
    return "".join(out)


def parse_principal_mapping_rules(text: str | None) -> tuple[PrincipalRule, ...]:
    """`ssl.principal.mapping.rules` (Kafka's syntax, default "DEFAULT") -> rules in order."""
    text = "DEFAULT" if text is None or not text.strip() else text
    rules: list[PrincipalRule] = []
    position = 0
    while position < len(text):
        match = _RULE.match(text, position)
        if match is None or match.end() == position:
            raise InvalidConfigError(f"invalid ssl.principal.mapping.rules {text!r} at {text[position:]!r}")
        position = match.end()
        whole, pattern, replacement, case = match.group(1), match.group(2), match.group(3), match.group(4)
        if whole == "DEFAULT":
            rules.append(PrincipalRule(None, "", "", whole))
        elif whole.startswith("RULE:") and pattern is not None:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise InvalidConfigError(f"ssl.principal.mapping.rules: rule {whole!r}: bad pattern: {exc}") from None
            rules.append(PrincipalRule(compiled, _java_replacement(replacement), case or "", whole))
        elif whole:
            raise InvalidConfigError(f"invalid ssl.principal.mapping.rules rule {whole!r}: expected DEFAULT or "
                                     f"RULE:pattern/replacement/[LU]")
    if not rules:
        raise InvalidConfigError(f"ssl.principal.mapping.rules names no rule: {text!r}")
    return tuple(rules)


def map_distinguished_name(distinguished_name: str, rules: tuple[PrincipalRule, ...]) -> str:
    """The first rule that matches decides; none matching is an error, as in Kafka."""
    for rule in rules:
        name = rule.apply(distinguished_name)
        if name is not None:
            return name
    raise NoMatchingRule(f"no ssl.principal.mapping.rules rule applies to {distinguished_name!r} "
                         f"(rules: {', '.join(rule.text for rule in rules)})")


def distinguished_name_of(auth_context: dict) -> str | None:
    """The client certificate's subject in RFC 2253 form, or None without a certificate.
    The PEM certificate is parsed (gRPC's x509_subject is OpenSSL's one-line form, which
    agrees with RFC 2253 for common names but escapes differently); x509_subject is the
    fallback when the certificate is not given."""
    pem = auth_context.get("x509_pem_cert")
    if pem:
        from cryptography import x509
        return x509.load_pem_x509_certificate(pem[0]).subject.rfc4514_string()
    subject = auth_context.get("x509_subject")
    return subject[0].decode("utf-8", "replace") if subject else None


def transport_of(security_protocol: str) -> str:
    """The transport a listener's protocol runs on: PLAINTEXT (in clear) or SSL (TLS)."""
    return SSL if security_protocol in (SSL, SASL_SSL) else PLAINTEXT


def protocol_of(auth_context: dict) -> str:
    """PLAINTEXT or SSL: the transport security of the connection a call came in on."""
    kind = auth_context.get("transport_security_type")
    return _TRANSPORT_PROTOCOL.get(kind[0], PLAINTEXT) if kind else PLAINTEXT


def principal_for(auth_context: dict, listener: Listener, rules: tuple[PrincipalRule, ...]) -> str:
    """Kafka's principal ("User:<name>") of a call on `listener` with this gRPC auth context."""
    if listener.security_protocol != SSL:
        return ANONYMOUS
    distinguished_name = distinguished_name_of(auth_context)
    if distinguished_name is None:
        return ANONYMOUS
    return "User:" + map_distinguished_name(distinguished_name, rules)


# ---- the principal of a call: one interceptor -----------------------------------------------

class CallIdentity(NamedTuple):
    listener: Listener
    principal: str
    host: str = ""        # the client's IP address (ACLs may name it), "" when gRPC gives none


def host_of_peer(peer: str | None) -> str:
    """gRPC's peer "ipv4:127.0.0.1:5555" / "ipv6:[::1]:5555" -> "127.0.0.1" / "::1"."""
    kind, _, address = (peer or "").partition(":")
    if kind in ("ipv4", "ipv6"):
        return address.rsplit(":", 1)[0].strip("[]")
    return ""


_current_call: contextvars.ContextVar[CallIdentity | None] = contextvars.ContextVar("eos_call_identity", default=None)


def current_call() -> CallIdentity | None:
    """The identity of the gRPC call this thread serves; None for an in-process call (the
    broker's own coordinators), which acts as the broker itself."""
    return _current_call.get()


def principal_of_call(context) -> str | None:
    """The principal of the gRPC call `context` serves; None for an in-process call (the
    broker's own coordinators: their context carries no metadata). A real call without an
    identity comes from a broker whose one PLAINTEXT listener needs none (broker/server.py
    installs the interceptor only when it must), where every client is User:ANONYMOUS."""
    if getattr(context, "invocation_metadata", None) is None:
        return None
    call = current_call()
    return call.principal if call is not None else ANONYMOUS


def listener_name_of_call() -> str | None:
    """The name of the listener the current call came in on; None for an in-process call,
    or on a broker whose one PLAINTEXT listener runs no identity interceptor (then the
    inter-broker listener is the only one)."""
    call = current_call()
    return None if call is None else call.listener.name


def inter_broker_security(listener: Listener, *, certificate_location: str, key_location: str,
                          ca_location: str):
    """How this broker's own channels to other brokers are secured: the inter-broker
    listener's protocol. Over SSL the broker shows its own certificate as a client
    certificate (Kafka's inter-broker SSL uses the listener's keystore the same way), so
    the other broker's principal for it is the broker's subject, which under an authorizer
    must be a super user, as in Kafka (its coordinators also describe topics and write for
    transactional ids). The PEM files are read once, here."""
    from eos.client_config import PLAINTEXT_SECURITY, security_of

    if listener.security_protocol == PLAINTEXT:
        return PLAINTEXT_SECURITY
    if listener.security_protocol != SSL:
        raise InvalidConfigError(f"inter.broker.listener.name {listener.name} is {listener.security_protocol}: "
                                 f"brokers talk to each other over PLAINTEXT or SSL (mutual TLS) in eos")
    try:
        security = security_of({"security.protocol": SSL, "ssl.ca.location": ca_location,
                                "ssl.certificate.location": certificate_location, "ssl.key.location": key_location})
    except ValueError as exc:       # a file that cannot be read, named by its setting
        raise InvalidConfigError(f"the inter-broker listener's TLS settings: {exc}") from None
    _check_usable_as_client(security.certificate_pem, certificate_location)
    return security


def _check_usable_as_client(certificate_pem: bytes, location: str) -> None:
    """Refuse, before any handshake fails, a broker certificate whose extended key usage
    leaves out client authentication: over an SSL inter-broker listener the broker is the
    client of the others, which would refuse it ("unsupported certificate purpose")."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    certificate = x509.load_pem_x509_certificate(certificate_pem)
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return      # no restriction: good for both ends
    if ExtendedKeyUsageOID.CLIENT_AUTH not in usages:
        raise InvalidConfigError(
            f"ssl.certificate.location {location}: the inter-broker listener is SSL, so this broker connects "
            f"to the others with its certificate, but its extended key usage does not include clientAuth "
            f"(only {', '.join(u._name for u in usages)}); issue it for serverAuth and clientAuth")


def client_id_of_call(context) -> str:
    """The client id a call carries (Kafka's request header field; eos's clients send it in
    the `client-id` metadata), "" when none."""
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID_METADATA_KEY:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return ""


def run_as_broker(function, *args):
    """Run `function(*args)` with no call identity: the broker's own work done on the
    thread of a client's call (the transaction coordinator writing its state while serving
    EndTxn) must not be checked as that client's."""
    token = _current_call.set(None)
    try:
        return function(*args)
    finally:
        _current_call.reset(token)


# A probe asks a SASL_SSL listener for its health over TLS alone, as it would any other
# listener (Kubernetes' gRPC probe cannot log in): health says nothing a principal guards.
_OPEN_TO_UNAUTHENTICATED = ("/grpc.health.v1.Health/",)


class CallIdentityInterceptor(grpc.ServerInterceptor):
    """Wraps every handler so the call's listener and principal are known before it runs."""

    def __init__(self, listeners: tuple[Listener, ...], rules: tuple[PrincipalRule, ...],
                 observer: Callable[[str, CallIdentity], None] | None = None, sessions=None):
        self._by_transport = {transport_of(listener.security_protocol): listener for listener in listeners}
        self._rules = rules
        self._sessions = sessions      # broker.scram_users.SessionTokens, for SASL_SSL listeners
        self.observer = observer

    def identify(self, context, method: str = "") -> CallIdentity:
        auth_context = context.auth_context()
        listener = self._by_transport.get(protocol_of(auth_context)) or next(iter(self._by_transport.values()))
        peer = context.peer()
        if (listener.security_protocol == SASL_SSL and method != SASL_AUTHENTICATE_METHOD
                and not method.startswith(_OPEN_TO_UNAUTHENTICATED)):
            return CallIdentity(listener, self._session_principal(context, peer), host_of_peer(peer))
        return CallIdentity(listener, principal_for(auth_context, listener, self._rules), host_of_peer(peer))

    def _session_principal(self, context, peer: str) -> str:
        """The principal of a SASL_SSL call: its session token's, when the token was issued
        on this very connection; else the call is not authenticated."""
        token = next((value for key, value in (context.invocation_metadata() or ()) if key == SASL_TOKEN_KEY), None)
        if token is None:
            raise NotAuthenticated("this SASL_SSL listener needs a SASL/SCRAM authentication first "
                                   "(security.protocol=SASL_SSL, sasl.mechanism, sasl.username, sasl.password)")
        principal = None if self._sessions is None else self._sessions.principal_of(token, peer)
        if principal is None:
            raise NotAuthenticated(f"{REAUTHENTICATE_MARK} the SASL session token is not valid on this connection "
                                   f"(expired, or issued on another connection)")
        return principal

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if handler.unary_unary:
            return handler._replace(unary_unary=self._wrap_unary(method, handler.unary_unary))
        if handler.unary_stream:
            return handler._replace(unary_stream=self._wrap_stream(method, handler.unary_stream))
        if handler.stream_unary:
            return handler._replace(stream_unary=self._wrap_unary(method, handler.stream_unary))
        return handler._replace(stream_stream=self._wrap_stream(method, handler.stream_stream))

    def _enter(self, method: str, context) -> CallIdentity:
        try:
            identity = self.identify(context, method)
        except (NoMatchingRule, NotAuthenticated) as exc:
            log.warning("refused a call to %s from %s: %s", method, context.peer(), exc)
            context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        observer = self.observer
        if observer is not None:
            observer(method, identity)
        return identity

    def _wrap_unary(self, method: str, behaviour):
        def call(request, context):
            token = _current_call.set(self._enter(method, context))
            try:
                return behaviour(request, context)
            finally:
                _current_call.reset(token)
        return call

    def _wrap_stream(self, method: str, behaviour):
        def call(request, context):
            # A generator that gRPC iterates on a worker thread. The identity is set only
            # while the handler's code runs (each step) and never across a `yield`: a
            # generator that gRPC drops without closing would otherwise restore a stale
            # value into whatever call that thread (or the garbage collector) serves next,
            # and no identity means "the broker itself" to the authorizer.
            identity = self._enter(method, context)
            token = _current_call.set(identity)
            try:
                steps = iter(behaviour(request, context))
            finally:
                _current_call.reset(token)
            try:
                while True:
                    token = _current_call.set(identity)
                    try:
                        item = next(steps)
                    except StopIteration:
                        return
                    finally:
                        _current_call.reset(token)
                    yield item
            finally:
                close = getattr(steps, "close", None)
                if close is not None:
                    token = _current_call.set(identity)
                    try:
                        close()
                    finally:
                        _current_call.reset(token)
        return call


# ---- TLS server credentials, reloaded when the files change ----------------------------------

def _file_stamp(path: str) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_mtime_ns, status.st_size


class ReloadingServerCertificates:
    """The TLS credentials of the SSL listener, re-read when the PEM files change."""

    def __init__(self, certificate_path: str, key_path: str, ca_path: str | None, *, client_auth: str):
        self._paths = tuple(p for p in (certificate_path, key_path, ca_path) if p)
        self._certificate_path, self._key_path, self._ca_path = certificate_path, key_path, ca_path
        self._require_client_auth = client_auth == "required"
        self._lock = threading.Lock()
        self._stamps = self._read_stamps()
        self.loaded_count = 0       # certificate configurations taken (the first one included)
        self._initial = self._load()

    def _read_stamps(self) -> tuple:
        return tuple(_file_stamp(p) for p in self._paths)

    def _load(self) -> grpc.ServerCertificateConfiguration:
        """Read and check the files; raise InvalidConfigError when they do not make a pair."""
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        def read(path: str, setting: str) -> bytes:
            try:
                with open(path, "rb") as file:
                    return file.read()
            except OSError as exc:
                raise InvalidConfigError(f"{setting} {path}: cannot read it: {exc}") from None

        certificate_pem = read(self._certificate_path, "ssl.certificate.location")
        key_pem = read(self._key_path, "ssl.key.location")
        ca_pem = read(self._ca_path, "ssl.ca.location") if self._ca_path else None
        try:
            certificate = x509.load_pem_x509_certificates(certificate_pem)[0]
            key = serialization.load_pem_private_key(key_pem, password=None)
            if ca_pem is not None:
                x509.load_pem_x509_certificates(ca_pem)
        except (ValueError, TypeError) as exc:
            raise InvalidConfigError(f"the broker's TLS files are not PEM certificates and an unencrypted "
                                     f"PEM key: {exc}") from None
        public = serialization.PublicFormat.SubjectPublicKeyInfo
        if (certificate.public_key().public_bytes(serialization.Encoding.DER, public)
                != key.public_key().public_bytes(serialization.Encoding.DER, public)):
            raise InvalidConfigError(f"ssl.key.location {self._key_path} is not the key of the certificate in "
                                     f"ssl.certificate.location {self._certificate_path}")
        self.loaded_count += 1
        return grpc.ssl_server_certificate_configuration([(key_pem, certificate_pem)], root_certificates=ca_pem)

    def fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher, called before each new handshake: a new configuration when the
        files changed and make a whole pair, else None (keep the current one)."""
        try:
            stamps = self._read_stamps()
        except OSError:
            return None       # a file being replaced (renamed away): try at the next connection
        with self._lock:
            if stamps == self._stamps:
                return None
            try:
                configuration = self._load()
            except InvalidConfigError as exc:
                log.warning("the TLS files changed but are not usable yet (keeping the certificate in use): %s", exc)
                return None
            self._stamps = stamps
        log.info("reloaded the TLS certificate from %s", self._certificate_path)
        return configuration

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(self._initial, self.fetch,
                                                   require_client_authentication=self._require_client_auth)


def advertised_host(bind_host: str) -> str:
    """The host a listener bound to every interface advertises: this machine's name."""
    return bind_host or socket.getfqdn()
