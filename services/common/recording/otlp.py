"""Recorded spans as standard OTLP protobuf, and their export over OTLP/gRPC to the configured endpoint (the standard
OTEL_EXPORTER_OTLP_* variables), off the serving path."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.recording.spans import RecordedSpan

log = logging.getLogger(__name__)
_HAS_IS_REMOTE = 0x100  # OTLP span flags: bit 8 says bit 9 (the parent is remote) is known
IS_REMOTE = 0x200
EXPORT_TIMEOUT_S = 10.0
VIA = "meshserve.via"  # only between a process and its collector


def any_value(value: Any) -> common_pb2.AnyValue:
    """An attribute value as OTLP's AnyValue (bool before int: a bool is an int in Python)."""
    if isinstance(value, bool):
        return common_pb2.AnyValue(bool_value=value)
    if isinstance(value, int):
        return common_pb2.AnyValue(int_value=value)
    if isinstance(value, float):
        return common_pb2.AnyValue(double_value=value)
    if isinstance(value, str):
        return common_pb2.AnyValue(string_value=value)
    if isinstance(value, bytes):
        return common_pb2.AnyValue(bytes_value=value)
    if isinstance(value, (list, tuple)):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[any_value(v) for v in value]))
    return common_pb2.AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, Any] | None) -> list[common_pb2.KeyValue]:
    if not attributes:
        return []
    return [common_pb2.KeyValue(key=k, value=any_value(v)) for k, v in attributes.items() if v is not None]


def span_pb(span: RecordedSpan, via: bool = False) -> trace_pb2.Span:
    """One recorded span as an OTLP Span; with `via`, the caller's span behind an unrecorded hop as the attribute
    VIA (for the collector, which removes it)."""
    out = trace_pb2.Span(
        trace_id=span.trace_id.to_bytes(16, "big"),
        span_id=span.span_id.to_bytes(8, "big"),
        parent_span_id=span.parent_id.to_bytes(8, "big") if span.parent_id else b"",
        name=span.name,
        kind=trace_pb2.Span.SpanKind.ValueType(span.kind.value + 1),  # OTLP counts SPAN_KIND_UNSPECIFIED as 0
        start_time_unix_nano=span.start_ns,
        end_time_unix_nano=span.end_ns,
        attributes=key_values(span.attributes),
        flags=(span.flags & 0xFF) | _HAS_IS_REMOTE | (IS_REMOTE if span.remote_parent and span.parent_id else 0),
    )
    if via and span.via:
        out.attributes.append(common_pb2.KeyValue(key=VIA, value=common_pb2.AnyValue(string_value=f"{span.via:016x}")))
    if span.trace_state is not None and len(span.trace_state):
        out.trace_state = span.trace_state.to_header()
    if span.status_code.value:
        out.status.code = trace_pb2.Status.StatusCode.ValueType(span.status_code.value)
        if span.status_message:
            out.status.message = span.status_message
    for name, at, attributes in span.events or ():
        out.events.append(trace_pb2.Span.Event(time_unix_nano=at, name=name, attributes=key_values(attributes)))
    for link in span.links or ():
        context = link.context
        out.links.append(
            trace_pb2.Span.Link(
                trace_id=context.trace_id.to_bytes(16, "big"),
                span_id=context.span_id.to_bytes(8, "big"),
                attributes=key_values(link.attributes),
                flags=int(context.trace_flags) | _HAS_IS_REMOTE | (IS_REMOTE if context.is_remote else 0),
            )
        )
    return out


def resource_spans(
    spans: Iterable[RecordedSpan], resource: Mapping[str, Any], via: bool = False
) -> trace_pb2.ResourceSpans:
    """One process's spans as OTLP ResourceSpans: its resource, one ScopeSpans per instrumentation scope."""
    by_scope: dict[str, list[trace_pb2.Span]] = {}
    for span in spans:
        by_scope.setdefault(span.scope, []).append(span_pb(span, via))
    return trace_pb2.ResourceSpans(
        resource=resource_pb2.Resource(attributes=key_values(resource)),
        scope_spans=[
            trace_pb2.ScopeSpans(scope=common_pb2.InstrumentationScope(name=scope), spans=items)
            for scope, items in by_scope.items()
        ],
    )


def _env(name: str, default: str = "") -> str:
    """OTEL_EXPORTER_OTLP_TRACES_<name>, else OTEL_EXPORTER_OTLP_<name>."""
    return os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}") or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}", default)


def _headers(text: str) -> list[tuple[str, str]]:
    """OTEL_EXPORTER_OTLP_HEADERS: `key=value,key2=value2`, URL-encoded."""
    out = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            out.append((unquote(key.strip()).lower(), unquote(value.strip())))
    return out


class OtlpExporter:
    """OTLP/gRPC TraceService Export to the endpoint the OTEL_EXPORTER_OTLP_* variables name, as the SDK's exporter
    reads them (endpoint, insecure, certificate, headers, compression, timeout). Build it inside the event loop."""

    def __init__(self) -> None:
        endpoint = _env("ENDPOINT", "http://localhost:4317")
        parsed = urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
        target = parsed.netloc or parsed.path
        insecure_env = _env("INSECURE").strip().lower()
        insecure = parsed.scheme == "http" or (parsed.scheme != "https" and insecure_env == "true")
        self.target = target
        self.metadata = tuple(_headers(_env("HEADERS")))
        self.timeout_s = EXPORT_TIMEOUT_S
        compression = _env("COMPRESSION").strip().lower()
        self.compression = grpc.Compression.Gzip if compression == "gzip" else None
        if insecure:
            self.channel = grpc.aio.insecure_channel(target, compression=self.compression)
        else:
            certificate = _env("CERTIFICATE")
            root = Path(certificate).read_bytes() if certificate else None
            credentials = grpc.ssl_channel_credentials(root_certificates=root)
            self.channel = grpc.aio.secure_channel(target, credentials, compression=self.compression)
        self.stub = trace_service_pb2_grpc.TraceServiceStub(self.channel)
        self.exported_spans = 0
        self.failures = 0
        self._last_warning = 0.0

    async def export(self, items: Sequence[trace_pb2.ResourceSpans]) -> bool:
        """One Export call; False (logged at most every 10 s, counted) when it failed. Never raises."""
        spans = sum(len(s.spans) for r in items for s in r.scope_spans)
        if not spans:
            return True
        request = trace_service_pb2.ExportTraceServiceRequest(resource_spans=items)
        try:
            response = await self.stub.Export(request, timeout=self.timeout_s, metadata=self.metadata)
        except grpc.RpcError as exc:
            self.failures += 1
            self._warn("OTLP export of %d spans to %s failed: %s", spans, self.target, exc)
            return False
        rejected = response.partial_success.rejected_spans if response.HasField("partial_success") else 0
        self.exported_spans += spans - rejected
        if rejected:
            self.failures += 1
            self._warn("OTLP endpoint %s rejected %d of %d spans", self.target, rejected, spans)
        return not rejected

    def _warn(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_warning >= 10.0:
            self._last_warning = now
            log.warning(message, *args)

    async def close(self) -> None:
        await self.channel.close()
