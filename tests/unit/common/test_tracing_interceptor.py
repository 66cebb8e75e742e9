"""Server tracing over a real grpc.aio socket: the caller's W3C context is the parent, errors carry their gRPC
code, health is not traced, and the latency histogram links to the trace by an exemplar."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY
from prometheus_client.openmetrics.exposition import generate_latest

from services.common.errors import InvalidArgument
from services.common.interceptors import ErrorAndMetricsInterceptor

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


async def ok(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def bad(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise InvalidArgument("input 'x' is missing")


@pytest.fixture
async def served() -> AsyncIterator[tuple[grpc.aio.Channel, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = grpc.aio.server(interceptors=[ErrorAndMetricsInterceptor("tracetest", provider)])
    handlers = {
        "Ok": grpc.unary_unary_rpc_method_handler(ok),
        "Bad": grpc.unary_unary_rpc_method_handler(bad),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", handlers)])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel, exporter
    await server.stop(None)


async def test_server_span_is_the_child_of_the_callers_context(served) -> None:
    channel, exporter = served
    call = channel.unary_unary("/test.Echo/Ok")
    assert await call(b"hi", metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT}-01"),)) == b"hi"
    (span,) = exporter.get_finished_spans()
    assert span.name == "test.Echo/Ok" and format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT
    exposition = generate_latest(REGISTRY).decode()
    linked = [line for line in exposition.splitlines() if "meshserve_grpc_server_handling_seconds_bucket" in line
              and 'service="tracetest"' in line and f'trace_id="{TRACE_ID}"' in line]  # fmt: skip
    assert linked, "no exemplar links the latency histogram to the trace"


async def test_an_error_span_carries_the_grpc_code(served) -> None:
    channel, exporter = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await channel.unary_unary("/test.Echo/Bad")(b"", metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT}-01"),))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "INVALID_ARGUMENT" in (span.status.description or "")


async def test_health_checks_are_not_traced_and_unsampled_calls_export_nothing(served) -> None:
    channel, exporter = served
    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    await channel.unary_unary("/test.Echo/Ok")(b"x", metadata=(("traceparent", f"00-{TRACE_ID}-{PARENT}-00"),))
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("header", "unsampled"),
    [
        (f"00-{TRACE_ID}-{PARENT}-00", True),
        (f"00-{TRACE_ID}-{PARENT}-02", True),
        (f"00-{TRACE_ID}-{PARENT}-01", False),
        (f"00-{TRACE_ID}-{PARENT}-zz", False),
        ("garbage", False),
        (None, False),
    ],
)
def test_only_a_well_formed_unsampled_traceparent_skips_the_span(header: str | None, unsampled: bool) -> None:
    from services.common.interceptors import _unsampled

    assert _unsampled(header) is unsampled
