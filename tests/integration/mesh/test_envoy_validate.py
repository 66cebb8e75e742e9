"""Rendered configurations pass `envoy --mode validate` (Istio's default retries included); Envoy's rejections
are reported; the command line validates."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.mesh import LocalMesh, MeshConfigError
from services.mesh.envoy import validate
from tests.unit.mesh.conftest import ISTIO, topology, vs


@pytest.mark.parametrize("variant", [None, "model-fault.yaml"])
def test_rendered_config_passes_envoy_validate(tmp_path: Path, variant: str | None) -> None:
    paths = [ISTIO] + ([ISTIO / "variants" / variant] if variant else [])
    mesh = LocalMesh(topology(otlp="127.0.0.1:4317"), paths, tmp_path)
    mesh.validate()
    assert sorted(p.name for p in (tmp_path / "routes").iterdir()) == [
        "ingress.yaml",
        "outbound_cache.yaml",
        "outbound_feature.yaml",
        "outbound_gateway.yaml",
        "outbound_model.yaml",
    ]


def test_a_topology_on_unix_sockets_passes_envoy_validate(tmp_path: Path) -> None:
    from tests.unit.mesh.test_unix_sockets import socket_topology

    for dynamic in (False, True):
        LocalMesh(socket_topology(dynamic=dynamic), [ISTIO], tmp_path / str(dynamic)).validate()


def test_envoy_rejection_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "envoy.yaml"
    bad.write_text("static_resources: {clusters: [{name: x, typo_field: 1}]}\n")
    with pytest.raises(MeshConfigError, match="rejected by envoy"):
        validate(bad)


def test_routes_with_istio_default_retries_and_with_none_pass_envoy_validate(tmp_path: Path) -> None:
    istio = tmp_path / "istio"
    istio.mkdir()
    http = [
        {
            "name": "none",
            "match": [{"headers": {"x-a": {"exact": "1"}}}],
            "route": [{"destination": {"host": "model"}}],
            "retries": {"attempts": 0},
        },
        {"name": "default", "route": [{"destination": {"host": "model"}}]},
    ]
    (istio / "vs.yaml").write_text(yaml.safe_dump(vs(http)))
    mesh = LocalMesh(topology(), [istio], tmp_path / "work")
    mesh.validate()
    routes = yaml.safe_load((tmp_path / "work" / "routes" / "outbound_model.yaml").read_text())
    none, default = routes["resources"][0]["virtual_hosts"][0]["routes"]
    assert "retry_policy" not in none["route"]
    assert default["route"]["retry_policy"]["num_retries"] == 2


def test_command_line_validate_and_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from services.mesh.__main__ import main

    topo = tmp_path / "topology.yaml"
    topo.write_text(topology().model_dump_json())
    assert main(["validate", "--topology", str(topo), "--workdir", str(tmp_path / "w")]) == 0
    bad = tmp_path / "istio" / "dr.yaml"
    bad.parent.mkdir()
    bad.write_text(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: model}\n"
        "spec: {host: model, trafficPolicy: {outlierDetection: {consecutiveErrors: 5}}}\n"
    )
    assert main(["render", "--topology", str(topo), "--istio", str(bad.parent), "--workdir", str(tmp_path / "w")]) == 2
    assert (
        "dr.yaml: DestinationRule 'model': spec.trafficPolicy.outlierDetection.consecutiveErrors"
        in capsys.readouterr().err
    )


def test_the_shipped_example_topology_is_valid(tmp_path: Path) -> None:
    from services.mesh.__main__ import EXAMPLE_TOPOLOGY, main

    assert main(["validate", "--topology", str(EXAMPLE_TOPOLOGY), "--workdir", str(tmp_path / "w")]) == 0
