"""Every model name that is not a pipeline goes to the model service as it came: v2 messages passed through
unchanged, the caller's deadline (and, for ModelInfer, its headers) passed on, errors with their own code."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Collection
from typing import TypeVar

from services.common.errors import InvalidArgument, MeshserveError, NotFound
from services.gateway.admission import Admission, Priority
from services.gateway.converters import pipeline_index
from services.gateway.upstream import Headers
from services.model.api import ModelClient
from services.protos import inference_pb2 as pb

log = logging.getLogger(__name__)
R = TypeVar("R")
FORWARD_TIMEOUT_S = 30.0  # a forwarded call without a client deadline


class Forwarder:
    """The model service's RPCs behind the gateway; `pipelines` are the names it answers for itself."""

    def __init__(self, model: ModelClient, admission: Admission, pipelines: Collection[str]) -> None:
        self.model = model
        self.admission = admission
        self.pipelines = pipelines

    @staticmethod
    def _timeout(caller_remaining_s: float | None) -> float:
        return FORWARD_TIMEOUT_S if caller_remaining_s is None else caller_remaining_s

    async def _forwarded(self, call: Awaitable[R]) -> R:
        """The call's answer; an unknown model's NotFound names the pipelines too (the caller may mean one)."""
        try:
            return await call
        except NotFound as exc:
            raise NotFound(f"{exc} (pipelines here: {', '.join(sorted(self.pipelines)) or 'none'})") from exc

    async def model_infer(
        self, request: pb.ModelInferRequest, priority: Priority, caller_remaining_s: float | None, headers: Headers
    ) -> pb.ModelInferResponse:
        """Admitted under the model's own pool (a fixed cap: the model service has its own queue)."""
        permit = self.admission.acquire(f"model:{request.model_name}", priority)
        try:
            timeout = self._timeout(caller_remaining_s)
            return await self._forwarded(self.model.model_infer(request, timeout_s=timeout, metadata=tuple(headers)))
        finally:
            permit.release(sample=False)

    async def model_ready(self, request: pb.ModelReadyRequest, caller_remaining_s: float | None) -> bool:
        """False when the model service says so, or cannot say."""
        try:
            response = await self.model.model_ready(request, timeout_s=self._timeout(caller_remaining_s))
        except MeshserveError:
            return False
        return bool(response.ready)

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, caller_remaining_s: float | None
    ) -> pb.ModelMetadataResponse:
        return await self._forwarded(self.model.model_metadata(request, timeout_s=self._timeout(caller_remaining_s)))

    async def model_config(
        self, request: pb.ModelConfigRequest, caller_remaining_s: float | None
    ) -> pb.ModelConfigResponse:
        return await self._forwarded(self.model.model_config(request, timeout_s=self._timeout(caller_remaining_s)))

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, caller_remaining_s: float | None
    ) -> pb.ModelStatisticsResponse:
        return await self._forwarded(self.model.model_statistics(request, timeout_s=self._timeout(caller_remaining_s)))

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, caller_remaining_s: float | None
    ) -> pb.RepositoryIndexResponse:
        """The pipelines, then the model service's models (left out when it does not answer)."""
        models = pipeline_index(self.pipelines)
        try:
            upstream = await self.model.repository_index(request, timeout_s=self._timeout(caller_remaining_s))
            models.extend(upstream.models)
        except MeshserveError as exc:
            log.debug("model repository index not available: %s", exc)
        return pb.RepositoryIndexResponse(models=models)

    def _not_a_pipeline(self, name: str) -> None:
        if name in self.pipelines:
            raise InvalidArgument(f"{name!r} is a pipeline (defined in YAML); load or unload its model instead")

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, caller_remaining_s: float | None
    ) -> pb.RepositoryModelLoadResponse:
        self._not_a_pipeline(request.model_name)
        return await self._forwarded(
            self.model.repository_model_load(request, timeout_s=self._timeout(caller_remaining_s))
        )

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, caller_remaining_s: float | None
    ) -> pb.RepositoryModelUnloadResponse:
        self._not_a_pipeline(request.model_name)
        return await self._forwarded(
            self.model.repository_model_unload(request, timeout_s=self._timeout(caller_remaining_s))
        )
