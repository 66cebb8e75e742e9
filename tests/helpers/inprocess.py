"""A real service's GrpcService (shared interceptors, health, reflection) on a loopback port, in this process."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import grpc

from services.common.server import GrpcService
from services.common.settings import ServiceSettings


@asynccontextmanager
async def serving_built(service: GrpcService, handler: Any) -> AsyncIterator[GrpcService]:
    """A service as its `__main__.build(settings)` wired it, started and SERVING (the handler's `start` is not run:
    tests drive what they need); `service.handler` is its handler, closed at the end."""
    service.handler = handler  # type: ignore[attr-defined]
    await service.start()
    await service.set_serving(True)
    try:
        yield service
    finally:
        await service.server.stop(0)
        await handler.close()


@asynccontextmanager
async def serving_in_process(
    name: str,
    settings: ServiceSettings,
    service_name: str,
    register: Callable[[grpc.aio.Server], None],
    handler: Any,
) -> AsyncIterator[GrpcService]:
    """Start a server with `register` applied (a handler or servicer the test made), SERVING; `service.handler` is
    the domain handler under test (the test closes it)."""
    service = GrpcService(name, settings, [service_name])
    register(service.server)
    service.handler = handler  # type: ignore[attr-defined]
    await service.start()
    await service.set_serving(True)
    try:
        yield service
    finally:
        await service.server.stop(0)
