"""The gateway's domain handler: pipelines answered as v2 models, in domain types; its parts do the work.

A pipeline request is checked against its pipeline, admitted (a refused request costs microseconds), run by
the pipeline's runner and counted (Prometheus metrics, Triton-style statistics). Model names that are not
pipelines go to `forwarder` (protobuf pass-through); versions, warm-up, the near cache's watch and the demand
reports to the scaler run beside. On a two-tier deployment (`tier` edge or cloud) each pipeline request is placed
by its data class first (services/gateway/placement.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from functools import partial

import grpc
import numpy as np
from opentelemetry import trace

from services.common.errors import DeadlineExceeded, InvalidArgument, MeshserveError, NotFound, Unavailable
from services.common.metrics import trace_exemplar
from services.common.recording import DEGRADED, PIPELINE
from services.common.server import Lifecycle
from services.common.tensor_codec import decode_raw_inputs
from services.gateway import metrics
from services.gateway.activator import Activator, ColdStart, Target
from services.gateway.admission import Admission, Permit
from services.gateway.cloud import CloudClient, PipelineCloud
from services.gateway.degradation import MODEL_FAILURES
from services.gateway.demand import DemandTracker, demand_reporter
from services.gateway.domain import PIPELINE_VERSION, Answer, OutputSpec, PipelineRequest, PipelineResponse
from services.gateway.forwarding import Forwarder
from services.gateway.inputs import check_inputs, check_wire
from services.gateway.near import near_cache
from services.gateway.pipeline import DataClass, PipelineSpec, load_pipelines
from services.gateway.pipeline_stats import PipelineStats, Statistics
from services.gateway.placement import (
    SENSITIVE,
    Route,
    claimed_class,
    classify,
    decide,
    fill_withheld,
    refuse_at_cloud,
    with_class_headers,
)
from services.gateway.runner import PipelineRunner
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import UNTRACED, Deadline, Headers, Upstreams
from services.gateway.versions import METADATA_TIMEOUT_S, ServingVersions, VersionRefresher
from services.model.api import ModelInfo

log = logging.getLogger(__name__)
WAKE_TIMEOUT_S = 30.0  # a pipeline's metadata waits for a replica of its model at most this long (and its cap)
# Errors that say the pipeline's upstreams are overloaded: the adaptive limit backs off at once.
_DROPS = (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED)
OVERLOAD_CAUSES = frozenset({MODEL_FAILURES[grpc.StatusCode.RESOURCE_EXHAUSTED]})  # degraded causes that are load


class GatewayHandler:
    """Everything the gateway's RPCs do. Build it inside the running event loop.

    `upstreams` defaults to channels opened from the settings, and `cloud` (an edge-tier gateway's client to the
    cloud tier, opened only when some pipeline sends general requests there) to one from the settings; tests pass
    clients of their own.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        lifecycle: Lifecycle,
        upstreams: Upstreams | None = None,
        cloud: CloudClient | None = None,
    ) -> None:
        self.settings = settings
        self.lifecycle = lifecycle
        self.tier = settings.tier
        self.pipelines: dict[str, PipelineSpec] = load_pipelines(settings.pipelines_dir)
        self.up = Upstreams.connect(settings) if upstreams is None else upstreams
        self.cloud = self._cloud_client(cloud)
        self.versions = ServingVersions(settings.versions_ttl_s)
        models = {spec.model.name for spec in self.pipelines.values()}
        self.refresher = VersionRefresher(self.up.model, models, self.versions, settings.versions_refresh_s, UNTRACED)
        self.admission = self._admission(settings)
        self.meters = {name: metrics.PipelineMeters(name) for name in self.pipelines}
        self.near, self.near_watch = near_cache(settings, self.up.cache)
        self.demand = DemandTracker()  # model calls in flight, reported to the scaler when there is one
        self.demand_reporter = demand_reporter(settings, self.demand, UNTRACED)
        self.activator = Activator(  # parks requests while their model has no serving replica
            self.demand,
            self.up.model,
            wait_s=settings.cold_start_wait_s,
            park_limit=settings.park_limit,
            probe_interval_s=settings.probe_interval_s,
        )
        self.runners = {
            name: PipelineRunner(
                spec,
                self.up.cache,
                self.up.feature,
                self.up.model,
                self.versions,
                self.near,
                self.refresher.outputs,
                self.demand,
                self.activator,
                self._cloud_of(spec),
            )
            for name, spec in self.pipelines.items()
        }
        self.stats = Statistics(self.pipelines)
        self.forwarder = Forwarder(
            self.up.model,
            self.admission,
            self.pipelines.keys(),
            settings.public_models,
            settings.admin_token.get_secret_value(),
            settings.jwks,
            settings.model_operator_token(),
            self.demand,
            self.activator,
        )
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle -----------------------------------------------------------------------------------------

    def _admission(self, settings: GatewaySettings) -> Admission:
        """Admission with a pool per pipeline, whose in-flight count and limit are read when /metrics is scraped
        (not set on every request)."""
        admission = Admission(
            settings.max_inflight, settings.min_limit, settings.low_priority_share, settings.retry_after_ms
        )
        for name, spec in self.pipelines.items():
            admission.add_pool(name, spec.admission.max_inflight, spec.admission.adaptive)
            pool = admission.pools[name]
            metrics.INFLIGHT.labels(name).set_function(partial(getattr, pool, "inflight"))
            metrics.LIMIT.labels(name).set_function(pool.current_limit)
        return admission

    async def start(self) -> None:
        """Connect to every upstream and learn each pipeline model's outputs and versions (best effort, so the
        first requests do not pay for connection set-up inside their tight stage budgets), then keep fresh."""
        feature_sets = sorted({s.features.feature_set for s in self.pipelines.values() if s.features is not None})
        await asyncio.gather(self.refresher.refresh(), self.up.warm_up(feature_sets), return_exceptions=True)
        self._tasks.append(asyncio.create_task(self.refresher.run()))
        if self.near_watch is not None:
            self._tasks.append(asyncio.create_task(self.near_watch.run()))
        if self.demand_reporter is not None:
            self._tasks.append(asyncio.create_task(self.demand_reporter.run()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.activator.close()
        for runner in self.runners.values():
            await runner.drain_stores()
        await self.up.close()
        if self.cloud is not None:
            await self.cloud.close()

    def _cloud_client(self, given: CloudClient | None) -> CloudClient | None:
        """An edge-tier gateway's client to the cloud tier: `given`, else one from the settings when some pipeline
        sends general requests to the cloud (None on the other tiers)."""
        if self.tier != "edge":
            return None
        crosses = any(s.placement is not None and decide(s, "general").tier == "cloud" for s in self.pipelines.values())
        return CloudClient.connect(self.settings) if given is None and crosses else given

    def _cloud_of(self, spec: PipelineSpec) -> PipelineCloud | None:
        """The cloud upstream of one pipeline's runner (None: it never sends to the cloud)."""
        if self.cloud is None or spec.placement is None:
            return None
        return self.cloud.for_pipeline(spec.name, spec.placement.leave_edge)

    # -- server and pipeline state -------------------------------------------------------------------------

    def live(self) -> bool:
        return self.lifecycle.live

    def ready(self) -> bool:
        return self.lifecycle.ready

    def has_pipeline(self, name: str) -> bool:
        """Whether `name` is one of this gateway's pipelines (anything else is forwarded)."""
        return name in self.pipelines

    def pipeline_ready(self, name: str, version: str) -> bool:
        return self.lifecycle.ready and name in self.pipelines and version in ("", PIPELINE_VERSION)

    def _spec(self, name: str) -> PipelineSpec:
        spec = self.pipelines.get(name)
        if spec is None:
            raise NotFound(f"no pipeline {name!r} (pipelines here: {', '.join(sorted(self.pipelines)) or 'none'})")
        return spec

    async def describe(
        self, name: str, caller_remaining_s: float | None = None
    ) -> tuple[PipelineSpec, dict[str, OutputSpec]]:
        """A pipeline and its model's outputs (read from the model service now if not known yet: parked while the
        model has no serving replica, since a client's first call is often this one)."""
        spec = self._spec(name)
        if not self.refresher.outputs.get(spec.model.name):
            await self.refresher.refresh()
        if not self.refresher.outputs.get(spec.model.name):
            await self._wake(spec.model.name, caller_remaining_s)
        outputs = self.refresher.outputs.get(spec.model.name)
        if not outputs:
            raise Unavailable(f"pipeline {spec.name!r}: model {spec.model.name!r} has not answered yet; retry")
        return spec, outputs

    async def _wake(self, model: str, caller_remaining_s: float | None) -> None:
        """Describe `model` through the activator (its demand wakes a model at zero; the call waits for a replica as
        a request would) and keep what it says; a model that answers with an error leaves the outputs unknown."""

        async def send() -> ModelInfo:
            return await self.up.model.describe(model, timeout_s=METADATA_TIMEOUT_S, metadata=UNTRACED)

        try:
            info = await self.activator.call(Target(model), send, Deadline(WAKE_TIMEOUT_S, caller_remaining_s))
        except (ColdStart, DeadlineExceeded):
            raise  # the model is starting: the caller hears so (UNAVAILABLE or DEADLINE_EXCEEDED, with the wait)
        except MeshserveError as exc:
            log.debug("metadata of %s not available: %s", model, exc)
            return
        self.refresher.learn(model, info)

    def statistics(self, name: str | None = None) -> dict[str, PipelineStats]:
        """One pipeline's counters, or every pipeline's."""
        if name:
            self._spec(name)
        return self.stats.of(name)

    # -- inference -----------------------------------------------------------------------------------------

    def claimed(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> DataClass | None:
        """The data class the caller's `x-meshserve-data-class` header claims (a single-tier gateway reads none);
        a cloud-tier gateway refuses one that says sensitive with PERMISSION_DENIED, for a pipeline and for a model
        forwarded by name alike."""
        if self.tier == "single":
            return None
        claimed = claimed_class(metadata)
        if self.tier == "cloud" and claimed == SENSITIVE:
            metrics.CLOUD_REFUSED.labels("header").inc()
            refuse_at_cloud(None, {}, claimed)
        return claimed

    def _place(
        self, spec: PipelineSpec, given_inputs: dict[str, np.ndarray], claimed: DataClass | None, headers: Headers
    ) -> tuple[int, dict[str, np.ndarray], Route | None, Headers]:
        """(rows, inputs checked, where the request is answered, the headers its calls carry). An edge-tier gateway
        classifies it and marks its calls with the class; a cloud-tier one refuses a value in a sensitive input.
        Sensitive inputs a two-tier request leaves out are filled with empty values."""
        if self.tier == "single":
            rows, inputs = check_inputs(spec, given_inputs)
            return rows, inputs, None, headers
        given, withheld = fill_withheld(spec, given_inputs)
        rows, inputs = check_inputs(spec, given)
        if self.tier == "cloud":
            try:
                refuse_at_cloud(spec, inputs, claimed, withheld)
            except MeshserveError:
                metrics.CLOUD_REFUSED.labels("input").inc()
                raise
            return rows, inputs, None, headers
        data_class = classify(spec, inputs, claimed, withheld)
        route = decide(spec, data_class) if self.cloud is not None else Route(data_class, "edge")
        return rows, inputs, route, with_class_headers(headers, data_class)

    async def infer(
        self,
        request: PipelineRequest,
        caller_remaining_s: float | None,
        headers: Headers,
        claimed: DataClass | None = None,
    ) -> PipelineResponse:
        """Check, place (two tiers), admit, run and count one pipeline request; `claimed` is the class the caller's
        header claims (`claimed`).

        A request that came as raw contents and that the near cache knows byte for byte is answered before anything
        is decoded or admitted (a single-tier gateway's; see `PipelineRunner.known_hit`)."""
        spec = self._spec(request.pipeline)
        span = trace.get_current_span()  # the request's server span: what the edge's keep decision reads
        span.set_attribute(PIPELINE, spec.name)
        if request.version not in ("", PIPELINE_VERSION):
            raise NotFound(f"pipeline {spec.name!r} has only version 1 (asked for {request.version!r})")
        unknown = [n for n in request.requested_outputs if n not in spec.outputs]
        if unknown:
            raise InvalidArgument(f"pipeline {spec.name!r} has no output {unknown[0]!r} (has {spec.outputs})")
        given = request.inputs
        wire_key = digest = None
        checked = None
        if request.wire is not None:
            runner = self.runners[spec.name]
            if self.tier == "single":
                wire_key = runner.wire_key(request.wire)
                if wire_key is not None:
                    start = time.perf_counter()
                    hit = runner.known_hit(wire_key)
                    if hit is not None:
                        metrics.WIRE_HITS.labels(spec.name).inc()
                        self.meters[spec.name].requests("OK", hit.cache).inc()
                        return self._answered(spec, request, hit, request.wire[0].shape[0], start, None)
                checked = check_wire(spec, request.wire, runner.key_inputs)  # None: the general path says what is off
            if checked is None:
                given = decode_raw_inputs(request.wire)
        if checked is not None:
            rows, inputs, digest = checked
            route = None
        else:
            rows, inputs, route, headers = self._place(spec, given, claimed, headers)
        try:
            permit = self.admission.acquire(spec.name, request.priority)
        except MeshserveError:
            metrics.SHED.labels(spec.name, request.priority.name.lower()).inc()
            self.meters[spec.name].requests("RESOURCE_EXHAUSTED", "none").inc()
            raise
        start = time.perf_counter()
        answer = await self._run(
            spec, inputs, rows, permit, start, caller_remaining_s, headers, route, (wire_key, digest)
        )
        return self._answered(spec, request, answer, rows, start, route)

    def _answered(
        self,
        spec: PipelineSpec,
        request: PipelineRequest,
        answer: Answer,
        rows: int,
        start: float,
        route: Route | None,
    ) -> PipelineResponse:
        """Count an answer (latency, stages, degraded, statistics) and make it the response."""
        elapsed = time.perf_counter() - start
        if self.tier != "single":
            answer.tier = answer.tier or self.tier
        if route is not None:
            metrics.TIER_ANSWERS.labels(spec.name, answer.tier, route.data_class).inc()
        meters = self.meters[spec.name]
        meters.request_seconds.observe(elapsed, trace_exemplar())
        for stage, ms in answer.stages_ms.items():
            if stage != "total":
                meters.stage(stage).observe(ms / 1e3)
        if answer.degraded:
            metrics.DEGRADED.labels(spec.name, answer.degraded).inc()
            trace.get_current_span().set_attribute(DEGRADED, answer.degraded)
        self.stats.succeeded(spec.name, answer, rows, elapsed)
        return self._response(spec, request, answer, elapsed)

    async def _run(
        self,
        spec: PipelineSpec,
        inputs: dict[str, np.ndarray],
        rows: int,
        permit: Permit,
        start: float,
        caller_remaining_s: float | None,
        headers: Headers,
        route: Route | None = None,
        known: tuple[bytes | None, bytes | None] = (None, None),
    ) -> Answer:
        """The runner's answer, the permit released with what it says about load, every outcome counted; `known`:
        the request's wire digest and request digest when the handler has them."""
        code = "OK"
        cache = "none"
        try:
            deadline = Deadline(spec.timeouts.total_ms / 1000.0, caller_remaining_s)
            answer = await self.runners[spec.name].run(inputs, rows, deadline, headers, route, *known)
            cache = answer.cache
            # Only whole answers that did work are latency samples: a hit or a fast degraded answer (Redis down) is
            # not the pipeline's latency, and would pull the baseline down. Only an overloaded dependency is a
            # drop: a dependency that is down or stopped is what degradation answers for, not a reason to refuse.
            whole = answer.degraded is None
            overloaded = answer.degraded is not None and answer.degraded.split(":", 1)[0] in OVERLOAD_CAUSES
            permit.release(sample=answer.cache != "hit" and whole, dropped=overloaded)
            return answer
        except MeshserveError as exc:
            code = exc.code.name
            permit.release(sample=False, dropped=exc.code in _DROPS)
            self.stats.failed(spec.name, time.perf_counter() - start)
            raise
        except BaseException:
            code = "INTERNAL"
            permit.release(sample=False)
            raise
        finally:
            self.meters[spec.name].requests(code, cache).inc()

    @staticmethod
    def _response(spec: PipelineSpec, request: PipelineRequest, answer: Answer, elapsed: float) -> PipelineResponse:
        requested = request.requested_outputs
        outputs = [t for t in answer.outputs if not requested or t.name in requested]
        stages: dict[str, float] = {}
        batches: dict[str, int] = {}
        if request.debug:
            batches = dict(answer.batches)
            stages = {stage: ms for stage, ms in answer.stages_ms.items() if stage != "total"}
            total_ms = elapsed * 1e3
            inner = sum(stages.values())
            stages["total"] = total_ms
            stages["gateway"] = max(0.0, total_ms - inner)
        return PipelineResponse(
            pipeline=spec.name,
            id=request.id,
            outputs=outputs,
            model_version=answer.model_version,
            cache=answer.cache,
            degraded=answer.degraded,
            degraded_detail=answer.degraded_detail,
            default_decision=answer.default_decision,
            tier=answer.tier,
            stages_ms=stages,
            batches=batches,
        )
