"""`python -m services.cache`'s wiring, in process: the servicer on the shared server, readiness from its
lifecycle, Watch streams that end as the replica drains; and the service's settings from the environment."""

from __future__ import annotations

import asyncio

import pytest

from services.cache.__main__ import build
from services.cache.client import CacheClient
from services.cache.settings import CacheSettings
from tests.helpers.fixtures import cache_settings


async def test_build_serves_the_cache_and_a_stop_drains_its_watchers(refused_redis_url: str) -> None:
    service, handler = build(cache_settings(watch_heartbeat_s=30, shutdown_delay_s=0, redis_url=refused_redis_url))
    assert handler.lifecycle is service.lifecycle and not handler.ready()
    running = asyncio.ensure_future(service.run(handler.start, handler.close))
    try:
        for _ in range(500):
            if handler.ready():
                break
            await asyncio.sleep(0.01)
        assert handler.ready() and handler.live()
        client = CacheClient(f"127.0.0.1:{service.port}", timeout_s=5.0)
        try:
            assert await client.lookup([b"k"]) == [None]  # Redis refuses: a miss, not an error
            events = client.watch()
            assert (await anext(events)).reset
            service.request_stop()  # as SIGTERM does
            assert not handler.live() and not handler.ready()
            assert [e async for e in events] == []  # the drain hook ended the stream: watchers go elsewhere
        finally:
            await client.close()
        await asyncio.wait_for(running, 30)
    finally:
        if not running.done():
            service.request_stop()
            await asyncio.gather(running, return_exceptions=True)
    assert handler.redis is not None and handler.fanout.closed


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_CACHE_PORT", "18003")
    monkeypatch.setenv("MESHSERVE_CACHE_L1_MAX_BYTES", "0")
    monkeypatch.setenv("MESHSERVE_REDIS_URL", "redis://redis:6379/0")  # the shared variable, no prefix
    settings = CacheSettings()
    assert (settings.port, settings.l1_max_bytes, settings.redis_url) == (18003, 0, "redis://redis:6379/0")
    monkeypatch.delenv("MESHSERVE_REDIS_URL")
    assert CacheSettings().redis_url is None  # unset: `python -m services.cache` starts an embedded Valkey
    with pytest.raises(ValueError):
        CacheSettings(max_key_bytes=256)  # a key's length must fit the byte that prefixes it in Redis
