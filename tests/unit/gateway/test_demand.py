"""The gateway's demand: the tracker counts model calls in flight (where the runner and the forwarder call a model)
and parked requests per model and mesh subset, and its reporter brings them to a real scaler service on loopback,
in this process; with no scaler address there is no reporter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from services.common.server import GrpcService
from services.gateway.admission import Admission, Priority
from services.gateway.demand import CANARY_SUBSET, DemandTracker, demand_reporter, gateway_id, subset_of
from services.gateway.forwarding import Forwarder
from services.gateway.runner import PipelineRunner
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import Deadline
from services.gateway.versions import ServingVersions
from services.protos import inference_pb2 as pb
from services.scaler.__main__ import build
from services.scaler.api import Demand
from services.scaler.handler import ScalerHandler
from tests.helpers.inprocess import serving_built
from tests.unit.gateway.fakes import FakeCache, FakeFeatures, FakeModel, inputs, pipeline


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        await asyncio.sleep(0.005)


def test_the_subset_is_what_the_call_pins() -> None:
    assert subset_of("2", ()) == "v2"
    assert subset_of("", [("x-model-version", "1")]) == "v1"
    assert subset_of("", [("traceparent", "00-x"), ("x-canary", "true")]) == CANARY_SUBSET == "canary"
    assert subset_of("", [("x-canary", "false")]) == ""
    assert subset_of("", ()) == ""  # the mesh picks (its weighted split)


async def test_the_tracker_counts_in_flight_and_parked_and_drops_keys_at_zero() -> None:
    tracker = DemandTracker()
    assert not tracker.changed.is_set()
    a = tracker.enter("m", "", ())
    b = tracker.enter("m", "", ())
    c = tracker.enter("m", "2", ())
    parked = tracker.park("m", "v2")
    assert tracker.changed.is_set()
    assert tracker.snapshot() == {("m", ""): Demand(2, 0), ("m", "v2"): Demand(1, 1)}
    tracker.changed.clear()
    tracker.leave(a)
    tracker.leave(c)
    assert tracker.changed.is_set()
    assert tracker.snapshot() == {("m", ""): Demand(1, 0), ("m", "v2"): Demand(0, 1)}
    tracker.unpark(parked)
    tracker.leave(b)
    assert tracker.snapshot() == {} and tracker._counts == {}  # nothing kept for keys with no demand
    tracker.unpark(tracker.park("n", ""))
    tracker.leave(("n", ""))  # an extra leave never goes below zero
    assert tracker.snapshot() == {}


def test_a_report_counts_the_calls_that_came_and_went_since_the_previous_one() -> None:
    tracker = DemandTracker()
    keys = [tracker.enter("m", "", ()) for _ in range(3)]  # three at once
    for key in keys:
        tracker.leave(key)
    tracker.leave(tracker.enter("m", "2", ()))  # one alone, as short as most calls
    parked = tracker.park("m", "")
    assert tracker.snapshot() == {("m", ""): Demand(0, 1)}  # now: nothing in flight
    assert tracker.report() == {("m", ""): Demand(3, 1), ("m", "v2"): Demand(1, 0)}  # since the last report
    assert tracker.report() == {("m", ""): Demand(0, 1)}  # the peaks start again from what is in flight now
    still = tracker.enter("m", "", ())
    tracker.unpark(parked)
    assert tracker.report() == {("m", ""): Demand(1, 0)}
    tracker.leave(still)
    assert tracker.report() == {}  # it was reported while in flight; nothing since


async def test_the_runner_counts_its_model_call_while_it_is_in_flight() -> None:
    log: list[str] = []
    model = FakeModel(log)
    model.gate = asyncio.Event()
    tracker = DemandTracker()
    spec = pipeline(model={"name": "m", "version": "2"})
    runner = PipelineRunner(spec, FakeCache(log), FakeFeatures(log), model, ServingVersions(60.0), demand=tracker)
    runs = [
        asyncio.ensure_future(runner.run(inputs(user=f"u{i}", amount=float(i)), 1, Deadline(5.0, None), ()))
        for i in range(3)
    ]
    await until(lambda: tracker.snapshot() == {("m", "v2"): Demand(3, 0)})
    model.gate.set()
    await asyncio.gather(*runs)
    assert tracker.snapshot() == {}


class HeldModel:
    """ModelClient's model_infer, answering once `gate` is set."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def model_infer(
        self, request: pb.ModelInferRequest, *, timeout_s: float, metadata: Sequence[tuple[str, str]]
    ) -> pb.ModelInferResponse:
        await self.gate.wait()
        return pb.ModelInferResponse(model_name=request.model_name)


