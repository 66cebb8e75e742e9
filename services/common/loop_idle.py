"""Runs callbacks at the moment an asyncio event loop runs out of work, just before it would wait for I/O.

A batcher on the event loop uses it to close a batch exactly when no more requests can join it before the
loop would sit idle: a lone request runs as soon as the loop has nothing else to do, and under load, while
requests keep arriving through gRPC, they gather without any timer. The hook wraps the loop's selector (no
asyncio API offers an idle callback): when the loop asks to wait and a poll finds no I/O ready, the callbacks
run, and if they scheduled work the loop polls again instead of blocking. Loops without a selector
attribute (uvloop) are not supported: `idle_hooks` returns None and callers fall back to `call_soon`.

Why not a timer (`call_later`) bounding the wait instead: epoll waits are whole milliseconds, so a sub-millisecond
timer on an idle loop costs a millisecond, and every batch at moderate load waited its full delay, which cost
throughput at moderate concurrency (`python -m bench.experiments.model_variants`; the figures are in
bench/README.md, "Model service").
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any


class IdleHooks:
    """One-shot callbacks run when the loop has no callback ready and no I/O pending."""

    def __init__(self, loop: asyncio.AbstractEventLoop, selector: Any) -> None:
        self._loop = loop
        self._pending: list[Callable[[], None]] = []
        select: Callable[[float | None], Any] = selector.select

        def select_or_idle(timeout: float | None = None) -> Any:
            if (timeout is not None and timeout <= 0) or not self._pending:
                return select(timeout)
            events = select(0)
            if events:
                return events  # more work has arrived: the loop is not idle yet
            callbacks, self._pending = self._pending, []
            for callback in callbacks:
                try:
                    callback()
                except Exception as exc:  # a hook must never break the loop; report it as asyncio does
                    loop.call_exception_handler({"message": "idle hook failed", "exception": exc})
            return select(0 if loop._ready else timeout)  # type: ignore[attr-defined]  # work was scheduled: no wait

        selector.select = select_or_idle

    def nothing_ready(self) -> bool:
        """Whether no other callback is due in this loop iteration (the caller is the last thing running)."""
        return not self._loop._ready  # type: ignore[attr-defined]

    def call_when_idle(self, callback: Callable[[], None]) -> None:
        """Run `callback` (once) on the loop's thread the next time it runs out of work."""
        self._pending.append(callback)


_HOOKS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, IdleHooks] = weakref.WeakKeyDictionary()


def idle_hooks(loop: asyncio.AbstractEventLoop) -> IdleHooks | None:
    """The idle hooks of `loop`, installed on first use; None for a loop without a selector."""
    hooks = _HOOKS.get(loop)
    if hooks is None:
        selector = getattr(loop, "_selector", None)
        if selector is None or not hasattr(loop, "_ready"):
            return None
        hooks = _HOOKS[loop] = IdleHooks(loop, selector)
    return hooks
