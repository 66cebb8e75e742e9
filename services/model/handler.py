"""The model service's domain handler: inference, metadata, config, statistics and repository actions, and what
the served process does at start (load, watch the repository) and after draining (unload).

The servicer only converts protobuf to these calls and back; tests and tools can use this directly.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from typing import TYPE_CHECKING

from services.common.errors import InvalidArgument, MeshserveError, quoted_names
from services.common.server import Lifecycle
from services.model.domain import InferenceRequest, InferenceResponse, ModelMetadata, ServerMetadata
from services.model.manager import ModelManager, RepositoryEntry
from services.model.stats import VersionStats
from services.model.validation import validate_inputs
from services.model.version import ModelVersion
from services.model.watcher import watch_repository

if TYPE_CHECKING:
    from services.model.settings import ModelSettings

log = logging.getLogger(__name__)

SERVER_NAME = "meshserve"
SERVER_VERSION = "0.1.0"
EXTENSIONS = (
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "statistics",
    "binary_tensor_data",
)


class ModelHandler:
    """Everything the v2 RPCs do, in domain types; liveness and readiness come from the service's Lifecycle.

    `start` and `close` are the served process's first and last steps; `settings` say which models `start` loads,
    whether it watches the repository and whether it may choose torch's thread count (None: every model of the
    repository, nothing watched, threads left alone).
    """

    def __init__(self, manager: ModelManager, lifecycle: Lifecycle, settings: ModelSettings | None = None) -> None:
        self.manager = manager
        self.lifecycle = lifecycle
        self.settings = settings
        self._stop_watch = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the models (a failure is logged, not raised), then follow the repository's changes."""
        settings = self.settings
        if settings is None:
            await self.manager.load_all()
            return
        await self.manager.load_all(settings.models or None)
        if not settings.torch_threads:
            self._one_thread_if_all_inline()
        if settings.watch and settings.repository.is_dir():
            watch = watch_repository(
                self.manager, settings.watch_debounce_ms, settings.watch_force_polling, self._stop_watch
            )
            self._watch = asyncio.create_task(watch)

    def _one_thread_if_all_inline(self) -> None:
        """With no thread count configured and every version loaded at start running inline, torch gets one
        intra-op thread: a forward short enough for the event loop gains nothing from a second thread, whose
        spinning takes the core the loop's gRPC work needs. Versions loaded later do not change it."""
        versions = [mv for entry in self.manager.models.values() for mv in entry.ready.values()]
        if versions and all(mv.execution == "inline" for mv in versions) and "torch" in sys.modules:
            import torch

            torch.set_num_threads(1)
            log.info("every model runs inline: torch uses 1 intra-op thread (MESHSERVE_MODEL_TORCH_THREADS overrides)")

    async def close(self) -> None:
        """Stop watching the repository and unload every version (after the server drained)."""
        self._stop_watch.set()
        if self._watch is not None:
            self._watch.cancel()
        await self.manager.close()

    def live(self) -> bool:
        return self.lifecycle.live

    def ready(self) -> bool:
        return self.lifecycle.ready

    def model_ready(self, name: str, version: str) -> bool:
        """A model version answers while the service is live (not draining) and the version is loaded."""
        return self.lifecycle.live and self.manager.is_ready(name, version)

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata(SERVER_NAME, SERVER_VERSION, EXTENSIONS)

    def metadata(self, name: str, version: str) -> ModelMetadata:
        mv = self.manager.get(name, version)
        return ModelMetadata(mv, sorted(self.manager.models[mv.name].ready))

    def config(self, name: str, version: str = "") -> ModelVersion:
        """The version whose configuration to report (the newest ready one when `version` is empty)."""
        return self.manager.get(name, version)

    async def infer(self, request: InferenceRequest, deadline: float | None) -> InferenceResponse:
        """Validate, queue for the version's scheduler, keep the requested outputs; `deadline` is monotonic."""
        start = time.perf_counter_ns()
        mv = self.manager.get(request.model_name, request.model_version)
        try:
            rows = validate_inputs(mv, request.inputs)
            outputs = await mv.infer(request.inputs, rows, deadline)
            if request.requested_outputs:
                unknown = [n for n in request.requested_outputs if n not in outputs]
                if unknown:
                    raise InvalidArgument(
                        f"model '{mv.name}' has no output(s) [{quoted_names(unknown)}]; outputs are {list(outputs)}"
                    )
                outputs = {n: outputs[n] for n in request.requested_outputs}
        except MeshserveError as exc:
            mv.stats.record_request(False, time.perf_counter_ns() - start, exc.code.name)
            raise
        mv.stats.record_request(True, time.perf_counter_ns() - start)
        return InferenceResponse(mv.name, mv.version_str, outputs, request.id)

    def statistics(self, name: str, version: str) -> list[VersionStats]:
        """Statistics of one model (all ready versions or one), or of every model when `name` is empty."""
        if name:
            if version:
                return [self.manager.get(name, version).stats]
            self.manager.get(name)  # NOT_FOUND / UNAVAILABLE with a clear message
            ready = self.manager.models[name].ready
            return [ready[v].stats for v in sorted(ready)]
        return [e.ready[v].stats for e in self.manager.models.values() for v in sorted(e.ready)]

    def repository_index(self, ready_only: bool) -> list[RepositoryEntry]:
        entries = self.manager.index()
        return [e for e in entries if e.state == "READY"] if ready_only else entries

    async def load(self, name: str) -> None:
        await self.manager.load(name)

    async def unload(self, name: str) -> None:
        await self.manager.unload(name)
