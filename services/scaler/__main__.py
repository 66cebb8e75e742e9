"""`python -m services.scaler`: KEDA's external scaler on the gateways' summed demand, until SIGTERM.

Why a service of its own, beside the gateways rather than inside them: KEDA calls one `scalerAddress`, and with N
gateway replicas behind a Service its gRPC connection pins to one pod, which sees only its own share of the
demand (and the share moves as connections do). So every gateway streams its demand to this one scaler, which
sums it over the gateways and answers KEDA (and `meshserve up`'s autoscaler) with the whole.
"""

from __future__ import annotations

import asyncio
import logging

from services.common.logs import setup_logging
from services.common.server import GrpcService
from services.protos import demand_pb2_grpc, externalscaler_pb2_grpc
from services.scaler.handler import ScalerHandler
from services.scaler.servicer import DEMAND_SERVICE_NAME, SERVICE_NAME, DemandServicer, ScalerServicer
from services.scaler.settings import ScalerSettings

log = logging.getLogger("services.scaler")


def build(settings: ScalerSettings) -> tuple[GrpcService, ScalerHandler]:
    """The server with KEDA's ExternalScaler and the gateways' DemandService on one handler. Its readiness is the
    server's lifecycle; draining ends every report and StreamIsActive stream at once, so gateways and KEDA
    reconnect (to the next replica during a rollout)."""
    service = GrpcService("scaler", settings, [SERVICE_NAME, DEMAND_SERVICE_NAME])
    handler = ScalerHandler(settings, service.lifecycle)
    externalscaler_pb2_grpc.add_ExternalScalerServicer_to_server(ScalerServicer(handler), service.server)
    demand_pb2_grpc.add_DemandServiceServicer_to_server(DemandServicer(handler), service.server)
    service.drain_hooks.append(handler.drain)
    return service, handler


async def serve(settings: ScalerSettings) -> None:
    """Build, then serve until SIGTERM."""
    service, handler = build(settings)
    log.info(
        "demand is forgotten after %.1f s without a report; default target %.1f per replica",
        settings.stale_after_s,
        settings.target_per_replica,
    )
    await service.run(None, handler.close)


def main() -> None:
    settings = ScalerSettings()
    setup_logging("scaler", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
