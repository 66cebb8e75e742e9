"""LocalMesh without a running Envoy: its command line, weight changes in route files, attach, `render`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.mesh.__main__ import main
from services.mesh.envoy import EnvoyProcess
from services.mesh.errors import MeshConfigError
from services.mesh.local import LocalMesh
from tests.unit.mesh.conftest import ISTIO, topology


def test_envoy_process_command_line(tmp_path: Path) -> None:
    proc = EnvoyProcess(tmp_path / "envoy.yaml", "127.0.0.1:9901", tmp_path / "envoy.log", concurrency=1)
    assert "--disable-hot-restart" in proc.command and "--log-path" in proc.command


def route_weights(workdir: Path) -> list[int]:
    doc = yaml.safe_load((workdir / "routes" / "outbound_model.yaml").read_text())
    split = doc["resources"][0]["virtual_hosts"][0]["routes"][-1]
    return [c["weight"] for c in split["route"]["weighted_clusters"]["clusters"]]


def test_set_weights_promote_rollback_and_attach(tmp_path: Path) -> None:
    mesh = LocalMesh(topology(), [ISTIO], tmp_path)
    mesh.render()
    assert mesh.subsets("model") == ["v1", "v2"]
    assert mesh.weights("model") == {"v1": 90, "v2": 10}
    assert mesh.set_weights("model", {"v1": 75, "v2": 25}, wait=False) == {"v1": 75, "v2": 25}
    assert route_weights(tmp_path) == [75, 25]
    other = LocalMesh.attach(tmp_path)  # e.g. the CLI in another process
    assert other.weights("model") == {"v1": 75, "v2": 25}
    other.promote("model", wait=False)
    assert route_weights(tmp_path) == [0, 100]
    other.rollback("model", wait=False)
    assert route_weights(tmp_path) == [100, 0]
    assert LocalMesh.attach(tmp_path).weights("model") == {"v1": 100, "v2": 0}
    assert not list((tmp_path / ".routes.staging").iterdir())  # written then renamed into place


@pytest.mark.parametrize(
    ("service", "weights", "fragment"),
    [
        ("model", {"v1": 50, "v2": 40}, "sum to 100"),
        ("model", {"v3": 100}, "unknown subsets"),
        ("feature", {"v1": 100}, "no weighted route"),
        ("nope", {"v1": 100}, "unknown service"),
    ],
)
def test_set_weights_errors(tmp_path: Path, service: str, weights: dict[str, int], fragment: str) -> None:
    mesh = LocalMesh(topology(), [ISTIO], tmp_path)
    mesh.render()
    with pytest.raises(MeshConfigError, match=fragment):
        mesh.set_weights(service, weights, wait=False)


def test_attach_without_state(tmp_path: Path) -> None:
    with pytest.raises(MeshConfigError, match="no local mesh state"):
        LocalMesh.attach(tmp_path)


def test_command_line_render_and_not_applicable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = tmp_path / "topology.yaml"
    topo.write_text(topology().model_dump_json())
    assert main(["render", "--topology", str(topo), "--istio", str(ISTIO), "--workdir", str(tmp_path / "w")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "w" / "envoy.yaml")
    assert (tmp_path / "w" / "routes" / "outbound_model.yaml").is_file()
    assert main(["not-applicable"]) == 0
    assert "PeerAuthentication: mutual TLS" in capsys.readouterr().out
    assert main(["render", "--topology", str(tmp_path / "none.yaml"), "--workdir", str(tmp_path / "w")]) == 2
    assert "none.yaml" in capsys.readouterr().err


def test_the_shipped_example_topology_renders_from_any_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from services.mesh.__main__ import EXAMPLE_TOPOLOGY

    monkeypatch.chdir(tmp_path)  # no istio/ here: the checkout's is used
    assert main(["render", "--topology", str(EXAMPLE_TOPOLOGY)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / ".meshserve" / "mesh" / "envoy.yaml")
    mesh = LocalMesh.attach(tmp_path / ".meshserve" / "mesh")
    assert sorted(mesh.topology.services) == ["cache", "feature", "gateway", "model"]
    assert mesh.weights("model") == {"v1": 90, "v2": 10}
    with pytest.raises(SystemExit):
        main(["validate"])
    assert str(EXAMPLE_TOPOLOGY) in capsys.readouterr().err
