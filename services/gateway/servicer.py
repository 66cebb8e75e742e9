"""The gateway's v2 GRPCInferenceService: reads the call's deadline and headers, then one Gateway call."""

from __future__ import annotations

import grpc

from services.gateway.handler import SERVER_NAME, SERVER_VERSION, Gateway
from services.gateway.upstream import outgoing_headers
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc

EXTENSIONS = ["model_repository", "statistics", "pipelines"]


class GatewayServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, gateway: Gateway) -> None:
        self.gw = gateway

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext):
        return pb.ServerLiveResponse(live=self.gw.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext):
        return pb.ServerReadyResponse(ready=self.gw.ready())

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext):
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext):
        return pb.ModelReadyResponse(ready=await self.gw.model_ready(request, context.time_remaining()))

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext):
        return await self.gw.metadata(request, context.time_remaining())

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext):
        return await self.gw.config(request, context.time_remaining())

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext):
        return await self.gw.statistics(request, context.time_remaining())

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext):
        headers = outgoing_headers(context.invocation_metadata())
        return await self.gw.infer(request, context.time_remaining(), headers)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext):
        return await self.gw.repository_index(request, context.time_remaining())

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext):
        return await self.gw.forward_repository("RepositoryModelLoad", request, context.time_remaining())

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext):
        return await self.gw.forward_repository("RepositoryModelUnload", request, context.time_remaining())
