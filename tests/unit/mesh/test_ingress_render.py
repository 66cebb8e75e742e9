"""The ingress listener as rendered from istio/: jwt_authn and RBAC as istiod renders them, TLS, header removal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.common import tokens
from services.mesh.authn import route_match
from services.mesh.authz import anonymous_paths, request_principals
from services.mesh.bootstrap import render
from services.mesh.errors import MeshConfigError
from services.mesh.istio import AuthorizationPolicy
from services.mesh.listeners import hcm_of
from services.mesh.loader import load_istio
from services.mesh.topology import IngressTls
from tests.unit.mesh.conftest import ISTIO, topology

LOAD = "/inference.GRPCInferenceService/RepositoryModelLoad"
UNLOAD = "/inference.GRPCInferenceService/RepositoryModelUnload"


def ingress(paths: list[Path] | None = None, **topo: Any) -> dict[str, Any]:
    rendered = render(load_istio(paths or [ISTIO]), topology(**topo), Path("/tmp/routes"))
    (listener,) = [item for item in rendered.bootstrap["static_resources"]["listeners"] if item["name"] == "ingress"]
    return listener


def filters(paths: list[Path] | None = None, **topo: Any) -> dict[str, dict[str, Any]]:
    """HTTP filter name (the RBAC ones as rbac.DENY / rbac.ALLOW) -> typed_config, in chain order."""
    out = {}
    for f in hcm_of(ingress(paths, **topo))["http_filters"]:
        config = f["typed_config"]
        name = f"rbac.{config['rules']['action']}" if f["name"] == "envoy.filters.http.rbac" else f["name"]
        out[name] = config
    return out


def policy(name: str, action: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "istio-system"},
        "spec": {"selector": {"matchLabels": {"istio": "ingressgateway"}}, "action": action, "rules": rules},
    }


def test_filters_run_authentication_then_authorization_then_the_limits() -> None:
    assert list(filters()) == [
        "envoy.filters.http.jwt_authn",
        "rbac.DENY",  # istiod: DENY policies before ALLOW ones
        "rbac.ALLOW",
        "envoy.filters.http.fault",
        "envoy.filters.http.local_ratelimit",  # EnvoyFilter INSERT_BEFORE the router: sees jwt_authn's subject
        "envoy.filters.http.adaptive_concurrency",  # counts only the calls all the others let through
        "envoy.filters.http.router",
    ]


def test_request_authentication_becomes_jwt_authn_as_istiod_renders_it() -> None:
    jwt = filters()["envoy.filters.http.jwt_authn"]
    (name,) = jwt["providers"]
    provider = jwt["providers"][name]
    assert name == "origins-0"
    assert provider["issuer"] == tokens.LOCAL_ISSUER and provider["audiences"] == [tokens.AUDIENCE]
    assert provider["forward"] is True  # forwardOriginalToken
    assert provider["payload_in_metadata"] == "payload"  # where RBAC's request principal matchers look
    assert provider["claim_to_headers"] == [{"header_name": "x-meshserve-subject", "claim_name": "sub"}]
    placeholder = json.loads(provider["local_jwks"]["inline_string"])
    assert placeholder["keys"][0]["kid"] == "placeholder-not-a-real-key"
    assert jwt["bypass_cors_preflight"] is True


def test_a_token_is_required_wherever_no_allow_rule_admits_anonymous_callers() -> None:
    """Istio's single `allow_missing` requirement would let RBAC answer a missing token with 403."""
    rules = filters()["envoy.filters.http.jwt_authn"]["rules"]
    optional = {"requires_any": {"requirements": [{"provider_name": "origins-0"}, {"allow_missing": {}}]}}
    assert rules == [
        {"match": {"prefix": "/grpc.health.v1.Health/"}, "requires": optional},  # probes: no token needed
        {"match": {"prefix": "/"}, "requires": {"provider_name": "origins-0"}},  # elsewhere: missing is 401
    ]


