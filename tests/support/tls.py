"""A certificate authority of a test's own and what it signed, PEM files in one folder: the TLS of the private
servers the managed-store tests start (a Kafka broker, a PostgreSQL server, an Elasticsearch node).

`make_pki(folder)` makes a CA, a server certificate for 127.0.0.1 and localhost, and a client certificate; a second
call in another folder makes a CA that signed none of the first's (what a client that must refuse is given).
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    """The PEM files: the CA's certificate, the server's certificate and key (and all three in one, Kafka's
    keystore), a client certificate and key."""

    ca: Path
    cert: Path
    key: Path
    keystore: Path
    client_cert: Path
    client_key: Path


def make_pki(folder: Path) -> Pki:
    """A CA named after `folder` and, signed by it, a server certificate for 127.0.0.1 / localhost and a client
    certificate (CN `ledger`); valid for a day, keys unencrypted (P-256)."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"ledger test CA {folder.name}")])

    def signed(subject: str, key: ec.EllipticCurvePrivateKey, *extensions: x509.ExtensionType) -> x509.Certificate:
        builder = x509.CertificateBuilder(
            subject_name=x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]) if subject else ca_name,
            issuer_name=ca_name,
            public_key=key.public_key(),
            serial_number=x509.random_serial_number(),
            not_valid_before=now - datetime.timedelta(minutes=5),
            not_valid_after=now + datetime.timedelta(days=1),
        ).add_extension(x509.BasicConstraints(ca=not subject, path_length=None), critical=True)
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    pem = serialization.Encoding.PEM

    def private(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca = signed("", ca_key)
    key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    server = signed("127.0.0.1", key, san)  # no key usage: a node of a cluster is its peers' client too
    client = signed("ledger", client_key, x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]))
    pki = Pki(*(folder / n for n in ("ca.pem", "server.pem", "server.key", "keystore.pem", "client.pem", "client.key")))
    pki.ca.write_bytes(ca.public_bytes(pem))
    pki.cert.write_bytes(server.public_bytes(pem))
    pki.key.write_bytes(private(key))
    pki.keystore.write_bytes(private(key) + server.public_bytes(pem) + ca.public_bytes(pem))
    pki.client_cert.write_bytes(client.public_bytes(pem))
    pki.client_key.write_bytes(private(client_key))
    return pki
