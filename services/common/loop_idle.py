"""Tells whether an asyncio event loop has waited for I/O with nothing to do, and when it last did.

A batcher on the event loop uses it to tell a lone request (the loop was idle before it came: send it at once)
from a backlog (the loop has been busy without a pause since the last batch: more requests are already on
their way through gRPC, and waiting briefly for them saves a forward pass each). The probe wraps the loop's
selector, so it knows only loops that have one (asyncio's own); on others it always says "idle", which keeps
batching work-conserving.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Any

IDLE_WAIT_NS = (
    50_000  # a wait for I/O this long means the loop had nothing to do (a busy loop's select returns at once)
)


class LoopIdle:
    """The last moment (time.perf_counter_ns) the loop came back from a real wait for I/O."""

    def __init__(self, selector: Any | None) -> None:
        self.supported = selector is not None
        self.idled_ns = 0
        if selector is None:
            return
        select: Callable[..., Any] = selector.select

        def timed_select(timeout: float | None = None) -> Any:
            if timeout is not None and timeout <= 0:  # the loop has callbacks ready: only a poll
                return select(timeout)
            start = time.perf_counter_ns()
            events = select(timeout)
            end = time.perf_counter_ns()
            if end - start >= IDLE_WAIT_NS:
                self.idled_ns = end
            return events

        selector.select = timed_select

    def idle_since(self, moment_ns: int) -> bool:
        """Whether the loop waited for I/O with nothing to do after `moment_ns` (always True when unsupported)."""
        return not self.supported or self.idled_ns > moment_ns


_PROBES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopIdle] = weakref.WeakKeyDictionary()


def loop_idle(loop: asyncio.AbstractEventLoop) -> LoopIdle:
    """The probe of `loop`, installed on first use (one per loop)."""
    probe = _PROBES.get(loop)
    if probe is None:
        probe = _PROBES[loop] = LoopIdle(getattr(loop, "_selector", None))
    return probe
