"""`python -m services.feature`: serve feature sets over gRPC until SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from services.common.embedded import redis_url_or_embedded
from services.common.logs import setup_logging
from services.common.operator_check import OperatorCheck
from services.common.server import GrpcService
from services.feature.handler import FeatureHandler
from services.feature.servicer import OPERATOR_RPCS, SERVICE_NAME, FeatureServicer
from services.feature.settings import FeatureSettings
from services.protos import feature_pb2_grpc

log = logging.getLogger("services.feature")


def build(settings: FeatureSettings) -> tuple[GrpcService, FeatureHandler]:
    """The server with the FeatureServicer on a handler over the online store at `settings.redis_url` (`serve` sets
    it to an embedded Valkey's when it is unset); liveness and readiness are the server's lifecycle. Ingest needs
    the operator's token when the settings have one (said in the log either way)."""
    if not settings.redis_url:
        raise ValueError("the feature service needs a Redis URL (serve starts an embedded Valkey when none is set)")
    service = GrpcService("feature", settings, [SERVICE_NAME])
    handler = FeatureHandler(settings, settings.redis_url, service.lifecycle)
    operator = OperatorCheck(
        settings.admin_token.get_secret_value(), FeatureSettings.env_name("admin_token"), OPERATOR_RPCS
    )
    operator.announce(log)
    feature_pb2_grpc.add_FeatureServiceServicer_to_server(FeatureServicer(handler, operator), service.server)
    return service, handler


async def serve(settings: FeatureSettings) -> None:
    """Build (on an embedded Valkey when no Redis URL is set), then serve until SIGTERM."""
    async with redis_url_or_embedded(settings.redis_url) as url:
        service, handler = build(settings.model_copy(update={"redis_url": url}))
        await service.run(handler.start, handler.close)


def main() -> None:
    settings = FeatureSettings()
    setup_logging("feature", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
