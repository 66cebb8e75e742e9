"""The v2 GRPCInferenceService of the model service: protobuf in, one ModelHandler call, protobuf out (loading and
unloading, after the operator check)."""

from __future__ import annotations

import time

import grpc

from services.common.operator_check import OPEN, OperatorCheck
from services.model import converters
from services.model.handler import ModelHandler
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc

SERVICE_NAME = "inference.GRPCInferenceService"
OPERATOR_RPCS = ("RepositoryModelLoad", "RepositoryModelUnload")
"""The RPCs that change what the service serves: only the operator may call them (`operator`)."""


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's deadline as a time.monotonic() instant (None when the call has none)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class ModelServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Every RPC of the Open Inference Protocol v2, as Triton serves it; errors map to status in the interceptor.
    `operator` guards OPERATOR_RPCS (default: open to every caller)."""

    def __init__(self, handler: ModelHandler, operator: OperatorCheck = OPEN) -> None:
        self.handler = handler
        self.operator = operator

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.handler.live())

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.handler.ready())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self.handler.model_ready(request.name, request.version))

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return converters.server_metadata_to_pb(self.handler.server_metadata())

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        return converters.metadata_to_pb(self.handler.metadata(request.name, request.version))

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        response = await self.handler.infer(converters.infer_request_from_pb(request), deadline_of(context))
        return converters.infer_response_to_pb(response)

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        return converters.config_response_to_pb(self.handler.config(request.name, request.version))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        return converters.statistics_to_pb(self.handler.statistics(request.name, request.version))

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        return converters.repository_index_to_pb(self.handler.repository_index(request.ready))

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        self.operator.require(context, "RepositoryModelLoad")
        await self.handler.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        self.operator.require(context, "RepositoryModelUnload")
        await self.handler.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()
