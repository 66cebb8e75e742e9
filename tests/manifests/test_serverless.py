"""The serverless overlay: it builds and validates strictly, each model Deployment is scaled by one KEDA ScaledObject
whose triggers follow the mesh's routing and the pipelines, the windows outlast a cold start, the gateway, feature,
cache and scaler never reach zero, and the scaler is deployed like the other services."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from services.gateway.settings import GatewaySettings
from services.scaler.settings import ScalerSettings
from tests.manifests import test_autoscaling as autoscaling_rules
from tests.manifests import test_workloads as workload_rules
from tests.manifests.support import REPO, Doc, crd_errors, env_of, find, ident, is_crd_kind, kustomize, one
from tests.manifests.test_build import KUBERNETES_VERSIONS, core_errors
from tests.manifests.test_schema_strictness import with_typo

SERVERLESS = REPO / "k8s" / "overlays" / "serverless"
# A model pod's cold start on Kubernetes, creation to SERVING, as a budget: scheduling, the init container's copy
# of the repository, the Istio sidecar (the app waits for it), then the process's own load and warm-up. That last
# part was measured locally at 0.94, 1.15 and 1.07 s (CPU, the demo repository); CUDA initialisation on a GPU node
# adds tens of seconds. 60 s covers a node that already holds the image. A pull onto a fresh node takes longer
# (the startup probe allows 300 s), but a window has to outlast the usual cold start, not the worst one.
COLD_START_S = 60
# Demand (in-flight plus parked calls) one model replica should carry, as the base HPA's queue target: a batch of
# up to 128 rows computes at once, and at 32 waiting per pod the batcher saturates.
TARGET_PER_REPLICA = 32.0
SCALER = "meshserve-scaler"
SCALER_PORT, SCALER_METRICS_PORT = 8005, 9005
# Never scaled to zero: the gateway parks requests for a sleeping model and reports the demand that wakes it;
# every request passes through feature and cache; the scaler is what KEDA asks.
NEVER_AT_ZERO = ("gateway", "feature", "cache", SCALER)
EXTERNAL_SCALER_PATHS = ["/externalscaler.ExternalScaler/*"]


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return kustomize(SERVERLESS)


def scaled_objects(docs: list[Doc]) -> list[Doc]:
    return find(docs, "ScaledObject")


def model_deployments(docs: list[Doc]) -> list[Doc]:
    return [d for d in find(docs, "Deployment") if workload_rules.pod_labels(d).get("app") == "model"]


def autoscalers_of(docs: list[Doc], deployment: str) -> list[Doc]:
    """The HPAs and ScaledObjects whose target is this Deployment."""
    return [
        a
        for a in find(docs, "HorizontalPodAutoscaler") + scaled_objects(docs)
        if a["spec"]["scaleTargetRef"]["name"] == deployment
        and a["spec"]["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
    ]


def demand_triggers(scaled: Doc) -> list[dict[str, Any]]:
    return [t for t in scaled["spec"]["triggers"] if t["type"] == "external-push"]


def without_scaler(docs: list[Doc]) -> list[Doc]:
    """The build less the scaler's Deployment, for the shared workload rules that map every Deployment to one of the
    four request-path services or spread it over zones (test_scaler_is_deployed_like_the_other_services checks the
    scaler; one replica has nothing to spread)."""
    return [d for d in docs if not (d["kind"] == "Deployment" and d["metadata"]["name"] == SCALER)]


# -- builds and validates ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_resources_pass_kubernetes_validate_strict(docs: list[Doc], version: str) -> None:
    errors = [e for d in docs if not is_crd_kind(d) for e in core_errors(d, version)]
    assert not errors, "\n".join(errors)


@pytest.mark.usefixtures("schemas_dir")
def test_custom_resources_pass_strict_crd_schemas(docs: list[Doc]) -> None:
    custom = [d for d in docs if is_crd_kind(d)]
    assert scaled_objects(docs), "no ScaledObject in the serverless build"
    errors = [e for d in custom for e in crd_errors(d)]
    assert not errors, "\n".join(errors)


@pytest.mark.usefixtures("schemas_dir")
def test_scaledobject_typos_fail(docs: list[Doc]) -> None:
    """KEDA's schema gets the same tightening as the other CRDs: misspelled keys and wrong types fail."""
    scaled = one(docs, "ScaledObject", "model-v2")
    assert not crd_errors(scaled)
    assert crd_errors(with_typo(scaled, ["spec", "cooldownPeriod"], "coolDownPeriod"))
    behavior = ["spec", "advanced", "horizontalPodAutoscalerConfig", "behavior"]
    assert crd_errors(with_typo(scaled, [*behavior, "scaleDown", "stabilizationWindowSeconds"], "stabilizationWindow"))
    assert crd_errors(with_typo(scaled, ["spec", "triggers", 0, "metadata"], "metdata"))
    wrong_type = copy.deepcopy(scaled)
    wrong_type["spec"]["minReplicaCount"] = "zero"
    assert crd_errors(wrong_type)


