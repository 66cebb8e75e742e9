"""`python -m services.traces` end to end: OTel SDK spans of several services in (a batched call's links too),
`meshserve traces` out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import Link, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from typer.testing import CliRunner

from services.traces.analysis import assemble
from services.traces.cli import app
from services.traces.store import TraceStore
from tests.helpers.servers import ServiceProcess, service_process

MS = 1_000_000
TRACES = 20
SLOW = 11  # this request's online feature lookup takes 40 ms
propagator = TraceContextTextMapPropagator()


@pytest.fixture()
def collector(tmp_path: Path) -> Iterator[tuple[ServiceProcess, Path]]:
    db = tmp_path / "traces.sqlite"
    with service_process("traces", tmp_path / "logs", {"MESHSERVE_TRACES_DB": str(db)}) as process:
        yield process, db


def providers(address: str) -> dict[str, TracerProvider]:
    """One TracerProvider per simulated process, each exporting every span at once over OTLP/gRPC."""
    out = {}
    for service in ("meshserve-ingress", "gateway", "feature", "model"):
        provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=address, insecure=True)))
        out[service] = provider
    return out


def hop(span: trace.Span) -> dict[str, str]:
    """The W3C headers a process sends with its call (what crosses the wire)."""
    carrier: dict[str, str] = {}
    propagator.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def request(tracers: dict[str, trace.Tracer], t0: int, online_ms: float) -> str:
    """One pipeline request's spans with explicit times: ingress -> gateway -> feature, model."""
    at = lambda ms: t0 + int(ms * MS)  # noqa: E731
    envoy, gw, feat, model = (tracers[s] for s in ("meshserve-ingress", "gateway", "feature", "model"))
    f_end = 1.5 + online_ms + 0.5
    total = f_end + 4.0
    ingress = envoy.start_span(
        "127.0.0.1:8000", kind=SpanKind.SERVER, start_time=at(0), attributes={"component": "proxy"}
    )
    up = envoy.start_span(
        "router gateway egress", trace.set_span_in_context(ingress), SpanKind.CLIENT, start_time=at(0.1)
    )
    server = gw.start_span(
        "inference.GRPCInferenceService/ModelInfer", propagator.extract(hop(up)), SpanKind.SERVER, start_time=at(0.2)
    )
    in_gw = trace.set_span_in_context(server)
    gw.start_span("cache.lookup", in_gw, start_time=at(0.3)).end(at(0.8))
    features = gw.start_span("features", in_gw, start_time=at(0.9))
    compute = feat.start_span(
        "meshserve.feature.FeatureService/Compute",
        propagator.extract(hop(features)),
        SpanKind.SERVER,
        start_time=at(1.2),
    )
    feat.start_span("feature.online_lookup", trace.set_span_in_context(compute), start_time=at(1.3)).end(
        at(1.3 + online_ms)
    )
    compute.end(at(f_end - 0.2))
    features.end(at(f_end))
    call = gw.start_span("model", in_gw, start_time=at(f_end + 0.1))
    infer = model.start_span(
        "inference.GRPCInferenceService/ModelInfer",
        propagator.extract(hop(call)),
        SpanKind.SERVER,
        start_time=at(f_end + 0.3),
    )
    in_model = trace.set_span_in_context(infer)
    model.start_span("model.queue_wait", in_model, start_time=at(f_end + 0.4)).end(at(f_end + 0.6))
    model.start_span("model.forward", in_model, start_time=at(f_end + 0.6), attributes={"batch.size": 1}).end(
        at(f_end + 2.6)
    )
    infer.end(at(f_end + 2.8))
    call.end(at(f_end + 3.0))
    server.end(at(total - 0.3))
    up.end(at(total - 0.1))
    ingress.end(at(total))
    return f"{ingress.get_span_context().trace_id:032x}"


