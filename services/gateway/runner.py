"""One pipeline request end to end: cache lookup, then on a miss features -> preprocess -> model, the cache
store off the critical path, identical concurrent requests coalesced, and the degradation policy when the
model or the features fail (never silent: the answer says `degraded`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TypeVar

import grpc
import numpy as np
from opentelemetry import trace

from services.cache.api import (
    CachedValue,
    Entry,
    L1Cache,
    StoreItem,
    request_digest,
    versioned_key,
    wire_digest,
)
from services.common.errors import DeadlineExceeded, MeshserveError, Unavailable
from services.common.tensor_codec import encode_raw
from services.common.tracing import child_span
from services.feature.api import FeatureMatrix
from services.gateway import metrics
from services.gateway.activator import Activator, ParkedPastDeadline, Target
from services.gateway.batching import BatchCall, StageBatcher
from services.gateway.cache_converters import answer_from_cache, answer_to_cache_value
from services.gateway.degradation import (
    FEATURES_INVALID,
    Failure,
    Remedy,
    default_answer,
    feature_failure,
    first_answer,
    model_failure,
    stale_answer,
)
from services.gateway.demand import DemandTracker
from services.gateway.domain import Answer, OutputSpec, WireTensor
from services.gateway.inputs import feature_rows
from services.gateway.joins import (
    PER_REQUEST_HEADERS,
    Rows,
    Wire,
    features_call,
    lookup_call,
    model_call,
    routing_headers,
    store_call,
)
from services.gateway.pipeline import PipelineSpec
from services.gateway.placement import DATA_CLASS_HEADER, SENSITIVE, Route, crossing
from services.gateway.upstream import CacheUpstream, Deadline, FeatureUpstream, Headers, ModelUpstream
from services.gateway.versions import ServingVersions
from services.model.api import InferResult, RawTensor

log = logging.getLogger(__name__)
tracer = trace.get_tracer("meshserve.gateway")
STORE_TIMEOUT_S = 0.2
KNOWN_WIRE_DIGESTS = 65_536  # wire digest -> request digest pairs kept for the near cache's fast path (about 10 MB)
T = TypeVar("T")
R = TypeVar("R")


def stage_batcher(spec: PipelineSpec, stage: str, span: str, call: BatchCall[T, R], rows: int) -> StageBatcher[T, R]:
    """The micro-batcher of one stage of `spec`'s pipeline: `call` (a join) sends its batches of at most `rows`
    rows, on the pipeline's batching settings."""
    batching = spec.batching
    return StageBatcher(
        spec.name,
        stage,
        span,
        call,
        max_rows=rows,
        max_inflight=batching.max_inflight,
        max_delay_s=batching.max_delay_ms / 1e3,
        max_gather_s=batching.max_gather_ms / 1e3,
        enabled=batching.enabled,
    )


class _Abandoned(Exception):
    """A flight's leader was cancelled before it answered: a caller still waiting runs the computation itself."""


class _Flight:
    """One computation that identical concurrent requests share. The first caller (the leader) runs it inline, in
    its own task; later callers wait for its outcome. A cancelled leader takes the computation with it (so nothing
    runs on, or stays parked for a cold model, for an answer nobody waits for); a caller still waiting then runs
    it again as the new leader. The future the others wait on is made only when one joins."""

    __slots__ = ("future",)

    def __init__(self) -> None:
        self.future: asyncio.Future[Answer] | None = None

    def waiter(self) -> asyncio.Future[Answer]:
        if self.future is None:
            self.future = asyncio.get_running_loop().create_future()
        return self.future

    def answered(self, answer: Answer) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_result(answer)

    def failed(self, error: BaseException) -> None:
        if self.future is not None and not self.future.done():
            self.future.set_exception(error)
            self.future.exception()  # retrieved: the callers that still wait raise it; none left is no warning


