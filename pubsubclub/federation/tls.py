"""TLS for dialled links: which CAs a ``wss://`` peer's certificate must chain to.

Listeners need nothing here: Twisted's ``ssl:`` endpoint strings serve TLS.
Hostname (or IP address) verification is Twisted's ``optionsForClientTLS``
with ``service_identity``, always on.
"""

from __future__ import annotations

from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

# IOpenSSLTrustRoot is public API (optionsForClientTLS takes one) but only defined here.
from twisted.internet._sslverify import IOpenSSLTrustRoot
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator
from twisted.internet.ssl import Certificate, optionsForClientTLS, platformTrust, trustRootFromCertificates


def load_trust_root(ca_file: str) -> IOpenSSLTrustRoot:
    """The CA certificates in the PEM file ``ca_file`` (one or several) as a trust root.

    Raises ``OSError`` when the file cannot be read and ``ValueError`` when it
    holds no PEM certificate.
    """
    with open(ca_file, "rb") as f:
        data = f.read()
    certificates = x509.load_pem_x509_certificates(data)  # ValueError when there is none
    return trustRootFromCertificates([Certificate.loadPEM(c.public_bytes(Encoding.PEM)) for c in certificates])


def client_tls(hostname: str, trust_root: IOpenSSLTrustRoot | None) -> IOpenSSLClientConnectionCreator:
    """TLS options verifying ``hostname`` against ``trust_root`` (the platform's CAs when None)."""
    root: Any = trust_root if trust_root is not None else platformTrust()
    return optionsForClientTLS(hostname, trustRoot=root)
