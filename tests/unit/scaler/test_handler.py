"""ScalerHandler in domain types: demand summed over gateways per model and subset, a gateway's demand forgotten when
its stream ends or falls silent, activity pushed the moment it flips, the trigger metadata checked key by key, and
the metric named as an HPA accepts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from prometheus_client import REGISTRY

from services.common.errors import InvalidArgument, NotFound, Unavailable
from services.scaler import metrics
from services.scaler.domain import Demand, DemandSnapshot, MetricSpec, MetricValue, ScaledTarget, metric_name
from services.scaler.handler import ScalerHandler
from tests.unit.scaler.conftest import Feed, scaler_settings, snapshot

FRAUD = {"model": "fraud_mlp", "scalerAddress": "meshserve-scaler:8005"}  # KEDA passes scalerAddress along
FRAUD_V2 = {**FRAUD, "subset": "v2"}


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def forgotten(reason: str) -> float:
    return sample("meshserve_scaler_gateways_forgotten_total", reason=reason)


async def no_reports() -> AsyncIterator[DemandSnapshot]:
    return
    yield


async def test_demand_is_in_flight_plus_parked_summed_over_gateways(handler: ScalerHandler) -> None:
    a, b = Feed(handler), Feed(handler)
    await a.send(snapshot("a", fraud_mlp=(2, 0), fraud_mlp__v2=(1, 1), digits=(3, 0)))
    await b.send(snapshot("b", fraud_mlp__v2=(0, 4)))
    assert handler.totals() == {
        ("fraud_mlp", ""): Demand(2, 0),
        ("fraud_mlp", "v2"): Demand(1, 5),
        ("digits", ""): Demand(3, 0),
    }
    assert handler.demand(handler.target(FRAUD_V2)) == 6
    assert handler.demand(handler.target(FRAUD)) == 8  # no subset: every subset of the model
    assert handler.demand(handler.target({**FRAUD, "subset": " "})) == 8  # blank is absent
    assert handler.demand(handler.target({"model": "other"})) == 0
    assert handler.is_active(FRAUD_V2) and not handler.is_active({"model": "other"})
    assert handler.metrics(FRAUD_V2, "meshserve-fraud-mlp-v2") == [MetricValue("meshserve-fraud-mlp-v2", 6.0)]
    assert sample("meshserve_scaler_demand", model="fraud_mlp", subset="v2", state="parked") == 5
    assert sample("meshserve_scaler_gateways") == 2
    assert handler.gateways() == ["a", "b"]
    await a.end()
    await b.end()


async def test_each_report_replaces_the_gateways_snapshot(handler: ScalerHandler) -> None:
    feed = Feed(handler)
    await feed.send(snapshot("a", fraud_mlp=(2, 0), digits=(1, 0)))
    await feed.send(snapshot("a", digits=(0, 1)))  # fraud_mlp left out: it has none now
    assert handler.totals() == {("digits", ""): Demand(0, 1)}
    await feed.send(snapshot("a", digits=(0, 0)))  # zeros are no demand
    assert handler.totals() == {}
    await feed.end()
    assert feed.task.result().reports == 3


async def test_a_gateway_whose_stream_ends_is_forgotten(handler: ScalerHandler) -> None:
    a, b = Feed(handler), Feed(handler)
    await a.send(snapshot("a", fraud_mlp=(2, 0)))
    await b.send(snapshot("b", fraud_mlp=(1, 0)))
    before = forgotten("closed")
    await a.end()
    assert handler.totals() == {("fraud_mlp", ""): Demand(1, 0)}
    assert handler.gateways() == ["b"] and forgotten("closed") == before + 1
    await b.end()
    assert handler.totals() == {} and handler.gateways() == []


async def test_a_reconnected_gateway_replaces_its_old_stream_whose_end_then_forgets_nothing(
    handler: ScalerHandler,
) -> None:
    old, new = Feed(handler), Feed(handler)
    await old.send(snapshot("a", fraud_mlp=(5, 0)))
    await new.send(snapshot("a", fraud_mlp=(1, 0)))  # the same gateway on a new stream: replaces, never adds
    assert handler.totals() == {("fraud_mlp", ""): Demand(1, 0)}
    await old.end()  # the old stream's end (a half-open connection noticed late) keeps the new snapshot
    assert handler.totals() == {("fraud_mlp", ""): Demand(1, 0)}
    await new.end()
    assert handler.totals() == {}


async def test_a_silent_gateway_is_forgotten_after_stale_after_s() -> None:
    handler = ScalerHandler(scaler_settings(stale_after_s=0.1))
    feed = Feed(handler)
    before = forgotten("stale")
    start = time.monotonic()
    await feed.send(snapshot("a", fraud_mlp=(3, 0)))
    assert handler.is_active(FRAUD)
    ack = await asyncio.wait_for(feed.task, 5)  # the stream ends: the gateway reconnects
    assert 0.1 <= time.monotonic() - start < 2.0
    assert ack.reports == 1 and handler.totals() == {} and not handler.is_active(FRAUD)
    assert forgotten("stale") == before + 1
    await handler.close()


async def test_heartbeats_keep_a_gateway_alive_past_stale_after_s() -> None:
    handler = ScalerHandler(scaler_settings(stale_after_s=0.2))
    feed = Feed(handler)
    for _ in range(8):  # 0.4 s of reports every 0.05 s, nothing changing
        await feed.send(snapshot("a", fraud_mlp=(1, 0)))
        await asyncio.sleep(0.05)
    assert not feed.task.done() and handler.totals() == {("fraud_mlp", ""): Demand(1, 0)}
    await feed.end()
    await handler.close()


async def test_stream_is_active_sends_the_state_at_once_then_every_flip_at_once(handler: ScalerHandler) -> None:
    stream = handler.watch_active(FRAUD_V2)
    assert await asyncio.wait_for(anext(stream), 1) is False
    feed = Feed(handler)
    flips: list[tuple[bool, float]] = []

    async def read() -> None:
        async for active in stream:
            flips.append((active, time.monotonic()))

    reader = asyncio.ensure_future(read())
    await asyncio.sleep(0)
    assert metrics.WATCHERS._value.get() >= 1
    sent = time.monotonic()
    await feed.send(snapshot("g", fraud_mlp__v2=(0, 1)))  # a request parks: active
    await feed.send(snapshot("g", fraud_mlp__v2=(3, 1)))  # more demand: no flip, nothing sent
    await feed.send(snapshot("g", fraud_mlp=(3, 0)))  # another subset only: inactive for v2
    await feed.send(snapshot("g", fraud_mlp__v2=(1, 0)))  # active again
    await feed.end()  # the gateway is gone: inactive
    for _ in range(50):
        if len(flips) == 4:
            break
        await asyncio.sleep(0.01)
    assert [active for active, _ in flips] == [True, False, True, False]
    assert flips[0][1] - sent < 0.05  # pushed at once: no poll interval
    await handler.close()  # draining ends the stream
    await asyncio.wait_for(reader, 1)


async def test_draining_ends_every_stream_and_refuses_new_reports(handler: ScalerHandler) -> None:
    feed = Feed(handler)
    await feed.send(snapshot("a", fraud_mlp=(1, 0)))
    stream = handler.watch_active(FRAUD)
    assert await anext(stream) is True
    before = forgotten("draining")
    handler.drain()
    assert (await asyncio.wait_for(feed.task, 1)).reports == 1
    assert [a async for a in stream] == []
    assert forgotten("draining") == before + 1 and handler.totals() == {}
    with pytest.raises(Unavailable, match="draining"):
        await handler.report(no_reports())
    assert [a async for a in handler.watch_active(FRAUD)] == []  # a late watcher: ended at once (KEDA retries)


async def test_draining_serves_on_through_the_shutdown_delay() -> None:
    handler = ScalerHandler(scaler_settings(shutdown_delay_s=0.2))
    feed = Feed(handler)
    await feed.send(snapshot("a", fraud_mlp=(1, 0)))
    handler.drain()
    await asyncio.sleep(0.1)
    assert not feed.task.done() and handler.is_active(FRAUD)
    await asyncio.wait_for(feed.task, 1)
    assert handler.totals() == {}


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({}, "no 'model'"),
        ({"model": "  ", "subset": "v2"}, "no 'model'"),
        ({"model": "m", "targetPerReplica": "many"}, "'targetPerReplica' must be a number above 0 .got 'many'"),
        ({"model": "m", "targetPerReplica": "0"}, "'targetPerReplica' must be a number above 0"),
        ({"model": "m", "targetPerReplica": "nan"}, "'targetPerReplica' must be a number above 0"),
        ({"model": "m", "targetPerReplica": "inf"}, "'targetPerReplica' must be a number above 0"),
    ],
)
async def test_trigger_metadata_is_checked_key_by_key(
    handler: ScalerHandler, metadata: dict[str, str], message: str
) -> None:
    for call in (handler.is_active, handler.metric_spec, lambda m: handler.metrics(m, "x")):
        with pytest.raises(InvalidArgument, match=message):
            call(metadata)
    with pytest.raises(InvalidArgument, match=message):
        await anext(handler.watch_active(metadata))


async def test_the_metric_spec_names_the_metric_and_its_target(handler: ScalerHandler) -> None:
    assert handler.target(FRAUD_V2) == ScaledTarget("fraud_mlp", "v2", 8.0)  # the settings' default target
    assert handler.metric_spec(FRAUD_V2) == [MetricSpec("meshserve-fraud-mlp-v2", 8.0)]
    assert handler.metric_spec({**FRAUD, "targetPerReplica": " 2.5 "}) == [MetricSpec("meshserve-fraud-mlp", 2.5)]
    with pytest.raises(NotFound, match="its metric is 'meshserve-fraud-mlp-v2'"):
        handler.metrics(FRAUD_V2, "s0-meshserve-fraud-mlp-v2")  # KEDA strips its sN- prefix before asking


def test_metric_names_are_what_an_hpa_accepts() -> None:
    assert metric_name("fraud_mlp", None) == "meshserve-fraud-mlp"
    assert metric_name("fraud_mlp", "") == "meshserve-fraud-mlp"
    assert metric_name("fraud_mlp", "v2") == "meshserve-fraud-mlp-v2"
    assert metric_name("Fraud.MLP/x", "__canary__") == "meshserve-fraud-mlp-x-canary"
    assert metric_name("_", "%") == "meshserve"
    assert ScaledTarget("a b", None, 1.0).metric_name == "meshserve-a-b"


@pytest.mark.parametrize(
    ("reports", "message"),
    [
        ([DemandSnapshot("")], "names its gateway"),
        ([DemandSnapshot("x" * 257)], "names its gateway"),
        ([DemandSnapshot("a"), DemandSnapshot("b")], "the gateway id changed"),
        ([DemandSnapshot("a", {("", "v1"): Demand(1, 0)})], "names its model"),
    ],
)
async def test_a_report_stream_is_checked(handler: ScalerHandler, reports: list[DemandSnapshot], message: str) -> None:
    feed = Feed(handler)
    for report in reports:
        await feed.send(report)
    with pytest.raises(InvalidArgument, match=message):
        await asyncio.wait_for(feed.task, 1)
    assert handler.totals() == {} and handler.gateways() == []