def test_the_topology_key_replaces_the_placeholder() -> None:
    jwks = tokens.jwks(tokens.new_signing_key())
    jwt = filters(jwks={tokens.LOCAL_ISSUER: jwks})["envoy.filters.http.jwt_authn"]
    assert jwt["providers"]["origins-0"]["local_jwks"] == {"inline_string": jwks}
    with pytest.raises(MeshConfigError, match=r"topology\.jwks: no RequestAuthentication rule .*https://typo"):
        filters(jwks={"https://typo": jwks})


def claim(name: str, match: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "filter": "envoy.filters.http.jwt_authn",
            "path": [{"key": "payload"}, {"key": name}],
            "value": {"string_match": match},
        }
    }


OPERATOR = {"and_ids": {"ids": [claim("iss", {"exact": tokens.LOCAL_ISSUER}), claim("sub", {"exact": "operator"})]}}
ANYONE = {
    "and_ids": {"ids": [claim("iss", {"safe_regex": {"regex": ".+"}}), claim("sub", {"safe_regex": {"regex": ".+"}})]}
}


def test_admin_rpcs_are_denied_unless_the_principal_is_the_operator() -> None:
    deny = filters()["rbac.DENY"]["rules"]["policies"]
    assert deny == {
        "ns[istio-system]-policy[ingress-operator-only]-rule[0]": {
            "permissions": [
                {
                    "and_rules": {
                        "rules": [
                            {
                                "or_rules": {
                                    "rules": [
                                        {"url_path": {"path": {"exact": LOAD}}},
                                        {"url_path": {"path": {"exact": UNLOAD}}},
                                    ]
                                }
                            }
                        ]
                    }
                }
            ],
            "principals": [{"and_ids": {"ids": [{"not_id": OPERATOR}]}}],
        }
    }


def test_allow_rules_open_health_to_all_and_the_rest_to_any_principal() -> None:
    allow = filters()["rbac.ALLOW"]["rules"]["policies"]
    health, authenticated = (allow[f"ns[istio-system]-policy[ingress-authenticated]-rule[{i}]"] for i in (0, 1))
    assert health["permissions"] == [
        {
            "and_rules": {
                "rules": [{"or_rules": {"rules": [{"url_path": {"path": {"prefix": "/grpc.health.v1.Health/"}}}]}}]
            }
        }
    ]
    assert health["principals"] == [{"and_ids": {"ids": [{"any": True}]}}]
    assert authenticated["permissions"] == [{"and_rules": {"rules": [{"any": True}]}}]
    assert authenticated["principals"] == [{"and_ids": {"ids": [ANYONE]}}]


def test_without_authentication_nobody_has_a_principal() -> None:
    rendered = filters(authenticate=False)
    assert "envoy.filters.http.jwt_authn" not in rendered
    allow = rendered["rbac.ALLOW"]["rules"]["policies"]
    # "any authenticated caller" admits every caller; the operator-only DENY rule now denies everyone
    assert allow["ns[istio-system]-policy[ingress-authenticated]-rule[1]"]["principals"] == [
        {"and_ids": {"ids": [{"any": True}]}}
    ]
    assert rendered["rbac.DENY"] == filters()["rbac.DENY"]


@pytest.mark.parametrize(
    ("value", "iss", "sub"),
    [
        ("*", {"safe_regex": {"regex": ".+"}}, {"safe_regex": {"regex": ".+"}}),
        ("https://meshserve.local/operator", {"exact": "https://meshserve.local"}, {"exact": "operator"}),
        ("https://meshserve.local/*", {"exact": "https://meshserve.local"}, {"safe_regex": {"regex": ".+"}}),
        ("https://meshserve.local/ops-*", {"exact": "https://meshserve.local"}, {"prefix": "ops-"}),
        ("*/operator", {"safe_regex": {"regex": ".+"}}, {"exact": "operator"}),
        ("*.local/operator", {"suffix": ".local"}, {"exact": "operator"}),
    ],
)
def test_request_principals_follow_istios_generator(value: str, iss: dict[str, Any], sub: dict[str, Any]) -> None:
    assert request_principals([value]) == {"and_ids": {"ids": [claim("iss", iss), claim("sub", sub)]}}


