"""Retroactive tracing in every overlay: every service runs in retroactive mode, each of its peers is a headless
Service that selects every pod of one service on the port that pod serves its metrics (and the collect path) on,
and every Deployment's pods are some peer's."""

from __future__ import annotations

from services.common.recording import RecordingSettings
from tests.manifests.support import Doc, containers, find, one

SERVICES = {"gateway", "model", "feature", "cache"}


def common_settings(docs: list[Doc]) -> dict[str, str]:
    (config,) = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].startswith("meshserve-common")]
    return dict(config["data"])


def metrics_port(workload: Doc) -> int:
    (port,) = [
        p["containerPort"]
        for c in containers(workload, init=False)
        for p in c.get("ports", [])
        if p.get("name") == "http-metrics"
    ]
    return int(port)


def test_every_service_records_and_every_pod_is_a_peer(overlay: tuple[str, list[Doc]]) -> None:
    name, docs = overlay
    data = common_settings(docs)
    settings = RecordingSettings.model_validate(
        {field: data[RecordingSettings.env_name(field)] for field in ("mode", "peers")}
    )
    assert settings.retroactive, name
    peered: set[str] = set()
    for peer in settings.peers:
        host, _, port = peer.rpartition(":")
        service = one(docs, "Service", host)
        spec = service["spec"]
        assert spec.get("clusterIP") == "None", f"{name}: {host} is not headless: its name resolves to one address"
        assert spec.get("publishNotReadyAddresses") is True, f"{name}: {host} drops draining pods"
        assert [p["port"] for p in spec["ports"]] == [int(port)], (name, peer)
        selected = [
            w
            for w in find(docs, "Deployment")
            if all(w["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in spec["selector"].items())
        ]
        assert selected, f"{name}: {host} selects no pods"
        for workload in selected:
            assert metrics_port(workload) == int(port), (name, peer, workload["metadata"]["name"])
            peered.add(workload["metadata"]["name"])
    apps = {
        w["metadata"]["name"]
        for w in find(docs, "Deployment")
        if w["spec"]["template"]["metadata"]["labels"].get("app") in SERVICES
    }
    assert apps and apps <= peered, f"{name}: pods no peer lists: {sorted(apps - peered)}"
