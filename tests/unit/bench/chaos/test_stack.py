"""bench.chaos.stack: the stack's topology and `meshserve up` arguments, and the private model repository."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from bench.chaos import stack as chaos_stack


def test_topology_pins_the_canary_to_the_versions_a_hot_load_adds(tmp_path: Path) -> None:
    data = yaml.safe_load(chaos_stack.topology_file(tmp_path / "t.yaml", 2, in_topology=False).read_text())
    assert data["canary"]["pinned_versions"]["fraud_mlp"] == list(range(2, 10))
    assert data["stable"]["pinned_versions"]["fraud_mlp"] == [1]
    assert data.get("gateway", {}).get("replicas", 1) == 1  # left as the demo's: the flag sets it
    with_gateways = yaml.safe_load(chaos_stack.topology_file(tmp_path / "g.yaml", 2, in_topology=True).read_text())
    assert with_gateways["gateway"] == {"replicas": 2}


def test_stack_arguments_use_the_flags_this_tree_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chaos_stack, "up_options", lambda: {"models", "topology", "gateway_replicas", "insecure"})
    args, stack = chaos_stack.stack_arguments(tmp_path, tmp_path / "models", 2)
    assert args[:2] == ["--models", str(tmp_path / "models")] and args[2] == "--topology"
    assert args[4:] == ["--gateway-replicas", "2", "--insecure"]
    assert stack["gateway replicas"] == 2
    assert "--insecure" not in chaos_stack.stack_arguments(tmp_path, tmp_path / "models", 2, secure=True)[0]
    monkeypatch.setattr(chaos_stack, "up_options", lambda: {"models", "topology"})
    args, stack = chaos_stack.stack_arguments(tmp_path, tmp_path / "models", 2)
    assert "--insecure" not in args and "--gateway-replicas" not in args
    assert isinstance(stack["gateway replicas"], int) or "runs one" in stack["gateway replicas"]


def test_the_private_model_repository_holds_models_not_build_scripts(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "m" / "1").mkdir(parents=True)
    (source / "m" / "config.yaml").write_text("name: m\n")
    (source / "m" / "1" / "model.pt").write_bytes(b"w")
    (source / "build.py").write_text("")
    (source / "scripts").mkdir()
    copy = chaos_stack.copy_models(tmp_path / "copy", source)
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*")) == ["m", "m/1", "m/1/model.pt", "m/config.yaml"]
