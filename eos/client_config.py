"""A client's settings: Kafka's names, checked when the client is made.

Theory of operation
-------------------
Every client (Producer, Consumer, Admin, the Spark source and sink) takes Kafka's setting
names, as a dict and as keyword arguments (dots as underscores). Each client has a table of
`ConfigSpec`s (a default and a converter that raises ValueError naming the setting), and
`resolve_config` merges what it was given into checked values once, in its constructor: an
unknown name, or a value of the wrong type or range, fails there with one message rather
than at the first request (`as_int32` holds Kafka's INT settings to 32 bits, as Kafka's
ConfigDef does).

Security: every client's table includes `CLIENT_SECURITY_CONFIG` (Kafka's and librdkafka's
`security.protocol`, `ssl.ca.location`, `ssl.certificate.location`, `ssl.key.location`,
`ssl.endpoint.identification.algorithm`, `sasl.*`). `channel_security` reads the PEM files
once, when the client is made, into a `ChannelSecurity` that eos/net.py's `open_channel`
uses for each of the client's connections. SASL_PLAINTEXT is refused by name; ssl.* files or
SASL credentials given beside a protocol that would not use them are refused rather than
ignored (the client would talk in clear, or go anonymous).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from eos.sasl import SaslSettings


# ---- security settings (Kafka's and librdkafka's names) -------------------------------------

PLAINTEXT, SSL, SASL_SSL = "PLAINTEXT", "SSL", "SASL_SSL"
SASL_MECHANISM_DEFAULT = "SCRAM-SHA-512"


def _security_protocol(name: str, value) -> str:
    text = str(value).strip().upper()
    if text in (PLAINTEXT, SSL, SASL_SSL):
        return text
    if text == "SASL_PLAINTEXT":
        raise ValueError(f"{name}=SASL_PLAINTEXT is not offered by eos (the session token would cross the "
                         f"network in clear); use SASL_SSL")
    raise ValueError(f"{name} must be PLAINTEXT, SSL or SASL_SSL, got {value!r}")


def _secret(name: str, value) -> str | None:
    """A password: checked like a string, never echoed in the error."""
    if value is None or isinstance(value, str):
        return value or None
    raise ValueError(f"{name} must be a string (a {type(value).__name__} was given)")


def _sasl_mechanism(name: str, value) -> str:
    from eos.scram import MECHANISMS
    text = str(value).strip().upper()
    if text not in MECHANISMS:
        raise ValueError(f"{name} must be {' or '.join(sorted(MECHANISMS))} (eos does not offer GSSAPI, PLAIN "
                         f"or OAUTHBEARER), got {value!r}")
    return text


def _endpoint_identification(name: str, value) -> str:
    text = str(value).strip().lower()
    if text in ("https", "none", ""):
        return text or "none"     # Kafka: an empty value turns the check off too
    raise ValueError(f"{name} must be https (check the broker's name in its certificate) or none, got {value!r}")




class ChannelSecurity(NamedTuple):
    """How a client's channels are secured: PLAINTEXT, or SSL with the PEM bytes read once
    when the client is made (the paths are kept for messages and the name probe)."""
    protocol: str = PLAINTEXT
    ca_pem: bytes | None = None               # None: the system's trusted roots (gRPC's bundle)
    certificate_pem: bytes | None = None      # the client certificate, for mutual TLS
    key_pem: bytes | None = None
    verify_hostname: bool = True              # ssl.endpoint.identification.algorithm=https
    certificate_location: str | None = None
    key_location: str | None = None
    sasl: "SaslSettings | None" = None        # SASL_SSL: the SCRAM mechanism, user and password

    @property
    def is_tls(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)


PLAINTEXT_SECURITY = ChannelSecurity()


def channel_security(settings: dict) -> ChannelSecurity:
    """The ChannelSecurity of a client's resolved settings; reads the PEM files (a missing
    or unreadable file fails the client's constructor, naming the setting)."""
    from eos.sasl import SaslSettings
    protocol = settings["security.protocol"]
    sasl = None
    if protocol == SASL_SSL:
        missing = [name for name in ("sasl.username", "sasl.password") if not settings[name]]
        if missing:
            raise ValueError(f"security.protocol=SASL_SSL needs {' and '.join(missing)}")
        sasl = SaslSettings(settings["sasl.mechanism"], settings["sasl.username"], settings["sasl.password"])
    elif settings["sasl.username"] or settings["sasl.password"]:
        # Kafka's clients ignore them; a client meant to authenticate would then go anonymous.
        raise ValueError(f"sasl.username/sasl.password given but security.protocol is {protocol}: "
                         f"set security.protocol=SASL_SSL to authenticate with them")
    given = [name for name in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location") if settings[name]]
    if protocol == PLAINTEXT:
        if given:
            # Kafka's clients ignore them; a client meant to use TLS would then talk in clear.
            raise ValueError(f"{', '.join(given)} given but security.protocol is PLAINTEXT: "
                             f"set security.protocol=SSL to use TLS")
        return PLAINTEXT_SECURITY
    certificate_location, key_location = settings["ssl.certificate.location"], settings["ssl.key.location"]
    if bool(certificate_location) != bool(key_location):
        raise ValueError("ssl.certificate.location and ssl.key.location go together (a client certificate "
                         "and its key), got only one of them")

    def read(name: str) -> bytes | None:
        path = settings[name]
        if not path:
            return None
        try:
            with open(path, "rb") as file:
                return file.read()
        except OSError as exc:
            raise ValueError(f"{name} {path}: cannot read it: {exc}") from None

    return ChannelSecurity(protocol, read("ssl.ca.location"), read("ssl.certificate.location"),
                           read("ssl.key.location"),
                           settings["ssl.endpoint.identification.algorithm"] == "https",
                           certificate_location, key_location, sasl)


# ---- configuration ------------------------------------------------------------------------

class ConfigSpec(NamedTuple):
    default: object
    convert: object          # callable(name, value) -> value, raising ValueError


def as_bool(name: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name} must be true or false, got {value!r}")


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def as_int(minimum: int, maximum: int = INT64_MAX):
    """A LONG setting of Kafka's (at least `minimum`); `as_int32` for an INT one."""
    def convert(name: str, value) -> int:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        try:
            number = int(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be an integer, got {value!r}") from None
        if isinstance(value, float) and value != number:
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if number < minimum:
            raise ValueError(f"{name} must be at least {minimum}, got {number}")
        if number > maximum:
            # Kafka's INT settings are 32-bit (a ConfigException at construction); the value
            # travels in 32-bit protocol fields, which would refuse it only at the first request
            raise ValueError(f"{name} must be at most {maximum}, got {number}")
        return number
    return convert


def as_int32(minimum: int):
    """An INT setting of Kafka's: at least `minimum`, at most 2^31 - 1."""
    return as_int(minimum, INT32_MAX)


def as_str(name: str, value) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {value!r}")
    return value


def as_optional_str(name: str, value) -> str | None:
    return None if value is None else as_str(name, value)


# Every client's config table includes these (Producer, Consumer, Admin, the Spark source and sink).
CLIENT_SECURITY_CONFIG: dict[str, ConfigSpec] = {
    "security.protocol": ConfigSpec(PLAINTEXT, _security_protocol),
    "ssl.ca.location": ConfigSpec(None, as_optional_str),
    "ssl.certificate.location": ConfigSpec(None, as_optional_str),
    "ssl.key.location": ConfigSpec(None, as_optional_str),
    "ssl.endpoint.identification.algorithm": ConfigSpec("https", _endpoint_identification),
    "sasl.mechanism": ConfigSpec(SASL_MECHANISM_DEFAULT, _sasl_mechanism),
    "sasl.username": ConfigSpec(None, as_optional_str),
    "sasl.password": ConfigSpec(None, _secret),
}


def security_settings(what: str, config: dict | None) -> dict:
    """Only the security settings (security.protocol, ssl.*, sasl.*) of a component whose
    clients it makes itself (the Spark source and sink), checked: ValueError names an
    unknown or bad one. Returns them by Kafka name, as given."""
    given = {str(name).replace("_", "."): value for name, value in (config or {}).items()}
    unknown = sorted(name for name in given if name not in CLIENT_SECURITY_CONFIG)
    if unknown:
        raise ValueError(f"{what}: {', '.join(unknown)} are not security settings "
                         f"(known: {', '.join(sorted(CLIENT_SECURITY_CONFIG))})")
    channel_security(resolve_config(what, CLIENT_SECURITY_CONFIG, given, {})[0])    # files readable, pairs whole
    return given


def security_of(config: dict | None) -> ChannelSecurity:
    """The ChannelSecurity of security settings checked by `security_settings`."""
    return channel_security(resolve_config("client", CLIENT_SECURITY_CONFIG, dict(config or {}), {})[0])


def resolve_config(what: str, spec: dict[str, ConfigSpec], config: dict | None,
                   kwargs: dict) -> tuple[dict, set[str]]:
    """Merge a dict of Kafka names and keyword arguments (dots as underscores) into checked
    values. Returns (values by Kafka name, the names given explicitly). Keyword arguments
    win over the dict. Unknown names raise one ValueError naming all of them."""
    given: dict[str, object] = {}
    unknown = []
    for source in (config or {}), kwargs:
        if not isinstance(source, dict):
            raise TypeError(f"{what} config must be a dict of Kafka config names, got {type(source).__name__}")
        for raw_name, value in source.items():
            name = str(raw_name).replace("_", ".")
            if name not in spec:
                unknown.append(str(raw_name))
                continue
            given[name] = value
    if unknown:
        raise ValueError(f"unknown {what} config: {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(sorted(spec))})")
    values = {}
    for name, item in spec.items():
        if name in given:
            values[name] = item.convert(name, given[name])
        else:
            values[name] = item.default
    return values, set(given)
