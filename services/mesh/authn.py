"""The ingress gateway's RequestAuthentication rules to Envoy's jwt_authn filter, rendered as istiod renders them
but for one thing: a missing token is refused by jwt_authn (401) where no ALLOW rule admits a caller without one.

istiod (pilot/pkg/security/authn, convertToEnvoyJwtConfig) makes one provider `origins-<i>` per rule (sorted by
issuer) with the payload in dynamic metadata under `payload`, and one requirement for every path: a valid token of
some provider, or no token at all (`allow_missing`). A bad token is then 401, but a missing one passes jwt_authn and
is refused by RBAC with 403, which a gRPC client sees as PERMISSION_DENIED, "you may not", where the truth is "who
are you?", UNAUTHENTICATED. So on the paths where RBAC could only refuse an anonymous caller the requirement here is
a valid token (no allow_missing); the paths an ALLOW rule opens to anonymous callers (health probes) keep Istio's
requirement. What is allowed is unchanged: only the status of the refusal differs.

Unlike istiod, every provider also requires `exp` (`require_expiration`): a token signed with the right key but
without an expiry would otherwise never expire. (Istio's JWTRule has no such field; in a cluster an
AuthorizationPolicy `when: request.auth.claims[exp]` does the same.)

Envoy's own calls to the OTLP collector (its tracer and its access log) carry the stack's internal credential when
the topology names its file (add_otlp_credential), as every process of the stack sends it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from services.mesh.authz import JWT_FILTER, JWT_PAYLOAD
from services.mesh.clusters import OTLP_CLUSTER
from services.mesh.errors import MeshConfigError
from services.mesh.gateways import selects_ingress
from services.mesh.istio import JWTRule
from services.mesh.loader import IstioConfig

JWT_TYPE = "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication"
SPACE_DELIMITED_CLAIMS = ["permission", "scope"]  # Istio's default list (buildSpaceDelimitedClaims)


def ingress_jwt_rules(istio: IstioConfig) -> list[tuple[JWTRule, str]]:
    """(rule, where) of every RequestAuthentication of the ingress gateway, sorted by issuer as istiod sorts them."""
    out: list[tuple[JWTRule, str]] = []
    for ra in istio.request_authentications:
        where = f"{ra.source}: RequestAuthentication '{ra.metadata.name}'"
        labels = ra.spec.selector.match_labels if ra.spec.selector else None
        if not selects_ingress(istio, labels, f"{where}: spec.selector"):
            raise MeshConfigError(
                f"{where}: spec.selector: only the ingress gateway authenticates callers in the local mesh "
                "(its sidecars have no jwt_authn)"
            )
        out.extend((rule, f"{where}: spec.jwtRules.{i}") for i, rule in enumerate(ra.spec.jwt_rules))
    return sorted(out, key=lambda item: item[0].issuer)


def check_jwks(rules: list[tuple[JWTRule, str]], jwks: Mapping[str, str]) -> None:
    """Every issuer the topology gives keys for has a rule (a misspelt issuer would leave the placeholder key)."""
    issuers = {rule.issuer for rule, _ in rules}
    unknown = sorted(set(jwks) - issuers)
    if unknown:
        raise MeshConfigError(f"topology.jwks: no RequestAuthentication rule of the ingress for issuer(s) {unknown}")


def provider(rule: JWTRule, jwks: Mapping[str, str], where: str) -> dict[str, Any]:
    keys = jwks.get(rule.issuer, rule.jwks)
    if keys is None:
        raise MeshConfigError(f"{where}: no `jwks` (jwksUri is not supported locally) and none in topology.jwks")
    out: dict[str, Any] = {"issuer": rule.issuer}
    if rule.audiences:
        out["audiences"] = list(rule.audiences)
    if rule.forward_original_token:
        out["forward"] = True
    out["require_expiration"] = True
    out["payload_in_metadata"] = JWT_PAYLOAD
    out["normalize_payload_in_metadata"] = {"space_delimited_claims": list(SPACE_DELIMITED_CLAIMS)}
    if rule.output_claim_to_headers:
        out["claim_to_headers"] = [
            {"header_name": c.header, "claim_name": c.claim} for c in rule.output_claim_to_headers
        ]
    out["local_jwks"] = {"inline_string": keys}
    return out


def route_match(pattern: str) -> dict[str, Any]:
    """A requirement rule's match for an AuthorizationPolicy path pattern (`*`, `/a/*`, `*/b` or exact)."""
    if pattern == "*":
        return {"prefix": "/"}
    if pattern.endswith("*"):
        return {"prefix": pattern[:-1]}
    if pattern.startswith("*"):
        suffix = "".join("\\" + c if not c.isalnum() else c for c in pattern[1:])
        return {"safe_regex": {"regex": f".*{suffix}"}}
    return {"path": pattern}


def jwt_authn_filter(
    rules: list[tuple[JWTRule, str]], jwks: Mapping[str, str], anonymous: list[str] | None
) -> dict[str, Any] | None:
    """The jwt_authn HTTP filter, or None without rules; `anonymous`: services.mesh.authz.anonymous_paths."""
    if not rules:
        return None
    providers = {f"origins-{i}": provider(rule, jwks, where) for i, (rule, where) in enumerate(rules)}
    names = [{"provider_name": name} for name in providers]
    allow_missing: dict[str, Any] = {"allow_missing": {}}
    if len(names) == 1:
        optional: dict[str, Any] = {"requires_any": {"requirements": [names[0], allow_missing]}}
        required: dict[str, Any] = copy.deepcopy(names[0])
    else:  # Istio's form for several providers: any one of them, or every token present valid
        each = [{"requires_any": {"requirements": [n, allow_missing]}} for n in names]
        optional = copy.deepcopy({"requires_any": {"requirements": [*names, {"requires_all": {"requirements": each}}]}})
        required = {"requires_any": {"requirements": copy.deepcopy(names)}}
    if anonymous is None:
        requirement_rules = [{"match": {"prefix": "/"}, "requires": optional}]
    else:
        requirement_rules = [{"match": route_match(p), "requires": copy.deepcopy(optional)} for p in anonymous]
        requirement_rules.append({"match": {"prefix": "/"}, "requires": required})  # missing token: 401, see above
    config = {"@type": JWT_TYPE, "providers": providers, "rules": requirement_rules, "bypass_cors_preflight": True}
    return {"name": JWT_FILTER, "typed_config": config}


def read_token(path: Path) -> str:
    """The bearer token in `path` (MeshConfigError when it cannot be read or is empty)."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise MeshConfigError(f"topology.otlp_token_file: cannot read {path} ({exc.strerror})") from None
    if not token:
        raise MeshConfigError(f"topology.otlp_token_file: {path} is empty")
    return token


def add_otlp_credential(config: Any, token: str) -> None:
    """Give every gRPC service of `config` (listeners: the tracers and access loggers) that calls the OTLP collector
    an `authorization: Bearer <token>` header (grpc_service.initial_metadata), in place."""
    if isinstance(config, list):
        for item in config:
            add_otlp_credential(item, token)
    elif isinstance(config, dict):
        service = config.get("grpc_service")
        if isinstance(service, dict) and service.get("envoy_grpc", {}).get("cluster_name") == OTLP_CLUSTER:
            service["initial_metadata"] = [{"key": "authorization", "value": f"Bearer {token}"}]
        for value in config.values():
            add_otlp_credential(value, token)
