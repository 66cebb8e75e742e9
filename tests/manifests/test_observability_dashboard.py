"""The Grafana dashboard k8s/observability/dashboards/meshserve.json: valid, complete, real metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.manifests.support import REPO, Doc, kustomize, one
from tests.manifests.test_observability_metrics import unknown_metrics

DASHBOARD = REPO / "k8s" / "observability" / "dashboards" / "meshserve.json"


@pytest.fixture(scope="module")
def dashboard() -> Doc:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: Doc) -> Iterator[Doc]:
    """Every panel, rows' nested panels included, rows themselves excluded."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def exprs(dashboard: Doc) -> dict[str, str]:
    """'panel title/refId' -> PromQL, plus the templating queries' metric selectors."""
    out = {f"{p['title']}/{t['refId']}": t["expr"] for p in panels(dashboard) for t in p["targets"]}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query: Any = var["query"]
            text = query["query"] if isinstance(query, dict) else query
            match = re.fullmatch(r"label_values\((.*),\s*\w+\)", text)
            assert match, f"variable {var['name']}: expected label_values(selector, label), got {text}"
            out[f"${var['name']}"] = match.group(1)
    return out


def test_dashboard_structure(dashboard: Doc) -> None:
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]] + [p["id"] for r in dashboard["panels"] for p in r.get("panels", [])]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        assert {"h", "w", "x", "y"} <= set(pos) and pos["x"] + pos["w"] <= 24, panel["title"]


def test_panels_have_datasource_and_targets(dashboard: Doc) -> None:
    found = list(panels(dashboard))
    assert len(found) >= 10
    for panel in found:
        title = panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], f"{title}: no targets"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), title
        for target in panel["targets"]:
            assert target["expr"].strip(), title
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], title
        assert panel.get("fieldConfig", {}).get("defaults", {}).get("unit"), f"{title}: no unit"


def test_dashboard_covers_the_issue(dashboard: Doc) -> None:
    """Request rate, errors by code, p50/p99 by stage, batch size, queue, cache hit ratio, GPU, shed, degraded."""
    text = "\n".join(exprs(dashboard).values())
    for needle in (
        "rate(meshserve_gateway_requests_total",
        "by (pipeline, code)",
        "histogram_quantile(0.5, sum by (stage, le) (rate(meshserve_gateway_stage_duration_seconds_bucket",
        "histogram_quantile(0.99, sum by (stage, le) (rate(meshserve_gateway_stage_duration_seconds_bucket",
        "meshserve_model_batch_size_bucket",
        "meshserve_model_pending_requests",
        'cache="hit"',
        "meshserve_gpu_utilization_ratio",
        "meshserve_gateway_shed_total",
        "meshserve_gateway_degraded_total",
    ):
        assert needle in text, needle


def test_dashboard_metrics_are_defined_in_services(dashboard: Doc) -> None:
    unknown = unknown_metrics(exprs(dashboard))
    assert not unknown, "metrics not defined in services/:\n" + "\n".join(unknown)


def test_dashboard_config_map(dashboard: Doc) -> None:
    """The kustomize build ships the file unchanged in a ConfigMap Grafana's sidecar picks up."""
    docs = kustomize(REPO / "k8s" / "observability")
    cm = one(docs, "ConfigMap", "meshserve-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["meshserve.json"]) == dashboard
