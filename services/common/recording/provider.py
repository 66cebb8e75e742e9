"""The process's recording as the OpenTelemetry tracer provider (Recorder): its tracers, where each ended span goes
(exported when its caller sampled it, pinned when its trace is kept, else the buffer), and the keep decision's
bookkeeping (triggers, the rate limit, other processes' triggers, traces that waited on another trace's batch)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

from services.common.recording.buffer import SpanBuffer
from services.common.recording.spans import (
    CURRENT,
    DEFAULT_CURRENT,
    END_ON_EXIT,
    RECORD_EXCEPTION,
    SAMPLED,
    SET_STATUS,
    TRIGGER,
    RecordedSpan,
    current_span,
)

_getrandbits = random.getrandbits


class RecordingTracer(trace.Tracer):
    """A tracer of one instrumentation scope whose spans are RecordedSpans of its Recorder."""

    def __init__(self, recorder: Recorder, scope: str) -> None:
        self.recorder = recorder
        self.scope = scope

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> RecordedSpan:
        parent = current_span() if context is None else trace.get_current_span(context)
        start = start_time if start_time is not None else time.time_ns()
        if type(parent) is RecordedSpan:
            return RecordedSpan(
                self.recorder,
                self.scope,
                name,
                parent.trace_id,
                parent.span_id,
                parent.flags,
                parent.trace_state,
                kind,
                start,
                attributes,
                links,
                False,
            )
        other = parent.get_span_context()
        if not other.is_valid:
            return self.recorder.root(self.scope, name, kind, start, attributes, links)
        # A caller's context (extracted: remote), or one of this process's spans passed as a bare context (the
        # gateway's batch span under its first member's span): local.
        return RecordedSpan(
            self.recorder,
            self.scope,
            name,
            other.trace_id,
            other.span_id,
            int(other.trace_flags),
            other.trace_state,
            kind,
            start,
            attributes,
            links,
            other.is_remote,
        )

    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: otel_context.Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> RecordedSpan:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        span._current = (
            CURRENT
            | (RECORD_EXCEPTION if record_exception else 0)
            | (SET_STATUS if set_status_on_exception else 0)
            | (END_ON_EXIT if end_on_exit else 0)
        )
        return span


@dataclass
class Kept:
    """A trace this process keeps: its spans here, pinned until collected, and why it is kept."""

    trace_id: int
    triggers: set[str]
    spans: list[RecordedSpan]
    lost: bool
    leaders: list[int] = field(default_factory=list)
    at: float = field(default_factory=time.monotonic)
    sampled: bool = False  # exported by every process on its own: only its leaders are collected


EdgeDecision = Callable[[RecordedSpan], list[str]]


class Recorder(trace.TracerProvider):
    """The process's recording: the tracer provider, its buffer, the head-sampled spans waiting for export, the
    traces kept here and waiting for collection, and (at the edge) the keep decision.

    `edge(root)` (set by the gateway) names the triggers of a request whose server span `root` just ended (empty:
    not kept). `on_keep(kept)` is called for every trace kept here (the collector schedules its collection);
    `on_trigger(trace_id, name)` for a trigger that needs an edge elsewhere (the collector tells the others).
    """

    def __init__(
        self,
        service: str,
        resource: Mapping[str, Any],
        buffer_spans: int,
        remember_evicted: int,
        max_kept_per_s: float = 200.0,
        max_pending: int = 10_000,
        export_max_spans: int = 20_000,
    ) -> None:
        self.service = service
        self.resource = dict(resource)
        self.buffer = SpanBuffer(buffer_spans, remember_evicted)
        self.edge: EdgeDecision | None = None
        self.on_keep: Callable[[Kept], None] | None = None
        self.on_trigger: Callable[[int, str], None] | None = None
        self.kept: dict[int, Kept] = {}
        self.sampled: list[RecordedSpan] = []  # head-sampled spans, waiting for the exporter
        self.export_max_spans = export_max_spans
        self.max_pending = max_pending
        self._external: dict[int, set[str]] = {}  # triggers from other processes for requests still in flight here
        self._tracers: dict[str, RecordingTracer] = {}
        self._rate = max_kept_per_s
        self._tokens = max_kept_per_s
        self._refilled = time.monotonic()
        self.kept_total: dict[str, int] = {}
        self.keep_dropped = 0
        self.sampled_dropped = 0

    # -- the tracer provider -------------------------------------------------------------------------------

    def get_tracer(self, instrumenting_module_name: str, *args: Any, **kwargs: Any) -> RecordingTracer:
        tracer = self._tracers.get(instrumenting_module_name)
        if tracer is None:
            tracer = self._tracers[instrumenting_module_name] = RecordingTracer(self, instrumenting_module_name)
        return tracer

    def root(
        self,
        scope: str,
        name: str,
        kind: SpanKind,
        start_ns: int,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
    ) -> RecordedSpan:
        """The first span of a new trace (no caller context): recorded, not head-sampled."""
        trace_id = _getrandbits(128) or 1
        return RecordedSpan(self, scope, name, trace_id, 0, 0, None, kind, start_ns, attributes, links, True)

    def child(self, scope: str, name: str, attributes: Attributes = None) -> RecordedSpan:
        """`start_as_current_span(name, attributes=...)` of an instrumentation scope, the common case made short."""
        parent = current_span()
        if type(parent) is not RecordedSpan:
            return self.get_tracer(scope).start_as_current_span(name, attributes=attributes)
        span = RecordedSpan(
            self,
            scope,
            name,
            parent.trace_id,
            parent.span_id,
            parent.flags,
            parent.trace_state,
            SpanKind.INTERNAL,
            time.time_ns(),
            attributes,
            None,
            False,
        )
        span._current = DEFAULT_CURRENT
        return span

    # -- where spans go ------------------------------------------------------------------------------------

    def finish(self, span: RecordedSpan) -> None:
        """An ended span: decided on at the edge when it ends a request here, then exported (head-sampled),
        pinned (kept) or buffered."""
        trace_id = span.trace_id
        if span.links is not None and not span.flags & SAMPLED:  # a sampled batch is exported by every process
            for link in span.links:
                if link.context.trace_id != trace_id:
                    self.buffer.lead(trace_id, link.context.trace_id)
        if span.remote_parent and self.edge is not None:
            self._decide(span)
        if span.flags & SAMPLED:
            if len(self.sampled) < self.export_max_spans:
                self.sampled.append(span)
            else:
                self.sampled_dropped += 1
            return
        kept = self.kept.get(trace_id) if self.kept else None
        if kept is not None:
            kept.spans.append(span)
            return
        buffer = self.buffer  # SpanBuffer.add, inline (once per span)
        spans = buffer.traces.get(trace_id)
        if spans is None:
            buffer.traces[trace_id] = [span]
            buffer._order.append(trace_id)
        else:
            spans.append(span)
        buffer.size += 1
        if buffer.size > buffer.capacity:
            buffer._evict()

    def _decide(self, root: RecordedSpan) -> None:
        assert self.edge is not None
        triggers = set(self.edge(root))
        external = self._external.pop(root.trace_id, None)
        if external:
            triggers |= external
        if triggers:
            self.keep(root.trace_id, triggers, root)

    def _admit(self) -> bool:
        """A token of the keep rate limit (refilled continuously, bursts of one second's worth)."""
        now = time.monotonic()
        self._tokens = min(self._rate, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens < 1 or len(self.kept) >= self.max_pending:
            return False
        self._tokens -= 1
        return True

    def keep(self, trace_id: int, triggers: set[str], root: RecordedSpan | None = None) -> bool:
        """Keep a trace: mark `root` with the triggers, pin this process's spans of it and have it collected (a
        head-sampled trace is exported anyway: only marked). False when the rate limit or the queue refused it."""
        sampled = root is not None and root.sampled
        kept = self.kept.get(trace_id)
        if kept is not None:
            kept.triggers |= triggers
        elif not sampled and not self._admit():
            self.keep_dropped += 1
            return False
        if root is not None:
            previous = root.attributes.get(TRIGGER)
            names = triggers | (set(str(previous).split(",")) if previous else set())
            root.attributes[TRIGGER] = ",".join(sorted(names))
        for name in triggers:
            self.kept_total[name] = self.kept_total.get(name, 0) + 1
        leaders = self.buffer.leaders(trace_id)
        if kept is None:
            spans, lost = self.buffer.take(trace_id)
            kept = Kept(trace_id, set(triggers), spans, lost, leaders, sampled=sampled)
            if sampled and not leaders:
                return True  # every process exports this trace's spans on its own
            self.kept[trace_id] = kept
            if self.on_keep is not None:
                self.on_keep(kept)
        else:
            kept.leaders.extend(t for t in leaders if t not in kept.leaders)
        return True

    def trigger(self, trace_id: int, name: str) -> None:
        """A symptom seen here (e.g. a long queue wait) that should keep the trace: kept here when this process is
        the edge, else the edges are told (they keep it at the end of the request)."""
        if self.edge is not None:
            self.external_trigger(trace_id, name)
        elif self.on_trigger is not None:
            self.on_trigger(trace_id, name)

    def external_trigger(self, trace_id: int, name: str) -> bool:
        """Another process's trigger for `trace_id`: kept at once if its request already ended here, else remembered
        for the end of the request (which may not have reached this process yet, or never will: another edge's).
        Returns whether this process has spans of the trace."""
        kept = self.kept.get(trace_id)
        if kept is not None:
            return self.keep(trace_id, {name})
        spans = self.buffer.traces.get(trace_id, [])
        root = next((s for s in spans if s.remote_parent), None)
        if root is not None:
            return self.keep(trace_id, {name}, root)
        self._external.setdefault(trace_id, set()).add(name)
        if len(self._external) > self.max_pending:
            self._external.pop(next(iter(self._external)))
        return bool(spans)

    def take_kept(self, trace_id: int) -> Kept | None:
        """A kept trace's pinned spans, for its collection (later spans of it go to the buffer again)."""
        return self.kept.pop(trace_id, None)

    def take(self, trace_ids: Sequence[int]) -> tuple[list[RecordedSpan], list[int]]:
        """For a collector: these traces' spans here (removed) and the ids of those that lost spans here."""
        spans: list[RecordedSpan] = []
        lost: list[int] = []
        for trace_id in trace_ids:
            kept = self.kept.pop(trace_id, None)
            found, was_lost = self.buffer.take(trace_id)
            if kept is not None:
                found = [*kept.spans, *found]
                was_lost = was_lost or kept.lost
            spans.extend(found)
            if was_lost:
                lost.append(trace_id)
        return spans, lost

    def drain_sampled(self) -> list[RecordedSpan]:
        spans, self.sampled = self.sampled, []
        return spans


def recorder() -> Recorder | None:
    """The process's Recorder when it is the global tracer provider."""
    provider = trace.get_tracer_provider()
    return provider if isinstance(provider, Recorder) else None
