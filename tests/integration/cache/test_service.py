"""The CacheService on a real Valkey over real gRPC sockets: the client, the Watch stream of two replicas, and
`python -m services.cache` as its own process."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc

from services.cache.client import CacheClient
from services.cache.handler import CacheHandler
from services.cache.servicer import SERVICE_NAME, CacheServicer
from services.common.server import GrpcService
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc
from tests.helpers.inprocess import serving_in_process
from tests.helpers.servers import cache_service


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
        assert (stats["l1_hits"], stats["misses"], stats["stores"], stats["circuit_open"]) == (1, 1, 1, False)
        removed = await client.invalidate(pipeline="fraud")
        assert removed == (1, 1) and (removed.l1_removed, removed.redis_removed) == (1, 1)
        assert await client.lookup([b"k1"], "fraud") == [None]
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

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_CacheServiceServicer_to_server(CacheServicer(a), server)

    async with serving_in_process("cache", a.settings, SERVICE_NAME, register, a) as service:
        service.drain_hooks.append(a.drain)
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
