"""Every meshserve container in every overlay runs grpc with exactly the settings `meshserve up` gives its processes."""

from __future__ import annotations

import pytest

from services.cli.stack.specs import GRPC_ENV
from tests.manifests.support import REPO, Doc, containers, env_of, find, kustomize

SERVERLESS = REPO / "k8s" / "overlays" / "serverless"
# The Deployments whose containers run `python -m services.<name>`, per overlay.
EXPECTED = {"gateway", "model-v1", "model-v2", "feature", "cache"}
EXPECTED_IN = {
    "dev": EXPECTED,
    "prod": EXPECTED,
    "prod-flagger": EXPECTED - {"model-v2"},
    "serverless": EXPECTED | {"meshserve-scaler"},
}


@pytest.fixture(scope="module")
def serverless() -> list[Doc]:
    return kustomize(SERVERLESS)


def effective_env(container: Doc, docs: list[Doc]) -> dict[str, str]:
    """The container's environment as the kubelet builds it: envFrom ConfigMaps first, then env over them."""
    maps = {d["metadata"]["name"]: d.get("data", {}) for d in find(docs, "ConfigMap")}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        assert "configMapRef" in source, f"{container['name']}: only ConfigMaps are resolved here: {source}"
        env.update(maps[source["configMapRef"]["name"]])
    return {**env, **env_of(container)}


def meshserve_containers(docs: list[Doc]) -> list[tuple[str, Doc]]:
    return [
        (workload["metadata"]["name"], c)
        for workload in find(docs, "Deployment") + find(docs, "StatefulSet")
        for c in containers(workload, init=False)
        if c.get("command", [])[:2] == ["python", "-m"] and c["command"][2].startswith("services.")
    ]


def check(name: str, docs: list[Doc]) -> None:
    found = meshserve_containers(docs)
    assert {workload for workload, _ in found} == EXPECTED_IN[name]
    for workload, container in found:
        grpc = {k: v for k, v in effective_env(container, docs).items() if k.startswith("GRPC_")}
        assert grpc == GRPC_ENV, (name, workload, container["name"])


def test_the_grpc_settings_of_meshserve_up(overlay: tuple[str, list[Doc]]) -> None:
    check(*overlay)


def test_the_grpc_settings_of_meshserve_up_in_serverless(serverless: list[Doc]) -> None:
    check("serverless", serverless)


def test_the_filter_above_sees_every_grpc_setting() -> None:
    assert GRPC_ENV and all(name.startswith("GRPC_") for name in GRPC_ENV)