def test_several_request_principals_are_ored() -> None:
    assert request_principals(["a/b", "c/d"]) == {
        "or_ids": {"ids": [request_principals(["a/b"]), request_principals(["c/d"])]}
    }


def parsed(doc: dict[str, Any]) -> AuthorizationPolicy:
    return AuthorizationPolicy.model_validate(doc)


def test_anonymous_paths_are_those_an_allow_rule_opens_without_a_principal() -> None:
    anyone = {"from": [{"source": {"requestPrincipals": ["*"]}}]}
    health = {"to": [{"operation": {"paths": ["/grpc.health.v1.Health/*"]}}]}
    assert anonymous_paths([parsed(policy("a", "ALLOW", [health, anyone]))]) == ["/grpc.health.v1.Health/*"]
    assert anonymous_paths([parsed(policy("a", "ALLOW", [anyone]))]) == []  # a token everywhere
    assert anonymous_paths([parsed(policy("a", "ALLOW", [health, {}]))]) is None  # a rule for anyone, anywhere
    assert anonymous_paths([parsed(policy("d", "DENY", [health]))]) is None  # no ALLOW policy: Istio's default
    one_source_anonymous = {"from": [{"source": {"requestPrincipals": ["*"]}}, {"source": {}}], **health}
    assert anonymous_paths([parsed(policy("a", "ALLOW", [one_source_anonymous]))]) == ["/grpc.health.v1.Health/*"]


@pytest.mark.parametrize(
    ("pattern", "match"),
    [
        ("*", {"prefix": "/"}),
        ("/grpc.health.v1.Health/*", {"prefix": "/grpc.health.v1.Health/"}),
        ("/a/b", {"path": "/a/b"}),
        ("*/Check", {"safe_regex": {"regex": ".*\\/Check"}}),
    ],
)
def test_requirement_matches_for_policy_paths(pattern: str, match: dict[str, Any]) -> None:
    assert route_match(pattern) == match


def test_several_issuers_get_istios_requirement_forms(write_yaml) -> None:
    doc = {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": "ingress-jwt"},
        "spec": {
            "selector": {"matchLabels": {"istio": "ingressgateway"}},
            "jwtRules": [
                {"issuer": "https://b", "jwks": tokens.jwks(tokens.new_signing_key())},
                {"issuer": "https://a", "jwks": tokens.jwks(tokens.new_signing_key())},
            ],
        },
    }
    jwt = filters([ISTIO, write_yaml("ra.yaml", doc)])["envoy.filters.http.jwt_authn"]
    assert [p["issuer"] for p in jwt["providers"].values()] == ["https://a", "https://b"]  # sorted, as istiod does
    a, b = {"provider_name": "origins-0"}, {"provider_name": "origins-1"}
    missing = {"allow_missing": {}}
    each = [{"requires_any": {"requirements": [a, missing]}}, {"requires_any": {"requirements": [b, missing]}}]
    health, rest = jwt["rules"]
    assert health["requires"] == {"requires_any": {"requirements": [a, b, {"requires_all": {"requirements": each}}]}}
    assert rest["requires"] == {"requires_any": {"requirements": [a, b]}}


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (
            {
                "apiVersion": "security.istio.io/v1",
                "kind": "RequestAuthentication",
                "metadata": {"name": "sidecar-jwt"},
                "spec": {"selector": {"matchLabels": {"app": "gateway"}}, "jwtRules": [{"issuer": "x", "jwks": "{}"}]},
            },
            "only the ingress gateway authenticates",
        ),
        (
            {
                "apiVersion": "security.istio.io/v1",
                "kind": "RequestAuthentication",
                "metadata": {"name": "ingress-jwt"},
                "spec": {"selector": {"matchLabels": {"istio": "ingressgateway"}}, "jwtRules": [{"issuer": "x"}]},
            },
            "jwksUri is not supported locally",
        ),
        ({**policy("everyone", "ALLOW", []), "spec": {"rules": []}}, "no workload selector"),
        (policy("peer", "ALLOW", [{"from": [{"source": {"principals": ["cluster.local/ns/a/sa/b"]}}]}]), "mTLS peer"),
        (policy("verbs", "ALLOW", [{"to": [{"operation": {"methods": ["POST"]}}]}]), "only `paths`"),
        (policy("audit", "AUDIT", [{}]), "spec.action: AUDIT"),
    ],
)
def test_what_the_local_ingress_cannot_enforce_is_an_error(write_yaml, doc: dict[str, Any], fragment: str) -> None:
    with pytest.raises(MeshConfigError, match=fragment):
        filters([ISTIO, write_yaml("bad.yaml", doc)])


