"""Invalidations fanned out to the cache's watchers (gateways' near caches), each with its own bounded queue."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from services.cache.entry import Entry

WATCH_QUEUE = 1024  # events a slow watcher may fall behind by before it gets a reset instead


@dataclass(frozen=True, slots=True)
class Invalidation:
    """What a watcher must drop: everything (reset), a pipeline's entries, or a model version's ("": all)."""

    reset: bool = False
    pipeline: str = ""
    model_name: str = ""
    model_version: str = ""

    @property
    def heartbeat(self) -> bool:
        return not (self.reset or self.pipeline or self.model_name)

    def matches(self, entry: Entry) -> bool:
        """Whether the entry is one this invalidation drops (the cache's L1 and the gateways' near caches alike)."""
        if self.reset:
            return True
        if self.pipeline:
            return entry.pipeline == self.pipeline
        return (
            bool(self.model_name)
            and entry.model_name == self.model_name
            and self.model_version in ("", entry.model_version)
        )


RESET = Invalidation(reset=True)
HEARTBEAT = Invalidation()
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
