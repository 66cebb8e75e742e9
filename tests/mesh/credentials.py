"""Credentials for tests of the secure ingress: a token issuer (signing key, JWKS, tokens) and a throwaway CA."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.common import tokens
from services.mesh.topology import IngressTls


@dataclass(frozen=True)
class Issuer:
    """A signing key of the local issuer and the JWKS that verifies it (MeshTopology.jwks)."""

    key: bytes

    @classmethod
    def new(cls) -> Issuer:
        return cls(tokens.new_signing_key())

    @property
    def jwks(self) -> str:
        return tokens.jwks(self.key)

    @property
    def topology_jwks(self) -> dict[str, str]:
        return {tokens.LOCAL_ISSUER: self.jwks}

    def token(self, subject: str, **kwargs: Any) -> str:
        return tokens.mint(self.key, subject, **kwargs)

    def bearer(self, subject: str, **kwargs: Any) -> tuple[str, str]:
        """The gRPC metadata pair carrying a token for `subject`."""
        return ("authorization", f"Bearer {self.token(subject, **kwargs)}")


@dataclass(frozen=True)
class Pki:
    """A CA and a server certificate it signed for 127.0.0.1 / localhost / ::1, as files."""

    ca_pem: bytes
    ca_path: Path
    ingress_tls: IngressTls


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("meshserve test CA"))
        .issuer_name(_name("meshserve test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    names = [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("meshserve ingress"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    chain, private = folder / "ingress.pem", folder / "ingress-key.pem"
    chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    private.chmod(0o600)
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    (folder / "ca.pem").write_bytes(ca_pem)
    return Pki(ca_pem, folder / "ca.pem", IngressTls(cert_chain=chain, private_key=private))
