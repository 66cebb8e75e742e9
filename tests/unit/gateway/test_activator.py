"""The activator against a real in-process gRPC server standing in for Envoy's model listener while the model is
scaled to zero (UNAVAILABLE "no healthy upstream" until the test flips it to serve): requests park and are all
answered once it serves, never earlier; each leaves at its own deadline, at the cap, when the queue is full or when
its caller goes; demand shows them parked and back to zero; the metrics and the `park` span count each wait."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY

import services.gateway.activator as activator_module
import services.gateway.runner as runner_module
from services.common.errors import DeadlineExceeded, MeshserveError, Unavailable
from services.common.server import Lifecycle
from services.gateway.activator import Activator, Target, is_cold
from services.gateway.admission import Admission, Priority
from services.gateway.demand import DemandTracker
from services.gateway.domain import Answer, OutputSpec, PipelineRequest
from services.gateway.forwarding import Forwarder
from services.gateway.handler import GatewayHandler
from services.gateway.pipeline import PipelineSpec
from services.gateway.runner import PipelineRunner
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import Deadline, Upstreams
from services.gateway.versions import ServingVersions
from services.model.api import ModelClient
from services.protos import inference_pb2 as pb
from services.scaler.api import Demand
from services.traces.analysis import assemble, breakdown
from services.traces.records import KIND_CLIENT, KIND_INTERNAL, KIND_SERVER, SpanRecord
from tests.unit.gateway.fake_services import ColdModelService, cold_model
from tests.unit.gateway.fakes import FakeCache, FakeFeatures, inputs, pipeline, pipeline_document, scores

PROBE_S = 0.01
OUTCOMES = ("released", "deadline", "cap", "full", "cancelled")


async def until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        await asyncio.sleep(0.002)


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Counts:
    """The park metrics of one model at one moment."""

    outcomes: dict[str, float]
    waits: float
    parked_s: float
    gauge: float

    @classmethod
    def of(cls, model: str) -> Counts:
        outcomes = {
            o: sample("meshserve_gateway_park_outcomes_total", {"model": model, "outcome": o}) for o in OUTCOMES
        }
        return cls(
            outcomes,
            sample("meshserve_gateway_parked_seconds_count", {"model": model}),
            sample("meshserve_gateway_parked_seconds_sum", {"model": model}),
            sample("meshserve_gateway_parked_requests", {"model": model}),
        )

    def since(self, before: Counts) -> dict[str, float]:
        """Outcomes counted since `before` (only those that changed)."""
        return {o: n - before.outcomes[o] for o, n in self.outcomes.items() if n != before.outcomes[o]}


@dataclass
class Rig:
    """A pipeline runner whose model calls go to the cold model over a real channel."""

    client: ModelClient
    spec: PipelineSpec = field(default_factory=pipeline)
    wait_s: float = 20.0
    park_limit: int = 1000

    def __post_init__(self) -> None:
        self.demand = DemandTracker()
        self.activator = Activator(
            self.demand, self.client, wait_s=self.wait_s, park_limit=self.park_limit, probe_interval_s=PROBE_S
        )
        log: list[str] = []
        versions = ServingVersions(60.0)
        versions.saw("m", "1")
        outputs = {"m": {"score": OutputSpec("FP32", [1])}}
        self.runner = PipelineRunner(
            self.spec,
            FakeCache(log),
            FakeFeatures(log),
            self.client,
            versions,
            None,
            outputs,
            self.demand,
            self.activator,
        )

    async def run(self, user: str = "u", deadline: Deadline | None = None, headers: Any = ()) -> Answer:
        deadline = deadline or Deadline(10.0, None)
        return await self.runner.run(inputs(user=user), 1, deadline, headers)


@asynccontextmanager
async def cold(**rig: Any) -> AsyncIterator[tuple[ColdModelService, Rig]]:
    async with cold_model() as (service, channel):
        r = Rig(ModelClient(channel), **rig)
        try:
            yield service, r
        finally:
            await r.activator.close()


def no_remedies() -> PipelineSpec:
    return pipeline(degradation={"on_model_failure": []})


def test_cold_is_envoys_no_healthy_upstream_and_nothing_else() -> None:
    assert is_cold(Unavailable("model 'm': no healthy upstream"))
    assert not is_cold(Unavailable("model 'm': connection refused"))
    assert not is_cold(MeshserveError("no healthy upstream"))  # INTERNAL: not Envoy's local reply


def test_the_settings_and_their_bounds() -> None:
    settings = GatewaySettings()
    assert (settings.cold_start_wait_s, settings.park_limit, settings.probe_interval_s) == (20.0, 1000, 0.05)
    assert GatewaySettings(cold_start_wait_s=0).cold_start_wait_s == 0
    for bad in ({"cold_start_wait_s": -1}, {"park_limit": 0}, {"probe_interval_s": 0}):
        with pytest.raises(ValueError):
            GatewaySettings(**bad)


# -- parked, then released ---------------------------------------------------------------------------------------


async def test_concurrent_requests_park_and_are_all_answered_once_a_replica_serves_none_earlier() -> None:
    async with cold() as (service, rig):
        before = Counts.of("m")
        runs = [asyncio.ensure_future(rig.run(user=f"u{i}")) for i in range(5)]
        done_at: list[float] = []
        for run in runs:
            run.add_done_callback(lambda _: done_at.append(time.monotonic()))
        await until(lambda: rig.demand.snapshot() == {("m", ""): Demand(in_flight=0, parked=5)})
        assert Counts.of("m").gauge == 5
        await until(lambda: len(service.probes) >= 3)  # the prober asked, and heard "not yet"
        assert not done_at
        flipped = time.monotonic()
        service.serving = True
        answers = await asyncio.gather(*runs)
        assert [(scores(a.outputs[0]), a.degraded, a.model_version) for a in answers] == [([0.5], None, "1")] * 5
        assert min(done_at) >= flipped
        assert rig.demand.snapshot() == {}  # every path unparks
        after = Counts.of("m")
        assert after.since(before) == {"released": 5}
        assert after.waits - before.waits == 5 and after.gauge == 0
        await until(lambda: not rig.activator._keys)  # the prober stopped with nothing parked
        request, metadata = service.probes[-1]
        assert (request.name, request.version) == ("m", "")
        assert "x-model-version" not in metadata and metadata["traceparent"].endswith("-00")  # unsampled housekeeping


async def test_a_call_that_pins_a_subset_parks_under_it_without_resending_and_is_probed_routed_alike() -> None:
    spec = pipeline(model={"name": "m", "version": "2"})
    async with cold(spec=spec) as (service, rig):
        run = asyncio.ensure_future(
            rig.run(headers=[("x-canary", "true"), ("traceparent", "00-" + "1" * 32 + "-" + "2" * 16 + "-01")])
        )
        await until(lambda: rig.demand.snapshot() == {("m", "v2"): Demand(0, 1)})
        assert len(service.infers) == 1  # no re-send: the mesh has no other subset for version 2
        await until(lambda: len(service.probes) >= 1)
        request, metadata = service.probes[0]
        assert (request.name, request.version) == ("m", "2")
        assert metadata["x-model-version"] == "2" and metadata["x-canary"] == "true"
        assert "1" * 32 not in metadata["traceparent"]  # the request's trace context is not the probe's
        service.serving = True
        answer = await run
        assert answer.model_version == "2" and answer.degraded is None
        assert rig.demand.snapshot() == {}


async def test_an_unpinned_cold_call_is_sent_again_at_once_and_served_by_the_second_try() -> None:
    async with cold() as (service, rig):
        service.serving, service.cold_infers = True, 1  # the split picked a subset at zero, then one that serves
        before = Counts.of("m")
        answer = await rig.run()
        assert answer.degraded is None and scores(answer.outputs[0]) == [0.5]
        assert len(service.infers) == 2 and service.probes == []
        assert Counts.of("m").since(before) == {}  # never parked


async def test_a_pinned_cold_call_parks_at_once_and_goes_when_the_probe_finds_it_ready() -> None:
    async with cold(spec=pipeline(model={"name": "m", "version": "2"})) as (service, rig):
        service.serving, service.cold_infers = True, 1
        before = Counts.of("m")
        answer = await rig.run()
        assert answer.degraded is None and len(service.infers) == 2 and len(service.probes) == 1
        assert Counts.of("m").since(before) == {"released": 1}


async def test_a_resend_that_finds_the_model_cold_again_parks_again_within_one_wait() -> None:
    async with cold(spec=pipeline(model={"name": "m", "version": "2"})) as (service, rig):
        before = Counts.of("m")
        run = asyncio.ensure_future(rig.run())
        await until(lambda: rig.demand.snapshot() == {("m", "v2"): Demand(0, 1)})
        service.cold_infers = 1  # ready says yes, but the next call still finds no endpoint
        service.serving = True
        answer = await run
        assert answer.degraded is None and len(service.infers) == 3
        assert Counts.of("m").since(before) == {"released": 2}


# -- leaving without a replica ------------------------------------------------------------------------------------


async def test_a_deadline_shorter_than_the_wait_ends_the_park_at_the_deadline_with_deadline_exceeded() -> None:
    async with cold() as (_service, rig):  # every remedy configured: none answers for a request out of time
        before = Counts.of("m")
        deadline = Deadline(10.0, 0.3)  # the caller's deadline: 0.3 s
        with pytest.raises(MeshserveError) as caught:
            await rig.run(deadline=deadline)
        left = time.monotonic()
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "'m' was starting" in str(caught.value)
        assert deadline.caller_end <= left < deadline.caller_end + 0.25  # never early; at the deadline, not the cap
        assert rig.demand.snapshot() == {}
        assert Counts.of("m").since(before) == {"deadline": 1}


async def test_time_parked_is_given_back_to_the_pipeline_total_but_never_past_the_caller_s_deadline() -> None:
    async with cold() as (service, rig):
        deadline = Deadline(0.3, 5.0)  # the pipeline's total is shorter than the cold start; the caller waits 5 s
        run = asyncio.ensure_future(rig.run(deadline=deadline))
        await asyncio.sleep(0.5)  # longer than the pipeline's total, parked all along
        assert not run.done()
        service.serving = True
        answer = await run
        assert answer.degraded is None and answer.model_version == "1"
        assert deadline.end <= deadline.caller_end
        assert Deadline(0.3, None).caller_end == float("inf")


async def test_the_cap_ends_the_park_with_unavailable_saying_the_model_is_starting() -> None:
    async with cold(spec=no_remedies(), wait_s=0.3) as (_service, rig):
        before = Counts.of("m")
        start = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            await rig.run()
        assert time.monotonic() - start >= 0.3
        assert str(caught.value) == "model 'm' is starting (no replica has served it for 0.3 s); retry"
        assert rig.demand.snapshot() == {}
        assert Counts.of("m").since(before) == {"cap": 1}


async def test_at_the_cap_the_pipelines_remedies_answer_marked_cold_start() -> None:
    async with cold(wait_s=0.2) as (service, rig):
        start = time.monotonic()
        answer = await rig.run()
        assert time.monotonic() - start >= 0.2  # never a remedy while parked
        assert (answer.degraded, answer.model_version, answer.default_decision) == (
            "cold_start:default",
            "default",
            "review",
        )
        assert "has served it for 0.2 s" in (answer.degraded_detail or "")
        fallback = [r for r in service.infers if r.model_version == "2"]
        assert len(fallback) == 1  # the fallback (cold too) was tried once, not parked


async def test_beyond_the_park_limit_unavailable_says_the_queue_is_full_and_parked_requests_hold_no_admission() -> None:
    async with cold_model() as (service, channel):
        client = ModelClient(channel)
        demand = DemandTracker()
        activator = Activator(demand, client, park_limit=2, probe_interval_s=PROBE_S)
        admission = Admission(total_cap=2, min_limit=1, low_priority_share=0.5, retry_after_ms=50)
        forwarder = Forwarder(client, admission, ["p"], public=["m"], demand=demand, activator=activator)
        request = pb.ModelInferRequest(model_name="m")
        before = Counts.of("m")
        parked = [asyncio.ensure_future(forwarder.model_infer(request, Priority.HIGH, 10.0, [])) for _ in range(2)]
        await until(lambda: demand.snapshot() == {("m", ""): Demand(0, 2)})
        assert admission.total_inflight == 0  # parked requests wait outside the gateway's capacity
        with pytest.raises(Unavailable) as caught:  # admitted (not RESOURCE_EXHAUSTED), then refused: queue full
            await forwarder.model_infer(request, Priority.HIGH, 10.0, [])
        assert "'m' is starting and its queue is full" in str(caught.value)
        service.serving = True
        answers = await asyncio.gather(*parked)
        assert [a.model_name for a in answers] == ["m", "m"]
        assert admission.total_inflight == 0 and demand.snapshot() == {}
        assert Counts.of("m").since(before) == {"full": 1, "released": 2}
        await activator.close()


async def test_a_cancelled_caller_leaves_the_queue_at_once() -> None:
    async with cold() as (_service, rig):
        forwarder = Forwarder(
            rig.client,
            Admission(total_cap=8, min_limit=1, low_priority_share=0.5, retry_after_ms=50),
            ["p"],
            public=["m"],
            demand=rig.demand,
            activator=rig.activator,
        )
        before = Counts.of("m")
        call = asyncio.ensure_future(
            forwarder.model_infer(pb.ModelInferRequest(model_name="m"), Priority.NORMAL, None, [])
        )
        run = asyncio.ensure_future(rig.run())
        await until(lambda: rig.demand.snapshot() == {("m", ""): Demand(0, 2)})
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        assert rig.demand.snapshot() == {("m", ""): Demand(0, 1)}
        run.cancel()  # the pipeline request's shared computation goes with its last caller
        await asyncio.gather(run, return_exceptions=True)
        await until(lambda: rig.demand.snapshot() == {})
        assert Counts.of("m").since(before) == {"cancelled": 2}
        await until(lambda: not rig.activator._keys)


async def test_the_gateway_parks_by_its_settings_and_parked_requests_leave_the_pipelines_slots_free(
    tmp_path: Path,
) -> None:
    (tmp_path / "p.yaml").write_text(
        yaml.safe_dump(pipeline_document(admission={"max_inflight": 1}, timeouts={"total_ms": 10000}))
    )
    settings = GatewaySettings(
        port=0, metrics_port=0, pipelines_dir=tmp_path, cold_start_wait_s=5.0, park_limit=7, probe_interval_s=PROBE_S
    )
    async with cold_model() as (service, channel):
        log: list[str] = []
        upstreams = Upstreams(cache=FakeCache(log), feature=FakeFeatures(log), model=ModelClient(channel))  # type: ignore[arg-type]
        lifecycle = Lifecycle()
        lifecycle.ready = True
        handler = GatewayHandler(settings, lifecycle, upstreams)
        assert (handler.activator.wait_s, handler.activator.park_limit) == (5.0, 7)
        assert handler.runners["p"].activator is handler.activator is handler.forwarder.activator
        runs = []
        for i in range(3):  # each arrives once the one before is parked: the pipeline admits one at a time
            request = PipelineRequest(pipeline="p", inputs=inputs(user=f"u{i}"))  # type: ignore[arg-type]
            runs.append(asyncio.ensure_future(handler.infer(request, None, ())))
            await until(lambda n=i + 1: handler.demand.snapshot() == {("m", ""): Demand(0, n)})
        service.serving = True
        responses = await asyncio.gather(*runs)
        assert [(r.degraded, r.model_version) for r in responses] == [(None, "1")] * 3
        assert handler.admission.pools["p"].inflight == 0 and handler.demand.snapshot() == {}
        await handler.close()


# -- waiting off --------------------------------------------------------------------------------------------------


async def test_waiting_off_answers_with_the_pipelines_remedy_at_once_marked_cold_start() -> None:
    async with cold(wait_s=0.0) as (service, rig):
        before = Counts.of("m")
        answer = await rig.run()
        assert answer.degraded == "cold_start:default"
        assert "'m' is starting" in (answer.degraded_detail or "")
        assert service.probes == [] and Counts.of("m").since(before) == {}


async def test_waiting_off_without_a_remedy_is_unavailable_saying_the_model_is_starting() -> None:
    async with cold(spec=no_remedies(), wait_s=0.0) as (service, rig):
        with pytest.raises(Unavailable, match="model 'm' is starting"):
            await rig.run()
        assert len(service.infers) == 3  # the first call and its two re-sends, then no wait


# -- the trace --------------------------------------------------------------------------------------------------


def record(span: ReadableSpan) -> SpanRecord:
    kinds = {trace.SpanKind.SERVER: KIND_SERVER, trace.SpanKind.CLIENT: KIND_CLIENT}
    assert span.context is not None and span.start_time is not None and span.end_time is not None
    return SpanRecord(
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
        f"{span.parent.span_id:016x}" if span.parent else "",
        "gateway",
        span.name,
        kinds.get(span.kind, KIND_INTERNAL),
        span.start_time,
        span.end_time,
        attributes=dict(span.attributes or {}),
    )


async def test_each_wait_is_a_park_span_under_the_model_span_and_the_hotspot_report_counts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("meshserve.gateway")
    monkeypatch.setattr(activator_module, "tracer", tracer)
    monkeypatch.setattr(runner_module, "tracer", tracer)
    async with cold(spec=pipeline(model={"name": "m", "version": "2"})) as (service, rig):
        with tracer.start_as_current_span("inference.GRPCInferenceService/ModelInfer", kind=trace.SpanKind.SERVER):
            run = asyncio.ensure_future(rig.run())
            await until(lambda: len(service.probes) >= 5)
            service.serving = True
            await run
    spans = exporter.get_finished_spans()
    (park,) = [s for s in spans if s.name == "park"]
    (model,) = [s for s in spans if s.name == "model"]
    assert park.parent is not None and park.parent.span_id == model.context.span_id
    attributes = dict(park.attributes or {})
    assert (attributes["model"], attributes["subset"], attributes["outcome"]) == ("m", "v2", "released")
    assert attributes["parked_ms"] >= PROBE_S * 5 * 1e3
    result = breakdown(assemble(record(s) for s in spans))
    stages = {s.stage: s for s in result.stages}
    assert "gateway.park" in stages and result.hotspot is not None and result.hotspot.stage == "gateway.park"
    assert stages["gateway.model"].self_p50_ns < stages["gateway.park"].self_p50_ns


def test_a_target_names_its_subset_from_its_routing() -> None:
    assert Target("m").subset == ""
    assert Target("m", "2", (("x-model-version", "2"),)).subset == "v2"
    assert (
        Target("m", "2", (("x-canary", "true"), ("x-model-version", "2"))).subset == "v2"
    )  # as demand.enter counts it
    assert Target("m", "", (("x-canary", "true"),)).describe() == "model 'm' (subset canary)"


async def test_a_pipeline_s_metadata_wakes_its_model_at_zero_and_waits_for_it(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(pipeline_document()))
    settings = GatewaySettings(
        port=0, metrics_port=0, pipelines_dir=tmp_path, cold_start_wait_s=5.0, probe_interval_s=PROBE_S
    )
    async with cold_model() as (service, channel):
        log: list[str] = []
        upstreams = Upstreams(cache=FakeCache(log), feature=FakeFeatures(log), model=ModelClient(channel))  # type: ignore[arg-type]
        handler = GatewayHandler(settings, Lifecycle(), upstreams)
        try:
            with pytest.raises(DeadlineExceeded):  # a client's first call: parked, here past its own deadline
                await handler.describe("p", 0.2)
            described = asyncio.ensure_future(handler.describe("p", 5.0))
            await until(lambda: handler.demand.snapshot() == {("m", ""): Demand(0, 1)})  # its demand wakes the model
            service.serving = True
            spec, outputs = await described
            assert spec.name == "p" and outputs["score"].datatype == "FP32"
            assert handler.demand.snapshot() == {}
        finally:
            await handler.close()
