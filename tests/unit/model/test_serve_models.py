"""serve_models: a replica loads only the models it serves; the rest of the repository stays listed, unread, and
calls for them are NOT_FOUND naming the setting."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from services.common.errors import NotFound
from services.model.manager import SERVE_MODELS_SETTING, ModelManager
from services.model.repository import ModelRepository
from services.model.settings import ModelSettings
from services.model.watcher import watch_repository
from tests.helpers.models import Mlp, mlp_config, save_scripted, write_model
from tests.unit.model.test_repository import _until


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """served: the replica's model; other: a valid model of another replica; unreadable: a config no parser takes,
    which a replica that never reads it cannot trip on."""
    root = tmp_path / "repo"
    write_model(root, "served", mlp_config("served"), {1: Mlp(1)})
    write_model(root, "other", mlp_config("other"), {1: Mlp(2)})
    (root / "unreadable" / "1").mkdir(parents=True)
    (root / "unreadable" / "config.yaml").write_text("name: [unterminated\n")
    return root


def test_the_setting_reads_json_and_names_the_env_the_errors_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ModelSettings.env_name("serve_models") == SERVE_MODELS_SETTING
    monkeypatch.setenv(SERVE_MODELS_SETTING, '["served"]')
    assert ModelSettings().serve_models == ["served"]
    monkeypatch.delenv(SERVE_MODELS_SETTING)
    assert ModelSettings().serve_models == []


def test_models_loaded_at_start_must_be_served() -> None:
    assert ModelSettings(serve_models=["a", "b"], models=["b"]).models == ["b"]
    assert ModelSettings(models=["x"]).models == ["x"]  # nothing restricted: any model may load at start
    with pytest.raises(ValidationError, match=r"models \['x'\] are not in serve_models \['a'\]"):
        ModelSettings(serve_models=["a"], models=["x"])


async def test_only_served_models_load_and_the_rest_stay_listed(repo: Path) -> None:
    manager = ModelManager(ModelRepository(repo), serve_models=["served"])
    try:
        await manager.load_all()
        assert set(manager.models) == {"served"}
        assert manager.get("served").version == 1
        rows = {(row.name, row.version): row for row in manager.index()}
        assert rows[("served", "1")].state == "READY"
        for name in ("other", "unreadable"):
            row = rows[(name, "")]
            assert row.state == "UNAVAILABLE"
            assert "this replica does not serve it" in row.reason and SERVE_MODELS_SETTING in row.reason
        for call in (lambda: manager.get("other"), lambda: manager.get("other", "1")):
            with pytest.raises(NotFound, match=f"'other' is in the repository, but .*{SERVE_MODELS_SETTING}"):
                call()
        with pytest.raises(NotFound, match=SERVE_MODELS_SETTING):
            await manager.load("other")
        with pytest.raises(NotFound, match=SERVE_MODELS_SETTING):
            await manager.unload("unreadable")
        with pytest.raises(NotFound, match="unknown model 'nope'"):  # not in the repository: no word of the setting
            manager.get("nope")
        assert set(manager.models) == {"served"}  # refused calls left nothing behind
    finally:
        await manager.close()


async def test_a_served_model_missing_from_the_repository_fails_alone(repo: Path) -> None:
    manager = ModelManager(ModelRepository(repo), serve_models=["served", "absent"])
    try:
        await manager.load_all()  # logs absent's failure, raises nothing
        assert manager.is_ready("served") and not manager.is_ready("absent")
        with pytest.raises(NotFound, match="unknown model 'absent'"):
            manager.get("absent")
    finally:
        await manager.close()


async def test_empty_serves_every_model_as_before(repo: Path) -> None:
    manager = ModelManager(ModelRepository(repo))
    try:
        await manager.load_all()
        assert manager.is_ready("served") and manager.is_ready("other")
        unreadable = next(row for row in manager.index() if row.name == "unreadable")
        assert unreadable.state == "UNAVAILABLE" and SERVE_MODELS_SETTING not in unreadable.reason
    finally:
        await manager.close()


async def test_the_watcher_leaves_models_of_other_replicas_alone(repo: Path, caplog: pytest.LogCaptureFixture) -> None:
    manager = ModelManager(ModelRepository(repo), drain_timeout_s=5.0, serve_models=["served"])
    await manager.load_all()
    stop = asyncio.Event()
    watching = asyncio.create_task(watch_repository(manager, debounce_ms=100, force_polling=True, stop=stop))
    try:
        await asyncio.sleep(0.3)  # the watcher has taken its first look
        save_scripted(Mlp(3), repo / "other" / "2" / "model.pt")
        await asyncio.sleep(0.3)  # a change of its own, seen before the served model's
        staging = repo / ".staging-served-2"
        save_scripted(Mlp(4), staging / "model.pt")
        os.rename(staging, repo / "served" / "2")
        await _until(lambda: manager.is_ready("served", "2"), "version 2 of served")
        assert set(manager.models) == {"served"}
        about_other = [r.getMessage() for r in caplog.records if re.search(r"\bother\b", r.getMessage())]
        assert not about_other  # not even a failed reload
    finally:
        stop.set()
        await asyncio.wait_for(watching, 10)
        await manager.close()
