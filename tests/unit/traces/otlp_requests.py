"""OTLP ExportTraceServiceRequests for the trace store's tests, built from small integers."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


def kv(key: str, value: Any) -> common_pb2.KeyValue:
    """An OTLP attribute; bool, int, float and str become their own AnyValue kinds."""
    if isinstance(value, bool):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(bool_value=value))
    if isinstance(value, int):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(int_value=value))
    if isinstance(value, float):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(double_value=value))
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def request(service: str, spans: list[trace_pb2.Span]) -> trace_service_pb2.ExportTraceServiceRequest:
    """One resource (service.name = `service`) carrying `spans`."""
    return trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(attributes=[kv("service.name", service)]),
                scope_spans=[trace_pb2.ScopeSpans(spans=spans)],
            )
        ]
    )


def pb_link(trace: int, span: int, **attrs: Any) -> trace_pb2.Span.Link:
    """A link to span `span` of trace `trace`."""
    return trace_pb2.Span.Link(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span.to_bytes(8, "big"),
        attributes=[kv(k, v) for k, v in attrs.items()],
    )


def pb_span(trace: int, span: int, parent: int = 0, name: str = "s", **attrs: Any) -> trace_pb2.Span:
    """A SERVER span with status ERROR at [1000 * span, 1000 * span + 500] ns."""
    return trace_pb2.Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        kind=trace_pb2.Span.SPAN_KIND_SERVER,
        start_time_unix_nano=1000 * span,
        end_time_unix_nano=1000 * span + 500,
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR),
        attributes=[kv(k, v) for k, v in attrs.items()],
    )
