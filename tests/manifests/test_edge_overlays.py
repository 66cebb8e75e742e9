"""The edge and cloud overlays of a two-tier deployment: both build and pass the schemas strictly (core and CRD); the
edge runs the INT8 model only, its gateway is the edge tier reaching the cloud through istio/edge's ServiceEntry host
with a token from a cluster Secret, sensitive traffic has no way out, the WAN emulation is gone; the cloud is prod
plus the DENY of the sensitive class at its ingress; the workload rules of the single-tier overlays hold on both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.gateway.settings import GatewaySettings
from services.model.settings import ModelSettings
from tests.manifests import test_workloads as workload_rules
from tests.manifests.support import REPO, Doc, crd_errors, env_of, find, is_crd_kind, kustomize, load_file, one
from tests.manifests.test_build import KUBERNETES_VERSIONS, core_errors

TIERS = {"edge": REPO / "k8s" / "overlays" / "edge", "cloud": REPO / "k8s" / "overlays" / "cloud"}
HEADER = "x-meshserve-data-class"
CLOUD_TOKEN_SECRET = "meshserve-cloud-token"


@pytest.fixture(scope="module")
def tiers() -> dict[str, list[Doc]]:
    return {name: kustomize(path) for name, path in TIERS.items()}


def gateway_container(docs: list[Doc]) -> Doc:
    container: Doc = one(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0]
    return container


# -- builds and validates ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tier", sorted(TIERS))
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_resources_pass_kubernetes_validate_strict(tiers: dict[str, list[Doc]], tier: str, version: str) -> None:
    errors = [e for d in tiers[tier] if not is_crd_kind(d) for e in core_errors(d, version)]
    assert not errors, "\n".join(errors)


@pytest.mark.usefixtures("schemas_dir")
@pytest.mark.parametrize("tier", sorted(TIERS))
def test_custom_resources_pass_strict_crd_schemas(tiers: dict[str, list[Doc]], tier: str) -> None:
    custom = [d for d in tiers[tier] if is_crd_kind(d)]
    assert custom
    errors = [e for d in custom for e in crd_errors(d)]
    assert not errors, "\n".join(errors)


def test_the_single_tier_workload_rules_hold(tiers: dict[str, list[Doc]]) -> None:
    """The cloud is prod plus a policy: prod's rules (GPUs, zones) hold on it; the edge is a CPU cluster as dev is."""
    for name, docs in (("edge", tiers["edge"]), ("prod", tiers["cloud"])):
        overlay = (name, docs)
        workload_rules.test_pods_are_hardened(overlay)
        workload_rules.test_labels_and_service_accounts(overlay)
        workload_rules.test_grpc_probes_and_drain_timing(overlay)
        workload_rules.test_zone_spread_in_prod(overlay)
        workload_rules.test_disruption_budgets_cover_every_deployment(overlay)
        workload_rules.test_volumes_reference_generated_config_maps(overlay)
        workload_rules.test_every_service_takes_its_operator_token_from_the_cluster_secret(overlay)
    workload_rules.test_expected_workloads(("prod", tiers["cloud"]))
    workload_rules.test_mesh_policy_matches_the_workloads(("prod", tiers["cloud"]))


# -- the edge ------------------------------------------------------------------------------------------------------


def service_entry_host(docs: list[Doc]) -> tuple[str, set[int]]:
    (entry,) = find(docs, "ServiceEntry")
    (host,) = entry["spec"]["hosts"]
    assert entry["spec"]["location"] == "MESH_EXTERNAL"
    return host, {p["number"] for p in entry["spec"]["ports"]}


