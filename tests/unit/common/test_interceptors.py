"""The server interceptor over a real grpc.aio socket, for unary and streaming RPCs: the caller's W3C context is
the parent, errors carry their gRPC code, every RPC is counted by code and timed, health and reflection are not
traced, and the latency histogram links to the trace by an exemplar."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import REGISTRY
from prometheus_client.openmetrics.exposition import generate_latest

from services.common.errors import MAX_MESSAGE_BYTES, InvalidArgument, Unavailable
from services.common.interceptors import ErrorAndMetricsInterceptor, _unsampled

SERVICE = "interceptortest"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
SAMPLED = (("traceparent", f"00-{TRACE_ID}-{PARENT}-01"),)
UNSAMPLED = (("traceparent", f"00-{TRACE_ID}-{PARENT}-00"),)


async def ok(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def bad(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise InvalidArgument("input 'x' is missing")


HUGE_NAME = "m" * 200_000


async def huge(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise InvalidArgument(f"unknown model '{HUGE_NAME}'")


async def leaky(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    raise RuntimeError("/srv/app/models/fraud_mlp/1/model.pt not found " + "x" * 5000)


async def check(request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext) -> bytes:
    return request.service.encode()


async def services(requests: AsyncIterator[health_pb2.HealthCheckRequest], context: grpc.aio.ServicerContext) -> bytes:
    return ",".join([r.service async for r in requests]).encode()


class Streams:
    """Streaming handlers: `Count` (async generator) yields `n` messages and then, as asked, ends, raises a domain
    error, raises something unexpected, waits until cancelled or sends more than the client reads; `Written`
    streams with context.write."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()  # set in Count's `finally`, however the stream ended
        self.closed_in_its_task = False  # whether that `finally` ran in the RPC's own task

    async def count(self, request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        n, _, then = request.decode().partition(":")
        task = asyncio.current_task()
        try:
            for i in range(int(n)):
                yield str(i).encode()
            if then == "unavailable":
                raise Unavailable("draining")
            if then == "boom":
                raise RuntimeError("unexpected")
            if then == "wait":  # the client's cancellation arrives while the handler awaits
                await asyncio.Event().wait()
            while then == "flood":  # ... or while it is suspended at a `yield` whose write waits for flow control
                yield b"x" * 65536
        finally:
            self.closed_in_its_task = asyncio.current_task() is task
            self.closed.set()

    async def written(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        for i in range(int(request)):
            await context.write(str(i).encode())

    async def total(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> bytes:
        return str(sum([int(r) async for r in requests])).encode()

    async def echo(self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for r in requests:
            if r == b"bad":
                raise InvalidArgument("bad element")
            yield r


Served = tuple[grpc.aio.Channel, InMemorySpanExporter, Streams]
PARSE = health_pb2.HealthCheckRequest.FromString
GARBAGE = [b"\xff" * 16, b"\x00", b"\x0a\x05ab"]  # a varint that never ends, field number 0, a cut-off string


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    server = grpc.aio.server(interceptors=[ErrorAndMetricsInterceptor(SERVICE, provider)])
    streams = Streams()
    handlers = {
        "Ok": grpc.unary_unary_rpc_method_handler(ok),
        "Bad": grpc.unary_unary_rpc_method_handler(bad),
        "Huge": grpc.unary_unary_rpc_method_handler(huge),
        "Leaky": grpc.unary_unary_rpc_method_handler(leaky),
        "Parse": grpc.unary_unary_rpc_method_handler(check, request_deserializer=PARSE),
        "ParseAll": grpc.stream_unary_rpc_method_handler(services, request_deserializer=PARSE),
        "Count": grpc.unary_stream_rpc_method_handler(streams.count),
        "Written": grpc.unary_stream_rpc_method_handler(streams.written),
        "Total": grpc.stream_unary_rpc_method_handler(streams.total),
        "Echo": grpc.stream_stream_rpc_method_handler(streams.echo),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", handlers)])
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    reflection.enable_server_reflection(["test.Echo", reflection.SERVICE_NAME], server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield channel, exporter, streams
    await server.stop(None)


def handled(method: str, code: str) -> float:
    labels = {"service": SERVICE, "method": method, "code": code}
    return REGISTRY.get_sample_value("meshserve_grpc_server_handled_total", labels) or 0.0


def stream_count(method: str) -> float:
    labels = {"service": SERVICE, "method": method}
    return REGISTRY.get_sample_value("meshserve_grpc_server_stream_seconds_count", labels) or 0.0


def stream_sum(method: str) -> float:
    labels = {"service": SERVICE, "method": method}
    return REGISTRY.get_sample_value("meshserve_grpc_server_stream_seconds_sum", labels) or 0.0


async def eventually(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    """Wait until `condition()` holds (server-side bookkeeping finishes after the client saw the end)."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.01)


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = exporter.get_finished_spans()
    return span


def assert_server_span_of(span: ReadableSpan, method: str) -> None:
    """The attributes every server span has, unary or streaming, and the caller's context as its parent."""
    assert span.name == f"test.Echo/{method}"
    assert span.kind.name == "SERVER"
    assert span.attributes is not None
    assert {k: span.attributes[k] for k in ("rpc.system", "rpc.service", "rpc.method")} == {
        "rpc.system": "grpc",
        "rpc.service": "test.Echo",
        "rpc.method": method,
    }
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT


# -- unary ------------------------------------------------------------------------------------------------------


async def test_server_span_is_the_child_of_the_callers_context(served: Served) -> None:
    channel, exporter, _ = served
    call = channel.unary_unary("/test.Echo/Ok")
    assert await call(b"hi", metadata=SAMPLED) == b"hi"
    span = only_span(exporter)
    assert_server_span_of(span, "Ok")
    assert span.attributes is not None and span.attributes["rpc.grpc.status_code"] == 0
    assert span.status.status_code == StatusCode.UNSET
    exposition = generate_latest(REGISTRY).decode()
    linked = [
        line
        for line in exposition.splitlines()
        if "meshserve_grpc_server_handling_seconds_bucket" in line
        and f'service="{SERVICE}"' in line
        and f'trace_id="{TRACE_ID}"' in line
    ]
    assert linked, "no exemplar links the latency histogram to the trace"


async def test_an_error_span_carries_the_grpc_code(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Bad", "INVALID_ARGUMENT")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await channel.unary_unary("/test.Echo/Bad")(b"", metadata=SAMPLED)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    span = only_span(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "INVALID_ARGUMENT" in (span.status.description or "")
    assert handled("Bad", "INVALID_ARGUMENT") == before + 1


async def test_health_checks_are_not_traced_and_unsampled_calls_export_nothing(served: Served) -> None:
    channel, exporter, _ = served
    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    await channel.unary_unary("/test.Echo/Ok")(b"x", metadata=UNSAMPLED)
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
    assert _unsampled(header) is unsampled


async def test_an_error_message_reaches_the_client_bounded_and_without_server_paths(served: Served) -> None:
    """A 200 kB message in grpc-message would exceed Envoy's header limit: Envoy would reset the stream and the
    client would see a retryable UNAVAILABLE (so the mesh retries and ejects a healthy replica)."""
    channel, _, _ = served
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await channel.unary_unary("/test.Echo/Huge")(b"")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = info.value.details() or ""
    assert details.startswith("unknown model 'mmm") and len(details.encode()) <= MAX_MESSAGE_BYTES
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await channel.unary_unary("/test.Echo/Leaky")(b"")
    assert info.value.code() == grpc.StatusCode.INTERNAL
    details = info.value.details() or ""
    assert details.startswith("internal error in Leaky: RuntimeError(") and "model.pt not found" in details
    assert "/srv" not in details and len(details.encode()) <= MAX_MESSAGE_BYTES


async def test_a_body_that_does_not_parse_is_invalid_argument_with_one_log_line(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    channel, _, _ = served
    assert await channel.unary_unary("/test.Echo/Parse")(b"\x0a\x02ok") == b"ok"
    before = handled("Parse", "INVALID_ARGUMENT")
    caplog.set_level(logging.INFO)
    for _ in range(10):
        for body in GARBAGE:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary("/test.Echo/Parse")(body)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == "the request body is not a valid grpc.health.v1.HealthCheckRequest"
    await eventually(lambda: handled("Parse", "INVALID_ARGUMENT") == before + 30)
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "/test.Echo/Parse" in lines[0].getMessage() and "\n" not in lines[0].getMessage()
    assert lines[0].exc_info is None


async def test_a_request_stream_element_that_does_not_parse_is_invalid_argument(served: Served) -> None:
    channel, _, _ = served
    call = channel.stream_unary("/test.Echo/ParseAll")
    assert await call(iter([b"\x0a\x01a", b"\x0a\x01b"])) == b"a,b"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call(iter([b"\x0a\x01a", b"\xff" * 16]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "HealthCheckRequest" in (info.value.details() or "")


# -- response streams -------------------------------------------------------------------------------------------


async def test_a_stream_that_ends_ok(served: Served) -> None:
    channel, exporter, streams = served
    before = handled("Count", "OK"), stream_count("Count")
    call = channel.unary_stream("/test.Echo/Count")(b"3", metadata=SAMPLED)
    assert [m async for m in call] == [b"0", b"1", b"2"]
    assert await call.code() == grpc.StatusCode.OK
    await eventually(lambda: stream_count("Count") == before[1] + 1)
    assert handled("Count", "OK") == before[0] + 1
    assert streams.closed.is_set()
    span = only_span(exporter)
    assert_server_span_of(span, "Count")
    assert span.attributes is not None and span.attributes["rpc.grpc.status_code"] == 0
    assert span.status.status_code == StatusCode.UNSET


async def test_a_stream_that_raises_a_domain_error_midway(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Count", "UNAVAILABLE"), stream_count("Count")
    call = channel.unary_stream("/test.Echo/Count")(b"2:unavailable", metadata=SAMPLED)
    received = []
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for message in call:
            received.append(message)
    assert received == [b"0", b"1"]  # what was sent before the error still arrived
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and info.value.details() == "draining"
    await eventually(lambda: stream_count("Count") == before[1] + 1)
    assert handled("Count", "UNAVAILABLE") == before[0] + 1
    span = only_span(exporter)
    assert_server_span_of(span, "Count")
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.UNAVAILABLE.value[0]
    assert span.status.status_code == StatusCode.ERROR and "UNAVAILABLE" in (span.status.description or "")


async def test_an_unexpected_error_in_a_stream_is_internal(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Count", "INTERNAL")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in channel.unary_stream("/test.Echo/Count")(b"1:boom", metadata=SAMPLED):
            pass
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert "internal error in Count: RuntimeError('unexpected')" in (info.value.details() or "")
    await eventually(lambda: handled("Count", "INTERNAL") == before + 1)
    assert only_span(exporter).status.status_code == StatusCode.ERROR


@pytest.mark.parametrize("then", ["wait", "flood"])
async def test_a_stream_cancelled_by_the_client(served: Served, caplog: pytest.LogCaptureFixture, then: str) -> None:
    channel, exporter, streams = served
    before = handled("Count", "CANCELLED"), stream_count("Count"), stream_sum("Count")
    call = channel.unary_stream("/test.Echo/Count")(f"1:{then}".encode(), metadata=SAMPLED)
    assert await call.read() == b"0"
    await asyncio.sleep(0.1)  # the stream stays open this long before the client goes away
    with caplog.at_level(logging.ERROR):
        call.cancel()
        await eventually(lambda: handled("Count", "CANCELLED") == before[0] + 1)
        await eventually(lambda: len(exporter.get_finished_spans()) == 1)
    assert stream_count("Count") == before[1] + 1
    assert stream_sum("Count") - before[2] >= 0.1  # the stream's whole life
    await asyncio.wait_for(streams.closed.wait(), 5)
    assert streams.closed_in_its_task  # the handler's `finally` ran before the RPC ended, not at garbage collection
    span = only_span(exporter)
    assert_server_span_of(span, "Count")
    assert span.attributes is not None
    assert span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.CANCELLED.value[0]
    assert span.status.status_code == StatusCode.UNSET  # the client left; not a fault of the server
    assert span.end_time is not None and span.start_time is not None
    assert (span.end_time - span.start_time) / 1e9 >= 0.1
    assert not [r for r in caplog.records if "detach" in r.getMessage()], "the span's context leaked to another task"


async def test_a_stream_written_with_context_write(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Written", "OK")
    call = channel.unary_stream("/test.Echo/Written")(b"2", metadata=SAMPLED)
    assert [m async for m in call] == [b"0", b"1"]
    await eventually(lambda: handled("Written", "OK") == before + 1)
    assert_server_span_of(only_span(exporter), "Written")


async def test_an_unsampled_stream_exports_nothing_and_is_still_counted(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Count", "OK")
    assert [m async for m in channel.unary_stream("/test.Echo/Count")(b"2", metadata=UNSAMPLED)] == [b"0", b"1"]
    await eventually(lambda: handled("Count", "OK") == before + 1)
    assert exporter.get_finished_spans() == ()


# -- request streams --------------------------------------------------------------------------------------------


async def test_a_request_stream(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Total", "OK")
    assert await channel.stream_unary("/test.Echo/Total")(iter([b"1", b"2", b"3"]), metadata=SAMPLED) == b"6"
    await eventually(lambda: handled("Total", "OK") == before + 1)
    assert_server_span_of(only_span(exporter), "Total")
    labels = {"service": SERVICE, "method": "Total"}
    assert REGISTRY.get_sample_value("meshserve_grpc_server_handling_seconds_count", labels)  # a unary response


async def test_a_bidirectional_stream_maps_its_errors(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Echo", "OK"), handled("Echo", "INVALID_ARGUMENT")
    call = channel.stream_stream("/test.Echo/Echo")(iter([b"a", b"b"]), metadata=SAMPLED)
    assert [m async for m in call] == [b"a", b"b"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in channel.stream_stream("/test.Echo/Echo")(iter([b"a", b"bad"]), metadata=SAMPLED):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await eventually(lambda: handled("Echo", "INVALID_ARGUMENT") == before[1] + 1)
    assert handled("Echo", "OK") == before[0] + 1
    first, second = sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0)
    assert_server_span_of(first, "Echo")
    assert second.status.status_code == StatusCode.ERROR


async def test_health_watch_and_reflection_streams_work_untraced(served: Served) -> None:
    channel, exporter, _ = served
    before = handled("Watch", "CANCELLED")
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(), metadata=SAMPLED)
    assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
    watch.cancel()
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = [s.name async for r in responses for s in r.list_services_response.service]
    assert "test.Echo" in names
    await eventually(lambda: handled("Watch", "CANCELLED") == before + 1)  # counted, like every RPC
    assert exporter.get_finished_spans() == ()
