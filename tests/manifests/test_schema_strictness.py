"""The validators reject what an API server with strict field validation rejects: planted typos fail."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.manifests.support import Doc, crd_errors, crd_validators, find, one, strict_root, strictify


def rename_key(node: dict[str, Any], path: list[str | int], new: str) -> None:
    """Rename the key at `path` (the last element) to `new`, keeping its value."""
    for step in path[:-1]:
        node = node[step]  # type: ignore[index]
    node[new] = node.pop(path[-1])  # type: ignore[arg-type]


def with_typo(doc: Doc, path: list[str | int], new: str) -> Doc:
    out = copy.deepcopy(doc)
    rename_key(out, path, new)
    return out


@pytest.fixture(scope="session")
def prod(builds: dict[str, list[Doc]]) -> list[Doc]:
    return builds["prod"]


def first_with(docs: list[Doc], kind: str, *keys: str) -> Doc:
    """The first resource of `kind` whose spec has the nested keys (so the typo has something to hit)."""
    for doc in find(docs, kind):
        node: Any = doc["spec"]
        if all(isinstance(node, dict) and (node := node.get(k)) is not None for k in keys):
            return doc
    pytest.fail(f"no {kind} with spec.{'.'.join(keys)} in the build")


@pytest.mark.usefixtures("schemas_dir")
def test_istio_typos_fail(prod: list[Doc]) -> None:
    dr = first_with(prod, "DestinationRule", "trafficPolicy", "outlierDetection")
    assert not crd_errors(dr)
    assert crd_errors(with_typo(dr, ["spec", "trafficPolicy", "outlierDetection"], "outlierDetecton"))

    def retries_on(r: dict) -> bool:
        return "retryOn" in r.get("retries", {})

    vs = next(d for d in find(prod, "VirtualService") if any(retries_on(r) for r in d["spec"].get("http", [])))
    route = next(i for i, r in enumerate(vs["spec"]["http"]) if retries_on(r))
    assert not crd_errors(vs)
    assert crd_errors(with_typo(vs, ["spec", "http", route, "retries", "retryOn"], "retryon"))

    pa = find(prod, "PeerAuthentication")[0]
    bad_mode = copy.deepcopy(pa)
    bad_mode["spec"]["mtls"]["mode"] = "STRICTEST"
    assert crd_errors(bad_mode)


@pytest.mark.usefixtures("schemas_dir")
def test_flagger_typos_fail(builds: dict[str, list[Doc]]) -> None:
    canary = one(builds["prod-flagger"], "Canary", "model")
    assert not crd_errors(canary)
    assert crd_errors(with_typo(canary, ["spec", "analysis", "stepWeight"], "stepWieght"))
    assert crd_errors(with_typo(canary, ["spec", "service", "trafficPolicy", "outlierDetection"], "outlierDetecton"))
    template = find(builds["prod-flagger"], "MetricTemplate")[0]
    assert crd_errors(with_typo(template, ["spec", "query"], "qurey"))


@pytest.mark.usefixtures("schemas_dir")
def test_unknown_custom_kind_fails() -> None:
    doc = {"apiVersion": "networking.istio.io/v1", "kind": "VirtualServis", "metadata": {"name": "x"}, "spec": {}}
    assert crd_errors(doc)


@pytest.mark.parametrize(
    ("kind", "name", "path", "typo"),
    [
        ("Deployment", "gateway", ["spec", "template", "spec", "containers", 0, "resources"], "resourcez"),
        ("Deployment", "model-v1", ["spec", "template", "spec", "containers", 0, "readinessProbe"], "readinesProbe"),
        ("PodDisruptionBudget", "gateway", ["spec", "maxUnavailable"], "maxUnavailible"),
        ("HorizontalPodAutoscaler", "gateway", ["spec", "minReplicas"], "minReplica"),
        ("Service", "model", ["spec", "ports", 0, "appProtocol"], "appProtocl"),
    ],
)
def test_core_typos_fail(prod: list[Doc], kind: str, name: str, path: list[str | int], typo: str) -> None:
    doc = one(prod, kind, name)
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(with_typo(doc, path, typo), kubernetes_validate.latest_version(), strict=True)


def test_strictify_follows_the_readme_rules() -> None:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "config": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {}},
                    "port": {"type": "integer", "nullable": True},
                    "match": {"type": "object", "oneOf": [{"properties": {"a": {}}, "required": ["a"]}]},
                },
            }
        },
    }
    strict = strict_root(schema)
    spec = strict["properties"]["spec"]
    assert strict["additionalProperties"] is False and "metadata" in strict["properties"]
    assert spec["additionalProperties"] is False
    assert spec["properties"]["labels"]["additionalProperties"] == {"type": "string"}
    assert "additionalProperties" not in spec["properties"]["config"]
    assert spec["properties"]["port"]["type"] == ["integer", "null"]
    assert "additionalProperties" not in spec["properties"]["match"]["oneOf"][0]
    assert "additionalProperties" not in schema["properties"]["spec"], "strict_root must not touch its input"
    node: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "object", "properties": {}}}}
    strictify(node)
    assert node["properties"]["a"]["additionalProperties"] is False


@pytest.mark.usefixtures("schemas_dir")
def test_every_expected_custom_kind_has_a_schema() -> None:
    """Istio, Flagger, KEDA and Prometheus Operator kinds are all checkable (none silently skipped)."""
    known = set(crd_validators())
    for api, kind in [
        ("networking.istio.io/v1", "VirtualService"),
        ("networking.istio.io/v1", "DestinationRule"),
        ("networking.istio.io/v1", "Gateway"),
        ("security.istio.io/v1", "PeerAuthentication"),
        ("security.istio.io/v1", "AuthorizationPolicy"),
        ("telemetry.istio.io/v1", "Telemetry"),
        ("flagger.app/v1beta1", "Canary"),
        ("flagger.app/v1beta1", "MetricTemplate"),
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PrometheusRule"),
    ]:
        assert (api, kind) in known, (api, kind)
