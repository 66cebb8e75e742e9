"""The model service's client: a v2 inference client that raises the project's own errors.

`infer` and `describe` speak plain types (services.model.domain) for the gateway's own pipelines, and one
pass-through call per v2 RPC serves what the gateway forwards unchanged. Every failed call raises a
`MeshserveError` carrying the model service's status code. Nothing here imports torch or the service's internals.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from services.common.errors import from_rpc_error
from services.model.domain import InferResult, ModelInfo, RawTensor, TensorInfo
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc

R = TypeVar("R")
Metadata = Sequence[tuple[str, str]]
SERVICE = "model service"


def _tensors(items: Sequence[pb.ModelMetadataResponse.TensorMetadata]) -> list[TensorInfo]:
    return [TensorInfo(t.name, t.datatype, list(t.shape)) for t in items]


class ModelClient:
    """The v2 GRPCInferenceService of the model service (or its mesh listener) over one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.stub = pb_grpc.GRPCInferenceServiceStub(channel)

    async def _call(
        self, what: str, rpc: Callable[..., Awaitable[R]], request: Any, timeout_s: float | None, metadata: Metadata
    ) -> R:
        try:
            return await rpc(request, timeout=timeout_s, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(what, exc) from exc

    # -- plain types ---------------------------------------------------------------------------------------

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[RawTensor],
        *,
        timeout_s: float | None = None,
        metadata: Metadata = (),
    ) -> InferResult:
        """One ModelInfer with raw inputs; a failure raises MeshserveError naming the model."""
        request = pb.ModelInferRequest(model_name=model, model_version=version)
        for tensor in inputs:
            request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            request.raw_input_contents.append(tensor.raw)
        response = await self._call(f"model {model!r}", self.stub.ModelInfer, request, timeout_s, metadata)
        outputs = [
            RawTensor(o.name, o.datatype, list(o.shape), raw)
            for o, raw in zip(response.outputs, response.raw_output_contents, strict=False)
        ]
        return InferResult(response.model_name, response.model_version, outputs)

    async def describe(
        self, model: str, version: str = "", *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> ModelInfo:
        """ModelMetadata of one model."""
        request = pb.ModelMetadataRequest(name=model, version=version)
        response = await self._call(SERVICE, self.stub.ModelMetadata, request, timeout_s, metadata)
        inputs, outputs = _tensors(response.inputs), _tensors(response.outputs)
        return ModelInfo(response.name, list(response.versions), response.platform, inputs, outputs)

    async def ready(
        self, model: str, version: str = "", *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> bool:
        """ModelReady of one model ("" version: any), answered by the replica the call is routed to."""
        request = pb.ModelReadyRequest(name=model, version=version)
        response = await self._call(f"model {model!r}", self.stub.ModelReady, request, timeout_s, metadata)
        return bool(response.ready)

    # -- pass-through, one per v2 RPC ----------------------------------------------------------------------

    async def model_infer(
        self, request: pb.ModelInferRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.ModelInferResponse:
        return await self._call(SERVICE, self.stub.ModelInfer, request, timeout_s, metadata)

    async def model_ready(
        self, request: pb.ModelReadyRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.ModelReadyResponse:
        return await self._call(SERVICE, self.stub.ModelReady, request, timeout_s, metadata)

    async def model_metadata(
        self, request: pb.ModelMetadataRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.ModelMetadataResponse:
        return await self._call(SERVICE, self.stub.ModelMetadata, request, timeout_s, metadata)

    async def model_config(
        self, request: pb.ModelConfigRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.ModelConfigResponse:
        return await self._call(SERVICE, self.stub.ModelConfig, request, timeout_s, metadata)

    async def model_statistics(
        self, request: pb.ModelStatisticsRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.ModelStatisticsResponse:
        return await self._call(SERVICE, self.stub.ModelStatistics, request, timeout_s, metadata)

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.RepositoryIndexResponse:
        return await self._call(SERVICE, self.stub.RepositoryIndex, request, timeout_s, metadata)

    async def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.RepositoryModelLoadResponse:
        return await self._call(SERVICE, self.stub.RepositoryModelLoad, request, timeout_s, metadata)

    async def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, *, timeout_s: float | None = None, metadata: Metadata = ()
    ) -> pb.RepositoryModelUnloadResponse:
        return await self._call(SERVICE, self.stub.RepositoryModelUnload, request, timeout_s, metadata)

    async def close(self) -> None:
        await self.channel.close()