def test_the_shared_workload_rules_hold(docs: list[Doc]) -> None:
    """The rules every other overlay meets (hardening, ports, settings, budgets, config maps, mesh policy, HPAs). The
    overlay is built on prod, so the rules that tell prod by the overlay's name (GPUs, zones) see it as prod."""
    overlay = ("prod-serverless", docs)
    for rule in (
        workload_rules.test_pods_are_hardened,
        workload_rules.test_services_and_ports,
        workload_rules.test_gateway_and_model_settings,
        workload_rules.test_disruption_budgets_cover_every_deployment,
        workload_rules.test_volumes_reference_generated_config_maps,
        workload_rules.test_redis_is_reachable_only_from_feature_and_cache,
        workload_rules.test_mesh_policy_matches_the_workloads,
        autoscaling_rules.test_hpas_target_existing_deployments_without_fixed_replicas,
        autoscaling_rules.test_gateway_scales_on_cpu_and_inflight,
        autoscaling_rules.test_adapter_serves_every_custom_metric,
    ):
        rule(overlay)
    for rule in (
        workload_rules.test_labels_and_service_accounts,
        workload_rules.test_grpc_probes_and_drain_timing,
        workload_rules.test_zone_spread_in_prod,
        workload_rules.test_every_service_takes_its_operator_token_from_the_cluster_secret,
    ):
        rule(("prod-serverless", without_scaler(docs)))


# -- who scales what -----------------------------------------------------------------------------------------------


def test_every_model_deployment_has_one_scaledobject_and_no_hpa(docs: list[Doc]) -> None:
    models = model_deployments(docs)
    assert {d["metadata"]["name"] for d in models} == {"model-v1", "model-v2"}
    for deployment in models:
        name = deployment["metadata"]["name"]
        scalers = autoscalers_of(docs, name)
        assert [ident(a) for a in scalers] == [f"ScaledObject/{name}"], f"{name}: {[ident(a) for a in scalers]}"
        scaled = scalers[0]
        assert scaled["metadata"]["namespace"] == deployment["metadata"]["namespace"]
        assert "replicas" not in deployment["spec"], f"{name}: KEDA's HPA owns replicas; kubectl apply would reset it"
        assert 0 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]
    targets = {s["spec"]["scaleTargetRef"]["name"] for s in scaled_objects(docs)}
    assert targets == {d["metadata"]["name"] for d in models}, "a ScaledObject for something other than a model"


def test_no_workload_has_two_autoscalers(docs: list[Doc]) -> None:
    """KEDA's webhook refuses a ScaledObject on a Deployment another HPA scales, and two would fight over replicas."""
    for deployment in find(docs, "Deployment"):
        name = deployment["metadata"]["name"]
        assert len(autoscalers_of(docs, name)) <= 1, name


