"""`python -m services.model`: serve the model repository over the v2 gRPC protocol until SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from services.common.logs import setup_logging
from services.common.operator_check import OperatorCheck
from services.common.server import GrpcService
from services.model.backends import set_torch_threads
from services.model.cold_start import ColdStartClock
from services.model.gpu_metrics import register_gpu_metrics
from services.model.handler import ModelHandler
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.servicer import OPERATOR_RPCS, SERVICE_NAME, ModelServicer
from services.model.settings import ModelSettings
from services.protos import inference_pb2_grpc

log = logging.getLogger("services.model")


def build(settings: ModelSettings) -> tuple[GrpcService, ModelHandler]:
    """The server with the ModelServicer on a handler over the repository's ModelManager: its `start` loads the
    models this replica serves (`serve_models`; health says SERVING after every one loaded and warmed up) and watches
    the repository, its `close` unloads every version once the server drained. Load and Unload need the operator's
    token when the settings have one (said in the log either way)."""
    service = GrpcService("model", settings, [SERVICE_NAME])
    manager = ModelManager(
        ModelRepository(settings.repository),
        drain_timeout_s=settings.grace_period_s,
        pinned_versions=settings.pinned_versions,
        fault_delay_ms=settings.fault_delay_ms,
        inline_max_forward_us=settings.inline_max_forward_us,
        serve_models=settings.serve_models,
    )
    handler = ModelHandler(manager, service.lifecycle, settings)
    operator = OperatorCheck(
        settings.admin_token.get_secret_value(), ModelSettings.env_name("admin_token"), OPERATOR_RPCS
    )
    operator.announce(log)
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(ModelServicer(handler, operator), service.server)
    return service, handler


async def serve(settings: ModelSettings, clock: ColdStartClock | None = None) -> None:
    """Build, then serve until SIGTERM (torch's thread count, applied once torch is imported, and the GPU gauges
    are the process's, set first); the clock, if given, records each model's cold start once health says SERVING."""
    set_torch_threads(settings.torch_threads)
    register_gpu_metrics()
    service, handler = build(settings)

    def serving() -> None:
        if clock is not None:
            clock.serving(handler.manager.load_seconds())

    await service.run(handler.start, handler.close, serving)


def main() -> None:
    clock = ColdStartClock()  # first: spawn until here is the interpreter and the imports
    settings = ModelSettings()
    setup_logging("model", settings.log_level)
    asyncio.run(serve(settings, clock))


if __name__ == "__main__":
    main()
