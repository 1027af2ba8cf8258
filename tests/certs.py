"""Throwaway X.509 certificates for the TLS tests, made at run time (none is committed).

`CertificateAuthority("test CA")` is a self-signed CA; `.issue_server(dir, "server")`
writes a server certificate for 127.0.0.1 / localhost (IP and DNS SANs; `names=` for others) and its key as
PEM files; `.issue_client(dir, "alice", subject={...})` a client certificate with the
given subject; `expired=True` gives a certificate whose validity ended yesterday. Keys are
EC P-256: quick to generate, and every TLS stack here accepts them.
"""
from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

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


class CertificateAuthority:
    def __init__(self, common_name: str = "eos test CA"):
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        name = _name(common_name)
        self.certificate = (
            x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
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
        Path(path).write_bytes(self.pem)
        return Path(path)

    def _issue(self, directory: Path, stem: str, subject, *, server: bool, expired: bool,
               names: tuple[str, ...] = ("127.0.0.1", "localhost")) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        if expired:
            not_before, not_after = now - datetime.timedelta(days=30), now - datetime.timedelta(days=1)
        else:
            not_before, not_after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=30)
        builder = (
            x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(self.certificate.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([_general_name(n) for n in names]),
                                            critical=False)
        certificate = builder.sign(self.key, hashes.SHA256())
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        certificate_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        certificate_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(_key_pem(key))
        return Issued(certificate_path, key_path)

    def issue_server(self, directory: Path, stem: str = "server", *, common_name: str = "localhost",
                     names: tuple[str, ...] = ("127.0.0.1", "localhost"), expired: bool = False) -> Issued:
        """A server certificate whose SANs are `names` (IP addresses or DNS names)."""
        return self._issue(directory, stem, common_name, server=True, expired=expired, names=names)

    def issue_client(self, directory: Path, stem: str, subject: dict[str, str] | str, *,
                     expired: bool = False) -> Issued:
        return self._issue(directory, stem, subject, server=False, expired=expired)
