"""The CacheService over real gRPC sockets: the client wrapper, status codes, single-flight, the process."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from services.cache.client import CacheClient, SingleFlight
from services.cache.handler import CacheHandler
from services.cache.servicer import SERVICE_NAME, CacheServicer
from services.common.errors import InvalidArgument
from services.common.server import GrpcService
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc
from tests.helpers.inprocess import serving_in_process
from tests.helpers.servers import cache_service, free_port


def target(service: GrpcService) -> str:
    return f"127.0.0.1:{service.port}"


async def test_client_store_lookup_stats(cache_server: GrpcService) -> None:
    client = CacheClient(target(cache_server), timeout_s=5.0)
    try:
        assert await client.lookup([b"k1"], "fraud") == [None]
        ok = await client.store(b"k1", b"v1", pipeline="fraud", model_name="m", model_version="3", ttl_s=60)
        assert ok
        (hit,) = await client.lookup([b"k1"], "fraud")
        assert hit is not None and (hit.value, hit.model_version, hit.stale) == (b"v1", "3", False)
        stats = await client.stats()
        assert (stats.l1_hits, stats.misses, stats.stores, stats.circuit_open) == (1, 1, 1, False)
        assert await client.invalidate(pipeline="fraud") == (1, 1)
    finally:
        await client.close()


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
        client = CacheClient("", channel=channel)
        with pytest.raises(InvalidArgument):
            await client.lookup([b""])  # bad input is not swallowed by fail-open


async def test_single_flight_computes_once(cache_server: GrpcService) -> None:
    client = CacheClient(target(cache_server), timeout_s=5.0)
    calls = 0
    started, release = asyncio.Event(), asyncio.Event()

    async def compute() -> bytes:
        nonlocal calls
        calls += 1
        started.set()
        await release.wait()
        return b"computed"

    async def call() -> tuple[bytes, bool]:
        return await client.get_or_compute(b"same", compute, pipeline="p", model_name="m", model_version="1", ttl_s=60)

    try:
        tasks = [asyncio.create_task(call()) for _ in range(50)]
        await started.wait()
        await asyncio.sleep(0.05)  # let every caller reach the in-flight computation
        release.set()
        results = await asyncio.gather(*tasks)
        assert calls == 1 and results == [(b"computed", False)] * 50
        assert await call() == (b"computed", True)  # stored after the computation
        assert calls == 1 and len(client.flights) == 0
    finally:
        await client.close()


async def test_single_flight_shares_errors_and_survives_a_cancelled_caller() -> None:
    flights: SingleFlight[int] = SingleFlight()
    gate = asyncio.Event()
    runs = 0

    async def boom() -> int:
        nonlocal runs
        runs += 1
        await gate.wait()
        raise ValueError("model failed")

    tasks = [asyncio.create_task(flights.do("k", boom)) for _ in range(10)]
    await asyncio.sleep(0.01)
    tasks[0].cancel()  # one caller gives up; the others still get the shared outcome
    gate.set()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert runs == 1 and isinstance(outcomes[0], asyncio.CancelledError)
    assert all(isinstance(o, ValueError) for o in outcomes[1:])

    async def ok() -> int:
        return 7

    assert await flights.do("k", ok) == 7 and len(flights) == 0


async def test_client_fails_open_when_the_cache_is_down() -> None:
    client = CacheClient(f"127.0.0.1:{free_port()}", timeout_s=0.2)
    try:
        assert await client.lookup([b"a", b"b"]) == [None, None]
        assert not await client.store(b"a", b"v", pipeline="p", model_name="m", model_version="1", ttl_s=1)
    finally:
        await client.close()


def test_process_with_embedded_valkey(tmp_path: Path) -> None:
    """`python -m services.cache` with MESHSERVE_REDIS_URL unset: embedded Valkey, health, metrics, SIGTERM."""
    with cache_service(tmp_path) as service:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.CacheServiceStub(channel)
            entry = pb.StoreEntry(key=b"k", value=b"v", pipeline="p", model_name="m", model_version="1", ttl_s=30)
            assert stub.Store(pb.StoreRequest(entries=[entry]), timeout=5).stored == 1
            (result,) = stub.Lookup(pb.LookupRequest(keys=[b"k"], pipeline="p"), timeout=5).results
            assert result.hit and result.value == b"v" and result.tier == pb.TIER_L1
        url = f"http://127.0.0.1:{service.metrics_port}/metrics"
        body = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'meshserve_cache_hits_total{pipeline="p",tier="l1"} 1.0' in body
        assert "meshserve_cache_lookup_seconds_bucket" in body and "meshserve_cache_circuit_open 0.0" in body
        assert service.terminate() == 0, service.log()
    assert "embedded valkey" in service.log()


async def test_watch_streams_every_replicas_invalidations_then_ends_at_drain(
    make_handler: Callable[..., CacheHandler],
) -> None:
    """Two replicas on one Redis: a watcher of replica A sees a reset first, then A's own invalidation and one
    B published (through Redis pub/sub), a heartbeat when idle, and the end of the stream when A drains."""
    a, b = make_handler(watch_heartbeat_s=0.3), make_handler()
    await asyncio.wait_for(asyncio.gather(a.redis.subscribed.wait(), b.redis.subscribed.wait()), 5)
    register = lambda server: pb_grpc.add_CacheServiceServicer_to_server(CacheServicer(a), server)  # noqa: E731
    async with serving_in_process("cache", a.settings, SERVICE_NAME, register, a) as service:
        service.drain_hooks.append(a.fanout.close)
        async with grpc.aio.insecure_channel(target(service)) as channel:
            call = pb_grpc.CacheServiceStub(channel).Watch(pb.WatchRequest(), timeout=10)
            assert (await call.read()).reset
            await a.invalidate(pipeline="fraud")
            await b.invalidate(model_name="fraud_mlp", model_version="2")
            seen = []
            while len(seen) < 2:  # A's own arrives twice (applied here, then back from the channel): harmless
                event = await call.read()
                key = (event.pipeline, event.model_name, event.model_version)
                if key not in seen and any(key):
                    seen.append(key)
            assert sorted(seen) == [("", "fraud_mlp", "2"), ("fraud", "", "")]
            start = asyncio.get_running_loop().time()
            while True:  # idle: heartbeats (nothing set) about every 0.3 s
                event = await call.read()
                if not (event.reset or event.pipeline or event.model_name):
                    break
            assert asyncio.get_running_loop().time() - start < 2.0
            drained = asyncio.ensure_future(service.drain())
            assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
            assert await call.code() == grpc.StatusCode.OK
            await drained
