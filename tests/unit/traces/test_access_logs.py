"""Envoy's access log records for retroactive tracing: parsed from OTLP log records as Envoy's OpenTelemetry access
logger sends them (services/mesh/access_log.py), kept by trace in a bounded buffer, and rebuilt into Envoy's hop
spans; then end to end in one process: records exported over a real OTLP/gRPC LogsService socket to the trace
store's servicer, a collector taking them over the store's admin endpoint (real HTTP) beside a service's part, and
the exported trace one tree with Envoy's hop between the gateway and the callee."""

from __future__ import annotations

import asyncio
import json

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.trace import SpanKind

from services.common.recording import Recorder
from services.common.recording_access import ACCESS_LOG, AccessLogBuffer, parse_record, record_spans
from services.common.recording_admin import AdminServer
from services.common.recording_collect import Collector
from services.common.recording_settings import RecordingSettings
from services.mesh.access_log import ATTRIBUTES
from services.traces.access_logs import AccessLogAdmin, AccessLogServicer
from tests.helpers.recording import Exported, http_status

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


async def test_a_kept_trace_is_collected_with_envoys_hop_from_the_trace_stores_access_log() -> None:
    buffer = AccessLogBuffer(capacity=100)
    server = grpc.aio.server()
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(AccessLogServicer(buffer), server)
    otlp_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    store_admin = AccessLogAdmin(buffer, "127.0.0.1", 0)
    gateway = Recorder("gateway", {"service.name": "gateway"}, 100, 1000)
    feature = Recorder("feature", {"service.name": "feature"}, 100, 1000)
    feature_admin = AdminServer(feature, "feature-id", "127.0.0.1", 0)
    peers = [f"127.0.0.1:{store_admin.start()}", f"127.0.0.1:{feature_admin.start()}"]
    settings = RecordingSettings(peers=peers, collect_delay_ms=0, collect_interval_ms=0)
    exporter = Exported()
    collector = Collector(gateway, settings, exporter, "gateway-id")  # type: ignore[arg-type]
    gateway.edge = lambda root: ["latency"]
    try:
        with gateway.get_tracer("g").start_as_current_span("rpc", kind=SpanKind.SERVER) as root:
            with gateway.get_tracer("g").start_as_current_span("features.batch", kind=SpanKind.CLIENT) as hop:
                # Envoy's egress hop (not sampled: nothing recorded) logs the request; the feature service hangs its
                # span on the id Envoy sent it, and names the gateway's hop in x-meshserve-parent.
                record = envoy_record(
                    trace_id=f"{root.trace_id:032x}",
                    traceparent=f"00-{root.trace_id:032x}-{SENT:016x}-00",
                    via=f"{hop.span_id:016x}",
                    start=f"{hop.start_ns // 10**9}.{hop.start_ns % 10**9:09d}",
                )
                async with grpc.aio.insecure_channel(f"127.0.0.1:{otlp_port}") as channel:
                    await logs_service_pb2_grpc.LogsServiceStub(channel).Export(
                        logs_service_pb2.ExportLogsServiceRequest(
                            resource_logs=[logs_pb2.ResourceLogs(scope_logs=[logs_pb2.ScopeLogs(log_records=[record])])]
                        )
                    )
                served = feature.get_tracer("f").start_span("Compute", kind=SpanKind.SERVER)
                served.parent_id, served.via = SENT, hop.span_id
                served.end()
        for _ in range(100):
            await asyncio.sleep(0.02)
            if exporter.requests:
                break
        (request,) = exporter.requests
        spans = {
            (attrs_of_resource(r)["service.name"], s.name): s for r in request for sc in r.scope_spans for s in sc.spans
        }
        listener = spans[("feature-sidecar", "ingress")]
        upstream = spans[("feature-sidecar", "router outbound|grpc|v1|feature egress")]
        compute = spans[("feature", "Compute")]
        assert listener.parent_span_id == hop.span_id.to_bytes(8, "big")
        assert upstream.parent_span_id == listener.span_id and compute.parent_span_id == upstream.span_id
        assert "meshserve.unrecorded_parent" not in attrs(compute)  # Envoy's hop is there: nothing was skipped
        assert collector.collected == {"complete": 1, "partial": 0} and len(buffer) == 0
        body = json.dumps({"trace_ids": ["nothex"]}).encode()
        assert await asyncio.to_thread(http_status, f"http://{peers[0]}/recording/collect", body) == 400
    finally:
        await collector.close()
        await asyncio.to_thread(store_admin.stop)
        await asyncio.to_thread(feature_admin.stop)
        await server.stop(0)
