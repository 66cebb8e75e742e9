"""k8s/observability: builds, passes the schemas (core and CRD, strict), hardened pods, and is wired
to the meshserve overlays (ServiceMonitors select the Services' metrics ports, the services' OTLP
endpoint is the collector, the collector exports to Jaeger)."""

from __future__ import annotations

from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from tests.manifests.support import (
    REPO,
    Doc,
    containers,
    crd_errors,
    find,
    ident,
    is_crd_kind,
    kustomize,
    one,
)

OBSERVABILITY = REPO / "k8s" / "observability"
NAMESPACE = "observability"
KUBERNETES_VERSIONS = ("1.31", kubernetes_validate.latest_version())
METRICS_SERVICES = ("gateway", "model", "feature", "cache")


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return kustomize(OBSERVABILITY)


def test_builds_into_its_namespace(docs: list[Doc]) -> None:
    assert one(docs, "Namespace", NAMESPACE)["metadata"]["labels"]["istio-injection"] == "disabled"
    kinds = sorted({d["kind"] for d in docs})
    assert {"Deployment", "Service", "ConfigMap", "ServiceMonitor", "PrometheusRule"} <= set(kinds), kinds
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == NAMESPACE, ident(doc)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_core_resources_pass_kubernetes_validate_strict(docs: list[Doc], version: str) -> None:
    errors = []
    for doc in (d for d in docs if not is_crd_kind(d)):
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{ident(doc)}: {'.'.join(str(p) for p in err.path) or '<root>'}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            errors.append(f"{ident(doc)}: {err.message}")
    assert not errors, "\n".join(errors)


def test_custom_resources_pass_strict_crd_schemas(docs: list[Doc], schemas_dir: None) -> None:
    custom = [d for d in docs if is_crd_kind(d)]
    assert {d["kind"] for d in custom} == {"ServiceMonitor", "PrometheusRule"}
    errors = [e for d in custom for e in crd_errors(d)]
    assert not errors, "\n".join(errors)


def test_pods_are_hardened(docs: list[Doc]) -> None:
    """The house style of k8s/base: non-root, read-only root, no capabilities, seccomp, probes, sizes."""
    accounts = {d["metadata"]["name"] for d in find(docs, "ServiceAccount")}
    workloads = find(docs, "Deployment")
    assert {w["metadata"]["name"] for w in workloads} == {"otel-collector", "jaeger"}
    for workload in workloads:
        where = workload["metadata"]["name"]
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0, where
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", where
        assert pod["automountServiceAccountToken"] is False and pod["serviceAccountName"] in accounts, where
        for c in containers(workload):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, where
            assert sc["runAsNonRoot"] is True and sc["capabilities"] == {"drop": ["ALL"]}, where
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (where, kind)
            assert "readinessProbe" in c and "livenessProbe" in c, where
            image = c["image"]
            assert ":" in image.rsplit("/", 1)[-1] and not image.endswith(":latest"), image
            ports = {p["name"] for p in c["ports"]}
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["httpGet"]["port"] in ports, (where, probe)
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in workload["spec"]["selector"]["matchLabels"].items()), where


def _service_port(docs: list[Doc], host: str, port: int) -> Doc:
    """The Service `name` or `name.namespace` (this namespace) exposing `port`."""
    name, _, namespace = host.partition(".")
    assert namespace in ("", NAMESPACE, f"{NAMESPACE}.svc", f"{NAMESPACE}.svc.cluster.local"), host
    service = one(docs, "Service", name)
    (match,) = [p for p in service["spec"]["ports"] if p["port"] == port]
    workload = next(
        w
        for w in find(docs, "Deployment")
        if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items())
    )
    container_ports = {p["name"]: p["containerPort"] for c in containers(workload) for p in c["ports"]}
    assert match["targetPort"] in container_ports, (host, match)
    return match


