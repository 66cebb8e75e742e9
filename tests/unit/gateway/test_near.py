"""The gateway's near cache follows a real in-process cache service's Watch stream (no Redis: L1 only)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from services.cache.api import CacheClient, Entry, Invalidation, L1Cache
from services.cache.handler import CacheHandler
from services.cache.servicer import SERVICE_NAME, CacheServicer
from services.cache.settings import CacheSettings
from services.common.errors import Unavailable
from services.gateway.near import NearCacheWatch, near_cache
from services.gateway.pipeline import load_pipelines
from services.gateway.runner import PipelineRunner
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import UNTRACED
from services.gateway.versions import ServingVersions
from services.protos import cache_pb2_grpc as pb_grpc
from tests.helpers.inprocess import serving_in_process
from tests.unit.gateway.fakes import FakeCache

ROOT = Path(__file__).resolve().parents[3]


def entry(pipeline: str, model: str, version: str) -> Entry:
    now = time.time()
    return Entry(b"v", pipeline, model, version, now, now + 600, now + 600)


async def wait_for(condition, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_near_cache_follows_invalidations_and_falls_back_when_the_stream_ends() -> None:
    settings = CacheSettings(host="127.0.0.1", port=0, metrics_port=0, watch_heartbeat_s=0.2)
    handler = CacheHandler(settings, None)
    register = lambda server: pb_grpc.add_CacheServiceServicer_to_server(CacheServicer(handler), server)  # noqa: E731
    near = L1Cache(1 << 20, 2.0)
    async with serving_in_process("cache", settings, SERVICE_NAME, register, handler) as service:
        service.drain_hooks.append(handler.fanout.close)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            watch = NearCacheWatch(near, CacheClient("", channel=channel), 60.0, 2.0, heartbeat_timeout_s=1.0)
            assert (watch.live, near.max_ttl_s) == (False, 2.0)
            task = asyncio.ensure_future(watch.run())
            try:
                await wait_for(lambda: watch.live, "the watch never went live")
                assert near.max_ttl_s == 60.0  # fresh hits may now stay near for a minute
                now = time.time()
                entries = {
                    b"a": ("fraud", "mlp", "1"),
                    b"b": ("fraud", "mlp", "2"),
                    b"c": ("digits", "cnn", "1"),
                    b"d": ("other", "mlp", "2"),
                }
                for key, (p, m, v) in entries.items():
                    assert near.put(key, entry(p, m, v), now)
                await handler.invalidate(model_name="mlp", model_version="2")
                await wait_for(lambda: len(near) == 2, "a model version's invalidation did not arrive")
                assert near.get(b"a", now) is not None and near.get(b"c", now) is not None
                await handler.invalidate(pipeline="fraud")
                await wait_for(lambda: len(near) == 1, "a pipeline's invalidation did not arrive")
                await asyncio.sleep(0.5)  # heartbeats keep a quiet stream alive
                assert watch.live and near.get(b"c", now) is not None
                await service.drain()  # the cache replica goes away: its Watch streams end
                await wait_for(lambda: not watch.live, "the watch did not notice the stream's end")
                assert len(near) == 0 and near.max_ttl_s == 2.0  # invalidations could be missed now
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    await handler.close()


def test_an_answer_older_than_an_invalidation_is_not_kept_near() -> None:
    """A lookup (or computation) that began before an invalidation reached the near cache may carry what the
    invalidation dropped: the runner keeps it near only if no invalidation came in between."""
    spec = load_pipelines(ROOT / "pipelines")["fraud"]
    near = L1Cache(1 << 20, 60.0)
    runner = PipelineRunner(spec, None, None, None, ServingVersions(3.0), near)  # type: ignore[arg-type]  # no call
    began = near.generation
    near.remove_where(Invalidation(pipeline="fraud").matches)  # the watch applies an invalidation meanwhile
    runner._keep_near(b"k", b"old answer", "1", time.time(), began)
    assert near.get(b"k", time.time()) is None
    runner._keep_near(b"k", b"new answer", "1", time.time(), near.generation)
    assert near.get(b"k", time.time()).value == b"new answer"


def test_the_settings_choose_the_near_cache_and_its_watch() -> None:
    base = {"near_cache_ttl_s": 2.0, "near_cache_max_bytes": 1 << 20, "near_cache_watched_ttl_s": 60.0}
    near, watch = near_cache(GatewaySettings(**base), FakeCache([]))
    assert near is not None and watch is not None and watch.near is near
    assert (watch.watched_ttl_s, watch.unwatched_ttl_s, near.max_ttl_s) == (60.0, 2.0, 2.0)
    assert watch.metadata == UNTRACED  # the mesh does not trace the watch
    near, watch = near_cache(GatewaySettings(**{**base, "near_cache_watched_ttl_s": 0.0}), FakeCache([]))
    assert near is not None and watch is None
    for off in ({"near_cache_ttl_s": 0.0}, {"near_cache_max_bytes": 0}):
        assert near_cache(GatewaySettings(**{**base, **off}), FakeCache([])) == (None, None)


async def test_a_watch_that_fails_empties_the_near_cache_and_reconnects() -> None:
    near = L1Cache(1 << 20, 2.0)
    opened: list[int] = []

    class Flaky:
        async def watch(self, metadata=(), *, heartbeat_timeout_s=None):
            opened.append(1)
            yield Invalidation(reset=True)
            raise Unavailable("cache service: Watch stream silent for 1.0 s")

    watch = NearCacheWatch(near, Flaky(), 60.0, 2.0, heartbeat_timeout_s=1.0)
    near.put(b"k", entry("fraud", "mlp", "1"), time.time())
    task = asyncio.ensure_future(watch.run())
    try:
        await wait_for(lambda: len(opened) >= 2, "the watch did not reconnect")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not watch.live and len(near) == 0 and near.max_ttl_s == 2.0
