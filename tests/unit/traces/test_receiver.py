"""OTLP request conversion, the batching SpanWriter, and the TraceService Export servicer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from services.traces.otlp import records_from_request, span_count
from services.traces.receiver import SERVICE_NAME, TraceReceiver
from services.traces.records import KIND_SERVER, STATUS_ERROR
from services.traces.store import TraceStore
from services.traces.writer import SpanWriter


def kv(key: str, value: Any) -> common_pb2.KeyValue:
    if isinstance(value, bool):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(bool_value=value))
    if isinstance(value, int):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(int_value=value))
    if isinstance(value, float):
        return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(double_value=value))
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def request(service: str, spans: list[trace_pb2.Span]) -> trace_service_pb2.ExportTraceServiceRequest:
    return trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(attributes=[kv("service.name", service)]),
                scope_spans=[trace_pb2.ScopeSpans(spans=spans)],
            )
        ]
    )


def pb_span(trace: int, span: int, parent: int = 0, name: str = "s", **attrs: Any) -> trace_pb2.Span:
    return trace_pb2.Span(
        trace_id=trace.to_bytes(16, "big"),
        span_id=span.to_bytes(8, "big"),
        parent_span_id=parent.to_bytes(8, "big") if parent else b"",
        name=name,
        kind=trace_pb2.Span.SPAN_KIND_SERVER,
        start_time_unix_nano=1000 * span,
        end_time_unix_nano=1000 * span + 500,
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR),
        attributes=[kv(k, v) for k, v in attrs.items()],
    )


def test_records_from_request() -> None:
    req = request("model", [pb_span(7, 1, name="m", **{"batch.size": 4, "ok": True, "x": 0.5}), pb_span(7, 2, 1)])
    req.resource_spans[0].scope_spans[0].spans.append(pb_span(0, 3))  # no trace id: ignored
    assert span_count(req) == 3
    a, b = records_from_request(req)
    assert a.trace_id == f"{7:032x}" and a.span_id == f"{1:016x}" and a.parent_span_id == ""
    assert (a.service, a.name, a.kind, a.status) == ("model", "m", KIND_SERVER, STATUS_ERROR)
    assert (a.start_ns, a.end_ns) == (1000, 1500)
    assert a.attributes == {"batch.size": 4, "ok": True, "x": 0.5}
    assert b.parent_span_id == f"{1:016x}"


def test_writer_batches_into_the_store(tmp_path: Path) -> None:
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0)
    writer.start()
    for t in range(1, 21):
        assert writer.submit(request("gateway", [pb_span(t, 1), pb_span(t, 2, 1)])) == 0
    writer.flush()
    assert writer.written == 40
    writer.close()
    with TraceStore(tmp_path / "t.sqlite") as store:
        assert store.trace_count() == 20 and store.span_total() == 40


def test_writer_rejects_past_its_queue_bound(tmp_path: Path) -> None:
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0, queue_max_spans=3)
    # Not started: nothing drains, so the bound is reached.
    assert writer.submit(request("gateway", [pb_span(1, 1), pb_span(1, 2, 1)])) == 0
    assert writer.submit(request("gateway", [pb_span(2, 1), pb_span(2, 2, 1)])) == 2
    assert writer.rejected == 2


def test_writer_start_fails_on_a_bad_path(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    writer = SpanWriter(tmp_path / "file" / "t.sqlite", max_spans=10, max_age_s=0)
    try:
        writer.start()
    except OSError:
        pass
    else:
        raise AssertionError("expected the store to fail to open")


def test_export_servicer(tmp_path: Path) -> None:
    assert SERVICE_NAME == "opentelemetry.proto.collector.trace.v1.TraceService"
    writer = SpanWriter(tmp_path / "t.sqlite", max_spans=1000, max_age_s=0, queue_max_spans=2)
    writer.start()
    receiver = TraceReceiver(writer)
    ok = asyncio.run(receiver.Export(request("feature", [pb_span(1, 1)]), None))  # type: ignore[arg-type]
    assert not ok.HasField("partial_success")
    big = asyncio.run(receiver.Export(request("feature", [pb_span(2, i + 1) for i in range(3)]), None))  # type: ignore[arg-type]
    assert big.partial_success.rejected_spans == 3
    writer.flush()
    writer.close()
    with TraceStore(tmp_path / "t.sqlite") as store:
        assert store.span_total() == 1


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from services.traces.settings import TracesSettings

    defaults = TracesSettings()
    assert (defaults.port, str(defaults.db), defaults.metrics_port) == (4317, ".logs/traces.sqlite", 0)
    monkeypatch.setenv("MESHSERVE_TRACES_PORT", "14317")
    monkeypatch.setenv("MESHSERVE_TRACES_DB", str(tmp_path / "x.sqlite"))
    monkeypatch.setenv("MESHSERVE_TRACES_MAX_SPANS", "1000")
    monkeypatch.setenv("MESHSERVE_TRACES_MAX_AGE_S", "0")
    s = TracesSettings()
    assert (s.port, s.db, s.max_spans, s.max_age_s) == (14317, tmp_path / "x.sqlite", 1000, 0)
