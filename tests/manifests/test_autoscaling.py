"""HPAs: the right targets and metrics, and prometheus-adapter rules that serve every custom metric."""

from __future__ import annotations

import re

import yaml

from tests.manifests.support import REPO, Doc, find, one


def adapter_config(docs: list[Doc]) -> dict:
    cm = one(docs, "ConfigMap", "prometheus-adapter-meshserve")
    assert cm["metadata"]["namespace"] == "monitoring"
    return yaml.safe_load(cm["data"]["config.yaml"])


def exposed(rules: list[dict]) -> dict[str, str]:
    """Metric name as served by the adapter -> the Prometheus series it reads."""
    out = {}
    for rule in rules:
        series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"].strip("'\" "))
        assert series, rule["seriesQuery"]
        assert re.fullmatch(rule["name"]["matches"], series.group(0)), rule
        out[rule["name"]["as"]] = series.group(0)
    return out


def metrics_by_type(hpa: Doc) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for metric in hpa["spec"]["metrics"]:
        out.setdefault(metric["type"], []).append(metric[metric["type"].lower()])
    return out


def test_hpas_target_existing_deployments_without_fixed_replicas(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    for hpa in find(docs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        target = one(docs, ref["kind"], ref["name"])
        assert "replicas" not in target["spec"], f"{ref['name']}: the HPA owns replicas; kubectl apply would reset it"
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]


def test_gateway_scales_on_cpu_and_inflight(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    metrics = metrics_by_type(one(docs, "HorizontalPodAutoscaler", "gateway"))
    assert metrics["Resource"][0]["name"] == "cpu"
    assert metrics["Resource"][0]["target"] == {"type": "Utilization", "averageUtilization": 70}
    assert metrics["Pods"][0]["metric"]["name"] == "meshserve_gateway_inflight_requests"


def test_model_scales_on_gpu_in_prod_and_queue_everywhere(overlay: tuple[str, list[Doc]]) -> None:
    name, docs = overlay
    for hpa in find(docs, "HorizontalPodAutoscaler"):
        if not hpa["metadata"]["name"].startswith("model-"):
            continue
        metrics = metrics_by_type(hpa)
        assert metrics["Pods"][0]["metric"]["name"] == "meshserve_model_pending_requests"
        if name.startswith("prod"):
            (gpu,) = metrics["External"]
            assert gpu["metric"]["name"] == "meshserve_gpu_utilization_ratio"
            assert gpu["target"] == {"type": "Value", "value": "700m"}
            version = hpa["metadata"]["name"].removeprefix("model-")
            assert gpu["metric"]["selector"]["matchLabels"] == {"app": "model", "version": version}
            assert "Resource" not in metrics
        else:
            assert "External" not in metrics, "no GPU metric on a CPU-only cluster"


def test_adapter_serves_every_custom_metric(overlay: tuple[str, list[Doc]]) -> None:
    _, docs = overlay
    config = adapter_config(docs)
    pods_metrics, external_metrics = exposed(config["rules"]), exposed(config["externalRules"])
    for hpa in find(docs, "HorizontalPodAutoscaler"):
        metrics = metrics_by_type(hpa)
        for m in metrics.get("Pods", []):
            assert m["metric"]["name"] in pods_metrics, m
        for m in metrics.get("External", []):
            assert m["metric"]["name"] in external_metrics, m
    for rule in config["rules"] + config["externalRules"]:
        for placeholder in ("<<.Series>>", "<<.LabelMatchers>>"):
            assert placeholder in rule["metricsQuery"]


def test_adapter_reads_series_the_services_export(builds: dict[str, list[Doc]]) -> None:
    """The Prometheus series named in the adapter rules are defined in the services' source."""
    config = adapter_config(builds["prod"])
    series = set(exposed(config["rules"]).values()) | set(exposed(config["externalRules"]).values())
    source = "\n".join(p.read_text() for p in (REPO / "services").rglob("*.py"))
    missing = sorted(s for s in series if f'"{s}"' not in source)
    assert not missing, f"no service exports {missing}"