class PipelineRunner:
    """Runs one pipeline; built once per pipeline at start, shared by every request.

    The upstream clients come in by the constructor (the real ones in the gateway, fakes in tests); `outputs`
    is what the version refresher learnt of each model's outputs (by model name), read by the default remedy;
    `demand` counts the model calls in flight (the gateway's, which it reports to the scaler); `activator` parks
    requests while their model has no serving replica (the gateway's, shared by every runner; None: one of this
    runner's own on `demand` and `model`, with the default settings).
    """

    def __init__(
        self,
        spec: PipelineSpec,
        cache: CacheUpstream,
        features: FeatureUpstream,
        model: ModelUpstream,
        versions: ServingVersions,
        near: L1Cache | None = None,
        outputs: Mapping[str, Mapping[str, OutputSpec]] | None = None,
        demand: DemandTracker | None = None,
        activator: Activator | None = None,
        cloud: ModelUpstream | None = None,
    ) -> None:
        self.spec = spec
        self.cache = cache
        self.features = features
        self.model = model
        self.versions = versions
        self.near = near if near is not None and near.max_bytes > 0 and near.max_ttl_s > 0 else None
        self.known_outputs: Mapping[str, Mapping[str, OutputSpec]] = {} if outputs is None else outputs
        self.demand = DemandTracker() if demand is None else demand  # model calls in flight, for the scaler
        self.activator = Activator(self.demand, model) if activator is None else activator
        self.model_inputs = spec.model_inputs()
        # Every model input computed by the feature service: a model refusing them as invalid is the features'
        # failure (degraded, the pipeline's remedies), not the caller's, who never sent those values.
        self._fed_by_features = spec.features is not None and set(self.model_inputs.values()) == {spec.features.output}
        self.key_inputs = spec.cache.key_inputs or [i.name for i in spec.inputs]
        # The fast path (`known_hit`) needs a near cache and a key of every input: a wire digest then stands for a
        # request that passed every check before.
        self._by_wire = self.near is not None and spec.cache.enabled and len(set(self.key_inputs)) == len(spec.inputs)
        self._known: dict[bytes, bytes] = {}  # wire digest -> request digest, oldest first
        self._waiting: dict[bytes, _Flight] = {}  # flight key -> the computation identical requests share
        timeouts = spec.timeouts
        self._budgets = {
            "cache": timeouts.budget(timeouts.cache_ms),
            "features": timeouts.budget(timeouts.features_ms),
            "model": timeouts.budget(timeouts.model_ms),
        }
        stage = spec.features
        feature_set, budget_ms = (stage.feature_set, stage.budget_ms) if stage else ("", 0.0)
        caps = spec.batching.max_rows
        # Each stage's batcher, typed by the join that sends its batches (services/gateway/joins.py).
        self._lookups: StageBatcher[list[bytes], list[CachedValue | None]] = stage_batcher(
            spec, "cache", "cache.lookup", lookup_call(cache, spec.name), caps.cache
        )
        self._computes: StageBatcher[Rows, FeatureMatrix] = stage_batcher(
            spec, "features", "features", features_call(features, spec.name, feature_set, budget_ms), caps.features
        )
        self._infers: StageBatcher[Mapping[str, Wire], InferResult] = stage_batcher(
            spec, "model", "model", model_call(model, spec.name), caps.model
        )
        self._writes: StageBatcher[StoreItem, bool] = stage_batcher(
            spec, "store", "cache.store", store_call(cache), caps.store
        )
        # An edge-tier gateway's calls to the cloud tier (general requests of a pipeline with placement), batched
        # like the model's: the WAN hop is the span `cloud` (its batched call `cloud.batch`).
        self._cloud_calls: StageBatcher[Mapping[str, Wire], InferResult] | None = None
        if cloud is not None and spec.placement is not None:
            self._cloud_calls = stage_batcher(spec, "cloud", "cloud", model_call(cloud, spec.name), caps.model)

    @property
    def model_outputs(self) -> Mapping[str, OutputSpec]:
        """The pipeline model's outputs (empty until its metadata has been read)."""
        return self.known_outputs.get(self.spec.model.name, {})

    # -- entry point ---------------------------------------------------------------------------------------

    def wire_key(self, wire: Sequence[WireTensor]) -> bytes | None:
        """The wire digest of a request that came as raw contents, when this pipeline's near cache can answer by it
        (`known_hit`); None when it cannot."""
        return wire_digest(wire) if self._by_wire else None

    def known_hit(self, wire_key: bytes) -> Answer | None:
        """The near cache's fresh answer to a request byte-identical to one answered before (by its `wire_key`),
        with nothing decoded: that request passed every check, so this one would. None: not known, or no fresh
        answer near (the request then takes the whole path)."""
        digest = self._known.get(wire_key)
        return None if digest is None else self._near_hit(digest)

    def _remember(self, wire_key: bytes, digest: bytes) -> None:
        known = self._known
        if wire_key not in known:
            if len(known) >= KNOWN_WIRE_DIGESTS:
                del known[next(iter(known))]
            known[wire_key] = digest

    async def run(
        self,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        deadline: Deadline,
        headers: Headers,
        route: Route | None = None,
        wire_key: bytes | None = None,
        digest: bytes | None = None,
    ) -> Answer:
        """The answer to one request (inputs checked against the pipeline); identical concurrent requests share
        one computation (`_Flight`: run by the first, run again by one still waiting if the first is
        cancelled). `route` (an edge-tier gateway's): where the request
        is answered; one routed to the cloud skips this tier's caches. `wire_key` (from `wire_key`): the request's
        wire digest, remembered with its request digest for the fast path; `digest`: the request digest of its key
        inputs when the caller has it already (`check_wire`)."""
        if digest is None:
            digest = request_digest({name: inputs[name] for name in self.key_inputs})
        if wire_key is not None and self._by_wire:
            self._remember(wire_key, digest)
        remote = route is not None and route.tier == "cloud" and self._cloud_calls is not None
        flight_key = digest if route is None else digest + f"|{route.tier}|{route.data_class}".encode()
        keys = None if remote or not self.spec.cache.enabled else self._cache_keys(digest)  # once per request
        near = None if keys is None else self._near_hit(digest, keys)
        if near is not None:  # answered from the gateway's own memory: no task, no flight
            return near
        joined = self._waiting.get(flight_key)
        if joined is not None:
            metrics.COALESCED.labels(self.spec.name).inc()
        while joined is not None:
            try:
                return await asyncio.shield(joined.waiter())  # this caller's cancellation is its own
            except _Abandoned:  # its leader was cancelled: run it here, or join whoever did first
                joined = self._waiting.get(flight_key)
        flight = self._waiting[flight_key] = _Flight()
        try:
            answer = await self._answer(inputs, digest, rows, deadline, headers, route, remote, keys)
        except asyncio.CancelledError:
            flight.failed(_Abandoned())
            raise
        except BaseException as exc:
            flight.failed(exc)
            raise
        finally:
            if self._waiting.get(flight_key) is flight:
                del self._waiting[flight_key]
        flight.answered(answer)
        return answer

    # -- stages --------------------------------------------------------------------------------------------

    def _route(self, headers: Headers) -> tuple[tuple[str, str], ...]:
        """The lane of a stage's batcher: requests with the same routing headers share batches (without
        batching, each request's call carries all its headers)."""
        if self.spec.batching.enabled:
            return routing_headers(headers, PER_REQUEST_HEADERS)
        return tuple(headers)

    def _cache_keys(self, digest: bytes) -> list[tuple[str, bytes]]:
        model = self.spec.model
        versions = [model.version] if model.version else self.versions.current(model.name)
        return [(v, versioned_key(self.spec.name, model.name, v, digest)) for v in versions]

    def _near_hit(self, digest: bytes, keys: list[tuple[str, bytes]] | None = None) -> Answer | None:
        """A fresh answer from the near cache, for the newest serving version that has one (`keys`: the digest's
        cache keys, when the caller has them)."""
        if self.near is None or not self.spec.cache.enabled:
            return None
        start = time.perf_counter()
        now = time.time()
        for _, key in self._cache_keys(digest) if keys is None else keys:
            entry = self.near.get(key, now)
            if entry is not None and entry.fresh(now):
                hit = CachedValue(entry.value, entry.model_version, now - entry.stored_at, False)
                return self._finish(
                    answer_from_cache(hit, "hit"), {"cache": (time.perf_counter() - start) * 1e3}, start
                )
        return None

    async def _lookup(
        self,
        keys: list[tuple[str, bytes]],
        deadline: Deadline,
        stages: dict[str, float],
        headers: Headers,
        generation: int,
        shared: dict[str, int],
    ) -> tuple[CachedValue | None, CachedValue | None]:
        """(fresh hit, stale hit) for the serving versions, newest version first, from the cache service (the
        near cache was asked before)."""
        if not self.spec.cache.enabled or not keys:
            return None, None
        start = time.perf_counter()
        with child_span(tracer, "cache.lookup", {"cache.keys": len(keys)}):
            budget = self._budgets["cache"]
            timeout = deadline.for_hop(budget.value_ms, "the cache lookup")
            try:
                hits = await self._lookups.submit(
                    [k for _, k in keys], len(keys), timeout, self._route(headers), shared
                )
                budget.observe(time.perf_counter() - start)
            except DeadlineExceeded:  # the cache fails open: a late lookup is a miss
                hits = [None] * len(keys)
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
            entry = Entry(value, self.spec.name, model, version, stored_at, fresh_until, fresh_until)
            self.near.put(key, entry, time.time())

    async def _features(
        self, inputs: Mapping[str, np.ndarray], rows: int, deadline: Deadline, headers: Headers, shared: dict[str, int]
    ) -> FeatureMatrix:
        """The feature matrix; a failed call the policy answers for raises Failure, any other error goes on."""
        stage = self.spec.features
        assert stage is not None
        budget = self._budgets["features"]
        timeout = deadline.for_hop(budget.value_ms, "computing features")
        fields = feature_rows(self.spec, inputs, rows)
        with child_span(tracer, "features", {"feature.set": stage.feature_set, "rows": rows}):
            start = time.perf_counter()
            try:
                matrix = await self._computes.submit(fields, rows, timeout, self._route(headers), shared)
                budget.observe(time.perf_counter() - start)
                return matrix
            except MeshserveError as exc:
                failure = feature_failure(exc)
                if failure is None:
                    raise
                raise failure from exc

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
        tensors: Mapping[str, Wire],
        deadline: Deadline,
        headers: Headers,
        shared: dict[str, int] | None = None,
        park: bool = True,
    ) -> InferResult:
        """One model call, parked while the model has no serving replica (`park=False`: never, as for a remedy's
        call); a failure the policy answers for raises Failure, any other error goes on (a deadline that passed
        while parked too: nothing is left of the request for a remedy)."""
        inputs = {model_input: tensors[tensor] for model_input, tensor in self.model_inputs.items()}
        rows = next(iter(inputs.values()))[1][0]
        budget = self._budgets["model"]
        key = (name, version, self._route(headers))

        async def send() -> InferResult:
            timeout = deadline.for_hop(budget.value_ms, f"calling model {name!r}")
            demand = self.demand.enter(name, version, headers)  # in flight while sent, not while parked
            try:
                start = time.perf_counter()
                result = await self._infers.submit(inputs, rows, timeout, key, shared)
                budget.observe(time.perf_counter() - start)
                return result
            finally:
                self.demand.leave(demand)

        with child_span(tracer, "model", {"model.name": name, "model.version": version}):
            try:
                result = await self.activator.call(self._target(name, version, headers), send, deadline, park=park)
            except ParkedPastDeadline:
                raise
            except MeshserveError as exc:
                failure = model_failure(exc)
                if failure is None:
                    raise
                raise failure from exc
        self.versions.saw(name, result.model_version)
        return result

    @staticmethod
    def _target(name: str, version: str, headers: Headers) -> Target:
        """What the model call goes to, routed as `model_call` sends it (a pinned version in `x-model-version`)."""
        routing = routing_headers(headers, PER_REQUEST_HEADERS)
        if version:
            routing = (*(h for h in routing if h[0] != "x-model-version"), ("x-model-version", version))
        return Target(name, version, routing)

    def _outputs(self, result: InferResult) -> list[RawTensor]:
        by_name = {t.name: t for t in result.outputs}
        missing = [n for n in self.spec.outputs if n not in by_name]
        if missing:
            raise Unavailable(f"model {result.model_name!r} answered without output {missing[0]!r}")
        return [by_name[n] for n in self.spec.outputs]

    # -- the whole request ---------------------------------------------------------------------------------

    async def _answer(
        self,
        inputs: Mapping[str, np.ndarray],
        digest: bytes,
        rows: int,
        deadline: Deadline,
        headers: Headers,
        route: Route | None,
        remote: bool,
        keys: list[tuple[str, bytes]] | None = None,
    ) -> Answer:
        """The answer at the tier `route` names: the cloud's (this tier's when it fails), or this tier's (`keys`: the
        request's cache keys, when known)."""
        if remote and route is not None:
            return await self._compute_remote(inputs, rows, deadline, headers, route)
        return await self._compute(inputs, digest, rows, deadline, headers, keys)

    async def _compute(
        self,
        inputs: Mapping[str, np.ndarray],
        digest: bytes,
        rows: int,
        deadline: Deadline,
        headers: Headers,
        keys: list[tuple[str, bytes]] | None = None,
    ) -> Answer:
        """The answer to one request: the cache's, else the model's on the request's features (or, when a call
        fails, the first remedy's that can answer)."""
        t0 = time.perf_counter()
        stages: dict[str, float] = {}
        shared: dict[str, int] = {}  # stage -> requests its batched call served
        keys = self._cache_keys(digest) if keys is None else keys
        generation = self.near.generation if self.near is not None else 0
        fresh, stale = await self._lookup(keys, deadline, stages, headers, generation, shared)
        if fresh is not None:
            return self._finish(answer_from_cache(fresh, "hit"), stages, t0, shared)

        staged = await self._model_tensors(inputs, rows, deadline, headers, stale, stages, shared)
        if isinstance(staged, Answer):  # the feature call failed and a remedy answered
            return self._finish(staged, stages, t0, shared)
        tensors, features = staged
        outcome = await self._call_model(tensors, stale, rows, deadline, headers, stages, shared)
        if isinstance(outcome, Answer):  # the model call failed and a remedy answered
            return self._finish(outcome, stages, t0, shared)
        answer = self._model_answer(outcome, rows, features, digest, headers, generation)
        return self._finish(answer, stages, t0, shared)

    async def _model_tensors(
        self,
        inputs: Mapping[str, np.ndarray],
        rows: int,
        deadline: Deadline,
        headers: Headers,
        stale: CachedValue | None,
        stages: dict[str, float],
        shared: dict[str, int],
    ) -> tuple[dict[str, Wire], tuple[int, str]] | Answer:
        """(pipeline tensor -> its wire form, (rows computed on degraded features, the feature service's reason)):
        the feature matrix and the preprocessed inputs the model takes; when the feature call fails, the first
        feature remedy's answer."""
        tensors: dict[str, Wire] = {}
        features_degraded, features_reason = 0, ""
        if self.spec.features is not None:
            start = time.perf_counter()
            failed: Failure | None = None
            try:
                matrix = await self._features(inputs, rows, deadline, headers, shared)
            except Failure as failure:
                failed = failure
            finally:
                stages["features"] = (time.perf_counter() - start) * 1e3
            if failed is not None:
                return await self._degrade_features(failed, stale, rows)
            tensors[self.spec.features.output] = ("FP32", [rows, matrix.columns], matrix.features)
            features_degraded, features_reason = matrix.degraded_rows, matrix.degraded_reason
        if self.spec.preprocess or self.spec.features is None:
            self._encode_inputs(inputs, tensors, stages)
        return tensors, (features_degraded, features_reason)

    def _encode_inputs(
        self, inputs: Mapping[str, np.ndarray], tensors: dict[str, Wire], stages: dict[str, float]
    ) -> None:
        """The model inputs the features did not compute: the request's own, preprocessed, in wire form."""
        start = time.perf_counter()
        arrays = dict(inputs)
        self._preprocess(arrays)
        for name in self.model_inputs.values():
            if name not in tensors:
                tensors[name] = encode_raw(arrays[name])
        stages["preprocess"] = (time.perf_counter() - start) * 1e3

    async def _call_model(
        self,
        tensors: Mapping[str, Wire],
        stale: CachedValue | None,
        rows: int,
        deadline: Deadline,
        headers: Headers,
        stages: dict[str, float],
        shared: dict[str, int],
    ) -> InferResult | Answer:
        """The pipeline model's result; when the call fails in a way the policy answers for, the remedy's answer
        (a model refusing the features the feature service computed is the features' failure)."""
        model = self.spec.model
        start = time.perf_counter()
        try:
            result = await self._model(model.name, model.version, tensors, deadline, headers, shared)
        except Failure as failure:
            stages["model"] = (time.perf_counter() - start) * 1e3
            return await self._degrade_model(failure, stale, rows, tensors, deadline, headers)
        except MeshserveError as exc:
            if not (self._fed_by_features and exc.code == grpc.StatusCode.INVALID_ARGUMENT):
                raise
            stages["model"] = (time.perf_counter() - start) * 1e3
            metrics.MODEL_FAILURES.labels(self.spec.name, FEATURES_INVALID).inc()
            return await self._degrade_features(Failure(FEATURES_INVALID, exc), stale, rows)
        stages["model"] = (time.perf_counter() - start) * 1e3
        return result

    def _model_answer(
        self,
        result: InferResult,
        rows: int,
        features: tuple[int, str],
        digest: bytes,
        headers: Headers,
        generation: int,
    ) -> Answer:
        """The model's answer: marked when some rows were computed on degraded features (see `_marked_answer`),
        else cached (the store goes off the critical path)."""
        answer = self._marked_answer(result, rows, features)
        if answer.degraded is None and self.spec.cache.enabled:
            key = versioned_key(self.spec.name, self.spec.model.name, result.model_version, digest)
            self._store_later(key, answer, headers, generation)
        return answer

    def _marked_answer(self, result: InferResult, rows: int, features: tuple[int, str]) -> Answer:
        """A model's answer, marked when some rows were computed on default aggregates (or on a store that lost
        its data: `features` is (degraded rows, the feature service's reason))."""
        answer = Answer(self._outputs(result), result.model_version, "miss")
        features_degraded, reason = features
        if features_degraded and reason:
            answer.degraded = reason
            answer.degraded_detail = f"{features_degraded} of {rows} rows: the online store lost its data recently"
        elif features_degraded:
            answer.degraded = "features_degraded"
            answer.degraded_detail = f"{features_degraded} of {rows} rows used default aggregates"
        return answer

    # -- the cloud tier ------------------------------------------------------------------------------------

    async def _compute_remote(
        self, inputs: Mapping[str, np.ndarray], rows: int, deadline: Deadline, headers: Headers, route: Route
    ) -> Answer:
        """A general request's answer from the cloud tier: its general inputs sent (`request`), or the features
        computed here (`derived_features`); when the cloud fails or is late, this tier's model answers, marked
        edge_only. Neither this tier's caches nor its remedies' stale entries are read for it."""
        t0 = time.perf_counter()
        stages: dict[str, float] = {}
        shared: dict[str, int] = {}
        missed: MeshserveError | None = None  # the cloud's failure: this tier answers
        if route.leave_edge == "request":
            name, general = crossing(self.spec, route, inputs, {})
            outcome = await self._ask_cloud(name, general, rows, (0, ""), deadline, headers, stages, shared)
            if isinstance(outcome, Answer):
                return self._finish(outcome, stages, t0, shared)
            missed = outcome
        staged = await self._model_tensors(inputs, rows, deadline, headers, None, stages, shared)
        if isinstance(staged, Answer):  # the feature call failed and a remedy answered
            return self._finish(self._edge_only(staged, missed), stages, t0, shared)
        tensors, features = staged
        if missed is None:
            name, derived = crossing(self.spec, route, inputs, tensors)
            outcome = await self._ask_cloud(name, derived, rows, features, deadline, headers, stages, shared)
            if isinstance(outcome, Answer):
                return self._finish(outcome, stages, t0, shared)
            missed = outcome
        local = await self._call_model(tensors, None, rows, deadline, headers, stages, shared)
        answer = local if isinstance(local, Answer) else self._marked_answer(local, rows, features)
        return self._finish(self._edge_only(answer, missed), stages, t0, shared)

    async def _ask_cloud(
        self,
        name: str,
        tensors: Mapping[str, Wire],
        rows: int,
        features: tuple[int, str],
        deadline: Deadline,
        headers: Headers,
        stages: dict[str, float],
        shared: dict[str, int],
    ) -> Answer | MeshserveError:
        """The cloud tier's answer from `name` (the pipeline, or its model; `features` marks it as `_marked_answer`
        does), or why it gave none (an answer without the pipeline's outputs included): within the placement's
        cloud_timeout_ms and the request's deadline."""
        assert self._cloud_calls is not None and self.spec.placement is not None
        placement = self.spec.placement
        start = time.perf_counter()
        with child_span(tracer, "cloud", {"cloud.model": name, "cloud.leave_edge": placement.leave_edge}) as span:
            try:
                timeout = deadline.for_hop(placement.cloud_timeout_ms, "calling the cloud tier")
                key = (name, "", self._route(headers))
                result = await self._cloud_calls.submit(tensors, rows, timeout, key, shared)
                answer = self._marked_answer(result, rows, features)
                answer.tier = "cloud"
                return answer
            except MeshserveError as exc:
                span.set_attribute("cloud.failed", exc.code.name)
                return exc
            finally:
                stages["cloud"] = (time.perf_counter() - start) * 1e3

    def _edge_only(self, answer: Answer, missed: MeshserveError | None) -> Answer:
        """This tier's answer to a request the cloud should have answered, marked edge_only (`missed`: why not)."""
        if missed is None:
            return answer
        metrics.EDGE_ONLY.labels(self.spec.name, missed.code.name).inc()
        why = f"the cloud tier did not answer ({missed.code.name})"
        if answer.degraded is None:
            answer.degraded = "edge_only"
            answer.degraded_detail = f"{why}; this tier's model answered"
        else:
            answer.degraded_detail = f"{answer.degraded_detail}; {why}"
        answer.tier = "edge"
        return answer

    # -- degradation ---------------------------------------------------------------------------------------

    def _default_remedy(self, failure: Failure, rows: int) -> Remedy:
        policy = self.spec.degradation

        async def default() -> Answer | None:
            answer = default_answer(failure, policy.default_outputs, self.spec.outputs, self.model_outputs, rows)
            if answer is not None:
                answer.default_decision = policy.default_decision
            return answer

        return default

    async def _degrade_features(self, failure: Failure, stale: CachedValue | None, rows: int) -> Answer:
        async def stale_cache() -> Answer | None:
            return stale_answer(failure, stale)

        remedies = {"stale_cache": stale_cache, "default": self._default_remedy(failure, rows)}
        return await first_answer(self.spec.degradation.on_feature_failure, remedies, failure)

    async def _edge_model_down(self, failure: Failure, rows: int) -> Answer:
        """A sensitive request whose model failed, answered as the placement says: never by another tier."""
        assert self.spec.placement is not None
        if self.spec.placement.on_edge_model_down == "default":
            answer = await self._default_remedy(failure, rows)()
            if answer is not None:
                return answer
        raise Unavailable(
            f"pipeline {self.spec.name!r}: the edge model did not answer ({failure.reason}) and "
            f"placement.on_edge_model_down is {self.spec.placement.on_edge_model_down}: a sensitive request is "
            "answered at the edge or not at all"
        ) from failure.error

    async def _degrade_model(
        self,
        failure: Failure,
        stale: CachedValue | None,
        rows: int,
        tensors: Mapping[str, Wire],
        deadline: Deadline,
        headers: Headers,
    ) -> Answer:
        policy = self.spec.degradation
        metrics.MODEL_FAILURES.labels(self.spec.name, failure.reason).inc()
        if self.spec.placement is not None and (DATA_CLASS_HEADER, SENSITIVE) in headers:
            return await self._edge_model_down(failure, rows)

        async def stale_cache() -> Answer | None:
            return stale_answer(failure, stale)

        async def fallback_model() -> Answer | None:
            fallback = policy.fallback_model
            if fallback is None:
                return None
            try:
                result = await self._model(fallback.name, fallback.version, tensors, deadline, headers, park=False)
            except (Failure, MeshserveError):
                return None  # the fallback failed too: the next remedy
            answer = Answer(self._outputs(result), result.model_version, "miss")
            answer.degraded = f"{failure.reason}:fallback_model"
            answer.degraded_detail = f"{failure.error}; answered by {fallback.name} version {result.model_version}"
            return answer

        remedies = {
            "stale_cache": stale_cache,
            "fallback_model": fallback_model,
            "default": self._default_remedy(failure, rows),
        }
        return await first_answer(policy.on_model_failure, remedies, failure)

    # -- after the answer ----------------------------------------------------------------------------------

    def _store_later(self, key: bytes, answer: Answer, headers: Headers, generation: int) -> None:
        """Store the answer off the critical path: posted to the store's batcher (no task, timer or span of its own;
        the batched call's span `cache.store.batch` is the trace's record of it)."""
        value = answer_to_cache_value(answer, self.spec.model.name)
        self._keep_near(key, value, answer.model_version, time.time(), generation)
        policy = self.spec.cache
        model, version = self.spec.model.name, answer.model_version
        item = StoreItem(key, value, self.spec.name, model, version, policy.ttl_s, policy.stale_s)
        self._writes.post(item, 1, STORE_TIMEOUT_S, self._route(headers))

    def _finish(
        self, answer: Answer, stages: dict[str, float], t0: float, shared: dict[str, int] | None = None
    ) -> Answer:
        answer.batches = shared or {}
        answer.stages_ms = stages
        answer.stages_ms["total"] = (time.perf_counter() - t0) * 1e3
        return answer

    async def drain_stores(self, timeout_s: float = 2.0) -> None:
        """Wait for the stores and batches still queued or in flight (at shutdown)."""
        for batcher in (self._lookups, self._computes, self._infers, self._writes):
            await batcher.drain(timeout_s)
