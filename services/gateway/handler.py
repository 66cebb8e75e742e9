"""The gateway's domain handler: pipelines appear as v2 models; every other model name is forwarded as is.

Admission happens first (a refused request costs microseconds), then the pipeline's runner; answers
carry `model_version`, `cache`, `degraded` and, on request, per-stage times as response parameters.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from services.cache.l1 import L1Cache
from services.common.errors import InvalidArgument, MeshserveError, NotFound, Unavailable
from services.common.metrics import trace_exemplar
from services.common.server import Lifecycle
from services.common.tensor_codec import decode_request_inputs
from services.common.triton_config import MODEL_CONFIG_DATA_TYPES
from services.gateway import metrics
from services.gateway.admission import Admission, Permit, Priority, parse_priority
from services.gateway.inputs import check_inputs
from services.gateway.near import NearCacheWatch
from services.gateway.pipeline import PipelineSpec, load_pipelines
from services.gateway.runner import Answer, OutputSpec, PipelineRunner
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import Deadline, Upstreams, upstream_error
from services.gateway.versions import ServingVersions
from services.protos import cache_pb2 as cpb
from services.protos import feature_pb2 as fpb
from services.protos import inference_pb2 as pb
from services.protos import model_config_pb2 as mc

log = logging.getLogger(__name__)
SERVER_NAME = "meshserve-gateway"
SERVER_VERSION = "0.1.0"
PLATFORM = "meshserve_pipeline"
FORWARD_TIMEOUT_S = 30.0  # a forwarded call without a client deadline
# Housekeeping calls (version refresh, warm-up) carry an unsampled W3C context: the mesh must not trace them.
UNTRACED = (("traceparent", f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00"),)


@dataclass
class PipelineStats:
    """Triton-style statistics of one pipeline (for ModelStatistics and perf_analyzer)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    features_ns: int = 0
    model_ns: int = 0
    model_count: int = 0
    inferences: int = 0
    last_ms: int = 0


def _param(value: pb.InferParameter) -> str | int | bool | float | None:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


