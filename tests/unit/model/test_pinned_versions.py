"""Version pinning: a replica loads only the pinned versions of a model, overriding its version_policy."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from services.common.errors import InvalidArgument, NotFound
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.settings import ModelSettings
from tests.helpers.models import Mlp, mlp_config, write_model


def test_setting_reads_json_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_MODEL_PINNED_VERSIONS", '{"fraud_mlp": [1]}')
    assert ModelSettings().pinned_versions == {"fraud_mlp": [1]}
    monkeypatch.delenv("MESHSERVE_MODEL_PINNED_VERSIONS")
    assert ModelSettings().pinned_versions == {}


@pytest.mark.parametrize(("pinned", "served"), [(None, [1, 2]), ([1], [1]), ([2], [2]), ([1, 2, 7], [1, 2])])
def test_pinned_versions_override_the_policy(tmp_path: Path, pinned: list[int] | None, served: list[int]) -> None:
    write_model(tmp_path, "m", mlp_config("m", version_policy={"all": {}}), {1: Mlp(1), 2: Mlp(2)})
    write_model(tmp_path, "other", mlp_config("other"), {1: Mlp(3), 2: Mlp(4)})

    async def run() -> None:
        manager = ModelManager(ModelRepository(tmp_path), pinned_versions={"m": pinned} if pinned else None)
        await manager.load_all()
        try:
            assert sorted(manager.models["m"].ready) == served
            assert manager.get("m").version == served[-1]  # an unversioned request names the subset
            assert sorted(manager.models["other"].ready) == [2]  # unpinned models keep their policy
            if pinned == [1]:
                with pytest.raises(NotFound):
                    manager.get("m", "2")
        finally:
            await manager.close()

    asyncio.run(run())


def test_pinning_a_version_not_on_disk_is_an_error(tmp_path: Path) -> None:
    write_model(tmp_path, "m", mlp_config("m"), {1: Mlp(1)})

    async def run() -> None:
        manager = ModelManager(ModelRepository(tmp_path), pinned_versions={"m": [5]})
        try:
            with pytest.raises(InvalidArgument, match="pinned_versions"):
                await manager.load("m")
        finally:
            await manager.close()

    asyncio.run(run())
