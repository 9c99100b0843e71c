"""Certificates for the tests' TLS servers (a Redis, a Kafka broker): a CA, a server certificate
for 127.0.0.1 and a client certificate it signed, as PEM files (keys unencrypted PKCS#8, the form
both OpenSSL and Java's PEM key stores read)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def tls_files(d: Path) -> TlsFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def cert(cn: str, key, issuer: x509.Name, signer, *, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(hours=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:  # a server's name is checked against it (librdkafka, Java, redis-py)
            san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
            builder = builder.add_extension(san, critical=False)
        return builder.sign(signer, hashes.SHA256())

    def write(path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        return path

    def pem_key(key) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = cert("test CA", ca_key, name("test CA"), ca_key, ca=True)
    out = {"ca": write(d / "ca.pem", ca.public_bytes(serialization.Encoding.PEM))}
    for who in ("server", "client"):
        key = ec.generate_private_key(ec.SECP256R1())
        signed = cert("127.0.0.1" if who == "server" else "social", key, ca.subject, ca_key, ca=False)
        out[f"{who}_cert"] = write(d / f"{who}.pem", signed.public_bytes(serialization.Encoding.PEM))
        out[f"{who}_key"] = write(d / f"{who}.key", pem_key(key))
    return TlsFiles(**out)