class Gateway:
    """Everything the gateway's RPCs do. Build it inside the running event loop."""

    def __init__(self, settings: GatewaySettings, lifecycle: Lifecycle) -> None:
        self.settings = settings
        self.lifecycle = lifecycle
        self.pipelines: dict[str, PipelineSpec] = load_pipelines(settings.pipelines_dir)
        self.up = Upstreams(settings)
        self.versions = ServingVersions(settings.versions_ttl_s)
        self.admission = Admission(
            settings.max_inflight, settings.min_limit, settings.low_priority_share, settings.retry_after_ms
        )
        near = L1Cache(settings.near_cache_max_bytes, settings.near_cache_ttl_s)
        self.near_watch: NearCacheWatch | None = None
        if near.max_bytes > 0 and settings.near_cache_ttl_s > 0 and settings.near_cache_watched_ttl_s > 0:
            self.near_watch = NearCacheWatch(
                near, self.up.cache.stub, settings.near_cache_watched_ttl_s, settings.near_cache_ttl_s,
                settings.watch_heartbeat_timeout_s, UNTRACED,
            )  # fmt: skip
        self.runners = {
            name: PipelineRunner(spec, self.up, self.versions, near) for name, spec in self.pipelines.items()
        }
        self.stats = {name: PipelineStats() for name in self.pipelines}
        for name, spec in self.pipelines.items():
            self.admission.add_pool(name, spec.admission.max_inflight, spec.admission.adaptive)
        self._refresher: asyncio.Task[None] | None = None
        self._watching: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect to every upstream and learn each pipeline model's outputs and versions (best effort, so the
        first requests do not pay for connection set-up inside their tight stage budgets), then keep fresh."""
        await asyncio.gather(self.refresh(), self._warm_up(), return_exceptions=True)
        self._refresher = asyncio.create_task(self._refresh_forever())
        if self.near_watch is not None:
            self._watching = asyncio.create_task(self.near_watch.run())

    async def _warm_up(self) -> None:
        """One cheap call per upstream, through the mesh when there is one (it connects both hops)."""
        calls = [self.up.cache.stub.Stats(cpb.StatsRequest(), timeout=2.0, metadata=UNTRACED)]
        for spec in self.pipelines.values():
            if spec.features is not None:
                request = fpb.GetFeatureSetRequest(feature_set=spec.features.feature_set)
                calls.append(self.up.feature.GetFeatureSet(request, timeout=2.0, metadata=UNTRACED))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                log.info("upstream not reachable yet (requests will retry the connection): %s", result)

    async def close(self) -> None:
        for task in (self._refresher, self._watching):
            if task is not None:
                task.cancel()
        for runner in self.runners.values():
            await runner.drain_stores()
        await self.up.close()

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.versions_refresh_s)
            try:
                await self.refresh()
            except Exception:  # never let the refresher die
                log.exception("refreshing model versions failed")

    async def refresh(self) -> None:
        models = {runner.spec.model.name for runner in self.runners.values()}
        results = await asyncio.gather(*(self._model_metadata(m) for m in models), return_exceptions=True)
        for model, result in zip(models, results, strict=True):
            if isinstance(result, BaseException):
                log.debug("metadata of %s not available: %s", model, result)
                continue
            for version in result.versions:
                self.versions.saw(model, version)
            outputs = {o.name: OutputSpec(o.datatype, list(o.shape[1:])) for o in result.outputs}
            for runner in self.runners.values():
                if runner.spec.model.name == model:
                    runner.model_outputs = outputs

    async def _model_metadata(self, model: str) -> pb.ModelMetadataResponse:
        request = pb.ModelMetadataRequest(name=model)
        return await self.up.model.ModelMetadata(request, timeout=2.0, metadata=UNTRACED)

    # -- inference -----------------------------------------------------------------------------------------

    async def infer(
        self,
        request: pb.ModelInferRequest,
        caller_remaining_s: float | None,
        headers: Sequence[tuple[str, str]],
    ) -> pb.ModelInferResponse:
        spec = self.pipelines.get(request.model_name)
        priority = parse_priority(_param(request.parameters["priority"]) if "priority" in request.parameters else None)
        if spec is None:
            return await self._forward_infer(request, caller_remaining_s, headers, priority)
        if request.model_version not in ("", "1"):
            raise NotFound(f"pipeline {spec.name!r} has only version 1 (asked for {request.model_version!r})")
        inputs = decode_request_inputs(request.inputs, request.raw_input_contents)
        rows, inputs = check_inputs(spec, inputs)
        requested = [o.name for o in request.outputs]
        unknown = [n for n in requested if n not in spec.outputs]
        if unknown:
            raise InvalidArgument(f"pipeline {spec.name!r} has no output {unknown[0]!r} (has {spec.outputs})")
        debug = "debug" in request.parameters and bool(_param(request.parameters["debug"]))
        try:
            permit = self.admission.acquire(spec.name, priority)
        except MeshserveError:
            metrics.SHED.labels(spec.name, priority.name.lower()).inc()
            metrics.REQUESTS.labels(spec.name, "RESOURCE_EXHAUSTED", "none").inc()
            raise
        return await self._run_pipeline(spec, request, inputs, rows, requested, debug, permit, caller_remaining_s,
                                        headers)  # fmt: skip

    async def _run_pipeline(
        self,
        spec: PipelineSpec,
        request: pb.ModelInferRequest,
        inputs: dict,
        rows: int,
        requested: list[str],
        debug: bool,
        permit: Permit,
        caller_remaining_s: float | None,
        headers: Sequence[tuple[str, str]],
    ) -> pb.ModelInferResponse:
        start = time.perf_counter()
        stats = self.stats[spec.name]
        pool = permit.pool
        metrics.INFLIGHT.labels(spec.name).set(pool.inflight)
        code = "OK"
        cache = "none"
        try:
            deadline = Deadline(spec.timeouts.total_ms / 1000.0, caller_remaining_s)
            answer = await self.runners[spec.name].run(inputs, rows, deadline, headers)
            cache = answer.cache
            permit.release(sample=answer.cache != "hit", dropped=answer.degraded is not None)
        except MeshserveError as exc:
            code = exc.code.name
            permit.release(dropped=exc.code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED))
            stats.fail_count += 1
            stats.fail_ns += int((time.perf_counter() - start) * 1e9)
            raise
        except BaseException:
            code = "INTERNAL"
            permit.release(sample=False)
            raise
        finally:
            metrics.REQUESTS.labels(spec.name, code, cache).inc()
            metrics.INFLIGHT.labels(spec.name).set(pool.inflight)
            metrics.LIMIT.labels(spec.name).set(pool.current_limit())
        elapsed = time.perf_counter() - start
        metrics.REQUEST_SECONDS.labels(spec.name).observe(elapsed, trace_exemplar())
        for stage, ms in answer.stages_ms.items():
            if stage != "total":
                metrics.STAGE_SECONDS.labels(spec.name, stage).observe(ms / 1e3)
        if answer.degraded:
            metrics.DEGRADED.labels(spec.name, answer.degraded).inc()
        self._count(stats, answer, rows, elapsed)
        return self._response(spec, request, answer, requested, debug, elapsed)

    def _count(self, stats: PipelineStats, answer: Answer, rows: int, elapsed: float) -> None:
        stats.success_count += 1
        stats.success_ns += int(elapsed * 1e9)
        stats.inferences += rows
        stats.last_ms = int(time.time() * 1000)
        if "model" in answer.stages_ms:
            stats.model_count += 1
            stats.model_ns += int(answer.stages_ms["model"] * 1e6)
            stats.features_ns += int(answer.stages_ms.get("features", 0.0) * 1e6)

    def _response(
        self,
        spec: PipelineSpec,
        request: pb.ModelInferRequest,
        answer: Answer,
        requested: list[str],
        debug: bool,
        elapsed: float,
    ) -> pb.ModelInferResponse:
        response = pb.ModelInferResponse(model_name=spec.name, model_version="1", id=request.id)
        for name, datatype, shape, raw in answer.outputs:
            if requested and name not in requested:
                continue
            response.outputs.add(name=name, datatype=datatype, shape=shape)
            response.raw_output_contents.append(raw)
        params = response.parameters
        params["model_version"].string_param = answer.model_version
        params["cache"].string_param = answer.cache
        if answer.degraded:
            params["degraded"].string_param = answer.degraded
            params["degraded_detail"].string_param = answer.degraded_detail or ""
        if debug:
            stages = answer.stages_ms
            for stage, ms in stages.items():
                if stage != "total":
                    params[f"stage_{stage}_ms"].double_param = round(ms, 4)
            total_ms = elapsed * 1e3
            params["stage_total_ms"].double_param = round(total_ms, 4)
            inner = sum(ms for stage, ms in stages.items() if stage != "total")
            params["stage_gateway_ms"].double_param = round(max(0.0, total_ms - inner), 4)
        return response

    async def _forward_infer(
        self,
        request: pb.ModelInferRequest,
        caller_remaining_s: float | None,
        headers: Sequence[tuple[str, str]],
        priority: Priority,
    ) -> pb.ModelInferResponse:
        permit = self.admission.acquire(f"model:{request.model_name}", priority)
        try:
            return await self._forward(self.up.model.ModelInfer, request, caller_remaining_s, headers)
        finally:
            permit.release(sample=False)

    async def _forward(self, method, request, caller_remaining_s: float | None, headers=()):
        """One call to the model service, the caller's deadline and headers passed on; errors keep their code."""
        timeout = FORWARD_TIMEOUT_S if caller_remaining_s is None else caller_remaining_s
        try:
            return await method(request, timeout=timeout, metadata=tuple(headers))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFound(
                    f"{exc.details()} (pipelines here: {', '.join(sorted(self.pipelines)) or 'none'})"
                ) from exc
            raise upstream_error("model service", exc) from exc

    # -- metadata ------------------------------------------------------------------------------------------

    def live(self) -> bool:
        return not self.lifecycle.draining

    def ready(self) -> bool:
        return self.lifecycle.ready

    async def model_ready(self, request: pb.ModelReadyRequest, remaining: float | None) -> bool:
        if request.name in self.pipelines:
            return self.lifecycle.ready and request.version in ("", "1")
        try:
            response = await self._forward(self.up.model.ModelReady, request, remaining)
        except MeshserveError:
            return False
        return bool(response.ready)

    async def _outputs_of(self, spec: PipelineSpec) -> dict[str, OutputSpec]:
        runner = self.runners[spec.name]
        if not runner.model_outputs:
            await self.refresh()
        if not runner.model_outputs:
            raise Unavailable(f"pipeline {spec.name!r}: model {spec.model.name!r} has not answered yet; retry")
        return runner.model_outputs

    async def metadata(self, request: pb.ModelMetadataRequest, remaining: float | None) -> pb.ModelMetadataResponse:
        spec = self.pipelines.get(request.name)
        if spec is None:
            return await self._forward(self.up.model.ModelMetadata, request, remaining)
        outputs = await self._outputs_of(spec)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=spec.name,
            versions=["1"],
            platform=PLATFORM,
            inputs=[tensor(name=i.name, datatype=i.datatype, shape=[-1, *i.dims]) for i in spec.inputs],
            outputs=[tensor(name=n, datatype=outputs[n].datatype, shape=[-1, *outputs[n].dims]) for n in spec.outputs],
        )

    async def config(self, request: pb.ModelConfigRequest, remaining: float | None) -> pb.ModelConfigResponse:
        spec = self.pipelines.get(request.name)
        if spec is None:
            return await self._forward(self.up.model.ModelConfig, request, remaining)
        outputs = await self._outputs_of(spec)
        types = MODEL_CONFIG_DATA_TYPES
        config = mc.ModelConfig(
            name=spec.name,
            platform=PLATFORM,
            backend="meshserve",
            max_batch_size=spec.max_batch_size,
            input=[mc.ModelInput(name=i.name, data_type=types[i.datatype], dims=i.dims) for i in spec.inputs],
            output=[
                mc.ModelOutput(name=n, data_type=types[outputs[n].datatype], dims=outputs[n].dims) for n in spec.outputs
            ],
        )
        config.parameters["model"].string_value = spec.model.name
        if spec.features is not None:
            config.parameters["feature_set"].string_value = spec.features.feature_set
        return pb.ModelConfigResponse(config=config)

    async def statistics(
        self, request: pb.ModelStatisticsRequest, remaining: float | None
    ) -> pb.ModelStatisticsResponse:
        if request.name and request.name not in self.pipelines:
            return await self._forward(self.up.model.ModelStatistics, request, remaining)
        names = [request.name] if request.name else sorted(self.pipelines)
        out = pb.ModelStatisticsResponse()
        for name in names:
            s = self.stats[name]
            d = pb.StatisticDuration
            out.model_stats.add(
                name=name,
                version="1",
                last_inference=s.last_ms,
                inference_count=s.inferences,
                execution_count=s.model_count,
                inference_stats=pb.InferStatistics(
                    success=d(count=s.success_count, ns=s.success_ns),
                    fail=d(count=s.fail_count, ns=s.fail_ns),
                    queue=d(count=s.success_count, ns=0),
                    compute_input=d(count=s.model_count, ns=s.features_ns),
                    compute_infer=d(count=s.model_count, ns=s.model_ns),
                    compute_output=d(count=s.model_count, ns=0),
                ),
            )
        return out

    async def repository_index(
        self, request: pb.RepositoryIndexRequest, remaining: float | None
    ) -> pb.RepositoryIndexResponse:
        index = pb.RepositoryIndexResponse.ModelIndex
        models = [index(name=n, version="1", state="READY", reason="pipeline") for n in sorted(self.pipelines)]
        try:
            upstream = await self._forward(self.up.model.RepositoryIndex, request, remaining)
            models.extend(upstream.models)
        except MeshserveError as exc:
            log.debug("model repository index not available: %s", exc)
        return pb.RepositoryIndexResponse(models=models)

    async def forward_repository(self, method_name: str, request, remaining: float | None):
        name = getattr(request, "model_name", "")
        if name in self.pipelines:
            raise InvalidArgument(f"{name!r} is a pipeline (defined in YAML); load or unload its model instead")
        return await self._forward(getattr(self.up.model, method_name), request, remaining)
