"""The server factory over a real socket: status mapping, health that tells the truth, reflection, limits."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from services.common.server import GrpcService
from services.common.settings import ServiceSettings

SERVICE = "test.Echo"


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    kind = request.decode()
    errors = {
        "bad": InvalidArgument("bad input: field x"),
        "missing": NotFound("no such model"),
        "busy": ResourceExhausted("shed"),
        "draining": Unavailable("draining"),
    }
    if kind in errors:
        raise errors[kind]
    if kind == "boom":
        raise RuntimeError("unexpected")
    if kind == "slow":
        await asyncio.sleep(0.5)
    return request


@pytest.fixture()
async def service() -> AsyncIterator[GrpcService]:
    settings = ServiceSettings(host="127.0.0.1", port=0, metrics_port=0, max_message_bytes=4096, grace_period_s=5)
    svc = GrpcService("test", settings, [SERVICE])
    handler = grpc.unary_unary_rpc_method_handler(echo)
    svc.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler})])
    await svc.start()
    yield svc
    await svc.server.stop(0)


def call(channel: grpc.aio.Channel):
    return channel.unary_unary(f"/{SERVICE}/Echo")


@pytest.mark.parametrize(
    ("payload", "code"),
    [
        (b"bad", grpc.StatusCode.INVALID_ARGUMENT),
        (b"missing", grpc.StatusCode.NOT_FOUND),
        (b"busy", grpc.StatusCode.RESOURCE_EXHAUSTED),
        (b"draining", grpc.StatusCode.UNAVAILABLE),
        (b"boom", grpc.StatusCode.INTERNAL),
    ],
)
async def test_domain_errors_map_to_status(service: GrpcService, payload: bytes, code: grpc.StatusCode) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(channel)(payload, timeout=5)
        assert err.value.code() == code
        assert await call(channel)(b"ok", timeout=5) == b"ok"  # still serving


async def test_health_tells_the_truth_and_drain_finishes_inflight(service: GrpcService) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        check = health_pb2.HealthCheckRequest
        assert (await health.Check(check(service=SERVICE))).status == health_pb2.HealthCheckResponse.NOT_SERVING
        await service.set_serving(True)
        assert (await health.Check(check(service=""))).status == health_pb2.HealthCheckResponse.SERVING
        assert service.lifecycle.live and service.lifecycle.ready
        inflight = asyncio.ensure_future(call(channel)(b"slow", timeout=5))
        await asyncio.sleep(0.1)
        service.request_stop()
        assert not service.lifecycle.ready and not service.lifecycle.live
        drain = asyncio.ensure_future(service.drain())
        await asyncio.sleep(0.05)
        assert await inflight == b"slow"
        await drain


async def test_reflection_lists_services_and_size_limit(service: GrpcService) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = [s.name async for r in responses for s in r.list_services_response.service]
        assert SERVICE in names and "grpc.health.v1.Health" in names
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(channel)(b"x" * 8192, timeout=5)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_unix_socket_server_is_its_owners_alone_and_replaces_a_stale_socket(tmp_path) -> None:
    folder = tmp_path / "sockets"
    folder.mkdir(mode=0o700)
    path = folder / "svc.sock"
    with socket.socket(socket.AF_UNIX) as stale:  # a leftover of a crashed run: the file stays after close
        stale.bind(str(path))
    settings = ServiceSettings(host="127.0.0.1", port=0, unix_socket=path, metrics_port=0, grace_period_s=0)
    svc = GrpcService("test", settings, [SERVICE])
    handler = grpc.unary_unary_rpc_method_handler(echo)
    svc.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Echo": handler})])
    assert await svc.start() == 0 and svc.address == f"unix:{path}"
    try:
        assert path.is_socket() and path.stat().st_mode & 0o777 == 0o600
        async with grpc.aio.insecure_channel(svc.address) as channel:
            assert await call(channel)(b"ok", timeout=5) == b"ok"
    finally:
        await svc.server.stop(0)