def test_gateway_feature_cache_and_scaler_never_reach_zero(docs: list[Doc]) -> None:
    for name in NEVER_AT_ZERO:
        deployment = one(docs, "Deployment", name)
        scalers = autoscalers_of(docs, name)
        if not scalers:
            assert deployment["spec"].get("replicas", 1) >= 1, name
        for scaler in scalers:
            spec = scaler["spec"]
            low = (
                spec.get("minReplicas", 1)
                if scaler["kind"] == "HorizontalPodAutoscaler"
                else spec.get("minReplicaCount", 0)
            )
            assert low >= 1, f"{ident(scaler)} lets {name} reach zero"
            assert "idleReplicaCount" not in spec, f"{ident(scaler)}: idleReplicaCount sends {name} to zero when idle"
    assert one(docs, "Deployment", SCALER)["spec"]["replicas"] == 1
    assert not autoscalers_of(docs, SCALER), "the scaler's state is per process: more replicas would split it"


def test_only_the_canary_may_sleep(docs: list[Doc]) -> None:
    """The subset with the largest share of the split stays up; the canary goes to zero when idle."""
    weights, _ = routing(docs)
    stable = max(weights, key=weights.__getitem__)
    for scaled in scaled_objects(docs):
        subset = subset_of(docs, scaled)
        floor = scaled["spec"]["minReplicaCount"]
        assert (floor >= 1) if subset == stable else (floor == 0), (ident(scaled), subset, floor)


def test_windows_outlast_the_cold_start(docs: list[Doc]) -> None:
    for scaled in scaled_objects(docs):
        spec, where = scaled["spec"], ident(scaled)
        drain = model_drain_s(one(docs, "Deployment", spec["scaleTargetRef"]["name"]))
        # The fallback poll for activation must not add more than a cold start to a wake-up.
        assert spec["pollingInterval"] < COLD_START_S, where
        if spec["minReplicaCount"] == 0:
            assert spec["cooldownPeriod"] > COLD_START_S, (
                f"{where}: it would sleep through pauses shorter than a wake-up"
            )
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0, (
            f"{where}: demand is waiting; add replicas at once"
        )
        down = behavior["scaleDown"]
        assert down["stabilizationWindowSeconds"] > COLD_START_S, (
            f"{where}: a dip would remove what a cold start brings back"
        )
        for policy in down["policies"]:
            if policy["type"] == "Pods" and policy["value"] == 1:
                assert policy["periodSeconds"] > drain, f"{where}: one drain at a time ({drain} s each)"


# -- the triggers follow the routing and the pipelines -------------------------------------------------------------


def routing(docs: list[Doc]) -> tuple[dict[str, float], dict[str, str]]:
    """From the VirtualService `model`: each subset's share (percent) of the weighted split, and the subset that each
    `x-model-version` value is routed to."""
    vs = one(docs, "VirtualService", "model")
    weights: dict[str, float] = {}
    pinned: dict[str, str] = {}
    for route in vs["spec"]["http"]:
        destinations = [r["destination"]["subset"] for r in route["route"]]
        if "match" not in route:
            weights = {r["destination"]["subset"]: float(r.get("weight", 100)) for r in route["route"]}
            continue
        for match in route["match"]:
            version = match.get("headers", {}).get("x-model-version", {}).get("exact")
            if version is not None:
                (pinned[version],) = destinations
    assert weights, "no weighted split in VirtualService/model"
    return weights, pinned


def pipeline_models(docs: list[Doc]) -> tuple[set[str], set[tuple[str, str]]]:
    """Every model the pipelines call, and the (model, version) pairs they pin (primary or fallback)."""
    (config,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].startswith("pipelines")]
    models: set[str] = set()
    pins: set[tuple[str, str]] = set()
    for text in config["data"].values():
        pipeline = yaml.safe_load(text)
        calls = [pipeline["model"], pipeline.get("degradation", {}).get("fallback_model")]
        for call in filter(None, calls):
            models.add(call["name"])
            if call.get("version"):
                pins.add((call["name"], str(call["version"])))
    return models, pins


