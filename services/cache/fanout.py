"""Invalidations fanned out to the cache's watchers (gateways' near caches), each with its own bounded queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from services.cache.domain import HEARTBEAT, RESET, Invalidation

WATCH_QUEUE = 1024  # events a slow watcher may fall behind by before it gets a reset instead
_END = object()


class InvalidationFanout:
    """Publish once, every current subscriber gets it. A subscriber that falls WATCH_QUEUE events behind
    gets one reset in place of what it missed; close() ends every subscription (the replica drains)."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[object]] = set()
        self.closed = False

    def __len__(self) -> int:
        return len(self._queues)

    def publish(self, event: Invalidation) -> None:
        for queue in self._queues:
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:  # too far behind: what it missed becomes one reset
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(RESET)

    async def subscribe(self, heartbeat_s: float) -> AsyncIterator[Invalidation]:
        """RESET first, then every event published, a HEARTBEAT after each `heartbeat_s` without one."""
        if self.closed:
            return
        queue: asyncio.Queue[object] = asyncio.Queue(WATCH_QUEUE)
        self._queues.add(queue)
        try:
            yield RESET
            while True:
                try:
                    item = await asyncio.wait_for(queue.get(), heartbeat_s)
                except TimeoutError:
                    item = HEARTBEAT
                if item is _END:
                    return
                assert isinstance(item, Invalidation)
                yield item
        finally:
            self._queues.discard(queue)

    def close(self) -> None:
        """End every subscription (their streams complete OK: the watchers reconnect elsewhere)."""
        self.closed = True
        for queue in self._queues:
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(_END)