def test_the_edge_gateway_reaches_the_cloud_through_the_service_entry(tiers: dict[str, list[Doc]]) -> None:
    docs = tiers["edge"]
    container = gateway_container(docs)
    env = env_of(container)
    known = {GatewaySettings.env_name(f) for f in GatewaySettings.model_fields}
    assert not sorted(v for v in env if v.startswith("MESHSERVE_GATEWAY_") and v not in known)
    assert env[GatewaySettings.env_name("tier")] == "edge"
    host, ports = service_entry_host(docs)
    cloud_host, _, cloud_port = env[GatewaySettings.env_name("cloud_url")].rpartition(":")
    assert cloud_host == host and int(cloud_port) in ports
    assert GatewaySettings.env_name("cloud_tls_ca_file") not in env, "the sidecar originates TLS"
    token = Path(env[GatewaySettings.env_name("cloud_token_file")])
    (mount,) = [m for m in container["volumeMounts"] if token.parent == Path(m["mountPath"])]
    assert mount["readOnly"] is True
    volumes = one(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == CLOUD_TOKEN_SECRET and volume["secret"]["optional"] is False
    assert not find(docs, "Secret"), "the cloud token is created by the cluster, never committed"


def test_the_edge_serves_the_int8_model_only(tiers: dict[str, list[Doc]]) -> None:
    docs = tiers["edge"]
    models = [d for d in find(docs, "Deployment") if workload_rules.pod_labels(d)["app"] == "model"]
    assert [d["metadata"]["name"] for d in models] == ["model-v2"]
    env = env_of(models[0]["spec"]["template"]["spec"]["containers"][0])
    settings = ModelSettings.model_validate(
        {f: json.loads(env[ModelSettings.env_name(f)]) for f in ("serve_models", "pinned_versions")}
    )
    assert settings.serve_models == ["fraud_mlp"] and settings.pinned_versions == {"fraud_mlp": [2]}
    for hpa in find(docs, "HorizontalPodAutoscaler"):
        one(docs, "Deployment", hpa["spec"]["scaleTargetRef"]["name"])
    (model_vs,) = [v for v in find(docs, "VirtualService") if v["metadata"]["name"] == "model"]
    subsets = {r["destination"]["subset"] for route in model_vs["spec"]["http"] for r in route["route"]}
    assert subsets == {"v2"}
    workload_rules.test_mesh_policy_matches_the_workloads(("edge", inside(docs)))


def inside(docs: list[Doc]) -> list[Doc]:
    """The build less the VirtualService of the external cloud host (its host is no Service of the cluster)."""
    host, _ = service_entry_host(docs)
    return [d for d in docs if not (d["kind"] == "VirtualService" and host in d["spec"]["hosts"])]


def routes_out(docs: list[Doc]) -> list[Doc]:
    host, _ = service_entry_host(docs)
    (vs,) = [v for v in find(docs, "VirtualService") if host in v["spec"]["hosts"]]
    routes: list[Doc] = vs["spec"]["http"]
    return routes


def test_only_general_requests_leave_the_edge(tiers: dict[str, list[Doc]]) -> None:
    """Every route to the cloud host aborts with 403 every time, but the one asking for the general class exactly."""
    routes = routes_out(tiers["edge"])
    assert routes, "no routes out"
    open_routes = [r for r in routes if "abort" not in r.get("fault", {})]
    assert [r["match"] for r in open_routes] == [[{"headers": {HEADER: {"exact": "general"}}}]]
    for route in routes:
        if route not in open_routes:
            assert route["fault"]["abort"] == {"httpStatus": 403, "percentage": {"value": 100}}, route["name"]
    sensitive = [r for r in routes if r.get("match") == [{"headers": {HEADER: {"exact": "sensitive"}}}]]
    assert sensitive and routes.index(sensitive[0]) < routes.index(open_routes[0])


def test_the_wan_emulation_is_not_deployed(tiers: dict[str, list[Doc]]) -> None:
    (local,) = load_file(REPO / "istio" / "edge" / "virtualservice.yaml")
    assert any("delay" in r.get("fault", {}) for r in local["spec"]["http"])  # what the local edge stack renders
    for vs in find(tiers["edge"], "VirtualService"):
        assert not [r["name"] for r in vs["spec"]["http"] if "delay" in r.get("fault", {})], vs["metadata"]["name"]


def test_the_cloud_host_is_reached_over_tls_without_locality_failover(tiers: dict[str, list[Doc]]) -> None:
    docs = tiers["edge"]
    host, _ = service_entry_host(docs)
    (rule,) = [d for d in find(docs, "DestinationRule") if d["spec"]["host"] == host]
    policy = rule["spec"]["trafficPolicy"]
    assert policy["tls"]["mode"] == "SIMPLE" and policy["tls"]["sni"] == host
    assert policy["loadBalancer"]["localityLbSetting"] == {"enabled": False}
    assert "subsets" not in rule["spec"]
    sidecar = one(docs, "Sidecar", "default")
    assert sidecar["spec"]["outboundTrafficPolicy"] == {"mode": "REGISTRY_ONLY"}


# -- the cloud -----------------------------------------------------------------------------------------------------


def test_the_cloud_ingress_denies_the_sensitive_class(tiers: dict[str, list[Doc]]) -> None:
    docs = tiers["cloud"]
    policy = one(docs, "AuthorizationPolicy", "ingress-deny-sensitive")
    assert policy["metadata"]["namespace"] == "istio-system"
    assert policy["spec"]["action"] == "DENY"
    assert policy["spec"]["selector"]["matchLabels"] in [g["spec"]["selector"] for g in find(docs, "Gateway")]
    assert policy["spec"]["rules"] == [{"when": [{"key": f"request.headers[{HEADER}]", "values": ["sensitive"]}]}]
    assert env_of(gateway_container(docs))[GatewaySettings.env_name("tier")] == "cloud"
    assert not find(docs, "ServiceEntry")
