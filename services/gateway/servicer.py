"""The gateway's v2 GRPCInferenceService: protobuf in, the call's deadline and headers read, one handler (or,
for a model that is not a pipeline, forwarder) call, protobuf out."""

from __future__ import annotations

import grpc

from services.gateway import converters
from services.gateway.handler import GatewayHandler
from services.gateway.upstream import outgoing_headers, passed_headers
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc

SERVICE_NAME = "inference.GRPCInferenceService"


class GatewayServicer(pb_grpc.GRPCInferenceServiceServicer):
    """Every RPC of the Open Inference Protocol v2; errors map to status in the shared interceptor."""

    def __init__(self, handler: GatewayHandler) -> None:
        self.handler = handler
        self.forwarder = handler.forwarder

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self.handler.live())

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.handler.ready())

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return converters.server_metadata_to_pb()

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        if self.handler.has_pipeline(request.name):
            ready = self.handler.pipeline_ready(request.name, request.version)
        else:
            ready = await self.forwarder.model_ready(request, context.time_remaining())
        return pb.ModelReadyResponse(ready=ready)

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        if not self.handler.has_pipeline(request.name):
            return await self.forwarder.model_metadata(request, context.time_remaining())
        return converters.metadata_to_pb(*await self.handler.describe(request.name, context.time_remaining()))

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        if not self.handler.has_pipeline(request.name):
            return await self.forwarder.model_config(request, context.time_remaining())
        return converters.config_to_pb(*await self.handler.describe(request.name, context.time_remaining()))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        if request.name and not self.handler.has_pipeline(request.name):
            return await self.forwarder.model_statistics(request, context.time_remaining())
        return converters.statistics_to_pb(self.handler.statistics(request.name))

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        remaining = context.time_remaining()
        metadata = context.invocation_metadata()
        priority = converters.priority_of(request)
        claimed = self.handler.claimed(metadata)  # a cloud tier refuses sensitive here
        if not self.handler.has_pipeline(request.model_name):
            return await self.forwarder.model_infer(request, priority, remaining, outgoing_headers(metadata))
        headers = passed_headers(metadata)  # each hop of the pipeline carries its own span's context
        pipeline_request = converters.infer_request_from_pb(request, priority)
        response = await self.handler.infer(pipeline_request, remaining, headers, claimed)
        return converters.infer_response_to_pb(response)

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        return await self.forwarder.repository_index(request, context.time_remaining())

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        return await self.forwarder.repository_model_load(request, context.time_remaining(), _metadata(context))

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        return await self.forwarder.repository_model_unload(request, context.time_remaining(), _metadata(context))


def _metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
    """The call's text headers (binary ones left out)."""
    return tuple((k, v) for k, v in (context.invocation_metadata() or ()) if isinstance(v, str))