def subset_of(docs: list[Doc], scaled: Doc) -> str:
    deployment = one(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
    return workload_rules.pod_labels(deployment)["version"]


def model_drain_s(deployment: Doc) -> float:
    env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
    return float(env["MESHSERVE_MODEL_SHUTDOWN_DELAY_S"]) + float(env["MESHSERVE_MODEL_GRACE_PERIOD_S"])


def test_triggers_follow_the_routing_and_the_pipelines(docs: list[Doc]) -> None:
    """The scaler counts a model's demand (every call for it) or a pinned subset's (`x-model-version: N` is subset
    `vN`); the gateways cannot tell where the weighted split sends a call. So a Deployment counts every model the
    pipelines call at its share of the split (target 32 / share), and each pin routed to its subset at the full
    target; and a pinned version is one its replicas serve."""
    weights, pinned_routes = routing(docs)
    models, pins = pipeline_models(docs)
    assert models and pins
    for scaled in scaled_objects(docs):
        subset = subset_of(docs, scaled)
        expected: dict[tuple[str, str | None], float] = {}
        if weights.get(subset, 0) > 0:
            expected |= {(m, None): TARGET_PER_REPLICA * 100 / weights[subset] for m in models}
        expected |= {(m, f"v{v}"): TARGET_PER_REPLICA for m, v in pins if pinned_routes.get(v) == subset}
        actual = {
            (t["metadata"]["model"], t["metadata"].get("subset")): float(t["metadata"]["targetPerReplica"])
            for t in demand_triggers(scaled)
        }
        assert len(actual) == len(demand_triggers(scaled)), f"{ident(scaled)}: two triggers count the same demand"
        assert actual.keys() == expected.keys(), ident(scaled)
        for key, target in expected.items():
            assert actual[key] == pytest.approx(target, rel=0.01), (ident(scaled), key)
        deployment = one(docs, "Deployment", scaled["spec"]["scaleTargetRef"]["name"])
        served = yaml.safe_load(
            env_of(deployment["spec"]["template"]["spec"]["containers"][0])["MESHSERVE_MODEL_PINNED_VERSIONS"]
        )
        for model, pin in actual:
            if pin is not None:
                assert int(pin.removeprefix("v")) in served.get(model, []), (
                    f"{ident(scaled)}: {model} {pin} not served there"
                )


def test_scaler_address_names_the_scaler_service_and_its_grpc_port(docs: list[Doc]) -> None:
    """KEDA's operator runs in its own namespace: the address carries the Service's namespace."""
    service = one(docs, "Service", SCALER)
    namespace = service["metadata"]["namespace"]
    (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc"]
    assert grpc["appProtocol"] == "grpc"
    for scaled in scaled_objects(docs):
        assert demand_triggers(scaled), ident(scaled)
        for trigger in demand_triggers(scaled):
            host, _, port = trigger["metadata"]["scalerAddress"].rpartition(":")
            assert host in (f"{SCALER}.{namespace}.svc", f"{SCALER}.{namespace}.svc.cluster.local"), (
                ident(scaled),
                host,
            )
            assert int(port) == grpc["port"] == SCALER_PORT, ident(scaled)


def test_gpu_utilisation_stays_a_model_signal_that_never_wakes_a_subset(
    docs: list[Doc], builds: dict[str, list[Doc]]
) -> None:
    """prod's second model signal, as a trigger on the same target as prod's HPA, activating at a ratio no GPU
    reaches, so that only demand wakes a subset or keeps it awake."""
    for scaled in scaled_objects(docs):
        name, subset = scaled["metadata"]["name"], subset_of(docs, scaled)
        (gpu,) = [t for t in scaled["spec"]["triggers"] if t["type"] == "prometheus"]
        (prod_metric,) = [
            m
            for m in one(builds["prod"], "HorizontalPodAutoscaler", name)["spec"]["metrics"]
            if m["type"] == "External"
        ]
        assert gpu["metricType"] == prod_metric["external"]["target"]["type"] == "Value"
        assert (
            float(gpu["metadata"]["threshold"]) == float(prod_metric["external"]["target"]["value"].rstrip("m")) / 1000
        )
        assert float(gpu["metadata"]["activationThreshold"]) >= 1, name
        query = gpu["metadata"]["query"]
        assert prod_metric["external"]["metric"]["name"] in query and f'version="{subset}"' in query, name


# -- the scaler and the gateway ------------------------------------------------------------------------------------


def test_scaler_is_deployed_like_the_other_services(docs: list[Doc]) -> None:
    deployment = one(docs, "Deployment", SCALER)
    labels = workload_rules.pod_labels(deployment)
    assert (
        labels["app"] == labels["app.kubernetes.io/name"] == "scaler"
        and labels["app.kubernetes.io/part-of"] == "meshserve"
    )
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SCALER and one(docs, "ServiceAccount", SCALER)
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "services.scaler"]
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "grpc": SCALER_PORT,
        "http-metrics": SCALER_METRICS_PORT,
    }
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"]["port"] == SCALER_PORT, probe
    env = env_of(container)
    settings_env = {ScalerSettings.env_name(f) for f in ScalerSettings.model_fields}
    unknown = sorted(v for v in env if v.startswith("MESHSERVE_SCALER_") and v not in settings_env)
    assert not unknown, f"not ScalerSettings fields (silently ignored): {unknown}"
    assert env[ScalerSettings.env_name("port")] == str(SCALER_PORT)
    assert env[ScalerSettings.env_name("metrics_port")] == str(SCALER_METRICS_PORT)
    drain = float(env[ScalerSettings.env_name("shutdown_delay_s")]) + float(
        env[ScalerSettings.env_name("grace_period_s")]
    )
    assert pod["terminationGracePeriodSeconds"] > drain
    assert container["livenessProbe"]["periodSeconds"] * container["livenessProbe"]["failureThreshold"] > drain
    assert container["envFrom"][0]["configMapRef"]["name"].startswith("meshserve-common-")
    assert container["image"].startswith("registry.example.com/meshserve/scaler:")
    service = one(docs, "Service", SCALER)
    assert workload_rules.selects(service["spec"]["selector"], labels)
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {
        "grpc": SCALER_PORT,
        "http-metrics": SCALER_METRICS_PORT,
    }
    assert (REPO / "services" / "scaler" / "__main__.py").is_file() and (
        REPO / "services" / "scaler" / "Dockerfile"
    ).is_file()


