"""`services.traces.__main__`: the OTLP receiver and its writer wired into the shared server, in-process on a real
socket; an exported span is in the SQLite store once SIGTERM has drained it, and in the trace UI when it runs; with a
recording port, Envoy's access log comes in on the same server and collectors are answered beside it."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from services.traces.__main__ import build, parse_args, serve
from services.traces.access_logs import SERVICE_NAME as LOGS_SERVICE_NAME
from services.traces.settings import TracesSettings
from services.traces.store import TraceStore
from tests.helpers.servers import free_port
from tests.unit.traces.otlp_requests import pb_span, request


async def test_serve_stores_exported_spans_and_writes_the_queue_at_sigterm(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "traces.sqlite"
    task = asyncio.create_task(serve(TracesSettings(host="127.0.0.1", port=port, db=db, grace_period_s=0.5)))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(300):
            try:
                status = (await health.Check(health_pb2.HealthCheckRequest(), timeout=1.0)).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    break
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the trace store never became SERVING")
        answer = await trace_service_pb2_grpc.TraceServiceStub(channel).Export(
            request("feature", [pb_span(7, 1), pb_span(7, 2)]), timeout=5
        )
        assert not answer.HasField("partial_success")
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, timeout=15)
    with TraceStore(db) as store:
        rows = store.recent_traces()
        assert len(rows) == 1
        assert len(store.spans([rows[0].trace_id])) == 2


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_TRACES_UI_PORT", "18091")
    assert TracesSettings().ui_port == 18091
    assert parse_args([]) == {}
    overrides = parse_args(["--ui-port", "0", "--ui-host", "::1"])
    assert overrides == {"ui_port": 0, "ui_host": "::1"}
    assert TracesSettings(**overrides).ui_port == 0  # type: ignore[arg-type]
    monkeypatch.delenv("MESHSERVE_TRACES_UI_PORT")
    assert TracesSettings().ui_port is None  # no UI unless asked for


async def test_serve_with_a_ui_port_serves_the_ui_over_the_store(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    db = tmp_path / "traces.sqlite"
    settings = TracesSettings(
        host="127.0.0.1", port=port, db=db, grace_period_s=0.5, ui_port=ui_port, ui_token="ui-secret"
    )
    task = asyncio.create_task(serve(settings))

    def fetch(path: str, token: str = "ui-secret") -> tuple[int, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", ui_port, timeout=5)
        connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
        answer = connection.getresponse()
        return answer.status, answer.read()

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await trace_service_pb2_grpc.TraceServiceStub(channel).Export(
            request("feature", [pb_span(7, 1), pb_span(7, 2, 1)]), timeout=30, wait_for_ready=True
        )
        for _ in range(100):
            status, body = await asyncio.to_thread(fetch, "/api/traces")
            if status == 200 and json.loads(body)["total"] == 1:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"the UI never listed the exported trace: {status} {body[:200]!r}")
        status, page = await asyncio.to_thread(fetch, "/")
        assert status == 200 and b"<title>meshserve traces</title>" in page
        assert (await asyncio.to_thread(fetch, "/api/traces", "guess"))[0] == 401  # the configured token only
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, timeout=15)
    with pytest.raises(OSError):
        await asyncio.to_thread(fetch, "/")  # stopped with the store


async def test_build_with_a_recording_port_takes_envoys_access_log_and_answers_collectors(tmp_path: Path) -> None:
    recording_port = free_port()
    settings = TracesSettings(
        host="127.0.0.1", port=0, db=tmp_path / "traces.sqlite", grace_period_s=0.5, recording_port=recording_port
    )
    service, parts = build(settings)
    assert parts.buffer is not None and LOGS_SERVICE_NAME in service.service_names

    def collect() -> tuple[int, dict[str, object]]:
        connection = http.client.HTTPConnection("127.0.0.1", recording_port, timeout=5)
        connection.request("POST", "/recording/collect", json.dumps({"trace_ids": [f"{7:032x}"]}))
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())

    await service.start()
    try:
        await parts.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            logs = logs_service_pb2_grpc.LogsServiceStub(channel)
            await logs.Export(logs_service_pb2.ExportLogsServiceRequest(), timeout=5)
        status, answer = await asyncio.to_thread(collect)
        assert status == 200 and answer["service"] == "envoy" and answer["spans"] == 0
    finally:
        await service.server.stop(0)
        await parts.close()
