"""What the recording tests build spans with: a Recorder, a caller's context (as the propagator extracts it), and
an OTLP span's attributes read back."""

from __future__ import annotations

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.trace import TraceFlags

from services.common.recording import Recorder

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT = CALLER = 0x00F067AA0BA902B7
ENVOY = 0x1111111111111111


def make_recorder(capacity: int = 100, **kwargs: float) -> Recorder:
    return Recorder("gateway", {"service.name": "gateway"}, capacity, 1000, **kwargs)  # type: ignore[arg-type]


def remote(flags: int = 0) -> otel_context.Context:
    """A caller's context, as the propagator extracts it."""
    parent = trace.SpanContext(TRACE, PARENT, is_remote=True, trace_flags=TraceFlags(flags))
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


def recorder(service: str, capacity: int = 100) -> Recorder:
    return Recorder(service, {"service.name": service}, capacity, 1000)


def caller(flags: int = 0) -> object:
    return trace.set_span_in_context(
        trace.NonRecordingSpan(trace.SpanContext(TRACE, CALLER, is_remote=True, trace_flags=TraceFlags(flags)))
    )


def attrs(span: trace_pb2.Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [v.string_value for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind)
    return out
