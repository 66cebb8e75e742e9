"""Workload rules in every overlay: hardening, probes, ports, labels, identities, drain timing, config."""

from __future__ import annotations

import json

from tests.manifests.support import Doc, containers, env_of, find, one

SERVICES = {"gateway": 8000, "model": 8001, "feature": 8002, "cache": 8003}
METRICS_PORTS = {"gateway": 9000, "model": 9001, "feature": 9002, "cache": 9003}
DEPLOYMENTS = {"gateway": "gateway", "model-v1": "model", "model-v2": "model", "feature": "feature", "cache": "cache"}
# Deployments of Redis (the cache's), not meshserve services; the feature store is a StatefulSet.
STORES = {"redis-cache"}
POD_LABELS = ("app", "app.kubernetes.io/name", "app.kubernetes.io/part-of", "version")


def workloads(docs: list[Doc]) -> list[Doc]:
    return find(docs, "Deployment") + find(docs, "StatefulSet")


def services(docs: list[Doc]) -> list[Doc]:
    """The Deployments of meshserve's services (not of the Redis servers they use)."""
    return [d for d in find(docs, "Deployment") if d["metadata"]["name"] not in STORES]


def pod_labels(workload: Doc) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def test_expected_workloads(overlay: tuple[str, list[Doc]]) -> None:
    name, docs = overlay
    expected = set(DEPLOYMENTS) - ({"model-v2"} if name == "prod-flagger" else set())
    assert {d["metadata"]["name"] for d in find(docs, "Deployment")} == expected | STORES
    assert [d["metadata"]["name"] for d in find(docs, "StatefulSet")] == ["redis"]
    assert all(d["metadata"]["namespace"] == "meshserve" for d in workloads(docs))
    assert one(docs, "Namespace", "meshserve")["metadata"]["labels"]["istio-injection"] == "enabled"


def test_pods_are_hardened(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    for workload in workloads(docs):
        where = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        assert pod["securityContext"]["runAsUser"] > 0, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert pod["automountServiceAccountToken"] is False, where
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC"), where
        for c in containers(workload):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, (where, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (where, c["name"])
            assert sc["runAsNonRoot"] is True, (where, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]}, (where, c["name"])
            assert not sc.get("privileged"), (where, c["name"])
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (where, c["name"], kind)
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), (where, image)


