"""The model service's domain handler: inference, metadata, config, statistics and repository actions.

The servicer only converts protobuf to these calls and back; tests and tools can use this directly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from services.common.errors import InvalidArgument, MeshserveError
from services.common.server import Lifecycle
from services.model.manager import ModelManager
from services.model.validation import validate_inputs
from services.model.version import ModelVersion

SERVER_NAME = "meshserve"
SERVER_VERSION = "0.1.0"
EXTENSIONS = ["model_repository", "model_repository(unload_dependents)", "schedule_policy", "model_configuration",
              "statistics", "binary_tensor_data"]  # fmt: skip


@dataclass(slots=True)
class InferenceRequest:
    model_name: str
    model_version: str
    inputs: dict[str, np.ndarray]
    id: str = ""
    requested_outputs: list[str] = field(default_factory=list)


@dataclass(slots=True)
class InferenceResponse:
    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    id: str = ""


class ModelHandler:
    """Everything the v2 RPCs do, in domain types."""

    def __init__(self, manager: ModelManager, lifecycle: Lifecycle) -> None:
        self.manager = manager
        self.lifecycle = lifecycle

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        return self.lifecycle.ready and not self.lifecycle.draining

    def model_ready(self, name: str, version: str) -> bool:
        return not self.lifecycle.draining and self.manager.is_ready(name, version)

    def version(self, name: str, version: str = "") -> ModelVersion:
        return self.manager.get(name, version)

    def metadata(self, name: str, version: str) -> tuple[ModelVersion, list[int]]:
        """The version whose metadata to report, and every ready version of the model."""
        mv = self.manager.get(name, version)
        return mv, sorted(self.manager.models[mv.name].ready)

    async def infer(self, request: InferenceRequest, deadline: float | None) -> InferenceResponse:
        start = time.perf_counter_ns()
        mv = self.manager.get(request.model_name, request.model_version)
        try:
            rows = validate_inputs(mv, request.inputs)
            outputs = await mv.infer(request.inputs, rows, deadline)
            if request.requested_outputs:
                unknown = [n for n in request.requested_outputs if n not in outputs]
                if unknown:
                    raise InvalidArgument(f"model '{mv.name}' has no output(s) {unknown}; outputs are {list(outputs)}")
                outputs = {n: outputs[n] for n in request.requested_outputs}
        except MeshserveError as exc:
            mv.stats.record_request(False, time.perf_counter_ns() - start, exc.code.name)
            raise
        mv.stats.record_request(True, time.perf_counter_ns() - start)
        return InferenceResponse(mv.name, mv.version_str, outputs, request.id)

    def statistics(self, name: str, version: str) -> list[ModelVersion]:
        """Versions whose statistics to report: one model (all ready versions or one), or every model."""
        if name:
            if version:
                return [self.manager.get(name, version)]
            self.manager.get(name)  # NOT_FOUND / UNAVAILABLE with a clear message
            return [self.manager.models[name].ready[v] for v in sorted(self.manager.models[name].ready)]
        return [e.ready[v] for e in self.manager.models.values() for v in sorted(e.ready)]

    def repository_index(self, ready_only: bool) -> list[tuple[str, str, str, str]]:
        rows = self.manager.index()
        return [r for r in rows if r[2] == "READY"] if ready_only else rows

    async def load(self, name: str) -> None:
        await self.manager.load(name)

    async def unload(self, name: str) -> None:
        await self.manager.unload(name)
