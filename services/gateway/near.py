"""The gateway's near cache, and how it follows the cache service's invalidations over a Watch stream.

While the stream is live, every invalidation any cache replica applies reaches the near cache within a
round trip, so fresh hits may stay near for `watched_ttl_s` (the pipeline's own TTL still bounds them).
While it is down (cache service restarting, draining, unreachable), invalidations could be missed: the
near cache is emptied and entries live at most `unwatched_ttl_s` until the stream is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from services.cache.api import Invalidation, L1Cache
from services.common.errors import MeshserveError
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import UNTRACED, WatchUpstream

log = logging.getLogger(__name__)
RECONNECT_S = 0.5  # wait between attempts to (re)open the stream


class NearCacheWatch:
    """Keeps `near` in step with the cache service: `run()` until cancelled."""

    def __init__(
        self,
        near: L1Cache,
        cache: WatchUpstream,
        watched_ttl_s: float,
        unwatched_ttl_s: float,
        heartbeat_timeout_s: float,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.near = near
        self.cache = cache
        self.watched_ttl_s = watched_ttl_s
        self.unwatched_ttl_s = unwatched_ttl_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.metadata = tuple(metadata)
        self.live = False
        self.events = 0  # invalidations applied (resets included)
        near.max_ttl_s = unwatched_ttl_s

    def apply(self, invalidation: Invalidation) -> int:
        """Drop what an event names; returns how many entries. The first event (a reset) makes the watch live."""
        if invalidation.heartbeat:
            return 0
        removed = self.near.remove_where(invalidation.matches)
        if invalidation.reset:
            self.live = True
            self.near.max_ttl_s = self.watched_ttl_s
        self.events += 1
        return removed

    def lost(self) -> None:
        """The stream ended or failed: what arrives from now on could be missed, so start over short-lived."""
        if self.live:
            log.info(
                "cache invalidation watch lost: near cache emptied, entries kept %.1f s until it is back",
                self.unwatched_ttl_s,
            )
        self.live = False
        self.near.max_ttl_s = self.unwatched_ttl_s
        self.near.remove_where(lambda e: True)

    async def run(self) -> None:
        while True:
            # A silent stream (no heartbeat for heartbeat_timeout_s) raises, and counts as lost.
            events = self.cache.watch(self.metadata, heartbeat_timeout_s=self.heartbeat_timeout_s)
            try:
                async for event in events:
                    self.apply(event)
            except MeshserveError as exc:
                log.debug("cache invalidation watch failed: %r", exc)
            finally:
                await events.aclose()
                self.lost()
            await asyncio.sleep(RECONNECT_S)


def near_cache(settings: GatewaySettings, cache: WatchUpstream) -> tuple[L1Cache | None, NearCacheWatch | None]:
    """The near cache the settings ask for (None: off), and its watch (None: entries live near_cache_ttl_s)."""
    if settings.near_cache_max_bytes <= 0 or settings.near_cache_ttl_s <= 0:
        return None, None
    near = L1Cache(settings.near_cache_max_bytes, settings.near_cache_ttl_s)
    if settings.near_cache_watched_ttl_s <= 0:
        return near, None
    watch = NearCacheWatch(
        near,
        cache,
        settings.near_cache_watched_ttl_s,
        settings.near_cache_ttl_s,
        settings.watch_heartbeat_timeout_s,
        UNTRACED,
    )
    return near, watch
