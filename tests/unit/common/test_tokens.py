"""Tokens minted from a local key verify against its JWKS, and nothing else does."""

from __future__ import annotations

import json

import pytest

from services.common import tokens


def test_minted_token_verifies_and_names_its_principal() -> None:
    key = tokens.new_signing_key()
    claims = tokens.verify(tokens.mint(key, "alice"), tokens.jwks(key))
    assert claims.subject == "alice"
    assert claims.principal == "https://meshserve.local/alice"


def test_jwks_holds_only_the_public_half() -> None:
    (entry,) = json.loads(tokens.jwks(tokens.new_signing_key()))["keys"]
    assert entry["kty"] == "EC" and entry["crv"] == "P-256" and entry["kid"] == tokens.KEY_ID
    assert "d" not in entry


def test_token_from_another_key_is_refused() -> None:
    token = tokens.mint(tokens.new_signing_key(), "mallory")
    with pytest.raises(tokens.TokenError, match="signature"):
        tokens.verify(token, tokens.jwks(tokens.new_signing_key()))


def test_expired_and_wrong_audience_tokens_are_refused() -> None:
    key = tokens.new_signing_key()
    with pytest.raises(tokens.TokenError, match="expired"):
        tokens.verify(tokens.mint(key, "bob", ttl_s=-10), tokens.jwks(key))
    with pytest.raises(tokens.TokenError, match="InvalidAudience"):
        tokens.verify(tokens.mint(key, "bob", audience="other"), tokens.jwks(key))


@pytest.mark.parametrize("subject", ["", "a/b", "x" * 129, "bad\nline"])
def test_subject_must_be_a_plain_name(subject: str) -> None:
    with pytest.raises(tokens.TokenError):
        tokens.mint(tokens.new_signing_key(), subject)
