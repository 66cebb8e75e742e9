"""`services.traces.__main__.serve`: the OTLP receiver and its writer wired into the shared server, in-process on a
real socket; an exported span is in the SQLite store once SIGTERM has drained it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from services.traces.__main__ import serve
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
