"""Fixtures for in-process feature tests: settings, rows, and handlers on a Redis URL that refuses connections
(no Valkey here: tests on a real one are in tests/integration/feature)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from services.feature.handler import FeatureHandler
from tests.helpers.fixtures import feature_settings
from tests.helpers.servers import free_port


@pytest.fixture()
def refused_url() -> str:
    """A Redis URL nothing listens on (a free loopback port): every store call fails at once."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture()
async def make_offline_handler(refused_url: str) -> AsyncIterator[Callable[..., FeatureHandler]]:
    """Build FeatureHandlers whose online store refuses connections; all are closed at the end."""
    made: list[FeatureHandler] = []

    def make(features_dir: Path | None = None, **overrides: Any) -> FeatureHandler:
        if features_dir is not None:
            overrides["features_dir"] = features_dir
        handler = FeatureHandler(feature_settings(**overrides), refused_url)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        await handler.close()
