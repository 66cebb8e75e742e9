"""Single-flight coalescing: concurrent calls with one key share one computation and its outcome."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class SingleFlight(Generic[T]):
    """N concurrent calls with the same key run `compute` once; every caller gets its result (or its error).

    The computation runs in its own task, so a caller that is cancelled does not cancel it for the others.
    """

    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Task[T]] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    def __contains__(self, key: Hashable) -> bool:
        """A computation for `key` is in flight (a `do` now joins it)."""
        return key in self._inflight

    async def do(self, key: Hashable, compute: Callable[[], Awaitable[T]]) -> T:
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(compute())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._forget(key, t))
        return await asyncio.shield(task)

    def _forget(self, key: Hashable, task: asyncio.Task[T]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here so that an error every caller saw is not logged as unhandled
