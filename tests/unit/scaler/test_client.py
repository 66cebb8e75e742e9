"""The scaler's clients against the real scaler service on loopback, in this process: DemandReporter streams a
gateway's demand (at once, coalesced, with heartbeats, reconnecting quietly), ExternalScalerClient reads it as KEDA
does, and errors cross the wire with their codes; the converters read KEDA's fields as KEDA does."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from services.common.errors import InvalidArgument, NotFound
from services.common.server import GrpcService
from services.protos import externalscaler_pb2 as keda_pb
from services.protos import externalscaler_pb2_grpc as keda_grpc
from services.scaler import converters
from services.scaler.__main__ import build
from services.scaler.api import Demand, DemandKey, DemandReporter, ExternalScalerClient, MetricSpec, MetricValue
from services.scaler.client import RECONNECT_OPTIONS
from services.scaler.domain import DemandSnapshot, ReportAck
from services.scaler.handler import ScalerHandler
from tests.helpers.inprocess import serving_built
from tests.helpers.servers import free_port
from tests.unit.scaler.conftest import scaler_settings

TRIGGER = {"model": "fraud_mlp", "subset": "v2", "targetPerReplica": "4"}


def address(service: GrpcService) -> str:
    return f"127.0.0.1:{service.port}"


def handler_of(service: GrpcService) -> ScalerHandler:
    return service.handler  # type: ignore[attr-defined,no-any-return]


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> float:
    """Seconds until `condition()` holds (polled every 5 ms); AssertionError after `timeout_s`."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        await asyncio.sleep(0.005)
    return time.monotonic() - start


@pytest.fixture()
async def reporting(scaler_server: GrpcService) -> AsyncIterator[tuple[dict[DemandKey, Demand], asyncio.Event, Any]]:
    """A DemandReporter of a dict of demand (heartbeat 0.1 s) running against the scaler."""
    demand: dict[DemandKey, Demand] = {}
    changed = asyncio.Event()
    reporter = DemandReporter(address(scaler_server), "gw-1", lambda: demand, changed, heartbeat_s=0.1)
    task = asyncio.ensure_future(reporter.run())
    yield demand, changed, reporter
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_the_reporter_streams_demand_that_keda_calls_read(
    scaler_server: GrpcService, reporting: tuple[dict[DemandKey, Demand], asyncio.Event, DemandReporter]
) -> None:
    demand, changed, _ = reporting
    handler = handler_of(scaler_server)
    await until(lambda: handler.gateways() == ["gw-1"])
    client = ExternalScalerClient(address(scaler_server))
    try:
        (spec,) = await client.metric_spec(TRIGGER)
        assert spec == MetricSpec("meshserve-fraud-mlp-v2", 4.0)
        assert await client.metrics(TRIGGER, spec.name) == [MetricValue(spec.name, 0.0)]
        assert not await client.is_active(TRIGGER)
        stream = client.stream_is_active(TRIGGER)
        assert await anext(stream) is False
        demand[("fraud_mlp", "v2")] = Demand(3, 2)
        changed.set()
        start = time.monotonic()
        assert await asyncio.wait_for(anext(stream), 2) is True
        assert time.monotonic() - start < 0.5  # the change is pushed through both streams at once
        assert await client.metrics(TRIGGER, spec.name) == [MetricValue(spec.name, 5.0)]
        assert await client.is_active(TRIGGER)
        demand.clear()
        changed.set()
        assert await asyncio.wait_for(anext(stream), 2) is False
        await stream.aclose()
        with pytest.raises(InvalidArgument, match="no 'model'"):
            await client.metric_spec({"subset": "v2"})
        with pytest.raises(NotFound, match="its metric is"):
            await client.metrics(TRIGGER, "something-else")
        with pytest.raises(InvalidArgument, match="targetPerReplica"):
            await anext(client.stream_is_active({**TRIGGER, "targetPerReplica": "-1"}))
    finally:
        await client.close()


async def test_changes_are_coalesced_and_heartbeats_keep_coming(
    scaler_server: GrpcService, reporting: tuple[dict[DemandKey, Demand], asyncio.Event, DemandReporter]
) -> None:
    demand, changed, reporter = reporting
    handler = handler_of(scaler_server)
    await until(lambda: reporter.connected)
    sent = reporter.sent
    for i in range(200):  # 200 changes in a burst
        demand[("fraud_mlp", "")] = Demand(i + 1, 0)
        changed.set()
        if i % 20 == 0:
            await asyncio.sleep(0.001)
    await until(lambda: handler.totals() == {("fraud_mlp", ""): Demand(200, 0)}, 2)
    assert reporter.sent - sent < 30  # at most one message per 20 ms, not one per change
    quiet_from = reporter.sent
    await asyncio.sleep(0.55)
    assert 3 <= reporter.sent - quiet_from <= 8  # nothing changed: a heartbeat every 0.1 s


