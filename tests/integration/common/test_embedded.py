"""The embedded Valkey used when no Redis URL is configured: started for the block, stopped after it."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis
import redis.exceptions

from services.common.embedded import EmbeddedValkey, redis_url_or_embedded


async def test_a_configured_url_is_used_as_it_is() -> None:
    async with redis_url_or_embedded("redis://10.0.0.1:6379/0") as url:
        assert url == "redis://10.0.0.1:6379/0"


async def test_without_a_url_an_embedded_valkey_serves_the_block() -> None:
    async with redis_url_or_embedded(None) as url:
        assert url.startswith("redis://")
        client = aioredis.from_url(url)
        try:
            await client.set("k", "v")
            assert await client.get("k") == b"v"
        finally:
            await client.aclose()
    client = aioredis.from_url(url, socket_connect_timeout=0.5)
    try:
        with pytest.raises(redis.exceptions.ConnectionError):  # stopped with the block
            await client.ping()
    finally:
        await client.aclose()


async def test_start_and_stop() -> None:
    embedded = EmbeddedValkey()
    assert embedded.url == ""
    url = await embedded.start()
    assert url == embedded.url and embedded.server.is_running()
    await embedded.stop()
    assert not embedded.server.is_running()
    await embedded.stop()  # stopping twice is harmless
