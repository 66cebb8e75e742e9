"""The local stack's layout: default ports, free ports, process specs and their dependencies."""

from __future__ import annotations

import json
from pathlib import Path

from services.cli.topology import Topology, build_specs


def test_default_ports_follow_the_documented_layout(tmp_path: Path) -> None:
    t = Topology.local(8000, models_dir=tmp_path)
    specs = {s.name: s for s in build_specs(t, "redis://127.0.0.1:6379")}
    assert specs["gateway"].port == 8000 and specs["gateway"].metrics_port == 9000
    assert specs["model-v1-a"].port == 8001 and specs["model-v1-a"].metrics_port == 9001
    assert specs["feature"].port == 8002 and specs["cache"].port == 8003
    assert specs["model-v1-b"].port == 8011 and specs["model-v2"].port == 8021
    assert list(specs)[-1] == "gateway"
    assert set(specs["gateway"].depends_on) == set(specs) - {"gateway"}


def test_specs_carry_settings(tmp_path: Path) -> None:
    t = Topology.local(8000, models_dir=tmp_path, pipelines_dir=tmp_path / "p")
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
    t = Topology.local(0, gateway_port=12345, models_dir=tmp_path, v1_replicas=3, canary=False)
    specs = build_specs(t, "redis://x:1")
    assert [s.name for s in specs] == ["model-v1-a", "model-v1-b", "model-v1-c", "feature", "cache", "gateway"]
    ports = [p for s in specs for p in (s.port, s.metrics_port)]
    assert len(set(ports)) == len(ports) and 12345 in ports
