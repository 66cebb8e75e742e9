"""In-process fake upstreams for the gateway: the same small interface as CacheClient, FeatureClient and
ModelClient, every call written to one shared log so a test can assert the exact order things happened in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import numpy as np

from services.cache.api import CachedValue, Invalidation, StoreItem
from services.common.errors import DeadlineExceeded, InvalidArgument, MeshserveError, Unavailable
from services.feature.api import FeatureMatrix, FeatureSetInfo, FieldValue
from services.gateway.cache_converters import answer_to_cache_value
from services.gateway.domain import Answer
from services.gateway.pipeline import PipelineSpec
from services.gateway.upstream import Upstreams
from services.model.api import InferResult, ModelInfo, RawTensor, TensorInfo

COLUMNS = 3


def score(value: float, rows: int = 1) -> RawTensor:
    """A `score` output of [rows, 1] FP32, every element `value`."""
    array = np.full((rows, 1), value, np.float32)
    return RawTensor("score", "FP32", [rows, 1], array.tobytes())


def scores(tensor: RawTensor) -> list[float]:
    return np.frombuffer(tensor.raw, np.float32).tolist()


def cached(value: float, *, version: str = "1", stale: bool, age_s: float = 30.0, rows: int = 1) -> CachedValue:
    """A cached answer as the cache client returns it."""
    payload = answer_to_cache_value(Answer([score(value, rows)], version, "miss"), "m")
    return CachedValue(payload, version, age_s, stale)


def pipeline_document(**overrides: Any) -> dict[str, Any]:
    """A small pipeline: two raw fields -> feature set fs_v1 -> model m -> score; every remedy available.
    An override that is a dict updates that section; None removes the key."""
    document: dict[str, Any] = {
        "name": "p",
        "max_batch_size": 8,
        "inputs": [{"name": "user_id", "datatype": "BYTES"}, {"name": "amount", "datatype": "FP32"}],
        "features": {"feature_set": "fs_v1"},
        "model": {"name": "m"},
        "outputs": ["score"],
        "degradation": {
            "on_model_failure": ["stale_cache", "fallback_model", "default"],
            "on_feature_failure": ["stale_cache", "default"],
            "fallback_model": {"name": "m", "version": "2"},
            "default_outputs": {"score": 0.5},
            "default_decision": "review",
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(document.get(key), dict):
            document[key] = {**document[key], **value}
        elif value is None:
            document.pop(key, None)
        else:
            document[key] = value
    return document


def pipeline(**overrides: Any) -> PipelineSpec:
    return PipelineSpec.model_validate(pipeline_document(**overrides))


def inputs(rows: int = 1, user: str = "u", amount: float = 12.5) -> dict[str, np.ndarray]:
    """Checked inputs of `pipeline()` ([rows, 1] each)."""
    return {
        "user_id": np.array([[user.encode()]] * rows, dtype=object),
        "amount": np.full((rows, 1), amount, np.float32),
    }


class FakeCache:
    """CacheClient's lookup/store/stats/watch. `hits` answers every lookup (one per key, the rest misses)."""

    def __init__(self, log: list[str], hits: Sequence[CachedValue | None] = ()) -> None:
        self.log = log
        self.hits = list(hits)
        self.error: MeshserveError | None = None
        self.stored: list[tuple[bytes, bytes, str]] = []
        self.lookups: list[list[bytes]] = []

    async def lookup(
        self,
        keys: Sequence[bytes],
        pipeline: str = "",
        allow_stale: bool = False,
        budget_ms: float = 0.0,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> list[CachedValue | None]:
        self.log.append("cache.lookup")
        self.lookups.append(list(keys))
        if self.error is not None:
            raise self.error
        return [self.hits[i] if i < len(self.hits) else None for i in range(len(keys))]

    async def store_many(
        self, items: Sequence[StoreItem], *, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()
    ) -> int:
        for item in items:
            self.log.append(f"cache.store {item.model_name}:{item.model_version}")
            self.stored.append((item.key, item.value, item.model_version))
        return len(items)

    async def stats(self, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()) -> object:
        return object()

    async def watch(
        self, metadata: Sequence[tuple[str, str]] = (), *, heartbeat_timeout_s: float | None = None
    ) -> AsyncGenerator[Invalidation, None]:
        yield Invalidation(reset=True)
        await asyncio.Event().wait()  # live until cancelled


class FakeFeatures:
    """FeatureClient's compute: COLUMNS zeros per row (the row's amount in the first column); the first
    `degraded_rows` rows and the rows of `degraded_users` flagged; `error` raises instead, and so does a row of
    a user in `refused_users` (INVALID_ARGUMENT, as a field the service cannot read)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.error: MeshserveError | None = None
        self.degraded_rows = 0
        self.degraded_users: set[str] = set()
        self.reason = ""  # the feature service's reason on each degraded row (e.g. features_store_reset)
        self.refused_users: set[str] = set()
        self.rows: list[list[dict[str, FieldValue]]] = []
        self.delay_s = 0.0
        self.enforce_timeout = False  # True: past `timeout_s` the call fails DEADLINE_EXCEEDED, as over gRPC

    async def compute(
        self,
        feature_set: str,
        rows: Sequence[Mapping[str, FieldValue]],
        budget_ms: float = 0.0,
        *,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> FeatureMatrix:
        self.log.append(f"features.compute {feature_set}")
        self.rows.append([dict(r) for r in rows])
        if self.delay_s:
            if self.enforce_timeout and timeout_s is not None and self.delay_s > timeout_s:
                await asyncio.sleep(timeout_s)
                raise DeadlineExceeded(f"feature service: no answer in {timeout_s * 1e3:.0f} ms")
            await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        refused = [r["user_id"] for r in rows if r.get("user_id") in self.refused_users]
        if refused:
            raise InvalidArgument(f"row of user {refused[0]!r}: unreadable field")
        matrix = np.zeros((len(rows), COLUMNS), np.float32)
        matrix[:, 0] = [float(r.get("amount", 0.0)) for r in rows]
        names = [f"f{i}" for i in range(COLUMNS)]
        flags = tuple(i < self.degraded_rows or r.get("user_id") in self.degraded_users for i, r in enumerate(rows))
        reasons = tuple(self.reason if f else "" for f in flags) if self.reason else ()
        return FeatureMatrix(matrix.tobytes(), len(rows), COLUMNS, names, sum(flags), flags, reasons)

    async def get_feature_set(
        self, feature_set: str, *, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()
    ) -> FeatureSetInfo:
        return FeatureSetInfo(feature_set, feature_set, 1, {}, [], "")


class FakeModel:
    """ModelClient's infer, ready (always) and describe. Model `m` answers score 0.9 as version 1 (asked
    for "") and 0.2 as version 2; `errors[(model, version)]` raises instead. `reachable=False`: describe fails (never
    reached)."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.errors: dict[tuple[str, str], MeshserveError] = {}
        self.values = {("m", ""): ("1", 0.9), ("m", "2"): ("2", 0.2)}
        self.inputs: list[list[RawTensor]] = []
        self.reachable = True
        self.gate: asyncio.Event | None = None  # infer waits for it when set
        self.echo = False  # answer each row's first feature / 100 instead of the constant

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[RawTensor],
        *,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> InferResult:
        self.log.append(f"model.infer {model}:{version}")
        self.inputs.append(list(inputs))
        if self.gate is not None:
            await self.gate.wait()
        error = self.errors.get((model, version))
        if error is not None:
            raise error
        answered, value = self.values[(model, version)]
        rows = inputs[0].shape[0]
        if self.echo:
            first = np.frombuffer(inputs[0].raw, np.float32).reshape(rows, -1)[:, :1] / 100
            return InferResult(model, answered, [RawTensor("score", "FP32", [rows, 1], first.tobytes())])
        return InferResult(model, answered, [score(value, rows)])

    async def ready(
        self, model: str, version: str = "", *, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()
    ) -> bool:
        self.log.append(f"model.ready {model}:{version}")
        return True

    async def describe(
        self, model: str, version: str = "", *, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()
    ) -> ModelInfo:
        self.log.append(f"model.describe {model}")
        if not self.reachable:
            raise Unavailable("model service: connection refused")
        outputs = [TensorInfo("score", "FP32", [-1, 1])]
        return ModelInfo(
            model, ["1", "2"], "onnxruntime_onnx", [TensorInfo("features", "FP32", [-1, COLUMNS])], outputs
        )


def fake_upstreams(log: list[str]) -> Upstreams:
    """Upstreams of fakes (typed as the real clients: they share the interface the gateway uses)."""
    return Upstreams(cache=FakeCache(log), feature=FakeFeatures(log), model=FakeModel(log))  # type: ignore[arg-type]
