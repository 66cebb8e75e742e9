"""Watches the model repository and reloads (or unloads) the models whose files changed."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from watchfiles import awatch

from services.common.errors import MeshserveError
from services.model.manager import ModelManager

log = logging.getLogger(__name__)


def changed_models(root: Path, paths: set[str]) -> set[str]:
    """Top-level model folder names touched by a set of changed paths."""
    names: set[str] = set()
    for raw in paths:
        try:
            parts = Path(raw).resolve().relative_to(root.resolve()).parts
        except ValueError:
            continue
        if parts and not parts[0].startswith("."):
            names.add(parts[0])
    return names


async def watch_repository(manager: ModelManager, debounce_ms: int, force_polling: bool, stop: asyncio.Event) -> None:
    """Reload each changed model this replica serves once the repository has been quiet for debounce_ms."""
    root = manager.repository.root
    log.info("watching %s for model changes", root)
    async for changes in awatch(
        root, debounce=debounce_ms, step=50, stop_event=stop, force_polling=force_polling, recursive=True
    ):
        for name in sorted(changed_models(root, {path for _, path in changes})):
            if not manager.serves(name):
                continue  # another replica's model: never read here
            try:
                if manager.repository.has_model(name):
                    log.info("repository change: reloading %s", name)
                    await manager.load(name)
                elif name in manager.models and manager.models[name].ready:
                    log.info("repository change: %s removed, unloading", name)
                    await manager.unload(name)
            except MeshserveError as exc:
                log.error("reload of %s failed, previous versions keep serving: %s", name, exc)
            except Exception:
                log.exception("reload of %s failed", name)