def test_services_send_spans_to_the_collector(docs: list[Doc], builds: dict[str, list[Doc]]) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT (k8s/base's meshserve-common) is the collector's OTLP gRPC port."""
    for overlay, built in builds.items():
        common = next(d for d in find(built, "ConfigMap") if d["metadata"]["name"].startswith("meshserve-common-"))
        url = urlparse(common["data"]["OTEL_EXPORTER_OTLP_ENDPOINT"])
        assert url.hostname and url.port, overlay
        port = _service_port(docs, url.hostname, url.port)
        assert port["appProtocol"] == "grpc", overlay


def test_collector_pipeline(docs: list[Doc]) -> None:
    """OTLP gRPC and HTTP in, batch processor, OTLP out to the Jaeger collector Service."""
    cm = next(d for d in find(docs, "ConfigMap") if d["metadata"]["name"].startswith("otel-collector-"))
    config = yaml.safe_load(cm["data"]["config.yaml"])
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"]
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}
    assert "batch" in traces["processors"] and set(traces["processors"]) <= set(config["processors"])
    assert traces["processors"][0] == "memory_limiter", "the memory limiter must come first"
    (exporter,) = traces["exporters"]
    assert exporter.split("/")[0] == "otlp"
    host, _, port = config["exporters"][exporter]["endpoint"].rpartition(":")
    _service_port(docs, host, int(port))
    # Probes reach the health_check extension; the Deployment mounts this ConfigMap at --config.
    health_port = int(config["extensions"]["health_check"]["endpoint"].rpartition(":")[2])
    collector = one(docs, "Deployment", "otel-collector")
    (c,) = collector["spec"]["template"]["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named[c["readinessProbe"]["httpGet"]["port"]] == health_port
    assert named["otlp-grpc"] == 4317 and named["otlp-http"] == 4318
    (arg,) = [a for a in c["args"] if a.startswith("--config=")]
    mount = next(m for m in c["volumeMounts"] if arg.removeprefix("--config=").startswith(m["mountPath"] + "/"))
    volume = next(v for v in collector["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == cm["metadata"]["name"]


def test_service_monitors_select_the_metrics_ports(docs: list[Doc], builds: dict[str, list[Doc]]) -> None:
    """One ServiceMonitor per service, on a Service port named http-metrics, in the meshserve namespace."""
    monitors = {m["metadata"]["name"]: m for m in find(docs, "ServiceMonitor")}
    assert set(monitors) == {f"meshserve-{s}" for s in METRICS_SERVICES}
    for overlay in ("dev", "prod"):
        services = find(builds[overlay], "Service")
        for name in METRICS_SERVICES:
            spec = monitors[f"meshserve-{name}"]["spec"]
            assert spec["namespaceSelector"] == {"matchNames": ["meshserve"]}
            selected = [
                s
                for s in services
                if s["metadata"]["namespace"] == "meshserve"
                and all(s["metadata"].get("labels", {}).get(k) == v for k, v in spec["selector"]["matchLabels"].items())
            ]
            assert [s["metadata"]["name"] for s in selected] == [name], (overlay, name)
            (endpoint,) = spec["endpoints"]
            assert endpoint["port"] == "http-metrics"
            assert "http-metrics" in {p["name"] for p in selected[0]["spec"]["ports"]}
            assert set(spec["podTargetLabels"]) == {"app", "version"}
            # Istio metrics merging: the address and path come from the prometheus.io annotations.
            targets = {r["targetLabel"] for r in endpoint["relabelings"]}
            assert {"__address__", "__metrics_path__"} <= targets


def test_pods_carry_the_scrape_annotations(builds: dict[str, list[Doc]]) -> None:
    """The ServiceMonitors' relabelings read prometheus.io/port and /path; every metrics pod sets them."""
    for overlay, built in builds.items():
        for workload in find(built, "Deployment"):
            annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
            (c, *_) = workload["spec"]["template"]["spec"]["containers"]
            named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            if "http-metrics" not in named:
                continue
            where = (overlay, workload["metadata"]["name"])
            assert annotations.get("prometheus.io/port") == str(named["http-metrics"]), where
            assert annotations.get("prometheus.io/path") == "/metrics", where
