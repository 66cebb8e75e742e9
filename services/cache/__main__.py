"""`python -m services.cache`: serve the response cache over gRPC until SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from services.cache.handler import CacheHandler
from services.cache.servicer import OPERATOR_RPCS, SERVICE_NAME, CacheServicer
from services.cache.settings import CacheSettings
from services.common.embedded import redis_url_or_embedded
from services.common.logs import setup_logging
from services.common.operator_check import OperatorCheck
from services.common.server import GrpcService
from services.protos import cache_pb2_grpc

log = logging.getLogger("services.cache")


def build(settings: CacheSettings) -> tuple[GrpcService, CacheHandler]:
    """The server with the CacheServicer on a handler in front of the Redis at `settings.redis_url` (`serve` sets it
    to an embedded Valkey's when it is unset; None here: L1 only). The handler's liveness and readiness are the
    server's lifecycle; its Watch streams end as soon as draining starts, so watchers go elsewhere. Invalidate
    needs the operator's token when the settings have one (said in the log either way)."""
    service = GrpcService("cache", settings, [SERVICE_NAME])
    handler = CacheHandler(settings, settings.redis_url, service.lifecycle)
    operator = OperatorCheck(
        settings.admin_token.get_secret_value(), CacheSettings.env_name("admin_token"), OPERATOR_RPCS
    )
    operator.announce(log)
    cache_pb2_grpc.add_CacheServiceServicer_to_server(CacheServicer(handler, operator), service.server)
    service.drain_hooks.append(handler.drain)
    return service, handler


async def serve(settings: CacheSettings) -> None:
    """Build (on an embedded Valkey when no Redis URL is set), then serve until SIGTERM."""
    async with redis_url_or_embedded(settings.redis_url) as url:
        service, handler = build(settings.model_copy(update={"redis_url": url}))
        await service.run(handler.start, handler.close)


def main() -> None:
    settings = CacheSettings()
    setup_logging("cache", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
