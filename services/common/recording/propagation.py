"""What crosses a process boundary beside the W3C trace context: the caller's span id in `x-meshserve-parent`, for
a callee behind a hop that replaces the traceparent's parent without recording, and the traceparent parsed."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagators.textmap import (
    CarrierT,
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)

from services.common.recording.spans import RecordedSpan, current_span

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
