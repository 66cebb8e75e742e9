"""The Flagger component: a consistent Canary, and no static routing left to fight it."""

from __future__ import annotations

from tests.manifests.support import Doc, find, one


def test_flagger_canary_is_consistent(builds: dict[str, list[Doc]]) -> None:
    docs = builds["prod-flagger"]
    canary = one(docs, "Canary", "model")["spec"]
    target = one(docs, "Deployment", canary["targetRef"]["name"])
    assert target["metadata"]["name"] == "model-v1"
    hpa = one(docs, "HorizontalPodAutoscaler", canary["autoscalerRef"]["name"])
    assert hpa["spec"]["scaleTargetRef"]["name"] == target["metadata"]["name"]
    assert canary["provider"] == "istio"
    assert canary["service"]["name"] == "model" and canary["service"]["port"] == 8001
    assert canary["service"]["portName"] == "grpc"
    analysis = canary["analysis"]
    assert 0 < analysis["stepWeight"] <= analysis["maxWeight"] <= 100
    assert analysis["threshold"] >= 1
    templates = {d["metadata"]["name"] for d in find(docs, "MetricTemplate")}
    names = {m["name"] for m in analysis["metrics"]}
    assert {"grpc-success-rate", "grpc-latency-p99"} <= names
    for metric in analysis["metrics"]:
        assert metric["templateRef"]["name"] in templates
        assert metric["thresholdRange"]


def test_flagger_replaces_the_static_split(builds: dict[str, list[Doc]]) -> None:
    flagger, prod = builds["prod-flagger"], builds["prod"]
    assert find(prod, "VirtualService", "model") and find(prod, "DestinationRule", "model")
    for kind, name in [
        ("VirtualService", "model"),
        ("DestinationRule", "model"),
        ("Service", "model"),
        ("Deployment", "model-v2"),
        ("HorizontalPodAutoscaler", "model-v2"),
        ("PodDisruptionBudget", "model-v2"),
    ]:
        assert not find(flagger, kind, name), f"{kind}/{name} must be left to Flagger"
    assert not find(prod, "Canary") and not find(builds["dev"], "Canary")
    # Flagger relabels primary pods app=model-primary: policies must select on a label it keeps.
    policy = one(flagger, "AuthorizationPolicy", "model-from-gateway")
    assert policy["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "model"}