def test_a_gateway_with_tls_gets_the_topology_certificate() -> None:
    tls = IngressTls(cert_chain=Path("/certs/ingress.pem"), private_key=Path("/certs/ingress-key.pem"))
    socket = ingress(ingress_tls=tls)["filter_chains"][0]["transport_socket"]
    assert socket["name"] == "envoy.transport_sockets.tls"
    context = socket["typed_config"]["common_tls_context"]
    assert context["tls_certificates"] == [
        {"certificate_chain": {"filename": "/certs/ingress.pem"}, "private_key": {"filename": "/certs/ingress-key.pem"}}
    ]
    assert context["alpn_protocols"] == ["h2", "http/1.1"]  # as istiod's HTTPS servers
    assert context["tls_params"] == {"tls_minimum_protocol_version": "TLSv1_2"}
    assert "transport_socket" not in ingress()["filter_chains"][0]  # no certificate: plaintext (--insecure)


def test_tls_needs_a_gateway_server_that_terminates_it(write_yaml) -> None:
    gateway = {
        "apiVersion": "networking.istio.io/v1",
        "kind": "Gateway",
        "metadata": {"name": "meshserve-ingress"},
        "spec": {
            "selector": {"istio": "ingressgateway"},
            "servers": [{"port": {"number": 80, "name": "grpc", "protocol": "GRPC"}, "hosts": ["*"]}],
        },
    }
    tls = IngressTls(cert_chain=Path("/c.pem"), private_key=Path("/k.pem"))
    with pytest.raises(MeshConfigError, match="no Gateway server of istio/ terminates TLS"):
        ingress([ISTIO, write_yaml("gw.yaml", gateway)], ingress_tls=tls)
    gateway["spec"]["servers"][0]["port"]["protocol"] = "HTTPS"  # HTTPS without `tls`
    with pytest.raises(MeshConfigError, match="an HTTPS server needs `tls`"):
        ingress([ISTIO, write_yaml("gw.yaml", gateway)])


def test_ingress_routes_remove_the_mesh_steering_headers() -> None:
    rendered = render(load_istio([ISTIO]), topology(), Path("/tmp/routes"))
    (route,) = rendered.routes["ingress"]["virtual_hosts"][0]["routes"]
    assert route["request_headers_to_remove"] == ["x-canary", "x-model-version"]
    model_routes = rendered.routes["outbound_model"]["virtual_hosts"][0]["routes"]
    assert not any("request_headers_to_remove" in r for r in model_routes)  # inside the mesh they steer


def test_admin_on_a_unix_socket_is_owner_only() -> None:
    boot = render(load_istio([ISTIO]), topology(admin="unix:/run/meshserve/admin.sock"), Path("/tmp/r")).bootstrap
    assert boot["admin"]["address"] == {"pipe": {"path": "/run/meshserve/admin.sock", "mode": 0o600}}
