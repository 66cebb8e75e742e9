"""The local stack's secrets: made once in <log-dir>/secrets (0700, files 0600), reused, remade only when missing,
stale or inconsistent; a CA whose ingress certificate names loopback; tokens that verify against the JWKS."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from services.cli.stack.credentials import SecretsError, StackSecrets
from services.common import tokens

FILES = {
    "ca.pem",
    "ca-key.pem",
    "ingress.pem",
    "ingress-key.pem",
    "signing-key.pem",
    "jwks.json",
    "operator-token",
    "valkey-password",
    "internal-token",
}


def contents(s: StackSecrets) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in s.dir.iterdir()}


def test_made_once_owner_only_and_reused(tmp_path: Path) -> None:
    s = StackSecrets.ensure(tmp_path / "logs")
    assert s.dir == (tmp_path / "logs" / "secrets").resolve()
    assert {p.name for p in s.dir.iterdir()} == FILES
    assert stat.S_IMODE(s.dir.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in s.dir.iterdir())
    first = contents(s)
    assert contents(StackSecrets.ensure(tmp_path / "logs")) == first  # the next `up` keeps them
    assert len(s.operator_token()) >= 40 and len(s.valkey_password()) >= 40
    assert s.operator_token() != s.valkey_password()
    assert len(s.internal_token()) >= 40 and s.internal_token() not in (s.operator_token(), s.valkey_password())


def test_the_trace_ui_token_is_new_at_every_up(tmp_path: Path) -> None:
    s = StackSecrets.ensure(tmp_path)
    with pytest.raises(SecretsError, match="meshserve up"):
        s.ui_token()
    first = s.renew_ui_token()
    assert s.ui_token() == first and len(first) >= 32
    assert stat.S_IMODE(s.ui_token_file.stat().st_mode) == 0o600
    assert s.renew_ui_token() != first


def test_loose_permissions_are_tightened(tmp_path: Path) -> None:
    s = StackSecrets.ensure(tmp_path)
    os.chmod(s.dir, 0o755)
    os.chmod(s.operator_token_file, 0o644)
    StackSecrets.ensure(tmp_path)
    assert stat.S_IMODE(s.dir.stat().st_mode) == 0o700
    assert stat.S_IMODE(s.operator_token_file.stat().st_mode) == 0o600


def test_the_ingress_certificate_is_issued_by_the_ca_for_loopback(tmp_path: Path) -> None:
    s = StackSecrets.ensure(tmp_path)
    ca = x509.load_pem_x509_certificate(s.ca_pem())
    cert = x509.load_pem_x509_certificate(s.ingress_cert.read_bytes())
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    }
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=300)


def test_only_what_is_stale_is_made_again(tmp_path: Path) -> None:
    s = StackSecrets.ensure(tmp_path)
    first = contents(s)
    StackSecrets.ensure(tmp_path, hosts=["10.1.2.3", "0.0.0.0"])  # another bind address: the certificate names it
    changed = {k for k, v in contents(s).items() if first[k] != v}
    assert changed == {"ingress.pem", "ingress-key.pem"}
    cert = x509.load_pem_x509_certificate(s.ingress_cert.read_bytes())
    ips = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)
    assert ipaddress.ip_address("10.1.2.3") in ips and ipaddress.ip_address("0.0.0.0") not in ips

    second = contents(s)
    s.ca_key.unlink()  # a new CA: the ingress certificate it issued before must go too
    StackSecrets.ensure(tmp_path)
    changed = {k for k, v in contents(s).items() if second[k] != v}
    assert changed == {"ca.pem", "ca-key.pem", "ingress.pem", "ingress-key.pem"}

    third = contents(s)
    s.jwks_file.write_text('{"keys": []}')  # a JWKS that is not the signing key's is rewritten from it
    s.operator_token_file.write_text("")
    StackSecrets.ensure(tmp_path)
    assert contents(s)["jwks.json"] == third["jwks.json"]
    assert s.operator_token() and contents(s)["operator-token"] != third["operator-token"]


def test_minted_tokens_verify_against_the_jwks(tmp_path: Path) -> None:
    s = StackSecrets.ensure(tmp_path)
    claims = tokens.verify(s.mint("alice", ttl_s=60), s.jwks())
    assert claims.principal == "https://meshserve.local/alice"
    other = StackSecrets.ensure(tmp_path / "other")
    with pytest.raises(tokens.TokenError):
        tokens.verify(other.mint("alice"), s.jwks())


def test_missing_secrets_say_how_to_make_them(tmp_path: Path) -> None:
    s = StackSecrets.of(tmp_path)
    with pytest.raises(SecretsError, match="meshserve up --log-dir"):
        s.mint("alice")
    with pytest.raises(SecretsError, match="valkey-password"):
        s.valkey_password()
