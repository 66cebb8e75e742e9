"""Conversion of an OTLP ExportTraceServiceRequest into span records with their links and events (no trace id:
dropped)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.traces.records import SpanEvent, SpanLink, SpanRecord

# OTLP times are fixed64 nanoseconds, the store's columns SQLite's signed 64-bit integers: a time past this one
# (the year 2262) is kept as this one, so that one span from a broken or hostile exporter cannot fail the insert
# of every span written with it.
MAX_TIME_NS = 2**63 - 1


def time_ns(value: int) -> int:
    """An OTLP time as the store keeps it (at most MAX_TIME_NS)."""
    return min(int(value), MAX_TIME_NS)


def any_value(value: common_pb2.AnyValue) -> Any:
    """The Python value of an OTLP AnyValue (arrays and maps recursively, bytes as hex)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if which == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, which)


def links(span: trace_pb2.Span) -> tuple[SpanLink, ...]:
    """The span's links that point to a span (non-zero trace and span ids), ids as lowercase hex."""
    return tuple(
        SpanLink(
            trace_id=link.trace_id.hex(),
            span_id=link.span_id.hex(),
            attributes={kv.key: any_value(kv.value) for kv in link.attributes},
        )
        for link in span.links
        if link.trace_id.strip(b"\0") and link.span_id.strip(b"\0")
    )


def events(span: trace_pb2.Span) -> tuple[SpanEvent, ...]:
    """The span's events (an exception, a retry, a log line), in their order."""
    return tuple(
        SpanEvent(
            name=event.name,
            time_ns=time_ns(event.time_unix_nano),
            attributes={kv.key: any_value(kv.value) for kv in event.attributes},
        )
        for event in span.events
    )


def span_count(request: trace_service_pb2.ExportTraceServiceRequest) -> int:
    """How many spans the request carries (cheap: no conversion)."""
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def records_from_request(request: trace_service_pb2.ExportTraceServiceRequest) -> list[SpanRecord]:
    """Every span with a non-zero trace id, its service.name taken from the resource attributes, with its links."""
    records: list[SpanRecord] = []
    for resource_spans in request.resource_spans:
        service = ""
        for kv in resource_spans.resource.attributes:
            if kv.key == "service.name":
                service = str(any_value(kv.value) or "")
                break
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if not span.trace_id.strip(b"\0") or not span.span_id:
                    continue
                records.append(
                    SpanRecord(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() if span.parent_span_id.strip(b"\0") else "",
                        service=service,
                        name=span.name,
                        kind=int(span.kind),
                        start_ns=time_ns(span.start_time_unix_nano),
                        end_ns=time_ns(span.end_time_unix_nano),
                        status=int(span.status.code),
                        attributes={kv.key: any_value(kv.value) for kv in span.attributes},
                        links=links(span),
                        events=events(span),
                        status_message=span.status.message,
                    )
                )
    return records
