"""Recorded spans as OTLP protobuf."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from services.common.recording.otlp import VIA, resource_spans, span_pb
from tests.unit.common.recording.recorders import CALLER, ENVOY, TRACE, attrs, caller, recorder


def test_a_recorded_span_as_otlp() -> None:
    rec = recorder("gateway")
    span = rec.get_tracer("meshserve.grpc").start_span(
        "rpc",
        context=caller(),  # type: ignore[arg-type]
        kind=SpanKind.SERVER,
        attributes={"s": "x", "i": 3, "f": 0.5, "b": True, "l": ["a", "b"]},
        links=[Link(trace.SpanContext(TRACE, ENVOY, is_remote=False), {"batch.index": 0})],
    )
    span.set_status(Status(StatusCode.ERROR, "NOT_FOUND: no"))
    span.add_event("retry", {"n": 1}, timestamp=span.start_ns + 1)
    span.via = ENVOY
    span.end()
    out = span_pb(span, via=True)
    assert out.trace_id == TRACE.to_bytes(16, "big") and out.parent_span_id == CALLER.to_bytes(8, "big")
    assert out.kind == trace_pb2.Span.SPAN_KIND_SERVER and out.name == "rpc"
    assert out.flags == 0x300  # unsampled, the parent is remote (and that is known)
    assert attrs(out) == {"s": "x", "i": 3, "f": 0.5, "b": True, "l": ["a", "b"], VIA: f"{ENVOY:016x}"}
    assert (out.status.code, out.status.message) == (trace_pb2.Status.STATUS_CODE_ERROR, "NOT_FOUND: no")
    assert [(e.name, e.time_unix_nano - out.start_time_unix_nano) for e in out.events] == [("retry", 1)]
    assert out.links[0].span_id == ENVOY.to_bytes(8, "big")
    assert VIA not in attrs(span_pb(span))
    grouped = resource_spans([span, span], {"service.name": "gateway"})
    assert [s.scope.name for s in grouped.scope_spans] == ["meshserve.grpc"]
    assert len(grouped.scope_spans[0].spans) == 2
