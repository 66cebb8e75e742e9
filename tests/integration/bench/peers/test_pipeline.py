"""bench.peers.pipeline's probe of Ray Serve's virtualenv, run for real: a python that answers the probe is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import pipeline as pp

ROOT = Path(__file__).resolve().parents[4]


def fake_python(path: Path, exit_code: int) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    path.chmod(0o755)


def test_an_existing_ray_venv_that_passes_the_probe_is_used_as_it_is(tmp_path: Path, monkeypatch) -> None:
    venv = tmp_path / "ray-venv"
    fake_python(venv / "bin" / "python", 0)
    monkeypatch.setattr(pp, "venv_commands", lambda *a: pytest.fail("reinstalled a working virtualenv"))

    assert pp.ensure_ray_venv(venv, ROOT / "tools" / "ray-requirements.txt") == venv / "bin" / "python"
