"""The OTLP/gRPC TraceService servicer over a real grpc.aio socket: Export queues the spans and answers at once,
reporting the spans of a request that does not fit the write queue in partial_success."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from services.traces.servicer import SERVICE_NAME, TracesServicer
from services.traces.store import TraceStore
from services.traces.writer import SpanWriter
from tests.unit.traces.otlp_requests import pb_span, request


@pytest.fixture()
async def served(tmp_path: Path) -> AsyncIterator[tuple[trace_service_pb2_grpc.TraceServiceStub, SpanWriter]]:
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0, queue_max_spans=2)
    writer.start()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TracesServicer(writer), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield trace_service_pb2_grpc.TraceServiceStub(channel), writer
    await server.stop(None)
    writer.close()


async def test_export_servicer(served: tuple[trace_service_pb2_grpc.TraceServiceStub, SpanWriter]) -> None:
    stub, writer = served
    assert SERVICE_NAME == "opentelemetry.proto.collector.trace.v1.TraceService"
    ok = await stub.Export(request("feature", [pb_span(1, 1)]), timeout=5)
    assert not ok.HasField("partial_success")
    big = await stub.Export(request("feature", [pb_span(2, i + 1) for i in range(3)]), timeout=5)
    assert big.partial_success.rejected_spans == 3
    assert big.partial_success.error_message == "trace store write queue full"
    writer.flush()
    with TraceStore(writer.path) as store:
        assert store.span_total() == 1
