"""The recorded span: the OpenTelemetry API's Span as a light object that goes to its Recorder when it ends, the
attribute names recording puts on spans, and the current span read and set without the API's layers of calls."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.trace import propagation as trace_propagation
from opentelemetry.util.types import Attributes

if TYPE_CHECKING:
    from services.common.recording.provider import Recorder

log = logging.getLogger(__name__)

TRIGGER = "meshserve.trigger"
PARTIAL = "meshserve.partial"
PARTIAL_PROCESSES = "meshserve.partial.processes"
UNRECORDED_PARENT = "meshserve.unrecorded_parent"
PIPELINE = "meshserve.pipeline"
DEGRADED = "meshserve.degraded"
LINKED = "linked"  # the trigger of a trace collected because a kept trace waited on its batched call
# On a span rebuilt from a proxy's access log record (services/traces/access_spans.py): the record's listener.
ACCESS_LOG = "meshserve.access_log"
SAMPLED = 1  # the W3C trace flag
_NO_STATE = TraceState()
_FLAGS = (TraceFlags(0), TraceFlags(1))
# RecordedSpan._current: made current by its `with` block, and start_as_current_span's options
CURRENT, RECORD_EXCEPTION, SET_STATUS, END_ON_EXIT = 1, 2, 4, 8
DEFAULT_CURRENT = CURRENT | RECORD_EXCEPTION | SET_STATUS | END_ON_EXIT
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
            if options & RECORD_EXCEPTION:
                self.record_exception(error, escaped=True)
            if options & SET_STATUS:
                self.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        leave(self._token)
        if options & END_ON_EXIT:
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
