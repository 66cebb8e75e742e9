"""Fixtures for in-process cache tests: settings, handlers (L1 only, or on a Redis URL that refuses connections)
and the real CacheService on a loopback port, all in this process (no Valkey here: see tests/integration)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from services.cache.__main__ import build
from services.cache.handler import CacheHandler
from services.common.server import GrpcService
from tests.helpers.fixtures import cache_settings
from tests.helpers.inprocess import serving_built
from tests.helpers.servers import free_port


@pytest.fixture()
def refused_redis_url() -> str:
    """A Redis URL on a loopback port nothing listens on: every connection is refused at once."""
    return f"redis://127.0.0.1:{free_port()}/0"


@pytest.fixture()
async def make_handler() -> AsyncIterator[Callable[..., CacheHandler]]:
    """Build CacheHandlers (`redis_url=None`: L1 only); all are closed at the end."""
    made: list[CacheHandler] = []

    def make(redis_url: str | None = None, **overrides: Any) -> CacheHandler:
        handler = CacheHandler(cache_settings(**overrides), redis_url)
        made.append(handler)
        return handler

    yield make
    for handler in made:
        await handler.close()


@pytest.fixture()
async def cache_server() -> AsyncIterator[GrpcService]:
    """The real CacheService as `python -m services.cache` wires it (L1 only, heartbeats every 0.2 s) on a loopback
    port, in this process."""
    async with serving_built(*build(cache_settings(watch_heartbeat_s=0.2))) as service:
        yield service
