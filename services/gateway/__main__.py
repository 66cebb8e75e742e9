"""`python -m services.gateway`: the ingress API (pipelines as v2 models) until SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from services.common.logs import setup_logging
from services.common.recording import RecordingSettings
from services.common.server import GrpcService
from services.gateway.handler import GatewayHandler
from services.gateway.servicer import SERVICE_NAME, GatewayServicer
from services.gateway.settings import GatewaySettings
from services.gateway.triggers import EdgeTriggers
from services.protos import inference_pb2_grpc

log = logging.getLogger("services.gateway")


def build(settings: GatewaySettings) -> tuple[GrpcService, GatewayHandler]:
    """The server with the GatewayServicer on a handler running the pipelines folder's pipelines: its `start` connects
    to the model, feature and cache services, its `close` finishes pending cache stores and lets them go. With
    always-on recording, the gateway is also the edge whose triggers decide which traces are kept."""
    service = GrpcService("gateway", settings, [SERVICE_NAME])
    handler = GatewayHandler(settings, service.lifecycle)
    if service.recorder is not None:  # always-on recording: the gateway is the edge that keeps traces
        service.recorder.edge = EdgeTriggers(handler.pipelines, RecordingSettings())
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(GatewayServicer(handler), service.server)
    log.info("pipelines: %s", ", ".join(sorted(handler.pipelines)) or "none")
    return service, handler


async def serve(settings: GatewaySettings) -> None:
    """Build, then serve until SIGTERM."""
    service, handler = build(settings)
    await service.run(handler.start, handler.close)


def main() -> None:
    settings = GatewaySettings()
    setup_logging("gateway", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
