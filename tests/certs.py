"""Throwaway X.509 certificates for the TLS tests, made at run time (none is committed).

The implementation is the product's own, `eos.tls_certs` (`eos cluster start --tls` makes its
local certificates the same way); this module keeps the tests' import path.
"""
from eos.tls_certs import CertificateAuthority, Issued, LocalTls, make_local_tls

__all__ = ["CertificateAuthority", "Issued", "LocalTls", "make_local_tls"]
