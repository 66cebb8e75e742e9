"""The OTLP/gRPC TraceService servicer: Export hands requests to the SpanWriter and answers at once."""

from __future__ import annotations

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.traces.writer import SpanWriter

SERVICE_NAME = trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name


class TracesServicer(trace_service_pb2_grpc.TraceServiceServicer):
    """Accepts spans; when the write queue is full the request's spans are reported in partial_success."""

    def __init__(self, writer: SpanWriter) -> None:
        self.writer = writer

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        rejected = self.writer.submit(request)
        if not rejected:
            return trace_service_pb2.ExportTraceServiceResponse()
        return trace_service_pb2.ExportTraceServiceResponse(
            partial_success=trace_service_pb2.ExportTracePartialSuccess(
                rejected_spans=rejected, error_message="trace store write queue full"
            )
        )
