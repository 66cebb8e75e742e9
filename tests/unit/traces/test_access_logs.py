"""Envoy's access log records end to end in one process: records exported over a real OTLP/gRPC LogsService socket
to the trace store's servicer, a collector taking them over the store's admin endpoint (real HTTP) beside a
service's part, and the exported trace one tree with Envoy's hop between the gateway and the callee."""

from __future__ import annotations

import asyncio
import json

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.logs.v1 import logs_pb2
from opentelemetry.trace import SpanKind

from services.common.recording import Recorder
from services.common.recording.admin import AdminServer
from services.common.recording.collect import Collector
from services.common.recording.settings import RecordingSettings
from services.traces.access_logs import AccessLogAdmin, AccessLogServicer
from services.traces.access_spans import AccessLogBuffer
from tests.helpers.recording import Exported, http_status
from tests.unit.traces.test_access_spans import SENT, attrs, attrs_of_resource, envoy_record


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
