"""The stack's internal credential on real loopback sockets: /metrics and the recording admin endpoint answer 401 (one
line naming the header) without it and serve with it; a collector holding it collects, one without it gets nothing;
the trace store's OTLP receiver refuses forged spans and logs with UNAUTHENTICATED, and takes the OTLP exporter's
(OTEL_EXPORTER_OTLP_HEADERS); without a credential configured every endpoint stays open."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.trace import SpanKind

from services.common.internal_auth import InternalAuthSettings, admits, internal_token
from services.common.metrics import start_metrics_server
from services.common.recording.admin import AdminServer
from services.common.recording.collect import Collector
from services.common.recording.otlp import OtlpExporter
from services.common.recording.provider import Kept
from services.common.recording.settings import RecordingSettings
from services.traces.__main__ import build
from services.traces.settings import TracesSettings
from services.traces.store import TraceStore
from tests.helpers.recording import Exported
from tests.helpers.servers import free_port
from tests.unit.common.recording.recorders import recorder
from tests.unit.traces.otlp_requests import pb_span, request

TOKEN = "internal-secret-token"


@pytest.fixture
def stack_token(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """This process configured as a stack's process is: MESHSERVE_INTERNAL_TOKEN set."""
    monkeypatch.setenv("MESHSERVE_INTERNAL_TOKEN", TOKEN)
    internal_token.cache_clear()
    yield TOKEN
    monkeypatch.delenv("MESHSERVE_INTERNAL_TOKEN")
    internal_token.cache_clear()


def fetch(url: str, token: str | None = None, body: bytes | None = None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=5) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def refused(status: int, text: str) -> bool:
    """A 401 whose one line says which header to send."""
    return status == 401 and text.count("\n") == 1 and "Authorization: Bearer" in text


def test_settings_read_the_token_or_its_file(tmp_path: Path) -> None:
    assert InternalAuthSettings().value() == ""
    assert InternalAuthSettings(token=" abc ").value() == "abc"
    (tmp_path / "t").write_text("from-file\n")
    assert InternalAuthSettings(token_file=tmp_path / "t").value() == "from-file"
    (tmp_path / "empty").write_text("")
    with pytest.raises(ValueError, match="empty"):  # told to require one: never open by accident
        InternalAuthSettings(token_file=tmp_path / "empty").value()
    with pytest.raises(OSError):
        InternalAuthSettings(token_file=tmp_path / "missing").value()
    assert admits("", None) and admits("t", "Bearer t") and admits("t", "bearer  t ")
    assert not admits("t", None) and not admits("t", "Bearer u") and not admits("t", "Basic t") and not admits("t", "t")


def test_metrics_need_the_credential_when_the_process_has_one(stack_token: str) -> None:
    port = start_metrics_server(free_port(), "127.0.0.1")
    url = f"http://127.0.0.1:{port}/metrics"
    assert refused(*fetch(url))
    assert refused(*fetch(url, "wrong"))
    status, text = fetch(url, stack_token)
    assert (status == 200 and "meshserve_grpc_server_handled_total" in text) or "python_info" in text


def test_metrics_stay_open_without_a_credential() -> None:
    port = start_metrics_server(free_port(), "127.0.0.1")
    assert fetch(f"http://127.0.0.1:{port}/metrics")[0] == 200


async def test_the_recording_endpoint_needs_the_credential_and_collectors_send_it(stack_token: str) -> None:
    gateway, feature = recorder("gateway"), recorder("feature")
    peer = AdminServer(feature, "feature-id", "127.0.0.1", 0)
    port = peer.start()
    settings = RecordingSettings(peers=[f"127.0.0.1:{port}"], collect_delay_ms=0, collect_interval_ms=0)
    with_token, without = Exported(), Exported()
    thief = Collector(recorder("thief"), settings, without, "thief-id", token="")  # type: ignore[arg-type]
    collector = Collector(gateway, settings, with_token, "gateway-id")  # type: ignore[arg-type]
    try:
        served = feature.get_tracer("f").start_span("Compute", kind=SpanKind.SERVER)
        served.end()
        ids = json.dumps({"trace_ids": [f"{served.trace_id:032x}"]}).encode()
        assert refused(*await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}/recording/collect", None, ids))
        assert refused(*await asyncio.to_thread(fetch, f"http://127.0.0.1:{port}/metrics"))
        kept = Kept(served.trace_id, {"slow"}, [], False)
        outcome = await thief.collect([kept])
        assert feature.buffer.size == 1  # nothing taken: the peer could not be asked, and the trace says so
        assert [o.spans for o in outcome.values()] == [0] and all(o.partial for o in outcome.values())
        await collector.collect([kept])
        assert feature.buffer.size == 0
        names = {s.name for r in with_token.requests[0] for scope in r.scope_spans for s in scope.spans}
        assert names == {"Compute"}
    finally:
        await thief.close()
        await collector.close()
        await asyncio.to_thread(peer.stop)


async def test_the_trace_store_takes_spans_and_logs_only_with_the_credential(
    stack_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db, recording_port = tmp_path / "traces.sqlite", free_port()
    settings = TracesSettings(host="127.0.0.1", port=0, db=db, grace_period_s=0.5, recording_port=recording_port)
    service, parts = build(settings)
    await service.start()
    await parts.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING  # probes stay open: it tells nothing
            traces = trace_service_pb2_grpc.TraceServiceStub(channel)
            logs = logs_service_pb2_grpc.LogsServiceStub(channel)
            for call, message in (
                (traces.Export, request("forged", [pb_span(7, 1)])),
                (logs.Export, logs_service_pb2.ExportLogsServiceRequest()),
            ):
                for metadata in ((), (("authorization", "Bearer wrong"),)):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await call(message, timeout=5, metadata=metadata)
                    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
                    assert "Authorization: Bearer" in (caught.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as unknown:  # an unknown method says no more than a known one
                await channel.unary_unary("/no.Such/Method")(b"", timeout=5)
            assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # the recording exporter, configured as the stack configures every process, gets in
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{service.port}")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"authorization=Bearer%20{stack_token}")
        exporter = OtlpExporter()
        assert await exporter.export(list(request("feature", [pb_span(8, 1)]).resource_spans))
        await exporter.close()
        collect = f"http://127.0.0.1:{recording_port}/recording/collect"
        assert refused(*await asyncio.to_thread(fetch, collect, None, b"{}"))
        assert (await asyncio.to_thread(fetch, collect, stack_token, b"{}"))[0] == 200
    finally:
        await service.server.stop(0)
        await parts.close()
    with TraceStore(db) as store:
        assert [row.trace_id for row in store.recent_traces()] == [f"{8:032x}"]  # the exporter's, no forged one
