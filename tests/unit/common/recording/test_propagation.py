"""What crosses a process boundary: the propagator's x-meshserve-parent beside traceparent, the traceparent parsed,
and the server interceptor recording every RPC under its caller's context over a real grpc.aio socket."""

from __future__ import annotations

import grpc
import pytest
from opentelemetry.propagate import get_global_textmap
from opentelemetry.trace import SpanKind, StatusCode

from services.common.errors import NotFound
from services.common.interceptors import ErrorAndMetricsInterceptor
from services.common.recording.propagation import PARENT_HEADER, ParentPropagator, parse_traceparent
from tests.unit.common.recording.recorders import CALLER, ENVOY, PARENT, TRACE, make_recorder, recorder, remote


def test_the_propagator_adds_the_current_spans_id_beside_traceparent() -> None:
    rec = make_recorder()
    propagator = ParentPropagator(get_global_textmap())
    carrier: dict[str, str] = {}
    with rec.get_tracer("t").start_as_current_span("hop", context=remote()) as hop:
        propagator.inject(carrier)
    assert carrier["traceparent"] == f"00-{TRACE:032x}-{hop.span_id:016x}-00"
    assert carrier[PARENT_HEADER] == f"{hop.span_id:016x}"
    untraced: dict[str, str] = {}
    propagator.inject(untraced)
    assert untraced == {}
    assert PARENT_HEADER in propagator.fields and "traceparent" in propagator.fields


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (f"00-{TRACE:032x}-{PARENT:016x}-01", (TRACE, PARENT, 1)),
        (f"00-{TRACE:032x}-{PARENT:016x}-00", (TRACE, PARENT, 0)),
        (f"00-{0:032x}-{PARENT:016x}-01", None),
        (f"01-{TRACE:032x}-{PARENT:016x}-01", None),
        (f"00-{TRACE:032x}-{PARENT:016x}-0z", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_traceparent_parsing(header: str | None, parsed: tuple[int, int, int] | None) -> None:
    assert parse_traceparent(header) == parsed


async def test_the_interceptor_records_every_rpc_with_its_callers_context() -> None:
    rec = recorder("svc")

    async def ok(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def missing(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        raise NotFound("no such model")

    server = grpc.aio.server(interceptors=[ErrorAndMetricsInterceptor("svc", rec)])
    handlers = {"Ok": grpc.unary_unary_rpc_method_handler(ok), "Missing": grpc.unary_unary_rpc_method_handler(missing)}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Svc", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            metadata = (("traceparent", f"00-{TRACE:032x}-{CALLER:016x}-00"), (PARENT_HEADER, f"{ENVOY:016x}"))
            await channel.unary_unary("/test.Svc/Ok")(b"x", metadata=metadata)
            with pytest.raises(grpc.aio.AioRpcError):
                await channel.unary_unary("/test.Svc/Missing")(b"x", metadata=metadata)
            await channel.unary_unary("/test.Svc/Ok")(b"x")  # no caller context: a new trace
    finally:
        await server.stop(0)
    spans, _ = rec.take([TRACE])
    ok_span, missing_span = spans
    assert (ok_span.name, ok_span.parent_id, ok_span.via, ok_span.remote_parent) == ("test.Svc/Ok", CALLER, ENVOY, True)
    assert ok_span.attributes["rpc.grpc.status_code"] == 0 and ok_span.kind is SpanKind.SERVER
    assert missing_span.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert missing_span.status_code is StatusCode.ERROR and "NOT_FOUND" in (missing_span.status_message or "")
    (other,) = [t for t in rec.buffer.traces if t != TRACE]
    (new,) = rec.buffer.traces[other]
    assert new.parent_id == 0 and new.remote_parent
