"""The repository on disk (Triton layout) and the watcher that hot-reloads the models whose files change."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from services.common.errors import InvalidArgument, NotFound
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.watcher import changed_models, watch_repository
from tests.helpers.models import Mlp, mlp_config, save_scripted, write_model


def test_models_and_versions_on_disk(repo: Path) -> None:
    (repo / "not_a_model").mkdir()  # no config.yaml
    for extra in ("0", "notes", ".hidden"):
        (repo / "mlp" / extra).mkdir()
    repository = ModelRepository(repo)
    assert repository.model_names() == ["batched", "broken", "int8", "mlp", "multi"]
    assert repository.has_model("mlp") and not repository.has_model("not_a_model")
    assert repository.versions("mlp") == [1, 2, 3]
    assert repository.version_dir("mlp", 2) == repo / "mlp" / "2"
    assert repository.read_config("mlp").version_policy.select([1, 2, 3]) == [2, 3]
    assert ModelRepository(repo / "missing").model_names() == []


@pytest.mark.parametrize("name", ["nope", "../repo/mlp", ".hidden", "not_a_model"])
def test_reading_a_config_outside_the_repository_is_not_found(repo: Path, name: str) -> None:
    (repo / "not_a_model").mkdir()
    with pytest.raises(NotFound, match="is not in the repository"):
        ModelRepository(repo).read_config(name)


def test_a_broken_config_is_invalid_argument(repo: Path) -> None:
    with pytest.raises(InvalidArgument, match=r"broken/config\.yaml: invalid model config: backend: unknown backend"):
        ModelRepository(repo).read_config("broken")


def test_fingerprint_changes_with_the_config_or_any_file_of_the_version(repo: Path) -> None:
    repository = ModelRepository(repo)
    before = {v: repository.fingerprint("mlp", v) for v in (2, 3)}
    save_scripted(Mlp(9), repo / "mlp" / "3" / "model.pt")
    os.utime(repo / "mlp" / "3" / "model.pt", ns=(1, 1))  # a new mtime even on coarse-clock filesystems
    assert repository.fingerprint("mlp", 3) != before[3]
    assert repository.fingerprint("mlp", 2) == before[2]
    (repo / "mlp" / "config.yaml").write_text((repo / "mlp" / "config.yaml").read_text() + "\nwarmup: false\n")
    assert repository.fingerprint("mlp", 2) != before[2]


def test_changed_models_are_the_top_level_folders_under_the_root(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    paths = {
        str(root / "a" / "1" / "model.pt"),
        str(root / "a" / "config.yaml"),
        str(root / "b"),
        str(root / ".staging-c-2" / "model.pt"),  # staging folders are not models
        str(tmp_path / "elsewhere" / "x"),
    }
    assert changed_models(root, paths) == {"a", "b"}


async def _until(condition: Callable[[], bool], what: str) -> None:
    """Poll for up to 30 s: the watcher reacts to the filesystem, not to anything this test can await."""
    for _ in range(600):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


async def test_watcher_loads_new_versions_and_unloads_removed_models(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    write_model(root, "w", mlp_config("w"), {1: Mlp(1)})
    write_model(root, "gone", mlp_config("gone"), {1: Mlp(2)})
    manager = ModelManager(ModelRepository(root), drain_timeout_s=5.0)
    await manager.load_all()
    stop = asyncio.Event()
    watching = asyncio.create_task(watch_repository(manager, debounce_ms=100, force_polling=True, stop=stop))
    try:
        await asyncio.sleep(0.3)  # the watcher has taken its first look
        staging = root / ".staging-w-2"
        save_scripted(Mlp(3), staging / "model.pt")
        os.rename(staging, root / "w" / "2")
        await _until(lambda: manager.is_ready("w", "2"), "version 2 of w")
        await _until(lambda: not manager.is_ready("w", "1"), "version 1 of w to retire")
        shutil.rmtree(root / "gone")
        await _until(lambda: not manager.is_ready("gone"), "gone to unload")
        assert manager.get("w").version == 2
    finally:
        stop.set()
        await asyncio.wait_for(watching, 10)
        await manager.close()


def test_a_load_error_is_shown_relative_to_the_repository(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo.parent)
    for repository in (ModelRepository(repo), ModelRepository(Path(repo.name))):  # absolute, relative to the cwd
        assert repository.relative(f"{repo}/mlp/1/model.pt not found") == "mlp/1/model.pt not found"
        assert repository.relative(f"{repo.resolve()}/mlp/config.yaml") == "mlp/config.yaml"


@pytest.mark.parametrize("size", [256, 200_000])
def test_a_name_longer_than_a_folder_name_is_invalid_argument(repo: Path, size: int) -> None:
    repository = ModelRepository(repo)
    assert not repository.has_model("m" * size)
    with pytest.raises(InvalidArgument, match=f"model name of {size} bytes; a model name has at most 255"):
        repository.read_config("m" * size)
    with pytest.raises(NotFound, match="'mmm"):
        repository.read_config("m" * 255)
