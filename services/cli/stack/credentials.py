"""The local stack's secrets in `<log-dir>/secrets/` (0700, files 0600), made once at `meshserve up` and reused: a
local CA and the ingress certificate it signs, the ES256 key that signs callers' tokens and its JWKS, the operator's
token every service checks, Valkey's password, and the internal token the stack's processes show one another on their
inner endpoints (/metrics, /recording/*, the trace store's OTLP receiver); and the trace UI's token, made afresh at
every `up` as Jupyter's is."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common import tokens

SECRETS_DIR = "secrets"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
CA_DAYS = 3650
CERT_DAYS = 365
RENEW_DAYS = 30  # a certificate with fewer days left is made again at `up`
WILDCARD_HOSTS = ("0.0.0.0", "::", "")  # bind-all addresses: nobody dials them, so no certificate names them


class SecretsError(RuntimeError):
    """The stack's secrets are missing or unreadable (the message says where, and that `meshserve up` makes them)."""


def _write(path: Path, data: bytes) -> None:
    """Replace `path` with `data`, readable by its owner only from the first byte on."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    tmp.replace(path)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: Iterable[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(h for h in hosts if h not in WILDCARD_HOSTS):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _fresh(cert: x509.Certificate) -> bool:
    return cert.not_valid_after_utc - _now() > dt.timedelta(days=RENEW_DAYS)


@dataclass(frozen=True)
class StackSecrets:
    """The files of one stack's secrets folder, and what is read or minted from them."""

    dir: Path

    @classmethod
    def of(cls, log_dir: Path) -> StackSecrets:
        return cls(log_dir.resolve() / SECRETS_DIR)

    @property
    def ca_cert(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.dir / "ca-key.pem"

    @property
    def ingress_cert(self) -> Path:
        return self.dir / "ingress.pem"

    @property
    def ingress_key(self) -> Path:
        return self.dir / "ingress-key.pem"

    @property
    def signing_key(self) -> Path:
        return self.dir / "signing-key.pem"

    @property
    def jwks_file(self) -> Path:
        return self.dir / "jwks.json"

    @property
    def operator_token_file(self) -> Path:
        return self.dir / "operator-token"

    @property
    def valkey_password_file(self) -> Path:
        return self.dir / "valkey-password"

    @property
    def internal_token_file(self) -> Path:
        return self.dir / "internal-token"

    @property
    def ui_token_file(self) -> Path:
        return self.dir / "traces-ui-token"

    # -- made at `up` ------------------------------------------------------------------------------------

    @classmethod
    def ensure(cls, log_dir: Path, hosts: Iterable[str] = ()) -> StackSecrets:
        """The secrets of the stack in `log_dir`, making whatever is missing, stale or inconsistent: a CA that
        expires within RENEW_DAYS, an ingress certificate not issued by the CA or not naming every host (loopback
        always, plus `hosts`), a JWKS that is not the signing key's."""
        s = cls.of(log_dir)
        s.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(s.dir, 0o700)
        for path in s.dir.iterdir():
            if path.is_file():
                os.chmod(path, 0o600)
        ca, ca_key, new_ca = s._ensure_ca()
        s._ensure_ingress(ca, ca_key, (*LOOPBACK_NAMES, *hosts), new_ca)
        if not s.signing_key.is_file():
            _write(s.signing_key, tokens.new_signing_key())
        jwks = tokens.jwks(s.signing_key.read_bytes()).encode()
        if not s.jwks_file.is_file() or s.jwks_file.read_bytes() != jwks:
            _write(s.jwks_file, jwks)
        for path in (s.operator_token_file, s.valkey_password_file, s.internal_token_file):
            if not path.is_file() or not path.read_text().strip():
                _write(path, secrets.token_urlsafe(32).encode())
        return s

    def _ensure_ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, bool]:
        try:
            ca = x509.load_pem_x509_certificate(self.ca_cert.read_bytes())
            key = serialization.load_pem_private_key(self.ca_key.read_bytes(), password=None)
            if isinstance(key, ec.EllipticCurvePrivateKey) and _fresh(ca) and ca.public_key() == key.public_key():
                return ca, key, False
        except (OSError, ValueError):
            pass
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshserve local CA")])
        now = _now()
        ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256())
        )
        _write(self.ca_key, _private_pem(key))
        _write(self.ca_cert, ca.public_bytes(serialization.Encoding.PEM))
        return ca, key, True

    def _ensure_ingress(
        self, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, hosts: Iterable[str], new_ca: bool
    ) -> None:
        wanted = _san(hosts)
        if not new_ca:
            try:
                cert = x509.load_pem_x509_certificate(self.ingress_cert.read_bytes())
                key = serialization.load_pem_private_key(self.ingress_key.read_bytes(), password=None)
                cert.verify_directly_issued_by(ca)
                named = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
                if _fresh(cert) and cert.public_key() == key.public_key() and set(wanted) <= set(named):
                    return
            except (OSError, ValueError, TypeError, x509.ExtensionNotFound, InvalidSignature):
                pass
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "meshserve local ingress")]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CERT_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(wanted), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write(self.ingress_key, _private_pem(key))
        _write(self.ingress_cert, cert.public_bytes(serialization.Encoding.PEM))

    # -- read by the CLI and the stack -------------------------------------------------------------------

    def _read(self, path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as e:
            raise SecretsError(
                f"cannot read {path} ({e.strerror}); `meshserve up --log-dir {self.dir.parent}` makes it"
            ) from None

    def operator_token(self) -> str:
        return self._read(self.operator_token_file).decode().strip()

    def valkey_password(self) -> str:
        return self._read(self.valkey_password_file).decode().strip()

    def jwks(self) -> str:
        return self._read(self.jwks_file).decode()

    def internal_token(self) -> str:
        """The bearer token the stack's inner endpoints require (services.common.internal_auth)."""
        return self._read(self.internal_token_file).decode().strip()

    def renew_ui_token(self) -> str:
        """A fresh token for the trace UI (each `up` makes one, so an address shared before no longer opens it)."""
        token = secrets.token_urlsafe(24)
        _write(self.ui_token_file, token.encode())
        return token

    def ui_token(self) -> str:
        return self._read(self.ui_token_file).decode().strip()

    def ca_pem(self) -> bytes:
        return self._read(self.ca_cert)

    def mint(self, subject: str, ttl_s: float = tokens.DEFAULT_TTL_S) -> str:
        """A token for `subject` (tokens.OPERATOR_SUBJECT for the operator) signed with the stack's key."""
        return tokens.mint(self._read(self.signing_key), subject, ttl_s=ttl_s)


def state_internal_token(state: Mapping[str, Any] | None) -> str:
    """The internal token of the stack whose stack.json is `state`, for a client of its /metrics or /recording/*
    ('' when it names no secrets folder or the token cannot be read: those endpoints are then open, or not ours)."""
    folder = (state or {}).get("secrets_dir")
    if not folder:
        return ""
    try:
        return StackSecrets(Path(str(folder))).internal_token()
    except SecretsError:
        return ""
