"""Every Python process of the local stack runs grpc on its iomgr endpoints unless the caller chose otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.cli.stack import specs
from services.cli.stack.layout import StackLayout


def python_specs(tmp_path: Path) -> list[specs.ProcessSpec]:
    layout = StackLayout.local(0, models_dir=tmp_path, traces=True, traces_db=tmp_path / "t.sqlite")
    return [s for s in specs.build_specs(layout, "redis://x:1") if s.argv[1:2] == ["-m"]]


def test_every_python_process_gets_grpcs_iomgr_endpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GRPC_EXPERIMENTS", raising=False)
    built = python_specs(tmp_path)
    assert {s.name for s in built} >= {"traces", "gateway", "feature", "cache", "model-v1-a"}
    for spec in built:
        assert spec.env["GRPC_EXPERIMENTS"] == specs.GRPC_EXPERIMENTS, spec.name
        assert spec.env["PYTHONUNBUFFERED"] == "1"


def test_a_grpc_experiments_setting_of_the_caller_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GRPC_EXPERIMENTS", "event_engine_client")
    for spec in python_specs(tmp_path):
        assert "GRPC_EXPERIMENTS" not in spec.env  # the supervisor passes its own environment on
