"""Always-on, cheap span recording: the OpenTelemetry tracing API answered by lightweight spans that end in a bounded
in-memory buffer per process, keyed by trace id, with no SDK span objects and no OTLP encoding on the serving path.

Every span the services create (the gRPC server span of each RPC, `child_span`'s stage spans, the gateway's batch
spans, the model's queue-wait and forward spans) is a `RecordedSpan` once `Recorder` is the global tracer
provider. A span of a trace whose caller sampled it (the W3C sampled flag) is exported as head sampling would;
every other span waits in the `SpanBuffer`, the oldest traces evicted whole, until the process's collector or
another process's collector asks for its trace, or until it rolls over. The edge (the gateway) decides at the end of
each request whether its trace is kept (`Recorder.edge`); a kept trace's spans here are pinned at once, so this
process never loses its own part after the decision.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.trace import propagation as trace_propagation
from opentelemetry.util.types import Attributes

log = logging.getLogger(__name__)

TRIGGER = "meshserve.trigger"
PARTIAL = "meshserve.partial"
PARTIAL_PROCESSES = "meshserve.partial.processes"
UNRECORDED_PARENT = "meshserve.unrecorded_parent"
PIPELINE = "meshserve.pipeline"
DEGRADED = "meshserve.degraded"
LINKED = "linked"  # the trigger of a trace collected because a kept trace waited on its batched call
SAMPLED = 1  # the W3C trace flag
_NO_STATE = TraceState()
_FLAGS = (TraceFlags(0), TraceFlags(1))
# RecordedSpan._current: made current by its `with` block, and start_as_current_span's options
_CURRENT, _RECORD_EXCEPTION, _SET_STATUS, _END_ON_EXIT = 1, 2, 4, 8
_DEFAULT_CURRENT = _CURRENT | _RECORD_EXCEPTION | _SET_STATUS | _END_ON_EXIT
_getrandbits = random.getrandbits
# The OTel API's current span, read and set without its layers of calls (a span's cost is mostly these): the SDK's
# own context variable and key when the runtime context is the default contextvars one, the public API otherwise.
_RUNTIME = getattr(otel_context, "_RUNTIME_CONTEXT", None)
_VAR = _RUNTIME._current_context if isinstance(_RUNTIME, ContextVarsRuntimeContext) else None
_SPAN_KEY: str = getattr(trace_propagation, "_SPAN_KEY", "")


def current_span() -> trace.Span:
    """The current span (the OTel API's `get_current_span()`)."""
    if _VAR is None or not _SPAN_KEY:
        return trace.get_current_span()
    span = _VAR.get().get(_SPAN_KEY)  # only spans are stored under the span key (set_span_in_context)
    return span if span is not None else trace.INVALID_SPAN  # type: ignore[return-value]


def enter(span: trace.Span) -> object:
    """Make `span` the current span (`attach(set_span_in_context(span))`); the token for `leave`."""
    if _VAR is None or not _SPAN_KEY:
        return otel_context.attach(trace.set_span_in_context(span))
    context = Context(_VAR.get())  # one copy (the API's set_value makes two)
    dict.__setitem__(context, _SPAN_KEY, span)  # Context refuses item assignment: it is new and not shared yet
    return _VAR.set(context)


def leave(token: object) -> None:
    """Restore the context `enter` replaced."""
    if _VAR is None or not _SPAN_KEY:
        otel_context.detach(token)  # type: ignore[arg-type]
        return
    try:
        _VAR.reset(token)  # type: ignore[arg-type]
    except ValueError:  # made in another context (as the API does: logged, not raised)
        log.exception("failed to restore the tracing context")


class RecordedSpan(trace.Span):
    """One span as the OTel API sees it; on `end` it goes to its Recorder. Ids are ints, times epoch ns.

    `remote_parent` says the parent is another process's span (or there is none): the span is where this process's
    part of the trace begins. `via` is the span id the caller put in `x-meshserve-parent` when a hop in between
    (Envoy) replaced the traceparent's parent and records nothing unless sampled.
    """

    __slots__ = (
        "_context",
        "_current",
        "_token",
        "attributes",
        "end_ns",
        "events",
        "flags",
        "kind",
        "links",
        "name",
        "parent_id",
        "recorder",
        "remote_parent",
        "scope",
        "span_id",
        "start_ns",
        "status_code",
        "status_message",
        "trace_id",
        "trace_state",
        "via",
    )

    def __init__(
        self,
        recorder: Recorder,
        scope: str,
        name: str,
        trace_id: int,
        parent_id: int,
        flags: int,
        trace_state: TraceState | None,
        kind: SpanKind,
        start_ns: int,
        attributes: Attributes,
        links: Sequence[Link] | None,
        remote_parent: bool,
        via: int = 0,
    ) -> None:
        self.recorder = recorder
        self.scope = scope
        self.name = name
        self.trace_id = trace_id
        self.span_id = _getrandbits(64) or 1
        self.parent_id = parent_id
        self.flags = flags
        self.trace_state = trace_state
        self.kind = kind
        self.start_ns = start_ns
        self.end_ns = 0
        self.attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self.status_code = StatusCode.UNSET
        self.status_message: str | None = None
        self.events: list[tuple[str, int, Attributes]] | None = None
        self.links: list[Link] | None = list(links) if links else None
        self.remote_parent = remote_parent
        self.via = via
        self._context: trace.SpanContext | None = None
        self._current = 0  # as start_as_current_span's context manager: CURRENT | its options
        self._token: object = None

    # -- the OTel Span API ---------------------------------------------------------------------------------

    def get_span_context(self) -> trace.SpanContext:
        context = self._context
        if context is None:
            # SpanContext's own constructor checks the ids' ranges, which these are in by construction.
            state = self.trace_state if self.trace_state is not None else _NO_STATE
            flags = _FLAGS[self.flags] if self.flags < 2 else TraceFlags(self.flags)
            context = tuple.__new__(trace.SpanContext, (self.trace_id, self.span_id, False, flags, state, True))
            self._context = context
        return context

    def __enter__(self) -> RecordedSpan:
        """As start_as_current_span's context manager: the current span until the block ends (else, as the API's
        Span: only ended at the end of the block)."""
        if self._current:
            self._token = enter(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        options = self._current
        if not options:
            self.end()
            return
        if error is not None:
            if options & _RECORD_EXCEPTION:
                self.record_exception(error, escaped=True)
            if options & _SET_STATUS:
                self.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        leave(self._token)
        if options & _END_ON_EXIT:
            self.end()

    def end(self, end_time: int | None = None) -> None:
        if self.end_ns:
            return
        self.end_ns = end_time if end_time is not None else time.time_ns()
        self.recorder.finish(self)

    def is_recording(self) -> bool:
        return not self.end_ns

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        self.attributes.update(attributes)

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        if self.events is None:
            self.events = []
        self.events.append((name, timestamp if timestamp is not None else time.time_ns(), attributes))

    def add_link(self, context: trace.SpanContext, attributes: Attributes = None) -> None:
        if context.is_valid:
            if self.links is None:
                self.links = []
            self.links.append(Link(context, attributes))

    def update_name(self, name: str) -> None:
        self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if isinstance(status, Status):
            code, description = status.status_code, status.description
        else:
            code = status
        if self.status_code is StatusCode.OK or code is StatusCode.UNSET:
            return  # OK is final; UNSET changes nothing (as the SDK does)
        self.status_code = code
        self.status_message = description if code is StatusCode.ERROR else None

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        # The SDK's event, without the formatted traceback (formatting it costs more than the rest of the span).
        event: dict[str, Any] = {
            "exception.type": type(exception).__qualname__,
            "exception.message": str(exception),
            "exception.escaped": str(escaped),
        }
        if attributes:
            event.update(attributes)
        self.add_event("exception", event, timestamp)

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def __repr__(self) -> str:
        return f"RecordedSpan({self.name!r}, trace={self.trace_id:032x}, span={self.span_id:016x})"


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
            _CURRENT
            | (_RECORD_EXCEPTION if record_exception else 0)
            | (_SET_STATUS if set_status_on_exception else 0)
            | (_END_ON_EXIT if end_on_exit else 0)
        )
        return span


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
        span._current = _DEFAULT_CURRENT
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


PARENT_HEADER = "x-meshserve-parent"


class ParentPropagator(TextMapPropagator):
    """The configured propagators (`inner`: W3C trace context and baggage by default), and the current span's id in
    `x-meshserve-parent` beside them: a hop that replaces the traceparent's parent with a span it does not record (an
    unsampled Envoy) leaves the callee this way to its caller's span."""

    def __init__(self, inner: TextMapPropagator) -> None:
        self.inner = inner

    def extract(
        self, carrier: CarrierT, context: otel_context.Context | None = None, getter: Getter[CarrierT] = default_getter
    ) -> otel_context.Context:
        return self.inner.extract(carrier, context, getter)

    def inject(
        self, carrier: CarrierT, context: otel_context.Context | None = None, setter: Setter[CarrierT] = default_setter
    ) -> None:
        self.inner.inject(carrier, context, setter)
        span = current_span() if context is None else trace.get_current_span(context)
        if type(span) is RecordedSpan:
            setter.set(carrier, PARENT_HEADER, f"{span.span_id:016x}")

    @property
    def fields(self) -> set[str]:
        return {*self.inner.fields, PARENT_HEADER}


def parse_traceparent(value: str | None) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a well-formed W3C traceparent (version 00), else None."""
    if value is None or len(value) != 55 or value[:3] != "00-" or value[35] != "-" or value[52] != "-":
        return None
    try:
        trace_id, span_id, flags = int(value[3:35], 16), int(value[36:52], 16), int(value[53:55], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace_id, span_id, flags


def recorder() -> Recorder | None:
    """The process's Recorder when it is the global tracer provider."""
    provider = trace.get_tracer_provider()
    return provider if isinstance(provider, Recorder) else None