def test_gateway_reports_to_the_scaler_only_in_serverless(docs: list[Doc], builds: dict[str, list[Doc]]) -> None:
    variable = "MESHSERVE_GATEWAY_SCALER_ADDRESS"
    assert variable in {GatewaySettings.env_name(f) for f in GatewaySettings.model_fields}
    gateway = env_of(one(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0])
    assert gateway[variable] == f"{SCALER}:{SCALER_PORT}"
    for name, other in builds.items():
        env = env_of(one(other, "Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0])
        assert variable not in env, name
        assert not scaled_objects(other) and not find(other, "Deployment", SCALER), name


def test_only_the_gateways_may_report_and_keda_may_only_read(docs: list[Doc]) -> None:
    """The scaler's gRPC port also takes plain text (KEDA is outside the mesh); plain-text callers reach only the
    read-only external-scaler API, and the namespace stays STRICT everywhere else."""
    scaler_pods = workload_rules.pod_labels(one(docs, "Deployment", SCALER))
    for peer in find(docs, "PeerAuthentication"):
        selector = peer["spec"].get("selector", {}).get("matchLabels")
        if selector is None:
            assert peer["spec"]["mtls"]["mode"] == "STRICT", ident(peer)
            continue
        assert workload_rules.selects(selector, scaler_pods), f"{ident(peer)}: only the scaler relaxes mTLS"
        assert peer["spec"]["portLevelMtls"] == {str(SCALER_PORT): {"mode": "PERMISSIVE"}}
    (policy,) = [
        p
        for p in find(docs, "AuthorizationPolicy")
        if workload_rules.selects(p["spec"].get("selector", {}).get("matchLabels", {}), scaler_pods)
    ]
    assert policy["spec"]["action"] == "ALLOW"
    for rule in policy["spec"]["rules"]:
        principals = [p for s in rule.get("from", []) for p in s["source"].get("principals", [])]
        if principals == ["cluster.local/ns/meshserve/sa/meshserve-gateway"]:
            continue
        assert not principals, rule
        (operation,) = [t["operation"] for t in rule["to"]]
        assert operation["paths"] == EXTERNAL_SCALER_PATHS and operation["ports"] == [str(SCALER_PORT)], rule
