"""The one way a service connects to Redis (or Valkey): a bounded blocking pool that fails fast, never retries.

Only the cache and feature services import this (the gateway image has no redis package). Retries are off
because both callers answer within a request's budget and degrade instead (the cache misses, the feature
service serves defaults); a retry would only spend the budget on a server that just failed.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

CONNECT_TIMEOUT_S = 0.5  # a Redis that does not accept within this is down for this request
POOL_WAIT_S = 1.0  # how long a caller waits for a free connection before the call fails


OnConnect = Callable[[AbstractConnection], Awaitable[None]]
"""Runs on every new connection (the first, and each reconnect after the server went away) before its first
command; it may send commands on that connection (`send_command` / `read_response`)."""


class _WatchedPool(aioredis.BlockingConnectionPool):
    """A blocking pool whose connections call `on_connect` each time they (re)connect."""

    on_connect: OnConnect | None = None

    def make_connection(self) -> AbstractConnection:
        connection: AbstractConnection = super().make_connection()
        connection.register_connect_callback(self._connected)
        return connection

    async def _connected(self, connection: AbstractConnection) -> None:
        if self.on_connect is not None:
            await self.on_connect(connection)


def connect(
    url: str, *, max_connections: int, command_timeout_s: float, on_connect: OnConnect | None = None
) -> aioredis.Redis:
    """A client over its own pool. `command_timeout_s` bounds one command or script: each caller sets it from
    the slowest call it makes (e.g. a feature ingest script over a large batch takes longer than a cache GET).
    `on_connect` runs on each new connection before its first command (a server that restarted is only ever met
    through new connections: the pool reconnects a connection whose server went away on its own)."""
    pool = _WatchedPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=command_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    pool.on_connect = on_connect
    return aioredis.Redis(connection_pool=pool)


def redact(url: str) -> str:
    """The URL without its password, for logs (redis://user:secret@host -> redis://user:***@host)."""
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)
