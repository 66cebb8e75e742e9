"""`python -m services.model`: serve the model repository over the v2 gRPC protocol until SIGTERM."""

from __future__ import annotations

import asyncio
import logging

from services.common.logs import setup_logging
from services.common.server import GrpcService
from services.model.gpu_metrics import register_gpu_metrics
from services.model.handler import ModelHandler
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.servicer import InferenceServicer
from services.model.settings import ModelSettings
from services.model.watcher import watch_repository
from services.protos import inference_pb2_grpc

log = logging.getLogger("services.model")
SERVICE_NAME = "inference.GRPCInferenceService"


async def serve(settings: ModelSettings) -> None:
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    register_gpu_metrics()
    service = GrpcService("model", settings, [SERVICE_NAME])
    manager = ModelManager(
        ModelRepository(settings.repository),
        drain_timeout_s=settings.grace_period_s,
        pinned_versions=settings.pinned_versions,
        fault_delay_ms=settings.fault_delay_ms,
    )
    dataplane = ModelHandler(manager, service.lifecycle)
    inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(dataplane), service.server)
    stop_watch = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    async def on_start() -> None:
        await manager.load_all(settings.models or None)
        if settings.watch and settings.repository.is_dir():
            tasks.append(
                asyncio.create_task(
                    watch_repository(manager, settings.watch_debounce_ms, settings.watch_force_polling, stop_watch)
                )
            )

    async def on_stop() -> None:
        stop_watch.set()
        for task in tasks:
            task.cancel()
        await manager.close()

    await service.run(on_start, on_stop)


def main() -> None:
    settings = ModelSettings()
    setup_logging("model", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
