"""Envoy's access log records for retroactive tracing: parsed from OTLP log records as Envoy's OpenTelemetry access
logger sends them (services/mesh/access_log.py), kept by trace in a bounded buffer, and rebuilt into Envoy's hop
spans."""

from __future__ import annotations

from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.recording import ACCESS_LOG
from services.mesh.access_log import ATTRIBUTES
from services.traces.access_spans import AccessLogBuffer, parse_record, record_spans

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
GATEWAY_HOP = 0x00F067AA0BA902B7
SENT = 0x2222222222222222  # the parent id in the traceparent Envoy sent upstream: its upstream span
START = 1_796_000_000_123_456_789


def envoy_record(**fields: str) -> logs_pb2.LogRecord:
    """A log record as Envoy's access logger fills ATTRIBUTES ("-" for what a request lacks)."""
    values = {
        "listener": "feature",
        "trace_id": f"{TRACE:032x}",
        "traceparent": f"00-{TRACE:032x}-{SENT:016x}-00",
        "via": f"{GATEWAY_HOP:016x}",
        "start": f"{START // 10**9}.{START % 10**9:09d}",
        "duration_us": "900",
        "upstream_start_us": "100",
        "upstream_end_us": "800",
        "path": "/meshserve.feature.FeatureService/Compute",
        "response_code": "200",
        "grpc_status": "0",
        "response_flags": "-",
        "upstream_cluster": "outbound|grpc|v1|feature",
        "upstream_host": "127.0.0.1:8002",
        **fields,
    }
    assert set(values) == set(ATTRIBUTES)  # what the mesh configures Envoy to send
    return logs_pb2.LogRecord(
        time_unix_nano=START,
        attributes=[common_pb2.KeyValue(key=k, value=common_pb2.AnyValue(string_value=v)) for k, v in values.items()],
    )


def attrs(span: trace_pb2.Span) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in span.attributes}


def test_a_record_becomes_the_listeners_span_and_its_upstream_span_with_the_id_the_callee_saw() -> None:
    record = parse_record(envoy_record())
    assert record is not None
    assert (record.trace_id, record.sent_parent, record.via) == (TRACE, SENT, GATEWAY_HOP)
    assert (record.start_ns, record.duration_ns, record.upstream_start_ns) == (START, 900_000, 100_000)
    (resource,) = record_spans([record])
    assert attrs_of_resource(resource) == {"service.name": "feature-sidecar"}
    server, upstream = resource.scope_spans[0].spans
    assert (server.kind, server.name, server.parent_span_id) == (2, "ingress", GATEWAY_HOP.to_bytes(8, "big"))
    assert (upstream.kind, upstream.span_id, upstream.parent_span_id) == (3, SENT.to_bytes(8, "big"), server.span_id)
    assert server.start_time_unix_nano == START and server.end_time_unix_nano == START + 900_000
    assert (upstream.start_time_unix_nano, upstream.end_time_unix_nano) == (START + 100_000, START + 800_000)
    assert attrs(server)[ACCESS_LOG] == "feature" and server.status.code == 0


def attrs_of_resource(resource: trace_pb2.ResourceSpans) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in resource.resource.attributes}


def test_an_ingress_record_heads_the_trace_and_a_refused_request_has_no_upstream_span() -> None:
    ingress = parse_record(envoy_record(listener="ingress", via="-"))
    refused = parse_record(
        envoy_record(upstream_start_us="-", upstream_end_us="-", response_code="200", grpc_status="16", via="-")
    )
    assert ingress is not None and refused is not None
    (head,) = record_spans([ingress])
    assert attrs_of_resource(head) == {"service.name": "meshserve-ingress"}
    assert head.scope_spans[0].spans[0].parent_span_id == b""  # nobody saw the client's span: the trace's root
    (alone,) = record_spans([refused])
    (server,) = alone.scope_spans[0].spans  # no upstream call: the logged traceparent is the caller's own
    assert server.parent_span_id == SENT.to_bytes(8, "big") and server.status.code == trace_pb2.Status.STATUS_CODE_ERROR


def test_records_without_a_trace_or_listener_are_not_access_records() -> None:
    assert parse_record(envoy_record(trace_id="-", traceparent="-")) is None
    assert parse_record(logs_pb2.LogRecord(body=common_pb2.AnyValue(string_value="hello"))) is None


def test_the_buffer_evicts_whole_traces_and_remembers_which() -> None:
    buffer = AccessLogBuffer(capacity=3)
    records = [parse_record(envoy_record(trace_id=f"{t:032x}", traceparent="-")) for t in (1, 1, 2, 3)]
    buffer.add(r for r in records if r is not None)
    assert len(buffer) == 2  # trace 1 (two records) went whole
    taken, lost = buffer.take([1, 2, 4])
    assert [r.trace_id for r in taken] == [2] and lost == [1]
    assert buffer.take([2]) == ([], []) and len(buffer) == 1
