"""`python -m services.gateway`: the ingress API (pipelines as v2 models) until SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from services.common.logs import setup_logging
from services.common.server import GrpcService
from services.gateway.handler import Gateway
from services.gateway.servicer import GatewayServicer
from services.gateway.settings import GatewaySettings
from services.protos import inference_pb2_grpc

log = logging.getLogger("services.gateway")
SERVICE_NAME = "inference.GRPCInferenceService"


async def serve(settings: GatewaySettings) -> None:
    service = GrpcService("gateway", settings, [SERVICE_NAME])
    gateway = Gateway(settings, service.lifecycle)
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(GatewayServicer(gateway), service.server)
    log.info("pipelines: %s", ", ".join(sorted(gateway.pipelines)) or "none")
    await service.run(gateway.start, gateway.close)


def main() -> None:
    settings = GatewaySettings()
    setup_logging("gateway", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
