"""The v2 GRPCInferenceService of the model service: protobuf in, one ModelHandler call, protobuf out."""

from __future__ import annotations

import time

import grpc

from services.model import converters
from services.model.handler import EXTENSIONS, SERVER_NAME, SERVER_VERSION, ModelHandler
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The caller's deadline as a time.monotonic() instant (None when the call has none)."""
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: ModelHandler) -> None:
        self.dp = dataplane

    async def ServerLive(self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext):
        return pb.ServerLiveResponse(live=self.dp.live())

    async def ServerReady(self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext):
        return pb.ServerReadyResponse(ready=self.dp.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext):
        return pb.ModelReadyResponse(ready=self.dp.model_ready(request.name, request.version))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext):
        return pb.ServerMetadataResponse(name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext):
        return converters.metadata_to_pb(*self.dp.metadata(request.name, request.version))

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext):
        response = await self.dp.infer(converters.infer_request_from_pb(request), deadline_of(context))
        return converters.infer_response_to_pb(response)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext):
        return pb.ModelConfigResponse(config=converters.config_to_pb(self.dp.version(request.name, request.version)))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext):
        versions = self.dp.statistics(request.name, request.version)
        return pb.ModelStatisticsResponse(model_stats=[converters.statistics_to_pb(mv.stats) for mv in versions])

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext):
        index = pb.RepositoryIndexResponse.ModelIndex
        rows = self.dp.repository_index(request.ready)
        return pb.RepositoryIndexResponse(models=[index(name=n, version=v, state=s, reason=r) for n, v, s, r in rows])

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext):
        await self.dp.load(request.model_name)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext):
        await self.dp.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()
