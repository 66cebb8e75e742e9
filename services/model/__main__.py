"""`python -m services.model`: serve the model repository over the v2 gRPC protocol until SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import sys

from services.common.logs import setup_logging
from services.common.operator_check import OperatorCheck
from services.common.server import GrpcService
from services.model.gpu_metrics import register_gpu_metrics
from services.model.handler import ModelHandler
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.servicer import OPERATOR_RPCS, SERVICE_NAME, ModelServicer
from services.model.settings import ModelSettings
from services.model.watcher import watch_repository
from services.protos import inference_pb2_grpc

log = logging.getLogger(__name__)


class ModelService:
    """The parts wired together: the shared GrpcService, the ModelManager, its ModelHandler and the servicer.

    `run` serves until SIGTERM: models load (then health says SERVING), the repository is watched, and after
    the server drained every version unloads.
    """

    def __init__(self, settings: ModelSettings) -> None:
        self.settings = settings
        self.server = GrpcService("model", settings, [SERVICE_NAME])
        self.manager = ModelManager(
            ModelRepository(settings.repository),
            drain_timeout_s=settings.grace_period_s,
            pinned_versions=settings.pinned_versions,
            fault_delay_ms=settings.fault_delay_ms,
            inline_max_forward_us=settings.inline_max_forward_us,
        )
        self.handler = ModelHandler(self.manager, self.server.lifecycle)
        self.operator = OperatorCheck(
            settings.admin_token.get_secret_value(), ModelSettings.env_name("admin_token"), OPERATOR_RPCS
        )
        servicer = ModelServicer(self.handler, self.operator)
        inference_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, self.server.server)
        self._stop_watch = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        await self.server.run(self._on_start, self._on_stop)

    async def _on_start(self) -> None:
        settings = self.settings
        self.operator.announce(log)
        await self.manager.load_all(settings.models or None)
        if not settings.torch_threads:
            self._one_thread_if_all_inline()
        if settings.watch and settings.repository.is_dir():
            watch = watch_repository(
                self.manager, settings.watch_debounce_ms, settings.watch_force_polling, self._stop_watch
            )
            self._tasks.append(asyncio.create_task(watch))

    def _one_thread_if_all_inline(self) -> None:
        """With no thread count configured and every version loaded at start running inline, torch gets one
        intra-op thread: a forward short enough for the event loop gains nothing from a second thread, whose
        spinning takes the core the loop's gRPC work needs. Versions loaded later do not change it."""
        versions = [mv for entry in self.manager.models.values() for mv in entry.ready.values()]
        if versions and all(mv.execution == "inline" for mv in versions) and "torch" in sys.modules:
            import torch

            torch.set_num_threads(1)
            log.info("every model runs inline: torch uses 1 intra-op thread (MESHSERVE_MODEL_TORCH_THREADS overrides)")

    async def _on_stop(self) -> None:
        self._stop_watch.set()
        for task in self._tasks:
            task.cancel()
        await self.manager.close()


async def serve(settings: ModelSettings) -> None:
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)
    register_gpu_metrics()
    await ModelService(settings).run()


def main() -> None:
    settings = ModelSettings()
    setup_logging("model", settings.log_level)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
