"""Retroactive collection in one process: recorded spans as OTLP, a collected trace made whole or marked partial,
a collector gathering a peer's part over the peer's admin endpoint (real HTTP on loopback) and exporting one OTLP
request, and the server interceptor recording every RPC over a real grpc.aio socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags

from services.common.errors import NotFound
from services.common.interceptors import ErrorAndMetricsInterceptor
from services.common.recording import PARENT_HEADER, RecordedSpan, Recorder, enter, leave
from services.common.recording_admin import AdminServer
from services.common.recording_assemble import COLLECTION_SPAN, Part, assemble
from services.common.recording_collect import Collector
from services.common.recording_otlp import VIA, resource_spans, span_pb
from services.common.recording_settings import RecordingSettings
from tests.helpers.recording import Exported, http_status

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER = 0x00F067AA0BA902B7
ENVOY = 0x1111111111111111


def recorder(service: str, capacity: int = 100) -> Recorder:
    return Recorder(service, {"service.name": service}, capacity, 1000)


def caller(flags: int = 0) -> object:
    return trace.set_span_in_context(
        trace.NonRecordingSpan(trace.SpanContext(TRACE, CALLER, is_remote=True, trace_flags=TraceFlags(flags)))
    )


def attrs(span: trace_pb2.Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in span.attributes:
        value = kv.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            out[kv.key] = [v.string_value for v in value.array_value.values]
        else:
            out[kv.key] = getattr(value, kind)
    return out


def test_a_recorded_span_as_otlp() -> None:
    rec = recorder("gateway")
    span = rec.get_tracer("meshserve.grpc").start_span(
        "rpc",
        context=caller(),  # type: ignore[arg-type]
        kind=SpanKind.SERVER,
        attributes={"s": "x", "i": 3, "f": 0.5, "b": True, "l": ["a", "b"]},
        links=[Link(trace.SpanContext(TRACE, ENVOY, is_remote=False), {"batch.index": 0})],
    )
    span.set_status(Status(StatusCode.ERROR, "NOT_FOUND: no"))
    span.add_event("retry", {"n": 1}, timestamp=span.start_ns + 1)
    span.via = ENVOY
    span.end()
    out = span_pb(span, via=True)
    assert out.trace_id == TRACE.to_bytes(16, "big") and out.parent_span_id == CALLER.to_bytes(8, "big")
    assert out.kind == trace_pb2.Span.SPAN_KIND_SERVER and out.name == "rpc"
    assert out.flags == 0x300  # unsampled, the parent is remote (and that is known)
    assert attrs(out) == {"s": "x", "i": 3, "f": 0.5, "b": True, "l": ["a", "b"], VIA: f"{ENVOY:016x}"}
    assert (out.status.code, out.status.message) == (trace_pb2.Status.STATUS_CODE_ERROR, "NOT_FOUND: no")
    assert [(e.name, e.time_unix_nano - out.start_time_unix_nano) for e in out.events] == [("retry", 1)]
    assert out.links[0].span_id == ENVOY.to_bytes(8, "big")
    assert VIA not in attrs(span_pb(span))
    grouped = resource_spans([span, span], {"service.name": "gateway"})
    assert [s.scope.name for s in grouped.scope_spans] == ["meshserve.grpc"]
    assert len(grouped.scope_spans[0].spans) == 2


def part_of(label: str, spans: Sequence[RecordedSpan], service: str, lost: set[int] = frozenset()) -> Part:  # type: ignore[assignment]
    return Part(
        label, resource_spans(spans, {"service.name": service}, via=True), {t.to_bytes(16, "big") for t in lost}
    )


def a_request_through_an_unsampled_mesh() -> tuple[list[RecordedSpan], list[RecordedSpan]]:
    """The gateway's root under an unsampled caller, its hop, and the feature service's server span whose parent is
    an (unrecorded) Envoy span, with the gateway's hop in x-meshserve-parent."""
    gateway, feature = recorder("gateway"), recorder("feature")
    tracer = gateway.get_tracer("meshserve.grpc")
    with tracer.start_as_current_span("rpc", context=caller(), kind=SpanKind.SERVER) as root:  # type: ignore[arg-type]
        with tracer.start_as_current_span("features.batch", kind=SpanKind.CLIENT) as hop:
            envoy = trace.set_span_in_context(
                trace.NonRecordingSpan(trace.SpanContext(TRACE, ENVOY, is_remote=True, trace_flags=TraceFlags(0)))
            )
            served = feature.get_tracer("meshserve.grpc").start_span("Compute", envoy, kind=SpanKind.SERVER)  # type: ignore[arg-type]
            served.via = hop.span_id
            served.end()
    assert root.trace_id == TRACE
    return gateway.take([TRACE])[0], feature.take([TRACE])[0]


