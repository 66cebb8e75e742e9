"""The trace store's settings: defaults and `MESHSERVE_TRACES_*` from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.traces.settings import TracesSettings


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    defaults = TracesSettings()
    assert (defaults.port, str(defaults.db), defaults.metrics_port) == (4317, ".logs/traces.sqlite", 0)
    monkeypatch.setenv("MESHSERVE_TRACES_PORT", "14317")
    monkeypatch.setenv("MESHSERVE_TRACES_DB", str(tmp_path / "x.sqlite"))
    monkeypatch.setenv("MESHSERVE_TRACES_MAX_SPANS", "1000")
    monkeypatch.setenv("MESHSERVE_TRACES_MAX_AGE_S", "0")
    s = TracesSettings()
    assert (s.port, s.db, s.max_spans, s.max_age_s) == (14317, tmp_path / "x.sqlite", 1000, 0)