def test_labels_and_service_accounts(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    accounts = {d["metadata"]["name"] for d in find(docs, "ServiceAccount")}
    for workload in find(docs, "Deployment"):
        name = workload["metadata"]["name"]
        svc = DEPLOYMENTS.get(name, name)
        labels = pod_labels(workload)
        assert all(k in labels for k in POD_LABELS), (name, labels)
        assert labels["app"] == labels["app.kubernetes.io/name"] == svc
        assert labels["app.kubernetes.io/part-of"] == "meshserve"
        assert labels["version"] == ("v2" if name == "model-v2" else "v1")
        assert selects(workload["spec"]["selector"]["matchLabels"], labels)
        sa = workload["spec"]["template"]["spec"]["serviceAccountName"]
        assert sa == f"meshserve-{svc}" and sa in accounts, name


def test_services_and_ports(overlay: tuple[str, list[Doc]]) -> None:
    name, docs = overlay
    for svc, port in SERVICES.items():
        if name == "prod-flagger" and svc == "model":
            assert not find(docs, "Service", "model"), "Flagger owns the apex Service `model`"
            continue
        service = one(docs, "Service", svc)
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        assert ports["grpc"]["port"] == port and ports["grpc"]["appProtocol"] == "grpc"
        assert ports["http-metrics"]["port"] == METRICS_PORTS[svc]
        pods = [d for d in find(docs, "Deployment") if selects(service["spec"]["selector"], pod_labels(d))]
        assert pods, f"Service {svc} selects no Deployment"
        for workload in pods:
            c = workload["spec"]["template"]["spec"]["containers"][0]
            named = {p["name"]: p["containerPort"] for p in c["ports"]}
            assert named == {"grpc": port, "http-metrics": METRICS_PORTS[svc]}
    redis = one(docs, "Service", "redis")
    assert redis["spec"]["ports"][0]["port"] == 6379


def test_grpc_probes_and_drain_timing(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    for workload in services(docs):
        name = workload["metadata"]["name"]
        svc = DEPLOYMENTS[name]
        pod = workload["spec"]["template"]["spec"]
        c = pod["containers"][0]
        assert c["command"] == ["python", "-m", f"services.{svc}"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["grpc"]["port"] == SERVICES[svc], (name, probe)
        env = env_of(c)
        prefix = f"MESHSERVE_{svc.upper()}_"
        assert env[f"{prefix}PORT"] == str(SERVICES[svc]) and env[f"{prefix}METRICS_PORT"] == str(METRICS_PORTS[svc])
        drain = float(env[f"{prefix}SHUTDOWN_DELAY_S"]) + float(env[f"{prefix}GRACE_PERIOD_S"])
        assert pod["terminationGracePeriodSeconds"] > drain, name
        live = c["livenessProbe"]
        assert live["periodSeconds"] * live["failureThreshold"] > drain, f"{name}: liveness would kill a drain"
        proxy = json.loads(workload["spec"]["template"]["metadata"]["annotations"]["proxy.istio.io/config"])
        assert float(proxy["terminationDrainDuration"].rstrip("s")) >= drain, name
        assert env_of(c).get("OTEL_SERVICE_NAME") == svc
        assert c["envFrom"][0]["configMapRef"]["name"].startswith("meshserve-common-")


def test_gateway_and_model_settings(overlay: tuple[str, list[Doc]]) -> None:
    name, docs = overlay
    gateway = env_of(one(docs, "Deployment", "gateway")["spec"]["template"]["spec"]["containers"][0])
    assert gateway["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == "model:8001"
    assert gateway["MESHSERVE_GATEWAY_FEATURE_ADDRESS"] == "feature:8002"
    assert gateway["MESHSERVE_GATEWAY_CACHE_ADDRESS"] == "cache:8003"
    for version in ("v1", "v2"):
        if name == "prod-flagger" and version == "v2":
            continue
        model = one(docs, "Deployment", f"model-{version}")
        pod = model["spec"]["template"]["spec"]
        env = env_of(pod["containers"][0])
        assert json.loads(env["MESHSERVE_MODEL_PINNED_VERSIONS"]) == {"fraud_mlp": [int(version[1:])]}
        repo = env["MESHSERVE_MODEL_REPOSITORY"]
        (init,) = pod["initContainers"]
        assert any(m["mountPath"] == repo for m in init["volumeMounts"])
        assert any(m["mountPath"] == repo for m in pod["containers"][0]["volumeMounts"])
        gpus = pod["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus == (1 if name.startswith("prod") else None), (name, version)


def test_zone_spread_in_prod(overlay: tuple[str, list[Doc]]) -> None:
    name, docs = overlay
    for workload in find(docs, "Deployment"):
        keys = {c["topologyKey"] for c in workload["spec"]["template"]["spec"]["topologySpreadConstraints"]}
        assert "kubernetes.io/hostname" in keys
        assert ("topology.kubernetes.io/zone" in keys) == name.startswith("prod"), workload["metadata"]["name"]


def test_disruption_budgets_cover_every_deployment(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    budgets = find(docs, "PodDisruptionBudget")
    for workload in find(docs, "Deployment"):
        covering = [b for b in budgets if selects(b["spec"]["selector"]["matchLabels"], pod_labels(workload))]
        assert len(covering) == 1, workload["metadata"]["name"]
        assert "maxUnavailable" in covering[0]["spec"]


def test_volumes_reference_generated_config_maps(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    maps = {d["metadata"]["name"]: d for d in find(docs, "ConfigMap")}
    for workload in workloads(docs):
        for volume in workload["spec"]["template"]["spec"].get("volumes", []):
            sources = [volume["configMap"]] if "configMap" in volume else []
            sources += [s["configMap"] for s in volume.get("projected", {}).get("sources", []) if "configMap" in s]
            for source in sources:
                assert source["name"] in maps, f"{workload['metadata']['name']}: no ConfigMap {source['name']}"
                if "items" in source:
                    assert {i["key"] for i in source["items"]} == set(maps[source["name"]]["data"]), source["name"]


def test_redis_is_reachable_only_from_feature_and_cache(overlay: tuple[str, list[Doc]]) -> None:
    """Each Redis admits only its one service: the feature store (redis) the feature pods, the cache's Redis
    (redis-cache) the cache pods; and each service is given the URL of its own."""
    _, docs = overlay
    for store, client in (("redis", "feature"), ("redis-cache", "cache")):
        policy = one(docs, "NetworkPolicy", store)
        assert policy["spec"]["podSelector"]["matchLabels"] == {"app": store}
        (rule,) = policy["spec"]["ingress"]
        (peer,) = rule["from"]
        selector = peer["podSelector"]
        admitted = selector["matchLabels"].get("app") if "matchLabels" in selector else None
        if "matchExpressions" in selector:
            (expr,) = selector["matchExpressions"]
            assert (expr["key"], expr["operator"]) == ("app", "In")
            (admitted,) = expr["values"]
        assert admitted == client, store
        assert one(docs, "Service", store)["spec"]["ports"][0]["port"] == 6379
        deployment = one(docs, "Deployment", client)
        assert env_of(deployment["spec"]["template"]["spec"]["containers"][0])["MESHSERVE_REDIS_URL"] == (
            f"redis://{store}:6379/0"
        )
    common = next(d for d in find(docs, "ConfigMap") if d["metadata"]["name"].startswith("meshserve-common-"))
    assert "MESHSERVE_REDIS_URL" not in common["data"]  # one URL for both would be wrong for one of them


def test_the_feature_store_keeps_every_write_and_the_cache_may_evict(overlay: tuple[str, list[Doc]]) -> None:
    """The feature store: append-only file fsynced before each reply on its volume, noeviction; the cache's Redis:
    no persistence, allkeys-lru (services/common/embedded.py FEATURE_STORE and CACHE, as `meshserve up` runs them)."""
    from services.common.embedded import CACHE, FEATURE_STORE

    _, docs = overlay

    def flags(workload: Doc) -> dict[str, str]:
        command = workload["spec"]["template"]["spec"]["containers"][0]["command"]
        return {command[i][2:]: command[i + 1] for i in range(1, len(command), 2)}

    store = flags(one(docs, "StatefulSet", "redis"))
    for key in ("appendonly", "appendfsync", "maxmemory-policy", "save"):
        assert store[key] == FEATURE_STORE[key], key
    mounts = one(docs, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "data", "mountPath": store["dir"]} in mounts
    cache = flags(one(docs, "Deployment", "redis-cache"))
    for key in ("appendonly", "maxmemory-policy", "save"):
        assert cache[key] == CACHE[key], key


def test_mesh_policy_matches_the_workloads(overlay: tuple[str, list[Doc]]) -> None:
    """istio/ and k8s/ agree: hosts are Services, subsets select pods, principals are ServiceAccounts."""
    _, docs = overlay
    services = {d["metadata"]["name"]: d for d in find(docs, "Service")}
    rules = {d["spec"]["host"]: d for d in find(docs, "DestinationRule")}
    for vs in find(docs, "VirtualService"):
        for route in vs["spec"].get("http", []):
            for dest in (r["destination"] for r in route.get("route", [])):
                host = dest["host"]
                assert host in services, f"VirtualService {vs['metadata']['name']}: no Service {host}"
                ports = {p["port"] for p in services[host]["spec"]["ports"]}
                assert dest.get("port", {}).get("number", next(iter(ports))) in ports
                if "subset" in dest:
                    subsets = {s["name"]: s for s in rules[host]["spec"]["subsets"]}
                    labels = {**services[host]["spec"]["selector"], **subsets[dest["subset"]]["labels"]}
                    assert any(selects(labels, pod_labels(w)) for w in find(docs, "Deployment")), (host, dest)
    accounts = {f"cluster.local/ns/meshserve/sa/{d['metadata']['name']}" for d in find(docs, "ServiceAccount")}
    # Istio's ingress gateway pods are not in the build: a policy for them selects what a Gateway selects.
    ingress = [d["spec"]["selector"] for d in find(docs, "Gateway")]
    for policy in find(docs, "AuthorizationPolicy"):
        selector = policy["spec"].get("selector", {}).get("matchLabels", {})
        if policy["metadata"].get("namespace") == "istio-system":
            assert selector in ingress, policy["metadata"]["name"]
            continue
        assert any(selects(selector, pod_labels(w)) for w in find(docs, "Deployment")), policy["metadata"]["name"]
        for rule in policy["spec"].get("rules", []):
            for source in rule.get("from", []):
                for principal in source["source"].get("principals", []):
                    assert principal in accounts, principal


OPERATOR_SECRET = "meshserve-operator"


def secret_refs(container: Doc) -> dict[str, dict[str, object]]:
    """env name -> its secretKeyRef, for the variables read from a Secret."""
    return {
        e["name"]: e["valueFrom"]["secretKeyRef"]
        for e in container.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    }


def test_every_service_takes_its_operator_token_from_the_cluster_secret(overlay: tuple[str, list[Doc]]) -> None:
    """MESHSERVE_<NAME>_ADMIN_TOKEN (and the gateway's JWKS) come from the Secret each cluster creates, required
    (optional: false, so a missing Secret keeps the pod from starting instead of leaving the RPCs open); the
    Secret itself is never part of the build (no committed credential)."""
    _, docs = overlay
    for workload in services(docs):
        name = workload["metadata"]["name"]
        svc = DEPLOYMENTS[name]
        container = workload["spec"]["template"]["spec"]["containers"][0]
        refs = secret_refs(container)
        expected = {
            f"MESHSERVE_{svc.upper()}_ADMIN_TOKEN": "token",
            **({"MESHSERVE_GATEWAY_JWKS": "jwks"} if svc == "gateway" else {}),
        }
        for var, key in expected.items():
            assert refs.get(var) == {"name": OPERATOR_SECRET, "key": key, "optional": False}, (name, var, refs.get(var))
        assert not [v for v in env_of(container) if v.endswith("_ADMIN_TOKEN") and v not in refs], name
    assert not [d for d in find(docs, "Secret") if d["metadata"]["name"].startswith(OPERATOR_SECRET)], "committed"
    assert not [k for d in find(docs, "ConfigMap") for k in d.get("data", {}) if k.endswith("_ADMIN_TOKEN")]
