"""The gateway's near cache follows the cache service's invalidations over a Watch stream.

While the stream is live, every invalidation any cache replica applies reaches the near cache within a
round trip, so fresh hits may stay near for `watched_ttl_s` (the pipeline's own TTL still bounds them).
While it is down (cache service restarting, draining, unreachable), invalidations could be missed: the
near cache is emptied and entries live at most `unwatched_ttl_s` until the stream is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import grpc

from services.cache.fanout import Invalidation
from services.cache.l1 import L1Cache
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
RECONNECT_S = 0.5  # wait between attempts to (re)open the stream


class NearCacheWatch:
    """Keeps `near` in step with the cache service: `run()` until cancelled."""

    def __init__(self, near: L1Cache, stub: pb_grpc.CacheServiceStub, watched_ttl_s: float, unwatched_ttl_s: float,
                 heartbeat_timeout_s: float, metadata: Sequence[tuple[str, str]] = ()) -> None:  # fmt: skip
        self.near = near
        self.stub = stub
        self.watched_ttl_s = watched_ttl_s
        self.unwatched_ttl_s = unwatched_ttl_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.metadata = tuple(metadata)
        self.live = False
        self.events = 0  # invalidations applied (resets included)
        near.max_ttl_s = unwatched_ttl_s

    def apply(self, event: pb.InvalidationEvent) -> int:
        """Drop what an event names; returns how many entries. The first event (a reset) makes the watch live."""
        invalidation = Invalidation(event.reset, event.pipeline, event.model_name, event.model_version)
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
            log.info("cache invalidation watch lost: near cache emptied, entries kept %.1f s until it is back",
                     self.unwatched_ttl_s)  # fmt: skip
        self.live = False
        self.near.max_ttl_s = self.unwatched_ttl_s
        self.near.remove_where(lambda e: True)

    async def run(self) -> None:
        while True:
            call = self.stub.Watch(pb.WatchRequest(), metadata=self.metadata)
            try:
                while True:  # a silent stream (no heartbeat) counts as lost
                    event = await asyncio.wait_for(call.read(), self.heartbeat_timeout_s)
                    if event is grpc.aio.EOF:
                        break
                    self.apply(event)
            except (grpc.aio.AioRpcError, TimeoutError) as exc:
                log.debug("cache invalidation watch failed: %r", exc)
            finally:
                call.cancel()
                self.lost()
            await asyncio.sleep(RECONNECT_S)
