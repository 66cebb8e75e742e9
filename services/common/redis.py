"""The one way a service connects to Redis (or Valkey): a bounded blocking pool that fails fast, never retries.

Only the cache and feature services import this (the gateway image has no redis package). Retries are off
because both callers answer within a request's budget and degrade instead (the cache misses, the feature
service serves defaults); a retry would only spend the budget on a server that just failed.
"""

from __future__ import annotations

import re

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

CONNECT_TIMEOUT_S = 0.5  # a Redis that does not accept within this is down for this request
POOL_WAIT_S = 1.0  # how long a caller waits for a free connection before the call fails


def connect(url: str, *, max_connections: int, command_timeout_s: float) -> aioredis.Redis:
    """A client over its own pool. `command_timeout_s` bounds one command or script: each caller sets it from
    the slowest call it makes (e.g. a feature ingest script over a large batch takes longer than a cache GET)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=command_timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    return aioredis.Redis(connection_pool=pool)


def redact(url: str) -> str:
    """The URL without its password, for logs (redis://user:secret@host -> redis://user:***@host)."""
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)