def test_spans_from_several_services_become_trees_and_a_hotspot(
    collector: tuple[ServiceProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    process, db = collector
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    by_service = providers(process.address)
    tracers = {s: p.get_tracer("test") for s, p in by_service.items()}
    start = time.time_ns() - 60 * 10**9
    ids = [request(tracers, start + i * 100 * MS, 40.0 if i == SLOW else 1.0) for i in range(TRACES)]
    for provider in by_service.values():
        provider.shutdown()

    expected = TRACES * 11
    deadline = time.monotonic() + 10
    with TraceStore(db) as store:
        while store.span_total() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.span_total() == expected, process.log()
        traces = {t.trace_id: t for t in assemble(store.spans(ids))}

    slow = traces[ids[SLOW]]
    assert slow.complete
    assert [(n.stage, d) for n, d in slow.walk()] == [
        ("envoy.ingress", 0),
        ("envoy.ingress.upstream", 1),
        ("gateway.rpc", 2),
        ("gateway.cache.lookup", 3),
        ("gateway.features", 3),
        ("feature.rpc", 4),
        ("feature.online_lookup", 5),
        ("gateway.model", 3),
        ("model.rpc", 4),
        ("model.queue_wait", 5),
        ("model.forward", 5),
    ]
    assert {n.span.service for n in slow.nodes} == {"meshserve-ingress", "gateway", "feature", "model"}
    assert slow.stage_self_ns()["feature.online_lookup"] == 40 * MS
    assert slow.duration_ns == pytest.approx(46 * MS, abs=10)

    runner = CliRunner()
    hot = runner.invoke(app, ["hotspots", "--db", str(db), "--last", str(TRACES)])
    assert hot.exit_code == 0, hot.output
    # 40 of the slow trace's 46 ms: 87%.
    assert hot.output.strip().splitlines()[-1] == "hotspot: feature.online_lookup (87% of p99)"
    assert ids[SLOW] in hot.output

    shown = runner.invoke(app, ["show", ids[SLOW], "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert "└ feature.online_lookup" in shown.output and "40.00" in shown.output

    listed = runner.invoke(app, ["list", "--db", str(db), "-n", str(TRACES)])
    assert listed.exit_code == 0, listed.output
    assert all(trace_id in listed.output for trace_id in ids)

    assert process.terminate() == 0
    assert f"wrote {expected} spans, rejected 0" in process.log()


def batched_requests(tracers: dict[str, trace.Tracer], t0: int, online_ms: float) -> tuple[list[str], trace.Span]:
    """Two requests whose feature calls go as one `features.batch` call, as the gateway emits it: each request keeps
    its `features` span; the batch span is a CLIENT child of the first one's, with `batch.members`, `batch.rows`
    and a link (`batch.index`) to each member's `features` span; the feature service's spans are below it.
    Returns the two trace ids and the batch span."""
    at = lambda ms: t0 + int(ms * MS)  # noqa: E731
    envoy, gw, feat = (tracers[s] for s in ("meshserve-ingress", "gateway", "feature"))
    members, roots, servers = [], [], []
    for i in range(2):
        d = 0.3 * i  # the second request arrives 0.3 ms after the first
        ingress = envoy.start_span("127.0.0.1:8000", kind=SpanKind.SERVER, start_time=at(d))
        server = gw.start_span(
            "inference.GRPCInferenceService/ModelInfer",
            propagator.extract(hop(ingress)),
            SpanKind.SERVER,
            start_time=at(d + 0.1),
        )
        members.append(gw.start_span("features", trace.set_span_in_context(server), start_time=at(d + 0.2)))
        roots.append(ingress)
        servers.append(server)
    links = [Link(m.get_span_context(), {"batch.index": i}) for i, m in enumerate(members)]
    batch = gw.start_span(
        "features.batch",
        trace.set_span_in_context(members[0]),
        SpanKind.CLIENT,
        attributes={"batch.members": 2, "batch.rows": 2},
        links=links,
        start_time=at(0.6),
    )
    compute = feat.start_span(
        "meshserve.feature.FeatureService/Compute", propagator.extract(hop(batch)), SpanKind.SERVER, start_time=at(0.8)
    )
    feat.start_span("feature.online_lookup", trace.set_span_in_context(compute), start_time=at(0.9)).end(
        at(0.9 + online_ms)
    )
    compute.end(at(1.0 + online_ms))
    batch.end(at(1.2 + online_ms))
    for member, server, ingress in zip(members, servers, roots, strict=True):
        member.end(at(1.3 + online_ms))
        server.end(at(1.5 + online_ms))
        ingress.end(at(1.6 + online_ms))
    return [f"{r.get_span_context().trace_id:032x}" for r in roots], batch


def test_a_batched_calls_links_reach_the_store_show_and_hotspots(
    collector: tuple[ServiceProcess, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    process, db = collector
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    by_service = providers(process.address)
    tracers = {s: p.get_tracer("test") for s, p in by_service.items()}
    (first, second), batch = batched_requests(tracers, time.time_ns() - 30 * 10**9, online_ms=8.0)
    for provider in by_service.values():
        provider.shutdown()

    expected = 2 * 3 + 3  # per request: ingress, gateway, features; the batch: its span, the feature rpc, lookup
    deadline = time.monotonic() + 10
    with TraceStore(db) as store:
        while store.span_total() < expected and time.monotonic() < deadline:
            time.sleep(0.05)
        assert store.span_total() == expected, process.log()
        batch_id = f"{batch.get_span_context().span_id:016x}"
        (stored,) = [s for s in store.spans([first]) if s.span_id == batch_id]
        member_ids = [next(s.span_id for s in store.spans([t]) if s.name == "features") for t in (first, second)]
        assert [(ln.trace_id, ln.span_id, ln.attributes) for ln in stored.links] == [
            (first, member_ids[0], {"batch.index": 0}),
            (second, member_ids[1], {"batch.index": 1}),
        ]
        assert (stored.kind, stored.attributes) == (3, {"batch.members": 2, "batch.rows": 2})
        assert store.linked_by(second, member_ids[1]) == [stored]

    runner = CliRunner()
    shown = runner.invoke(app, ["show", first, "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert f"links: 2 members: {first}/{member_ids[0]}, {second}/{member_ids[1]}" in shown.output
    shown = runner.invoke(app, ["show", second, "--db", str(db)])
    assert shown.exit_code == 0, shown.output
    assert f"batched with 1 other in {first}/{batch_id} (features.batch)" in shown.output
    # The second request's trace alone: the 8 ms lookup it waited for (in the first one's trace) is its hotspot.
    hot = runner.invoke(app, ["hotspots", "--db", str(db), "--last", "1"])
    assert hot.exit_code == 0, hot.output
    assert second in hot.output and first not in hot.output
    # 8 of its 9.3 ms (0.3 to 9.6 ms): 86%.
    assert hot.output.strip().splitlines()[-1] == "hotspot: feature.online_lookup (86% of p99)"
