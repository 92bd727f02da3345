#!/usr/bin/env python3
"""Make a throw-away CA, node certificates and a cluster secret for trying TLS (docs/security.md, "TLS walk-through").

    python examples/tls/make_certs.py certs/                  # node1..node3, for localhost and 127.0.0.1
    python examples/tls/make_certs.py certs/ --nodes a b --host node-a.internal --host 10.0.0.5

Writes into the folder:

- ``ca.pem``: the CA's certificate; every node trusts it with ``--ca-file certs/ca.pem``;
- ``NAME.pem`` per node: its private key then its certificate, signed by the CA, valid for
  every ``--host`` (default ``localhost`` and ``127.0.0.1``); give the same file as
  ``privateKey=`` and ``certKey=`` of an ``ssl:`` listener endpoint;
- ``cluster-secret``: 64 random hex characters for ``--cluster-secret-file``.

Keys and the secret are written readable by their owner only (0600). The CA's own
key is not kept: to add a node later, run the script again into a new folder and
give every node the new files. For trying things only; production certificates
come from your own CA.
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import secrets
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the certificates stay valid.
VALID_DAYS = 30


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _dated(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=VALID_DAYS)
    )


def _private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path.chmod(0o600)


def make_ca() -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A new self-signed CA that may sign server certificates only."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name("pubsubclub throw-away CA"))
        .issuer_name(_name("pubsubclub throw-away CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    return key, _dated(builder).sign(key, hashes.SHA256())


def node_pem(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, name: str, hosts: list[str]) -> bytes:
    """A node's key and certificate (PEM, key first) for ``hosts`` (names and IP addresses)."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    cert = _dated(builder).sign(ca_key, hashes.SHA256())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ) + cert.public_bytes(serialization.Encoding.PEM)


def main(argv: list[str] | None = None) -> int:
    """Write the CA, the node files and the cluster secret into the folder given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="where to write the files (created if missing)")
    parser.add_argument("--nodes", nargs="+", default=["node1", "node2", "node3"], help="node names (one file each)")
    parser.add_argument(
        "--host",
        action="append",
        help="a name or IP address the nodes are dialled at, repeatable (default: localhost and 127.0.0.1)",
    )
    args = parser.parse_args(argv)
    hosts = args.host or ["localhost", "127.0.0.1"]
    args.folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = make_ca()
    (args.folder / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for name in args.nodes:
        _private(args.folder / f"{name}.pem", node_pem(ca_key, ca, name, hosts))
    _private(args.folder / "cluster-secret", (secrets.token_hex(32) + "\n").encode())
    files = ", ".join(["ca.pem", *(f"{n}.pem" for n in args.nodes), "cluster-secret"])
    print(f"wrote {files} into {args.folder} (certificates for {', '.join(hosts)}, valid {VALID_DAYS} days)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
