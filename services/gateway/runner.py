"""One pipeline request end to end: cache lookup, then on a miss features -> preprocess -> model, the cache
store off the critical path, identical concurrent requests coalesced, and the pipeline's degradation
policy when the model or the features fail (never silent: the answer says `degraded`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import grpc
import numpy as np
from opentelemetry import trace

from services.cache.client import CachedValue, SingleFlight
from services.cache.entry import Entry
from services.cache.keys import request_digest, versioned_key
from services.cache.l1 import L1Cache
from services.common.errors import MeshserveError, Unavailable
from services.common.tensor_codec import NUMPY_DTYPES, encode_raw
from services.common.tracing import child_span
from services.gateway import metrics
from services.gateway.inputs import feature_rows
from services.gateway.pipeline import PipelineSpec
from services.gateway.upstream import Deadline, Upstreams, hop_headers, upstream_error
from services.gateway.versions import ServingVersions
from services.protos import feature_pb2 as fpb
from services.protos import inference_pb2 as pb

log = logging.getLogger(__name__)
tracer = trace.get_tracer("meshserve.gateway")

# Model failures the degradation policy answers for; anything else (e.g. INVALID_ARGUMENT) goes to the caller.
MODEL_FAILURES = {
    grpc.StatusCode.UNAVAILABLE: "model_unavailable",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "model_overloaded",
    grpc.StatusCode.DEADLINE_EXCEEDED: "model_timeout",
    grpc.StatusCode.NOT_FOUND: "model_not_loaded",
    grpc.StatusCode.INTERNAL: "model_error",
    grpc.StatusCode.UNKNOWN: "model_error",
    grpc.StatusCode.CANCELLED: "model_unavailable",
}


@dataclass
class Answer:
    """What a pipeline answered: the output tensors (raw v2 bytes) and how the answer came about."""

    outputs: list[tuple[str, str, list[int], bytes]]
    model_version: str
    cache: str  # hit, miss or stale
    degraded: str | None = None
    degraded_detail: str | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)

    def to_cache_value(self, model_name: str) -> bytes:
        message = pb.ModelInferResponse(model_name=model_name, model_version=self.model_version)
        for name, datatype, shape, raw in self.outputs:
            message.outputs.add(name=name, datatype=datatype, shape=shape)
            message.raw_output_contents.append(raw)
        return message.SerializeToString()

    @staticmethod
    def from_cache(hit: CachedValue, cache: str) -> Answer:
        message = pb.ModelInferResponse.FromString(hit.value)
        outputs = [
            (o.name, o.datatype, list(o.shape), raw)
            for o, raw in zip(message.outputs, message.raw_output_contents, strict=True)
        ]
        return Answer(outputs, message.model_version or hit.model_version, cache)


@dataclass
class OutputSpec:
    datatype: str
    dims: list[int]


class ModelFailure(Exception):
    def __init__(self, reason: str, error: MeshserveError) -> None:
        super().__init__(str(error))
        self.reason = reason
        self.error = error


class PipelineRunner:
    """Runs one pipeline; built once per pipeline at start, shared by every request."""

    def __init__(
        self, spec: PipelineSpec, upstreams: Upstreams, versions: ServingVersions, near: L1Cache | None = None
    ) -> None:
        self.spec = spec
        self.near = near if near is not None and near.max_bytes > 0 and near.max_ttl_s > 0 else None
        self.up = upstreams
        self.versions = versions
        self.model_inputs = spec.model_inputs()
        self.key_inputs = spec.cache.key_inputs or [i.name for i in spec.inputs]
        self.model_outputs: dict[str, OutputSpec] = {}  # filled from ModelMetadata (see Gateway.refresh)
        self._flights: SingleFlight[Answer] = SingleFlight()
        self._stores: set[asyncio.Task[bool]] = set()

    # -- entry point ---------------------------------------------------------------------------------------

    async def run(
        self, inputs: Mapping[str, np.ndarray], rows: int, deadline: Deadline, headers: Sequence[tuple[str, str]]
    ) -> Answer:
        """The answer to one request; identical concurrent requests share one computation."""
        flight_key = request_digest({name: inputs[name] for name in self.key_inputs})
        if flight_key in self._flights:
            metrics.COALESCED.labels(self.spec.name).inc()
        return await self._flights.do(flight_key, lambda: self._compute(inputs, flight_key, rows, deadline, headers))

    # -- stages --------------------------------------------------------------------------------------------

    def _cache_keys(self, digest: bytes) -> list[tuple[str, bytes]]:
        model = self.spec.model
        versions = [model.version] if model.version else self.versions.current(model.name)
        return [(v, versioned_key(self.spec.name, model.name, v, digest)) for v in versions]

    async def _lookup(
        self,
        keys: list[tuple[str, bytes]],
        deadline: Deadline,
        stages: dict[str, float],
        headers: Sequence[tuple[str, str]],
        generation: int,
    ) -> tuple[CachedValue | None, CachedValue | None]:
        """(fresh hit, stale hit) for the serving versions, newest version first."""
        if not self.spec.cache.enabled or not keys:
            return None, None
        start = time.perf_counter()
        if self.near is not None:
            now = time.time()
            for _, key in keys:
                entry = self.near.get(key, now)
                if entry is not None and entry.fresh(now):
                    stages["cache"] = (time.perf_counter() - start) * 1e3
                    return CachedValue(entry.value, entry.model_version, now - entry.stored_at, False), None
        with child_span(tracer, "cache.lookup", {"cache.keys": len(keys)}):
            timeout = deadline.for_hop(self.spec.timeouts.cache_ms, "the cache lookup")
            hits = await self.up.cache.lookup(
                [k for _, k in keys], self.spec.name, allow_stale=True, timeout_s=timeout, metadata=hop_headers(headers)
            )
        stages["cache"] = (time.perf_counter() - start) * 1e3
        fresh_at = next((i for i, h in enumerate(hits) if h is not None and not h.stale), None)
        stale = next((h for h in hits if h is not None and h.stale), None)
        if fresh_at is None:
            return None, stale
        fresh = hits[fresh_at]
        assert fresh is not None
        self._keep_near(keys[fresh_at][1], fresh.value, fresh.model_version, time.time() - fresh.age_s, generation)
        return fresh, stale

    def _keep_near(self, key: bytes, value: bytes, version: str, stored_at: float, generation: int) -> None:
        """Keep a fresh answer in the near cache (never past its own fresh time, nor the near cache's TTL), unless
        an invalidation reached the near cache since the request began (`generation`): the answer may predate it."""
        if self.near is not None and self.near.generation == generation:
            policy, model = self.spec.cache, self.spec.model.name
            fresh_until = stored_at + policy.ttl_s
            self.near.put(key, Entry(value, self.spec.name, model, version, stored_at, fresh_until, fresh_until),
                          time.time())  # fmt: skip

    async def _features(
        self, inputs: Mapping[str, np.ndarray], rows: int, deadline: Deadline, headers: Sequence[tuple[str, str]]
    ) -> tuple[bytes, int, int]:
        """(FP32 matrix bytes, columns, degraded rows) from the feature service."""
        stage = self.spec.features
        assert stage is not None
        timeout = deadline.for_hop(self.spec.timeouts.features_ms, "computing features")
        request = fpb.ComputeRequest(
            feature_set=stage.feature_set, rows=feature_rows(self.spec, inputs, rows), budget_ms=stage.budget_ms
        )
        with child_span(tracer, "features", {"feature.set": stage.feature_set, "rows": rows}):
            response = await self.up.feature.Compute(request, timeout=timeout, metadata=hop_headers(headers))
        degraded = sum(1 for f in response.flags if f.degraded)
        return response.features, response.columns, degraded

    def _preprocess(self, tensors: dict[str, np.ndarray]) -> None:
        for p in self.spec.preprocess:
            value = tensors[p.input].astype(np.float32) * np.float32(p.scale) + np.float32(p.offset)
            if p.clip is not None:
                value = np.clip(value, p.clip[0], p.clip[1])
            tensors[p.output or p.input] = value

    async def _model(
        self,
        name: str,
        version: str,
        tensors: Mapping[str, tuple[str, list[int], bytes]],
        deadline: Deadline,
        headers: Sequence[tuple[str, str]],
    ) -> tuple[pb.ModelInferResponse, str]:
        request = pb.ModelInferRequest(model_name=name, model_version=version)
        for model_input, tensor in self.model_inputs.items():
            datatype, shape, raw = tensors[tensor]
            request.inputs.add(name=model_input, datatype=datatype, shape=shape)
            request.raw_input_contents.append(raw)
        try:
            timeout = deadline.for_hop(self.spec.timeouts.model_ms, f"calling model {name!r}")
        except MeshserveError as exc:
            raise ModelFailure("model_timeout", exc) from exc
        with child_span(tracer, "model", {"model.name": name, "model.version": version}):
            try:
                metadata = hop_headers((*headers, ("x-model-version", version)) if version else headers)
                response = await self.up.model.ModelInfer(request, timeout=timeout, metadata=metadata)
            except grpc.aio.AioRpcError as exc:
                reason = MODEL_FAILURES.get(exc.code())
                error = upstream_error(f"model {name!r}", exc)
                if reason is None:
                    raise error from exc
                raise ModelFailure(reason, error) from exc
        self.versions.saw(name, response.model_version)
        return response, response.model_version

    def _outputs(self, response: pb.ModelInferResponse) -> list[tuple[str, str, list[int], bytes]]:
        by_name = {o.name: (o, raw) for o, raw in zip(response.outputs, response.raw_output_contents, strict=False)}
        missing = [n for n in self.spec.outputs if n not in by_name]
        if missing:
            raise Unavailable(f"model {response.model_name!r} answered without output {missing[0]!r}")
        return [(n, by_name[n][0].datatype, list(by_name[n][0].shape), by_name[n][1]) for n in self.spec.outputs]

    def _default(self, rows: int, cause: str, detail: str) -> Answer | None:
        values = self.spec.degradation.default_outputs
        if values is None or any(n not in self.model_outputs for n in self.spec.outputs):
            return None  # no default configured, or output shapes not known yet (model never reached)
        outputs = []
        for n in self.spec.outputs:
            out = self.model_outputs[n]
            array = np.full([rows, *out.dims], values.get(n, 0.0), dtype=NUMPY_DTYPES[out.datatype])
            datatype, shape, raw = encode_raw(array)
            outputs.append((n, datatype, shape, raw))
        return Answer(outputs, "default", "miss", f"{cause}:default", detail)

    # -- the whole request ---------------------------------------------------------------------------------

    async def _compute(
        self,
        inputs: Mapping[str, np.ndarray],
        digest: bytes,
        rows: int,
        deadline: Deadline,
        headers: Sequence[tuple[str, str]],
    ) -> Answer:
        t0 = time.perf_counter()
        stages: dict[str, float] = {}
        keys = self._cache_keys(digest)
        generation = self.near.generation if self.near is not None else 0
        fresh, stale = await self._lookup(keys, deadline, stages, headers, generation)
        if fresh is not None:
            return self._finish(Answer.from_cache(fresh, "hit"), stages, t0)

        tensors: dict[str, tuple[str, list[int], bytes]] = {}
        features_degraded = 0
        if self.spec.features is not None:
            start = time.perf_counter()
            try:
                matrix, columns, features_degraded = await self._features(inputs, rows, deadline, headers)
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
                    raise upstream_error("feature service", exc) from exc
                answer = self._degrade(
                    "features_unavailable", self.spec.degradation.on_feature_failure, stale, rows,
                    upstream_error("feature service", exc),
                )  # fmt: skip
                return self._finish(answer, stages, t0)
            finally:
                stages["features"] = (time.perf_counter() - start) * 1e3
            tensors[self.spec.features.output] = ("FP32", [rows, columns], matrix)
        if self.spec.preprocess or self.spec.features is None:
            start = time.perf_counter()
            arrays = dict(inputs)
            self._preprocess(arrays)
            for name in self.model_inputs.values():
                if name not in tensors:
                    tensors[name] = encode_raw(arrays[name])
            stages["preprocess"] = (time.perf_counter() - start) * 1e3

        model = self.spec.model
        start = time.perf_counter()
        try:
            response, version = await self._model(model.name, model.version, tensors, deadline, headers)
        except ModelFailure as failure:
            stages["model"] = (time.perf_counter() - start) * 1e3
            answer = await self._model_failure(failure, stale, rows, tensors, deadline, headers)
            return self._finish(answer, stages, t0)
        stages["model"] = (time.perf_counter() - start) * 1e3
        answer = Answer(self._outputs(response), version, "miss")
        if features_degraded:
            answer.degraded = "features_degraded"
            answer.degraded_detail = f"{features_degraded} of {rows} rows used default aggregates"
        elif self.spec.cache.enabled:
            key = versioned_key(self.spec.name, model.name, version, digest)
            self._store_later(key, answer, headers, generation)
        return self._finish(answer, stages, t0)

    def _degrade(
        self, cause: str, remedies: Sequence[str], stale: CachedValue | None, rows: int, error: MeshserveError
    ) -> Answer:
        for remedy in remedies:
            if remedy == "stale_cache" and stale is not None:
                answer = Answer.from_cache(stale, "stale")
                answer.degraded, answer.degraded_detail = (
                    f"{cause}:stale_cache",
                    f"{error} (cached {stale.age_s:.0f} s ago)",
                )
                return answer
            if remedy == "default":
                answer = self._default(rows, cause, str(error))
                if answer is not None:
                    return answer
        raise error

    async def _model_failure(
        self,
        failure: ModelFailure,
        stale: CachedValue | None,
        rows: int,
        tensors: Mapping[str, tuple[str, list[int], bytes]],
        deadline: Deadline,
        headers: Sequence[tuple[str, str]],
    ) -> Answer:
        policy = self.spec.degradation
        metrics.MODEL_FAILURES.labels(self.spec.name, failure.reason).inc()
        for remedy in policy.on_model_failure:
            if remedy == "fallback_model" and policy.fallback_model is not None:
                fb = policy.fallback_model
                try:
                    response, version = await self._model(fb.name, fb.version, tensors, deadline, headers)
                except (ModelFailure, MeshserveError):
                    continue
                answer = Answer(self._outputs(response), version, "miss")
                answer.degraded = f"{failure.reason}:fallback_model"
                answer.degraded_detail = f"{failure.error}; answered by {fb.name} version {version}"
                return answer
            try:
                return self._degrade(failure.reason, [remedy], stale, rows, failure.error)
            except MeshserveError:
                continue
        raise failure.error

    def _store_later(self, key: bytes, answer: Answer, headers: Sequence[tuple[str, str]], generation: int) -> None:
        """Store the answer off the critical path (a task; the response does not wait for it)."""
        value = answer.to_cache_value(self.spec.model.name)
        self._keep_near(key, value, answer.model_version, time.time(), generation)
        task = asyncio.ensure_future(self._store(key, value, answer.model_version, headers))
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    async def _store(self, key: bytes, value: bytes, version: str, headers: Sequence[tuple[str, str]]) -> bool:
        policy = self.spec.cache
        with child_span(tracer, "cache.store"):
            return await self.up.cache.store(
                key, value, pipeline=self.spec.name, model_name=self.spec.model.name, model_version=version,
                ttl_s=policy.ttl_s, stale_ttl_s=policy.stale_s, metadata=hop_headers(headers),
            )  # fmt: skip

    def _finish(self, answer: Answer, stages: dict[str, float], t0: float) -> Answer:
        answer.stages_ms = stages
        answer.stages_ms["total"] = (time.perf_counter() - t0) * 1e3
        return answer

    async def drain_stores(self, timeout_s: float = 2.0) -> None:
        if self._stores:
            await asyncio.wait(list(self._stores), timeout=timeout_s)
