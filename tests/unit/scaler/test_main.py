"""`python -m services.scaler`'s wiring, in process: both services on the shared server (health, reflection),
readiness from its lifecycle, streams that end as the replica drains; and the settings from the environment."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.scaler.__main__ import build
from services.scaler.api import Demand, DemandReporter, ExternalScalerClient
from services.scaler.servicer import DEMAND_SERVICE_NAME, SERVICE_NAME
from services.scaler.settings import ScalerSettings
from tests.unit.scaler.conftest import scaler_settings


async def listed_services(target: str) -> set[str]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo()
        await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
        response = await call.read()
        await call.done_writing()
        return {s.name for s in response.list_services_response.service}


async def health(target: str, service: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
        return int(response.status)


async def test_build_serves_both_apis_and_a_stop_drains_every_stream() -> None:
    service, handler = build(scaler_settings())
    assert handler.lifecycle is service.lifecycle and not handler.ready()
    running = asyncio.ensure_future(service.run(None, handler.close))
    reporting: asyncio.Future[None] | None = None
    try:
        for _ in range(500):
            if handler.ready():
                break
            await asyncio.sleep(0.01)
        assert handler.ready() and handler.live()
        target = f"127.0.0.1:{service.port}"
        assert {SERVICE_NAME, DEMAND_SERVICE_NAME} <= await listed_services(target)
        for name in ("", SERVICE_NAME, DEMAND_SERVICE_NAME):
            assert await health(target, name) == health_pb2.HealthCheckResponse.SERVING
        reporter = DemandReporter(target, "gw", lambda: {("m", ""): Demand(1, 0)}, asyncio.Event(), heartbeat_s=0.1)
        reporting = asyncio.ensure_future(reporter.run())
        client = ExternalScalerClient(target)
        try:
            stream = client.stream_is_active({"model": "m"})
            assert await asyncio.wait_for(anext(stream), 5) in (False, True)
            for _ in range(500):
                if handler.gateways() == ["gw"]:
                    break
                await asyncio.sleep(0.01)
            assert handler.is_active({"model": "m"})
            service.request_stop()  # as SIGTERM does
            assert not handler.live() and not handler.ready()
            remaining = [a async for a in stream]  # the stream ends (EOF): KEDA reconnects
            assert remaining in ([], [True])  # at most the flip sent before the stop
        finally:
            await client.close()
        await asyncio.wait_for(running, 30)
        assert handler.gateways() == []  # the drain ended the gateway's stream
    finally:
        if reporting is not None:
            reporting.cancel()
            await asyncio.gather(reporting, return_exceptions=True)
        if not running.done():
            service.request_stop()
            await asyncio.gather(running, return_exceptions=True)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = ScalerSettings()
    assert (defaults.port, defaults.metrics_port, defaults.stale_after_s) == (8005, 9005, 3.0)
    monkeypatch.setenv("MESHSERVE_SCALER_PORT", "18005")
    monkeypatch.setenv("MESHSERVE_SCALER_STALE_AFTER_S", "1.5")
    monkeypatch.setenv("MESHSERVE_SCALER_TARGET_PER_REPLICA", "32")
    settings = ScalerSettings()
    assert (settings.port, settings.stale_after_s, settings.target_per_replica) == (18005, 1.5, 32.0)
    with pytest.raises(ValueError):
        ScalerSettings(stale_after_s=0)
    with pytest.raises(ValueError):
        ScalerSettings(target_per_replica=0)
