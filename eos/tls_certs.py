"""Throwaway X.509 certificates for local work and tests, made at run time (none is committed).

Theory of operation
-------------------
`CertificateAuthority("test CA")` is a self-signed CA that lives in memory only: its key is
never written, so once the process ends nobody can sign with it again. `.issue_server(dir,
"server")` writes a server certificate for 127.0.0.1 / localhost (IP and DNS SANs; `names=`
for others) and its key as PEM files; `.issue_client(dir, "alice", subject={...})` a client
certificate with the given subject; `expired=True` gives a certificate whose validity ended
yesterday. A server certificate carries the serverAuth extended key usage only, a client
certificate clientAuth only (TLS stacks check it); `client_auth=True` on `issue_server` adds
clientAuth, for a broker that also dials its peers with mutual TLS. Keys are EC P-256: quick
to generate, and every TLS stack here accepts them. Key files are created with mode 0600
(never readable by others, not even for an instant); certificates and the CA with 0644.

`make_local_tls(directory)` is the set `eos cluster start --tls` uses: `ca.pem`, one broker
certificate (CN=broker, serverAuth and clientAuth, SANs for `broker_names`) and one client
certificate per entry of `clients` (file stem -> CN), in a 0700 directory. It reuses a
directory that already holds a complete, still-valid set made for the same names, so a local
cluster restarted over the same directory keeps its certificates and the client settings
handed out before stay good. Anything else (a file missing, a certificate not issued by that
`ca.pem`, a key that is not its certificate's, one expiring within `LOCAL_RENEW_MARGIN`,
other names asked for) makes a whole new set: the old CA's key is gone, so nothing can be
added to an old set, and a half-old half-new set would not verify.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, NamedTuple

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from eos.files import write_file_atomically

__all__ = ["CertificateAuthority", "Issued", "LocalTls", "make_local_tls", "DEFAULT_LIFETIME",
           "LOCAL_LIFETIME", "LOCAL_RENEW_MARGIN"]

DEFAULT_LIFETIME = datetime.timedelta(days=30)      # tests: long enough for any run
LOCAL_LIFETIME = datetime.timedelta(days=365)        # a local cluster may be restarted for months
LOCAL_RENEW_MARGIN = datetime.timedelta(days=7)      # make a new set rather than one about to expire
_BACKDATE = datetime.timedelta(days=1)               # tolerate a peer whose clock is a little behind

KEY_FILE_MODE = 0o600
CERTIFICATE_FILE_MODE = 0o644
LOCAL_DIRECTORY_MODE = 0o700

_NAME_OIDS = {
    "CN": NameOID.COMMON_NAME, "OU": NameOID.ORGANIZATIONAL_UNIT_NAME, "O": NameOID.ORGANIZATION_NAME,
    "L": NameOID.LOCALITY_NAME, "ST": NameOID.STATE_OR_PROVINCE_NAME, "C": NameOID.COUNTRY_NAME,
}


class Issued(NamedTuple):
    certificate_path: Path
    key_path: Path


def _name(subject: dict[str, str] | str) -> x509.Name:
    """A Name from {"CN": "alice", "OU": "eng"} (attributes in the order given) or a CN."""
    if isinstance(subject, str):
        subject = {"CN": subject}
    return x509.Name([x509.NameAttribute(_NAME_OIDS[key], value) for key, value in subject.items()])


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class CertificateAuthority:
    def __init__(self, common_name: str = "eos test CA", *, lifetime: datetime.timedelta = DEFAULT_LIFETIME):
        """`lifetime` is the CA's validity and that of every certificate it issues (from now)."""
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.lifetime = lifetime
        now = _now()
        name = _name(common_name)
        self.certificate = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE)
            .not_valid_after(now + lifetime)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(self.key, hashes.SHA256()))

    @property
    def pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def write_ca(self, path: Path) -> Path:
        path = Path(path)
        write_file_atomically(path, self.pem, mode=CERTIFICATE_FILE_MODE)
        return path

    def _issue(self, directory: Path, stem: str, subject, *, usages: tuple[x509.ObjectIdentifier, ...],
               expired: bool, names: tuple[str, ...] | None) -> Issued:
        """A certificate for `subject` with extended key usages `usages` and, when `names` is
        given, those SANs; written as `<stem>.crt` and `<stem>.key` (0600) in `directory`."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        if expired:
            not_before, not_after = now - datetime.timedelta(days=30), now - datetime.timedelta(days=1)
        else:
            not_before, not_after = now - _BACKDATE, now + self.lifetime
        builder = (
            x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(self.certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False))
        if names is not None:
            builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]),
                                            critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        certificate_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        write_file_atomically(certificate_path, certificate.public_bytes(serialization.Encoding.PEM),
                              mode=CERTIFICATE_FILE_MODE)
        # Atomic with its mode from creation: an existing wider-mode key file is replaced, not reused.
        write_file_atomically(key_path, _key_pem(key), mode=KEY_FILE_MODE)
        return Issued(certificate_path, key_path)

    def issue_server(self, directory: Path, stem: str = "server", *, common_name: str = "localhost",
                     names: tuple[str, ...] = ("127.0.0.1", "localhost"), expired: bool = False,
                     client_auth: bool = False) -> Issued:
        """A server certificate whose SANs are `names` (IP addresses or DNS names); with
        `client_auth` it is also a client certificate (a broker dialling its peers over mTLS)."""
        usages = (ExtendedKeyUsageOID.SERVER_AUTH,) + ((ExtendedKeyUsageOID.CLIENT_AUTH,) if client_auth else ())
        return self._issue(directory, stem, common_name, usages=usages, expired=expired, names=names)

    def issue_client(self, directory: Path, stem: str, subject: dict[str, str] | str, *,
                     expired: bool = False) -> Issued:
        return self._issue(directory, stem, subject, usages=(ExtendedKeyUsageOID.CLIENT_AUTH,),
                           expired=expired, names=None)


DEFAULT_LOCAL_CLIENTS: Mapping[str, str] = MappingProxyType({"admin": "admin"})
BROKER_STEM = "broker"
BROKER_COMMON_NAME = "broker"
CA_FILE_NAME = "ca.pem"


@dataclass(frozen=True)
class LocalTls:
    """The files of one `make_local_tls` set, and the settings that use them."""
    ca_path: Path
    broker: Issued
    clients: dict[str, Issued] = field(default_factory=dict)   # file stem -> its certificate and key

    def client_config(self, stem: str) -> dict[str, str]:
        """Kafka client settings for mutual TLS as client `stem` (KeyError for an unknown one)."""
        issued = self.clients[stem]
        return {"security.protocol": "SSL", "ssl.ca.location": str(self.ca_path),
                "ssl.certificate.location": str(issued.certificate_path),
                "ssl.key.location": str(issued.key_path)}

    def broker_config(self) -> dict[str, str]:
        """Broker settings: serve with the broker certificate and require client certificates
        from this CA (other brokers present the same broker certificate)."""
        return {"ssl.certificate.location": str(self.broker.certificate_path),
                "ssl.key.location": str(self.broker.key_path),
                "ssl.ca.location": str(self.ca_path), "ssl.client.auth": "required"}


def _check_stem(stem: str) -> None:
    if not stem or stem in (".", "..") or os.sep in stem or (os.altsep and os.altsep in stem):
        raise ValueError(f"client name {stem!r} is not a plain file name")
    if stem == BROKER_STEM:
        raise ValueError(f"client name {stem!r} is taken by the broker's certificate")


def _reusable(directory: Path, broker_names: tuple[str, ...], clients: Mapping[str, str]) -> LocalTls | None:
    """The set in `directory` when it is complete, still valid past the renew margin, issued by
    its ca.pem, each key its certificate's, and made for these names; else None."""
    tls = _local_tls(directory, clients)
    try:
        ca = x509.load_pem_x509_certificate(tls.ca_path.read_bytes())
        deadline = _now() + LOCAL_RENEW_MARGIN
        if ca.not_valid_after_utc <= deadline:
            return None
        loaded = {}
        for stem, issued in [(BROKER_STEM, tls.broker), *tls.clients.items()]:
            certificate = x509.load_pem_x509_certificate(issued.certificate_path.read_bytes())
            key = serialization.load_pem_private_key(issued.key_path.read_bytes(), password=None)
            certificate.verify_directly_issued_by(ca)        # raises for another CA's certificate
            if (certificate.public_key() != key.public_key() or certificate.not_valid_after_utc <= deadline
                    or certificate.not_valid_before_utc > _now()):
                return None
            loaded[stem] = certificate
    except (OSError, ValueError, TypeError, InvalidSignature):   # missing, unreadable or not this CA's
        return None
    broker = loaded[BROKER_STEM]
    try:
        sans = broker.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        usages = set(broker.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except x509.ExtensionNotFound:
        return None
    if (list(sans) != [_general_name(name) for name in broker_names]
            or usages != {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}):
        return None
    for stem, common_name in clients.items():
        if loaded[stem].subject != _name(common_name):
            return None
    return tls


def _local_tls(directory: Path, clients: Mapping[str, str]) -> LocalTls:
    return LocalTls(ca_path=directory / CA_FILE_NAME,
                    broker=Issued(directory / f"{BROKER_STEM}.crt", directory / f"{BROKER_STEM}.key"),
                    clients={stem: Issued(directory / f"{stem}.crt", directory / f"{stem}.key")
                             for stem in clients})


def make_local_tls(directory: Path, *, broker_names: tuple[str, ...] = ("localhost", "127.0.0.1"),
                   clients: Mapping[str, str] = DEFAULT_LOCAL_CLIENTS) -> LocalTls:
    """A CA, a broker certificate and one client certificate per `clients` entry (file stem ->
    CN) in `directory`, for local work; an existing complete set for the same names is reused
    as it is (see the module docstring). `directory` is created 0700 when it does not exist
    (an existing one keeps its mode: it may be the user's own)."""
    directory = Path(directory)
    broker_names = tuple(broker_names)
    if not broker_names:
        raise ValueError("the broker certificate needs at least one name")
    clients = dict(clients)
    for stem in clients:
        _check_stem(stem)
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        directory.mkdir(mode=LOCAL_DIRECTORY_MODE)
        os.chmod(directory, LOCAL_DIRECTORY_MODE)   # mkdir's mode is narrowed by the umask
    except FileExistsError:
        reused = _reusable(directory, broker_names, clients)
        if reused is not None:
            return reused
    ca = CertificateAuthority("eos local CA", lifetime=LOCAL_LIFETIME)
    broker = ca.issue_server(directory, BROKER_STEM, common_name=BROKER_COMMON_NAME, names=broker_names,
                             client_auth=True)
    issued_clients = {stem: ca.issue_client(directory, stem, common_name) for stem, common_name in clients.items()}
    # ca.pem last: until it is written, a crash leaves certificates that do not verify against
    # the old ca.pem, so the next call makes a new set rather than reuse a mixed one.
    ca_path = ca.write_ca(directory / CA_FILE_NAME)
    return LocalTls(ca_path=ca_path, broker=broker, clients=issued_clients)
