"""Envoy's part of a kept trace that Envoy did not sample, rebuilt from its access log: every request's record
(services/mesh/access_log.py) kept in a bounded buffer by trace id, and turned into Envoy's two spans per hop when a
collector asks for the trace.

Envoy records spans only for the requests it samples, but it logs every request. A record gives the listener, the
caller's span (the gateway's `x-meshserve-parent`; none at the ingress), the `traceparent` Envoy sent upstream
(whose parent is its upstream span: the callee hangs on it), when the request started, when the upstream call began
and ended, and how it ended. From it come the listener's SERVER span (a new span id: nobody saw Envoy's) and its
upstream CLIENT span with the id the callee saw, so that a kept trace reads as a sampled one does.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.recording import ACCESS_LOG, parse_traceparent

INGRESS = "ingress"
SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
_ERROR = trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR)


@dataclass(frozen=True)
class AccessRecord:
    """One request through one Envoy listener, from its access log record."""

    listener: str
    trace_id: int
    sent_parent: int  # the parent span id of the traceparent in the logged (upstream) headers, 0 when none
    via: int  # the caller's span (x-meshserve-parent), 0 when absent (at the ingress)
    start_ns: int
    duration_ns: int
    upstream_start_ns: int | None  # since start; None when no upstream call was made
    upstream_end_ns: int | None
    path: str
    response_code: int
    grpc_status: int | None
    response_flags: str
    upstream_cluster: str
    upstream_host: str

    @property
    def service_name(self) -> str:
        """The service name Envoy's own tracer gives this listener's spans (services/mesh/bootstrap.py)."""
        return "meshserve-ingress" if self.listener == INGRESS else f"{self.listener}-sidecar"

    @property
    def failed(self) -> bool:
        return self.response_code >= 500 or self.response_code == 0 or (self.grpc_status or 0) != 0


def _text(value: common_pb2.AnyValue) -> str:
    text = value.string_value
    return "" if text == "-" else text


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def parse_record(record: logs_pb2.LogRecord) -> AccessRecord | None:
    """The access record of one log record; None when it is not one (other logs, a record without a trace)."""
    fields = {kv.key: _text(kv.value) for kv in record.attributes}
    listener = fields.get("listener", "")
    trace_id = _int_hex(fields.get("trace_id", ""))
    sent = parse_traceparent(fields.get("traceparent", ""))  # the request's headers when logged: as sent upstream
    if sent is not None:
        trace_id = trace_id or sent[0]
    if not listener or not trace_id:
        return None
    try:
        start_ns = int(Decimal(fields.get("start", "")) * 1_000_000_000)
    except (InvalidOperation, ValueError):
        start_ns = record.time_unix_nano
    duration = _int(fields.get("duration_us", ""))
    up_start = _int(fields.get("upstream_start_us", ""))
    up_end = _int(fields.get("upstream_end_us", ""))
    return AccessRecord(
        listener=listener,
        trace_id=trace_id,
        sent_parent=sent[1] if sent is not None and sent[0] == trace_id else 0,
        via=_int_hex(fields.get("via", "")),
        start_ns=start_ns,
        duration_ns=max(0, duration or 0) * 1000,
        upstream_start_ns=up_start * 1000 if up_start is not None else None,
        upstream_end_ns=up_end * 1000 if up_end is not None else None,
        path=fields.get("path", ""),
        response_code=_int(fields.get("response_code", "")) or 0,
        grpc_status=_int(fields.get("grpc_status", "")),
        response_flags=fields.get("response_flags", ""),
        upstream_cluster=fields.get("upstream_cluster", ""),
        upstream_host=fields.get("upstream_host", ""),
    )


def _int_hex(text: str) -> int:
    if not text or len(text) > 32:
        return 0
    try:
        return int(text, 16)
    except ValueError:
        return 0


class AccessLogBuffer:
    """The recent access records by trace id, at most `capacity` of them; the oldest traces go whole, and the ids
    of the last `remember` evicted traces are kept, so that a collection can tell a lost part from none. Used from
    the OTLP receiver and the admin threads: every method holds the lock."""

    def __init__(self, capacity: int, remember: int = 100_000) -> None:
        self.capacity = capacity
        self.size = 0
        self.added = 0
        self.evicted_records = 0
        self._traces: OrderedDict[int, list[AccessRecord]] = OrderedDict()
        self._evicted: OrderedDict[int, None] = OrderedDict()
        self._remember = remember
        self._lock = threading.Lock()

    def add(self, records: Iterable[AccessRecord]) -> None:
        with self._lock:
            for record in records:
                found = self._traces.get(record.trace_id)
                if found is None:
                    self._traces[record.trace_id] = [record]
                else:
                    found.append(record)
                self.size += 1
                self.added += 1
            while self.size > self.capacity and self._traces:
                trace_id, gone = self._traces.popitem(last=False)
                self.size -= len(gone)
                self.evicted_records += len(gone)
                self._evicted[trace_id] = None
                if len(self._evicted) > self._remember:
                    self._evicted.popitem(last=False)

    def take(self, trace_ids: Sequence[int]) -> tuple[list[AccessRecord], list[int]]:
        """The records of these traces, removed from the buffer, and which of them lost records to eviction."""
        out: list[AccessRecord] = []
        lost: list[int] = []
        with self._lock:
            for trace_id in trace_ids:
                records = self._traces.pop(trace_id, None)
                if records:
                    out.extend(records)
                    self.size -= len(records)
                if trace_id in self._evicted:
                    lost.append(trace_id)
        return out, lost

    def __len__(self) -> int:
        with self._lock:
            return self.size


def record_spans(records: Sequence[AccessRecord]) -> list[trace_pb2.ResourceSpans]:
    """Envoy's spans of these records, one ResourceSpans per listener: the listener's SERVER span, and under it
    the upstream CLIENT span when an upstream call was made (ACCESS_CALLER names the caller's span it serves)."""
    by_service: dict[str, trace_pb2.ResourceSpans] = {}
    for record in records:
        resource = by_service.get(record.service_name)
        if resource is None:
            resource = trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(
                    attributes=[
                        common_pb2.KeyValue(
                            key="service.name", value=common_pb2.AnyValue(string_value=record.service_name)
                        )
                    ]
                )
            )
            resource.scope_spans.add().scope.name = "envoy.access_log"
            by_service[record.service_name] = resource
        spans = resource.scope_spans[0].spans
        trace_id = record.trace_id.to_bytes(16, "big")
        upstream_made = record.upstream_start_ns is not None and record.sent_parent
        # Without an upstream call the logged traceparent is still the caller's own.
        caller = record.via or (record.sent_parent if not upstream_made else 0)
        server = spans.add(
            trace_id=trace_id,
            span_id=os.urandom(8),
            parent_span_id=caller.to_bytes(8, "big") if caller else b"",
            name=INGRESS,  # Envoy's operation name for a listener's span
            kind=SERVER,
            start_time_unix_nano=record.start_ns,
            end_time_unix_nano=record.start_ns + record.duration_ns,
            flags=0x300 if caller else 0x100,  # the parent is remote (and its remoteness known)
        )
        _attributes(server, record)
        if not upstream_made or record.upstream_start_ns is None:
            continue
        end = record.upstream_end_ns if record.upstream_end_ns is not None else record.duration_ns
        upstream = spans.add(
            trace_id=trace_id,
            span_id=record.sent_parent.to_bytes(8, "big"),
            parent_span_id=server.span_id,
            name=f"router {record.upstream_cluster} egress",
            kind=CLIENT,
            start_time_unix_nano=record.start_ns + record.upstream_start_ns,
            end_time_unix_nano=record.start_ns + max(end, record.upstream_start_ns),
            flags=0x100,
        )
        _attributes(upstream, record)
        upstream.attributes.add(key="upstream_address", value=common_pb2.AnyValue(string_value=record.upstream_host))
    return list(by_service.values())


def _attributes(span: trace_pb2.Span, record: AccessRecord) -> None:
    add = span.attributes.add
    add(key=ACCESS_LOG, value=common_pb2.AnyValue(string_value=record.listener))
    add(key="http.url", value=common_pb2.AnyValue(string_value=record.path))
    add(key="http.status_code", value=common_pb2.AnyValue(string_value=str(record.response_code)))
    if record.grpc_status is not None:
        add(key="grpc.status_code", value=common_pb2.AnyValue(string_value=str(record.grpc_status)))
    add(key="response_flags", value=common_pb2.AnyValue(string_value=record.response_flags or "-"))
    add(key="upstream_cluster", value=common_pb2.AnyValue(string_value=record.upstream_cluster))
    add(key="component", value=common_pb2.AnyValue(string_value="proxy"))
    if record.failed:
        span.status.CopyFrom(_ERROR)
