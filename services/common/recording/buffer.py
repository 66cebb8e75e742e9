"""The recent spans of one process by trace, bounded: the oldest traces evicted whole and remembered, so that a
collection can tell a lost part from none."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from services.common.recording.spans import RecordedSpan


class SpanBuffer:
    """The recent spans of this process by trace, at most `capacity` spans: past it the oldest traces go, whole,
    and their ids are remembered (up to `remember`) so that a collection can tell a lost part from no part.

    Also remembers which traces waited on a batched call that went in another trace (the batch's leader), so
    that collecting a member's trace collects the shared call too. Event-loop only (not thread-safe).
    """

    def __init__(self, capacity: int, remember: int) -> None:
        self.capacity = capacity
        self.remember = remember
        self.traces: dict[int, list[RecordedSpan]] = {}
        self.size = 0
        self.evictions = 0
        self._order: deque[int] = deque()
        self._evicted: set[int] = set()
        self._evicted_order: deque[int] = deque()
        self._leaders: dict[int, list[int]] = {}
        self._leader_order: deque[int] = deque()

    def add(self, span: RecordedSpan) -> None:
        spans = self.traces.get(span.trace_id)
        if spans is None:
            self.traces[span.trace_id] = [span]
            self._order.append(span.trace_id)
        else:
            spans.append(span)
        self.size += 1
        if self.size > self.capacity:
            self._evict()

    def _evict(self) -> None:
        traces, order = self.traces, self._order
        while self.size > self.capacity and order:
            trace_id = order.popleft()
            spans = traces.pop(trace_id, None)
            if spans is None:
                continue  # taken by a collection already
            self.size -= len(spans)
            self.evictions += 1
            self.forget(trace_id)

    def forget(self, trace_id: int) -> None:
        """Remember that this trace's spans here were lost."""
        if not self.remember or trace_id in self._evicted:
            return
        self._evicted.add(trace_id)
        self._evicted_order.append(trace_id)
        if len(self._evicted_order) > self.remember:
            self._evicted.discard(self._evicted_order.popleft())

    def take(self, trace_id: int) -> tuple[list[RecordedSpan], bool]:
        """The trace's spans (removed from the buffer) and whether some of its spans were evicted before."""
        spans = self.traces.pop(trace_id, None)
        if spans is None:
            spans = []
        else:
            self.size -= len(spans)
        if len(self._order) > 2 * self.capacity + 64:  # ids of taken traces pile up in an idle buffer
            self._order = deque(self.traces)
        return spans, trace_id in self._evicted

    def lead(self, leader: int, member: int) -> None:
        """`member`'s request waited on a batched call recorded in `leader`'s trace."""
        leaders = self._leaders.get(member)
        if leaders is None:
            self._leaders[member] = [leader]
            self._leader_order.append(member)
            if len(self._leader_order) > self.capacity:
                self._leaders.pop(self._leader_order.popleft(), None)
        elif leader not in leaders:
            leaders.append(leader)

    def leaders(self, member: int) -> list[int]:
        return self._leaders.pop(member, [])
