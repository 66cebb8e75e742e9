"""The local stack's layout: default ports, free ports, process specs and their dependencies."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from services.cli.layout import StackLayout, mesh_topology
from services.cli.specs import build_specs, busy_ports
from services.cli.stack_topology import StackTopology


def test_default_ports_follow_the_documented_layout(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path)
    specs = {s.name: s for s in build_specs(t, "redis://127.0.0.1:6379")}
    assert specs["gateway"].port == 8000 and specs["gateway"].metrics_port == 9000
    assert specs["model-v1-a"].port == 8001 and specs["model-v1-a"].metrics_port == 9001
    assert specs["feature"].port == 8002 and specs["cache"].port == 8003
    assert specs["model-v1-b"].port == 8011 and specs["model-v2"].port == 8021
    assert list(specs)[-1] == "gateway"
    assert set(specs["gateway"].depends_on) == set(specs) - {"gateway"}


def test_specs_carry_settings(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path, pipelines_dir=tmp_path / "p")
    specs = {s.name: s for s in build_specs(t, "redis://x:1")}
    assert json.loads(specs["model-v1-b"].env["MESHSERVE_MODEL_PINNED_VERSIONS"]) == {"fraud_mlp": [1]}
    assert json.loads(specs["model-v2"].env["MESHSERVE_MODEL_PINNED_VERSIONS"]) == {"fraud_mlp": [2]}
    assert specs["model-v2"].env["MESHSERVE_MODEL_REPOSITORY"] == str(tmp_path.resolve())
    assert specs["feature"].env["MESHSERVE_REDIS_URL"] == specs["cache"].env["MESHSERVE_REDIS_URL"] == "redis://x:1"
    gw = specs["gateway"].env
    assert gw["MESHSERVE_GATEWAY_PORT"] == "8000"
    assert gw["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == "127.0.0.1:8001"
    assert gw["MESHSERVE_GATEWAY_FEATURE_ADDRESS"] == "127.0.0.1:8002"
    assert gw["MESHSERVE_GATEWAY_CACHE_ADDRESS"] == "127.0.0.1:8003"
    assert gw["MESHSERVE_GATEWAY_PIPELINES_DIR"] == str((tmp_path / "p").resolve())
    assert specs["gateway"].argv[1:] == ["-m", "services.gateway"]


def test_port_base_zero_picks_distinct_free_ports(tmp_path: Path) -> None:
    three_no_canary = StackTopology.demo().with_counts(3, canary=False)
    t = StackLayout.local(0, gateway_port=12345, models_dir=tmp_path, topology=three_no_canary)
    specs = build_specs(t, "redis://x:1")
    assert [s.name for s in specs] == ["model-v1-a", "model-v1-b", "model-v1-c", "feature", "cache", "gateway"]
    ports = [p for s in specs for p in (s.port, s.metrics_port)]
    assert len(set(ports)) == len(ports) and 12345 in ports


def test_mesh_puts_envoy_between_the_gateway_and_its_upstreams(tmp_path: Path) -> None:
    t = StackLayout.local(8000, models_dir=tmp_path, mesh=True)
    assert (t.ingress_port, t.admin_port) == (8080, 9901)
    assert t.listen_ports == {"gateway": 8100, "model": 8101, "feature": 8102, "cache": 8103}
    with pytest.raises(ValueError, match="Envoy's command"):
        build_specs(t, "redis://x:1")
    specs = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy", "-c", "x.yaml"])}
    assert specs["envoy"].argv == ["envoy", "-c", "x.yaml"]
    assert specs["envoy"].health_url == "http://127.0.0.1:9901/ready"
    assert "envoy" in specs["gateway"].depends_on and "gateway" not in specs["envoy"].depends_on
    gw = specs["gateway"].env
    assert gw["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == "127.0.0.1:8101"
    assert gw["MESHSERVE_GATEWAY_FEATURE_ADDRESS"] == "127.0.0.1:8102"
    assert gw["MESHSERVE_GATEWAY_CACHE_ADDRESS"] == "127.0.0.1:8103"

    mesh = mesh_topology(t)
    assert mesh.ingress == "127.0.0.1:8080" and mesh.admin == "127.0.0.1:9901"
    model = mesh.services["model"]
    assert model.listen == "127.0.0.1:8101"
    assert [(r.address, r.labels["version"]) for r in model.replicas] == [
        ("127.0.0.1:8001", "v1"),
        ("127.0.0.1:8011", "v1"),
        ("127.0.0.1:8021", "v2"),
    ]
    assert mesh.services["gateway"].replicas[0].address == "127.0.0.1:8000"


def test_busy_ports_name_the_holder(tmp_path: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        t = StackLayout.local(0, gateway_port=port, models_dir=tmp_path, mesh=True)
        specs = build_specs(t, "redis://x:1", envoy_command=["envoy"])
        assert busy_ports(t, specs) == [f"gateway: port {port}"]


def test_redis_passwords_are_not_printed() -> None:
    from services.cli.up import redact

    assert redact("redis://user:secret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redact("rediss://:pw@h:1") == "rediss://:***@h:1"
    assert redact("redis://127.0.0.1:16381") == "redis://127.0.0.1:16381"


def test_free_port_layouts_never_repeat_a_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import services.cli.layout as layout

    offered = iter([40001, 40001, 40002, 40002, *range(40003, 40100)])  # the OS offering a released port again
    monkeypatch.setattr(layout, "free_port", lambda host="127.0.0.1": next(offered))
    t = StackLayout.local(0, models_dir=tmp_path, mesh=True, traces=True)
    ports = [
        *(t.gateway_port, t.gateway_metrics_port, t.feature_port, t.feature_metrics_port, t.cache_port),
        *(t.cache_metrics_port, t.ingress_port, t.admin_port, t.traces_port, *t.listen_ports.values()),
        *(p for r in t.replicas for p in (r.port, r.metrics_port)),
    ]
    assert len(ports) == len(set(ports)) == 19
    assert sorted(port for _, port in t.ports()) == sorted(ports)  # what the clash check looks at


def test_a_layout_whose_ports_clash_is_refused(tmp_path: Path) -> None:
    crowded = StackTopology.model_validate(
        {"stable": {"subset": "v1", "replicas": 8}, "canary": {"subset": "v2", "replicas": 3}}
    )
    with pytest.raises(ValueError, match=r"port 8101: model-v2-c, envoy model"):
        StackLayout.local(8000, topology=crowded, models_dir=tmp_path, mesh=True)


def test_the_topology_names_and_places_the_replicas(tmp_path: Path) -> None:
    topology = StackTopology.model_validate(
        {
            "stable": {"subset": "blue", "replicas": 1, "pinned_versions": {"m": [3]}},
            "canary": {"subset": "green", "replicas": 2, "pinned_versions": {"m": [4]}},
        }
    )
    t = StackLayout.local(9000, topology=topology, models_dir=tmp_path)
    assert [(r.name, r.subset, r.port, r.pinned_versions) for r in t.replicas] == [
        ("model-blue-a", "blue", 9001, {"m": [3]}),
        ("model-green-a", "green", 9021, {"m": [4]}),
        ("model-green-b", "green", 9031, {"m": [4]}),
    ]
    specs = {s.name: s for s in build_specs(t, "redis://x:1")}
    assert specs["model-green-b"].role == "model green m:[4]"
