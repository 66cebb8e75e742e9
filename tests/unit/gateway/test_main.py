"""`services.gateway.__main__.serve` wires settings, handler and servicer into the shared server: in-process, on a
real socket, with every upstream down; SIGTERM drains it and `serve` returns."""

from __future__ import annotations

import asyncio
import os
import signal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.__main__ import serve
from services.gateway.converters import SERVER_NAME
from services.gateway.settings import GatewaySettings
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.servers import free_port


async def wait_serving(channel: grpc.aio.Channel, timeout_s: float = 15.0) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.aio.AioRpcError:
            pass
        assert asyncio.get_running_loop().time() < deadline, "the gateway never became SERVING"
        await asyncio.sleep(0.05)


async def test_serve_answers_as_the_gateway_and_stops_at_sigterm() -> None:
    port = free_port()
    settings = GatewaySettings(
        host="127.0.0.1",
        port=port,
        metrics_port=0,
        model_address=f"127.0.0.1:{free_port()}",
        feature_address=f"127.0.0.1:{free_port()}",
        cache_address=f"127.0.0.1:{free_port()}",
        grace_period_s=0.5,
    )
    task = asyncio.create_task(serve(settings))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await wait_serving(channel)  # the signal handlers are installed before the server answers at all
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        metadata = await stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=5)
        assert metadata.name == SERVER_NAME
        ready = await stub.ModelReady(pb.ModelReadyRequest(name="fraud"), timeout=5)
        assert ready.ready  # a pipeline from the repository's pipelines/ folder
        live = await stub.ServerLive(pb.ServerLiveRequest(), timeout=5)
        assert live.live
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, timeout=15)
    assert task.exception() is None