async def test_the_reporter_comes_back_after_the_scaler_restarts_and_logs_the_outage_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    demand = {("fraud_mlp", ""): Demand(1, 0)}
    reporter = DemandReporter(
        f"127.0.0.1:{port}", "gw-1", lambda: demand, asyncio.Event(), heartbeat_s=0.1, max_backoff_s=0.2
    )
    assert dict(RECONNECT_OPTIONS)["grpc.max_reconnect_backoff_ms"] <= 1000  # back within a second of the scaler
    caplog.set_level(logging.DEBUG, logger="services.scaler.client")
    task = asyncio.ensure_future(reporter.run())
    try:
        await asyncio.sleep(1.0)  # nothing listens: several attempts
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "cannot report demand" in warnings[0].getMessage()
        assert sum("still unreachable" in r.getMessage() for r in caplog.records) >= 2
        async with serving_built(*build(scaler_settings(port=port))) as service:
            await until(lambda: handler_of(service).totals() == demand, 5)
        await until(lambda: not reporter.connected, 5)  # the scaler stopped: the stream ended
        async with serving_built(*build(scaler_settings(port=port))) as service:
            await until(lambda: handler_of(service).totals() == demand, 5)
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) <= 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_keda_calls_over_the_wire(scaler_server: GrpcService) -> None:
    """The generated stubs, as KEDA's Go client sends them: codes and fields on the wire."""
    async with grpc.aio.insecure_channel(address(scaler_server)) as channel:
        stub = keda_grpc.ExternalScalerStub(channel)
        ref = keda_pb.ScaledObjectRef(name="model-v2", namespace="meshserve", scalerMetadata=TRIGGER)
        spec = await stub.GetMetricSpec(ref, timeout=5)
        assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
            ("meshserve-fraud-mlp-v2", 4, 4.0)
        ]
        request = keda_pb.GetMetricsRequest(scaledObjectRef=ref, metricName="meshserve-fraud-mlp-v2")
        values = await stub.GetMetrics(request, timeout=5)
        assert [(v.metricName, v.metricValue, v.metricValueFloat) for v in values.metricValues] == [
            ("meshserve-fraud-mlp-v2", 0, 0.0)
        ]
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.IsActive(keda_pb.ScaledObjectRef(name="x"), timeout=5)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "no 'model'" in (error.value.details() or "")


def test_converters_read_kedas_fields_as_keda_does() -> None:
    specs = converters.specs_to_pb([MetricSpec("m", 0.4), MetricSpec("n", 12.6)])
    assert [(s.targetSize, s.targetSizeFloat) for s in specs.metricSpecs] == [(1, 0.4), (13, 12.6)]
    assert converters.specs_from_pb(keda_pb.GetMetricSpecResponse(metricSpecs=[keda_pb.MetricSpec(targetSize=3)])) == [
        MetricSpec("", 3.0)
    ]
    values = converters.values_to_pb([MetricValue("m", 0.5), MetricValue("m", 7.0)])
    assert [(v.metricValue, v.metricValueFloat) for v in values.metricValues] == [(1, 0.5), (7, 7.0)]
    legacy = keda_pb.GetMetricsResponse(metricValues=[keda_pb.MetricValue(metricName="m", metricValue=4)])
    assert converters.values_from_pb(legacy) == [MetricValue("m", 4.0)]
    snapshot = DemandSnapshot("g", {("m", ""): Demand(1, 2), ("m", "v2"): Demand(0, 3)})
    report = converters.snapshot_to_pb(snapshot)
    assert converters.snapshot_from_pb(report) == snapshot
    report.demand.add(model="m", subset="", in_flight=4)  # repeated entries add up
    assert converters.snapshot_from_pb(report).demand[("m", "")] == Demand(5, 2)
    assert converters.ack_from_pb(converters.ack_to_pb(ReportAck(7))) == ReportAck(7)
    assert converters.metadata_from_pb(converters.ref_to_pb({"model": "m"}, "so", "ns")) == {"model": "m"}
