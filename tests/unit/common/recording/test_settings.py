"""MESHSERVE_TRACING_*: the peers, the mode, and a peers file read again each time."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.common.recording.settings import RecordingSettings


def test_settings_peers_and_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_TRACING_PEERS", "a:9000, b:9001")
    assert RecordingSettings().peers == ["a:9000", "b:9001"] and RecordingSettings().retroactive
    monkeypatch.setenv("MESHSERVE_TRACING_PEERS", '["c:9002"]')
    assert RecordingSettings().peers == ["c:9002"]
    monkeypatch.setenv("MESHSERVE_TRACING_MODE", "head")
    assert not RecordingSettings().retroactive
    monkeypatch.delenv("MESHSERVE_TRACING_PEERS")
    monkeypatch.setenv("MESHSERVE_TRACING_MODE", "auto")
    assert not RecordingSettings().retroactive
    monkeypatch.setenv("MESHSERVE_TRACING_MODE", "retroactive")
    assert RecordingSettings().retroactive


def test_a_peers_file_is_read_each_time(tmp_path: Path) -> None:
    listed = tmp_path / "peers"
    settings = RecordingSettings(peers=["a:1"], peers_file=listed)
    assert settings.retroactive and settings.all_peers() == ["a:1"]  # not written yet
    listed.write_text("b:2\nc:3, a:1\n")
    assert settings.all_peers() == ["a:1", "b:2", "c:3"]
    listed.write_text('["d:4"]')
    assert settings.all_peers() == ["a:1", "d:4"]
