"""Fake model and feature services on an in-process gRPC server (loopback), for the upstream clients and the
forwarder: each answers simply, records what it got, and fails with `fail[rpc]` (a status code) when told; and a
cold model (Envoy's model listener with no endpoints until a test flips it to serve), for the activator."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc

from services.protos import feature_pb2 as fpb
from services.protos import feature_pb2_grpc as fpb_grpc
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc


class Recorder:
    def __init__(self) -> None:
        self.fail: dict[str, grpc.StatusCode] = {}
        self.requests: dict[str, Any] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self.time_remaining: dict[str, float | None] = {}

    async def seen(self, rpc: str, request: Any, context: grpc.aio.ServicerContext) -> None:
        self.requests[rpc] = request
        self.metadata[rpc] = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        self.time_remaining[rpc] = context.time_remaining()
        code = self.fail.get(rpc)
        if code is not None:
            await context.abort(code, f"{rpc} failed")


class FakeModelService(pb_grpc.GRPCInferenceServiceServicer, Recorder):
    """ModelInfer echoes each input back as output `y` (version 1 unless asked); `nope` is an unknown model."""

    def __init__(self) -> None:
        Recorder.__init__(self)
        self.index = ["m"]  # what RepositoryIndex lists

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("ModelInfer", request, context)
        if request.model_name == "nope":
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown model 'nope'")
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version or "1")
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
            response.outputs.add(name="y", datatype=tensor.datatype, shape=tensor.shape)
            response.raw_output_contents.append(raw)
        return response

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("ModelMetadata", request, context)
        if request.name == "nope":
            await context.abort(grpc.StatusCode.NOT_FOUND, "unknown model 'nope'")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=request.name,
            versions=["1", "2"],
            platform="onnxruntime_onnx",
            inputs=[tensor(name="x", datatype="FP32", shape=[-1, 4])],
            outputs=[tensor(name="y", datatype="FP32", shape=[-1, 1])],
        )

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("ModelReady", request, context)
        return pb.ModelReadyResponse(ready=True)

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("ModelConfig", request, context)
        response = pb.ModelConfigResponse()
        response.config.name = request.name
        return response

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("ModelStatistics", request, context)
        response = pb.ModelStatisticsResponse()
        response.model_stats.add(name=request.name or "m", version="1")
        return response

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("RepositoryIndex", request, context)
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[index(name=n, version="1", state="READY") for n in self.index])

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        await self.seen("RepositoryModelLoad", request, context)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        await self.seen("RepositoryModelUnload", request, context)
        return pb.RepositoryModelUnloadResponse()


class FakeFeatureService(fpb_grpc.FeatureServiceServicer, Recorder):
    """Compute answers two FP32 columns per row; a row whose user_id is `slow` is flagged degraded."""

    def __init__(self) -> None:
        Recorder.__init__(self)

    async def Compute(self, request: fpb.ComputeRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("Compute", request, context)
        rows = len(request.rows)
        flags = [fpb.RowFlags(degraded=r.fields["user_id"].string_value == "slow") for r in request.rows]
        return fpb.ComputeResponse(
            feature_set=request.feature_set,
            rows=rows,
            columns=2,
            feature_names=["a", "b"],
            features=b"\0" * (rows * 2 * 4),
            flags=flags,
        )

    async def GetFeatureSet(self, request: fpb.GetFeatureSetRequest, context: grpc.aio.ServicerContext) -> Any:
        await self.seen("GetFeatureSet", request, context)
        return fpb.GetFeatureSetResponse(
            feature_set=request.feature_set,
            name="fraud",
            version=1,
            inputs=[fpb.InputField(name="user_id", type="string")],
            features=[fpb.FeatureInfo(name="a", dtype="FP32", group="request")],
            timestamp_field="event_time",
        )


@asynccontextmanager
async def fake_services() -> AsyncIterator[tuple[FakeModelService, FakeFeatureService, grpc.aio.Channel]]:
    """Both fakes on one loopback server, and a channel to it."""
    model, feature = FakeModelService(), FakeFeatureService()
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(model, server)
    fpb_grpc.add_FeatureServiceServicer_to_server(feature, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield model, feature, channel
    finally:
        await server.stop(0)


class ColdModelService(pb_grpc.GRPCInferenceServiceServicer):
    """Envoy's model listener while the model is scaled to zero: ModelInfer and ModelReady answer UNAVAILABLE "no
    healthy upstream" (Envoy's local reply) until `serving` is set, then a replica answers: ModelInfer a `score`
    of 0.5 per row (as version 1, or the version asked for), ModelReady ready, ModelMetadata version 1 with its
    `score` output. The next `cold_infers` ModelInfer
    calls answer cold whatever `serving` says (a weighted split that picked a subset at zero)."""

    def __init__(self) -> None:
        self.serving = False
        self.cold_infers = 0
        self.infers: list[pb.ModelInferRequest] = []
        self.probes: list[tuple[pb.ModelReadyRequest, dict[str, str]]] = []

    async def ModelInfer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> Any:
        self.infers.append(request)
        if self.cold_infers or not self.serving:
            self.cold_infers = max(0, self.cold_infers - 1)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no healthy upstream")
        rows = request.inputs[0].shape[0] if request.inputs else 1
        response = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version or "1")
        response.outputs.add(name="score", datatype="FP32", shape=[rows, 1])
        response.raw_output_contents.append(struct.pack(f"<{rows}f", *[0.5] * rows))
        return response

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext) -> Any:
        if not self.serving:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no healthy upstream")
        response = pb.ModelMetadataResponse(name=request.name, versions=["1"], platform="onnxruntime_onnx")
        response.inputs.add(name="features", datatype="FP32", shape=[-1, 4])
        response.outputs.add(name="score", datatype="FP32", shape=[-1, 1])
        return response

    async def ModelReady(self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext) -> Any:
        metadata = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        self.probes.append((request, metadata))
        if not self.serving:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no healthy upstream")
        return pb.ModelReadyResponse(ready=True)


@asynccontextmanager
async def cold_model() -> AsyncIterator[tuple[ColdModelService, grpc.aio.Channel]]:
    """A ColdModelService on a loopback server (cold), and a channel to it."""
    service = ColdModelService()
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield service, channel
    finally:
        await server.stop(0)
