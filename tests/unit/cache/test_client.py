"""CacheClient against in-process gRPC servers on loopback: it answers in domain types and raises only the
project's errors (lookups and stores fail open; bad input, invalidate, stats and a failed Watch raise)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc
import pytest

from services.cache.__main__ import build
from services.cache.client import CacheClient
from services.cache.domain import Invalidation
from services.cache.handler import CacheHandler
from services.common.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    MeshserveError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from services.common.server import GrpcService
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc
from tests.helpers.fixtures import cache_settings
from tests.helpers.inprocess import serving_built
from tests.helpers.servers import free_port


def target(service: GrpcService) -> str:
    return f"127.0.0.1:{service.port}"


async def test_bad_input_is_invalid_argument(cache_server: GrpcService) -> None:
    max_value = cache_server.settings.max_value_bytes
    entry = {"key": b"k", "value": b"v", "model_name": "m", "model_version": "1", "ttl_s": 10.0}
    bad = [
        ("Lookup", pb.LookupRequest(keys=[])),
        ("Lookup", pb.LookupRequest(keys=[b"k", b""])),
        ("Store", pb.StoreRequest(entries=[pb.StoreEntry(**{**entry, "key": b""})])),
        ("Store", pb.StoreRequest(entries=[pb.StoreEntry(**{**entry, "value": b"x" * (max_value + 1)})])),
        ("Store", pb.StoreRequest(entries=[pb.StoreEntry(**{**entry, "ttl_s": 0.0})])),
        ("Store", pb.StoreRequest(entries=[pb.StoreEntry(**{**entry, "ttl_s": 1e9})])),
        ("Invalidate", pb.InvalidateRequest()),
    ]
    async with grpc.aio.insecure_channel(target(cache_server)) as channel:
        stub = pb_grpc.CacheServiceStub(channel)
        for method, request in bad:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await getattr(stub, method)(request, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, request)
        client = CacheClient("", channel=channel, timeout_s=5.0)
        with pytest.raises(InvalidArgument, match=r"^cache service: key 0 is empty"):
            await client.lookup([b""])  # bad input is not swallowed by fail-open
        with pytest.raises(InvalidArgument, match="ttl_s"):
            await client.store(b"k", b"v", pipeline="p", model_name="m", model_version="1", ttl_s=0.0)
        with pytest.raises(InvalidArgument, match="either pipeline or model_name"):
            await client.invalidate()


async def test_client_fails_open_when_the_cache_is_down() -> None:
    client = CacheClient(f"127.0.0.1:{free_port()}", timeout_s=0.2)
    try:
        assert await client.lookup([b"a", b"b"]) == [None, None]
        assert not await client.store(b"a", b"v", pipeline="p", model_name="m", model_version="1", ttl_s=1)
        # What is not on a request's path says why it failed, as the project's own error.
        with pytest.raises(Unavailable, match=r"^cache service: "):
            await client.invalidate(pipeline="p", timeout_s=0.5)
        with pytest.raises(Unavailable):
            await client.stats(timeout_s=0.5)
        with pytest.raises(Unavailable):
            async with aclosing(client.watch()) as events:
                async for _ in events:
                    pass
    finally:
        await client.close()


async def test_a_cache_whose_redis_refuses_connections_is_all_misses_through_the_client(refused_redis_url: str) -> None:
    """The real servicer and handler on a Redis URL nothing listens on: lookups miss, stores are kept in L1 only
    (not stored), and after `circuit_failures` failures the circuit is open, which Stats reports."""
    async with serving_built(*build(cache_settings(redis_url=refused_redis_url, l1_max_bytes=0))) as service:
        client = CacheClient(target(service), timeout_s=5.0)
        try:
            assert not await client.store(b"k", b"v", pipeline="p", model_name="m", model_version="1", ttl_s=60)
            for _ in range(3):
                assert await client.lookup([b"k", b"j"], "p") == [None, None]
            stats = await client.stats()
            assert stats["circuit_open"] and stats["redis_errors"] >= 3 and stats["stores_dropped"] == 1
            assert stats["misses"] >= 4 and stats["stores"] == 0
            assert await client.invalidate(pipeline="p") == (0, 0)  # nothing reached: not an error either
        finally:
            await client.close()


async def test_watch_yields_domain_events_and_ends_when_the_replica_drains(cache_server: GrpcService) -> None:
    handler: CacheHandler = cache_server.handler  # type: ignore[attr-defined]
    client = CacheClient(target(cache_server))
    try:
        events = client.watch(metadata=(("x-request-id", "watch-test"),), heartbeat_timeout_s=5.0)
        first = await anext(events)
        assert first == Invalidation(reset=True) and first.reset
        await handler.invalidate(pipeline="fraud")
        await handler.invalidate(model_name="fraud_mlp", model_version="2")
        assert await anext(events) == Invalidation(pipeline="fraud")
        assert await anext(events) == Invalidation(model_name="fraud_mlp", model_version="2")
        beat = await anext(events)  # idle: a heartbeat about every 0.2 s
        assert beat.heartbeat and not beat.reset
        drained = asyncio.ensure_future(cache_server.drain())
        rest = [e async for e in events]  # the stream completes OK: the iteration just ends
        assert all(e.heartbeat for e in rest)
        await drained
    finally:
        await client.close()


async def test_leaving_a_watch_ends_its_stream_on_the_replica(cache_server: GrpcService) -> None:
    handler: CacheHandler = cache_server.handler  # type: ignore[attr-defined]
    client = CacheClient(target(cache_server))
    try:
        async with aclosing(client.watch()) as events:
            assert (await anext(events)).reset
            assert len(handler.fanout) == 1
        for _ in range(200):
            if len(handler.fanout) == 0:
                break
            await asyncio.sleep(0.01)
        assert len(handler.fanout) == 0
    finally:
        await client.close()


class FailingCache(pb_grpc.CacheServiceServicer):
    """Answers every call with one status (and a Watch with a reset, then that status; or, with `hang`, silence)."""

    def __init__(self, code: grpc.StatusCode, hang: bool = False) -> None:
        self.code = code
        self.hang = hang

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        await context.abort(self.code, "refused on purpose")

    async def Store(self, request: pb.StoreRequest, context: grpc.aio.ServicerContext) -> pb.StoreResponse:
        await context.abort(self.code, "refused on purpose")

    async def Invalidate(
        self, request: pb.InvalidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.InvalidateResponse:
        await context.abort(self.code, "refused on purpose")

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        await context.abort(self.code, "refused on purpose")

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.InvalidationEvent]:
        yield pb.InvalidationEvent(reset=True)
        if self.hang:
            await asyncio.Event().wait()
        await context.abort(self.code, "stream lost on purpose")


async def failing_client(servicer: FailingCache) -> tuple[grpc.aio.Server, CacheClient]:
    server = grpc.aio.server()
    pb_grpc.add_CacheServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, CacheClient(f"127.0.0.1:{port}", timeout_s=5.0)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
        (grpc.StatusCode.NOT_FOUND, NotFound),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
        (grpc.StatusCode.INTERNAL, Internal),
        (grpc.StatusCode.PERMISSION_DENIED, MeshserveError),
    ],
    ids=lambda v: v.name if isinstance(v, grpc.StatusCode) else "",
)
async def test_every_status_becomes_the_projects_error_with_its_code(
    code: grpc.StatusCode, kind: type[MeshserveError]
) -> None:
    server, client = await failing_client(FailingCache(code))
    try:
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            with pytest.raises(InvalidArgument):
                await client.lookup([b"k"])
            with pytest.raises(InvalidArgument):
                await client.store(b"k", b"v", pipeline="p", model_name="m", model_version="1", ttl_s=1)
        else:  # fail open
            assert await client.lookup([b"k", b"j"]) == [None, None]
            assert not await client.store(b"k", b"v", pipeline="p", model_name="m", model_version="1", ttl_s=1)
        for call in (lambda: client.invalidate(pipeline="p"), client.stats):
            with pytest.raises(kind, match=r"^cache service: refused on purpose$") as err:
                await call()
            assert err.value.code == code and isinstance(err.value.__cause__, grpc.aio.AioRpcError)
        events = client.watch()
        assert (await anext(events)).reset
        with pytest.raises(kind, match="stream lost on purpose") as err:
            await anext(events)
        assert err.value.code == code
    finally:
        await client.close()
        await server.stop(0)


async def test_a_silent_watch_raises_unavailable_after_the_heartbeat_timeout() -> None:
    server, client = await failing_client(FailingCache(grpc.StatusCode.OK, hang=True))
    try:
        events = client.watch(heartbeat_timeout_s=1.0)
        assert (await anext(events)).reset
        with pytest.raises(Unavailable, match="silent"):
            await anext(events)
    finally:
        await client.close()
        await server.stop(0)