async def test_the_forwarder_counts_forwarded_infers_under_the_subset_the_headers_pin() -> None:
    model = HeldModel()
    tracker = DemandTracker()
    admission = Admission(total_cap=8, min_limit=1, low_priority_share=0.5, retry_after_ms=50)
    forwarder = Forwarder(model, admission, ["p"], public=["m"], demand=tracker)  # type: ignore[arg-type]
    request = pb.ModelInferRequest(model_name="m", model_version="7")  # the mesh does not route on the message
    calls = [
        asyncio.ensure_future(forwarder.model_infer(request, Priority.NORMAL, 5.0, [("x-canary", "true")])),
        asyncio.ensure_future(forwarder.model_infer(request, Priority.NORMAL, 5.0, [])),
    ]
    await until(lambda: tracker.snapshot() == {("m", "canary"): Demand(1, 0), ("m", ""): Demand(1, 0)})
    model.gate.set()
    await asyncio.gather(*calls)
    assert tracker.snapshot() == {}


def test_no_scaler_address_no_reporter() -> None:
    tracker = DemandTracker()
    assert GatewaySettings().scaler_address == ""
    assert demand_reporter(GatewaySettings(), tracker) is None
    reporter = demand_reporter(GatewaySettings(scaler_address="meshserve-scaler:8005"), tracker)
    assert reporter is not None and reporter.target == "meshserve-scaler:8005"
    assert reporter.gateway == gateway_id() and reporter.changed is tracker.changed


@pytest.fixture()
async def scaler() -> AsyncIterator[GrpcService]:
    from tests.unit.scaler.conftest import scaler_settings

    async with serving_built(*build(scaler_settings())) as service:
        yield service


async def test_the_gateways_demand_reaches_the_scaler_as_it_changes(scaler: GrpcService) -> None:
    handler: ScalerHandler = scaler.handler  # type: ignore[attr-defined]
    tracker = DemandTracker()
    settings: Any = GatewaySettings(scaler_address=f"127.0.0.1:{scaler.port}")
    reporter = demand_reporter(settings, tracker)
    assert reporter is not None
    task = asyncio.ensure_future(reporter.run())
    try:
        await until(lambda: handler.gateways() == [gateway_id()])
        key = tracker.enter("fraud_mlp", "", [("x-canary", "true")])
        await until(lambda: handler.is_active({"model": "fraud_mlp", "subset": "canary"}), 1)
        parked = tracker.park("fraud_mlp", "v2")
        await until(lambda: handler.demand(handler.target({"model": "fraud_mlp"})) == 2, 1)
        tracker.leave(key)
        tracker.unpark(parked)
        await until(lambda: handler.totals() == {}, 1)
        flips: list[bool] = []

        async def watch() -> None:
            async for active in handler.watch_active({"model": "fraud_mlp"}):
                flips.append(active)

        watcher = asyncio.ensure_future(watch())
        await until(lambda: flips == [False], 1)
        tracker.leave(tracker.enter("fraud_mlp", "", ()))  # a call over before the reporter wakes still counts
        await until(lambda: flips[:2] == [False, True], 1)
        await until(lambda: handler.totals() == {}, 1)
        watcher.cancel()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await until(lambda: handler.gateways() == [], 2)  # the stream ended with the task: forgotten