def test_a_callee_behind_an_unrecorded_hop_hangs_on_the_callers_span_and_the_root_is_freed() -> None:
    own, theirs = a_request_through_an_unsampled_mesh()
    parts = [part_of("gateway@self", own, "gateway"), part_of("feature@127.0.0.1:9002", theirs, "feature")]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"latency"}})[TRACE.to_bytes(16, "big")]
    assert outcome.spans == 3 and not outcome.partial
    spans = {s.name: s for p in parts for sc in p.resource.scope_spans for s in sc.spans}  # type: ignore[union-attr]
    assert spans["Compute"].parent_span_id == spans["features.batch"].span_id
    assert attrs(spans["Compute"])["meshserve.unrecorded_parent"] == f"{ENVOY:016x}"
    assert spans["rpc"].parent_span_id == b""
    assert attrs(spans["rpc"]) == {"meshserve.unrecorded_parent": f"{CALLER:016x}", "meshserve.trigger": "latency"}
    assert all(VIA not in attrs(s) for s in spans.values())


def test_a_process_that_lost_its_part_makes_the_trace_partial() -> None:
    own, _ = a_request_through_an_unsampled_mesh()
    parts = [part_of("gateway@self", own, "gateway"), part_of("feature@127.0.0.1:9002", [], "feature", {TRACE})]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"error"}})[TRACE.to_bytes(16, "big")]
    assert outcome.missing == ["feature@127.0.0.1:9002: buffer rolled over"]
    (root,) = [s for sc in parts[0].resource.scope_spans for s in sc.spans if s.name == "rpc"]  # type: ignore[union-attr]
    assert attrs(root)["meshserve.partial"] is True
    assert attrs(root)["meshserve.partial.processes"] == ["feature@127.0.0.1:9002: buffer rolled over"]


def test_a_missing_callee_while_a_process_did_not_answer_is_partial() -> None:
    own, _ = a_request_through_an_unsampled_mesh()
    parts = [part_of("gateway@self", own, "gateway"), Part("127.0.0.1:9002", None)]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"latency"}})[TRACE.to_bytes(16, "big")]
    assert outcome.missing == ["callee of features.batch: not collected (127.0.0.1:9002)"]


def test_a_kept_trace_with_no_spans_left_still_arrives_marked() -> None:
    parts = [part_of("gateway@self", [], "gateway", {TRACE})]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"latency"}})[TRACE.to_bytes(16, "big")]
    assert outcome.partial
    (marker,) = [s for sc in parts[0].resource.scope_spans for s in sc.spans]  # type: ignore[union-attr]
    assert marker.name == COLLECTION_SPAN and attrs(marker)["meshserve.partial"] is True
    assert attrs(marker)["meshserve.trigger"] == "latency"
    linked_only = [part_of("gateway@self", [], "gateway")]
    assert assemble(linked_only, {TRACE.to_bytes(16, "big"): {"linked"}})[TRACE.to_bytes(16, "big")].spans == 0
    assert not linked_only[0].resource.scope_spans  # type: ignore[union-attr]


async def test_a_collector_gathers_a_peers_part_over_its_admin_endpoint() -> None:
    gateway, feature = recorder("gateway"), recorder("feature")
    peer = AdminServer(feature, "feature-id", "127.0.0.1", 0)
    port = peer.start()
    own = AdminServer(gateway, "gateway-id", "127.0.0.1", 0)
    own_port = own.start()
    settings = RecordingSettings(
        peers=[f"127.0.0.1:{port}", f"127.0.0.1:{own_port}"], collect_delay_ms=0, collect_interval_ms=0
    )
    exporter = Exported()
    collector = Collector(gateway, settings, exporter, "gateway-id")  # type: ignore[arg-type]
    gateway.edge = lambda root: ["latency"]
    try:
        with gateway.get_tracer("g").start_as_current_span("rpc", kind=SpanKind.SERVER) as root:
            # The peer's span, in the gateway's trace (as the traceparent would make it), in the peer's buffer.
            served = feature.get_tracer("f").start_span("Compute", kind=SpanKind.SERVER)
            served.end()
        assert (served.trace_id, served.parent_id) == (root.trace_id, root.span_id)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if exporter.requests:
                break
        (request,) = exporter.requests
        by_service = {
            dict((kv.key, kv.value.string_value) for kv in r.resource.attributes)["service.name"]: r for r in request
        }
        assert set(by_service) == {"gateway", "feature"}  # the collector's own admin answered "self": not twice
        assert [s.name for s in by_service["feature"].scope_spans[0].spans] == ["Compute"]
        assert collector.collected == {"complete": 1, "partial": 0}
        assert feature.buffer.size == 0  # taken: a second collection would not send it again
        assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{port}/metrics") == 200
        body = json.dumps({"trace_ids": ["nothex"]}).encode()
        assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{port}/recording/collect", body) == 400
    finally:
        await collector.close()
        await asyncio.to_thread(peer.stop)
        await asyncio.to_thread(own.stop)


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


def test_enter_and_leave_nest() -> None:
    rec = recorder("x")
    a, b = rec.get_tracer("t").start_span("a"), rec.get_tracer("t").start_span("b")
    ta = enter(a)
    tb = enter(b)
    assert trace.get_current_span() is b
    leave(tb)
    assert trace.get_current_span() is a
    leave(ta)
