"""Envoy's access log records for retroactive tracing: the OTLP/gRPC LogsService servicer that keeps them in an
AccessLogBuffer, and the admin endpoint (`POST /recording/collect`, as every recording process has) from which a
kept trace's collector takes Envoy's hops, rebuilt as spans (access_spans.py)."""

from __future__ import annotations

import base64
from typing import Any

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc

from services.common.recording import MAX_IDS, JsonAdmin, trace_id_of
from services.traces.access_spans import AccessLogBuffer, parse_record, record_spans

SERVICE_NAME = logs_service_pb2.DESCRIPTOR.services_by_name["LogsService"].full_name


class AccessLogServicer(logs_service_pb2_grpc.LogsServiceServicer):
    """Accepts OTLP logs; the access records among them (by their attributes) go to the buffer, the rest is
    dropped and counted."""

    def __init__(self, buffer: AccessLogBuffer) -> None:
        self.buffer = buffer
        self.ignored = 0

    async def Export(
        self, request: logs_service_pb2.ExportLogsServiceRequest, context: grpc.aio.ServicerContext
    ) -> logs_service_pb2.ExportLogsServiceResponse:
        records = []
        for resource in request.resource_logs:
            for scope in resource.scope_logs:
                for log_record in scope.log_records:
                    record = parse_record(log_record)
                    if record is None:
                        self.ignored += 1
                    else:
                        records.append(record)
        self.buffer.add(records)
        return logs_service_pb2.ExportLogsServiceResponse()


class AccessLogAdmin(JsonAdmin):
    """Answers collectors with Envoy's spans of the traces they ask for, one ResourceSpans per listener."""

    def __init__(self, buffer: AccessLogBuffer, host: str, port: int) -> None:
        self.buffer = buffer
        super().__init__(host, port)

    def routes(self) -> dict[str, Any]:
        return {"/recording/collect": self.collect, "/recording/trigger": lambda body: {"seen": False}}

    def collect(self, body: dict[str, Any]) -> dict[str, Any]:
        ids = [trace_id_of(t) for t in body.get("trace_ids", [])[:MAX_IDS]]
        records, lost = self.buffer.take(ids)
        resources = record_spans(records)
        return {
            "service": "envoy",
            "spans": sum(len(r.scope_spans[0].spans) for r in resources),
            "lost": [f"{t:032x}" for t in lost],
            "otlp": [base64.b64encode(r.SerializeToString()).decode() for r in resources],
        }
