"""Caller tokens: ES256 JWTs that the ingress (Envoy's jwt_authn, from istio/'s RequestAuthentication) and the
gateway check, minted from a local signing key and verified against its JWKS."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

LOCAL_ISSUER = "https://meshserve.local"
"""The issuer of tokens `meshserve up` signs (istio/requestauthentication.yaml names it)."""
AUDIENCE = "meshserve"
OPERATOR_SUBJECT = "operator"
"""The subject of the operator's token: the only caller that may load or unload models."""
ALGORITHM = "ES256"
KEY_ID = "meshserve-local-1"
DEFAULT_TTL_S = 30 * 24 * 3600


class TokenError(ValueError):
    """A token that does not verify: its message says why, without echoing the token."""


@dataclass(frozen=True)
class Claims:
    issuer: str
    subject: str
    expires_at: float

    @property
    def principal(self) -> str:
        """Istio's request principal, `<iss>/<sub>`."""
        return f"{self.issuer}/{self.subject}"


def new_signing_key() -> bytes:
    """A fresh P-256 private key, PEM (PKCS#8, unencrypted: it lives in a 0600 file of the local stack)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def jwks(private_key_pem: bytes, key_id: str = KEY_ID) -> str:
    """The JSON Web Key Set (public half only) that verifies tokens signed with `private_key_pem`."""
    key = serialization.load_pem_private_key(private_key_pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TokenError("the signing key is not an EC key")
    public: dict[str, Any] = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
    public.update({"kid": key_id, "alg": ALGORITHM, "use": "sig"})
    return json.dumps({"keys": [public]}, sort_keys=True)


def mint(
    private_key_pem: bytes,
    subject: str,
    *,
    issuer: str = LOCAL_ISSUER,
    audience: str = AUDIENCE,
    ttl_s: float = DEFAULT_TTL_S,
    key_id: str = KEY_ID,
    now: float | None = None,
) -> str:
    """A signed token for `subject`, valid `ttl_s` from now."""
    if not subject or len(subject) > 128 or not subject.isprintable() or "/" in subject:
        raise TokenError("a token's subject is 1-128 printable characters without '/'")
    issued = time.time() if now is None else now
    claims = {
        "iss": issuer,
        "sub": subject,
        "aud": audience,
        "iat": int(issued),
        "exp": int(issued + ttl_s),
        "jti": uuid.uuid4().hex,
    }
    return jwt.encode(claims, private_key_pem, algorithm=ALGORITHM, headers={"kid": key_id})


def verify(token: str, jwks_json: str, *, issuer: str = LOCAL_ISSUER, audience: str = AUDIENCE) -> Claims:
    """The token's claims when it is signed by a key of `jwks_json`, from `issuer`, for `audience`, unexpired."""
    try:
        keys = jwt.PyJWKSet.from_json(jwks_json)
        kid = jwt.get_unverified_header(token).get("kid")
        candidates = [k for k in keys.keys if kid is None or k.key_id == kid]
        if not candidates:
            raise TokenError("the token's key id is not in the JWKS")
        for candidate in candidates:
            try:
                decoded = jwt.decode(
                    token,
                    candidate.key,
                    algorithms=[ALGORITHM],
                    audience=audience,
                    issuer=issuer,
                    options={"require": ["exp", "iss", "sub", "aud"]},
                )
                return Claims(decoded["iss"], decoded["sub"], float(decoded["exp"]))
            except jwt.InvalidSignatureError:
                continue
        raise TokenError("the token's signature does not verify")
    except TokenError:
        raise
    except jwt.ExpiredSignatureError as exc:
        raise TokenError("the token has expired") from exc
    except jwt.PyJWTError as exc:
        raise TokenError(f"the token is not valid: {type(exc).__name__}") from exc
