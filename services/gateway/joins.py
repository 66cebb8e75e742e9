"""How each pipeline stage's callers join into one downstream call, and how its answer splits back to them:
the cache lookup (keys), the feature call (rows), the model call (rows of every input) and the cache store.

A batch that the callee refuses as the caller's fault (a bad row: `INVALID_ARGUMENT`) is sent again member by
member, so only the member at fault gets the error. A batch that fails otherwise (down, overloaded, late)
fails every member with that error, and each member's own degradation policy answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Mapping, Sequence
from typing import Protocol, TypeVar

import grpc
import numpy as np

from services.cache.api import CachedValue, StoreItem
from services.common.errors import MeshserveError, Unavailable
from services.common.recording import PARENT_HEADER
from services.common.tensor_codec import deserialize_bytes, serialize_bytes
from services.feature.api import FeatureMatrix, FieldValue
from services.gateway import metrics
from services.gateway.batching import BatchCall
from services.gateway.upstream import CacheUpstream, FeatureUpstream, Headers, ModelUpstream, hop_headers
from services.model.api import InferResult, RawTensor

T = TypeVar("T")
R = TypeVar("R")
Wire = tuple[str, list[int], bytes]  # a tensor's datatype, shape and raw contents
Rows = Sequence[Mapping[str, FieldValue]]
ModelKey = tuple[str, str, Headers]  # model name, version asked for, routing headers
# Passed-on headers that belong to one request: the members of a batch need not share them.
PER_REQUEST_HEADERS = ("traceparent", "tracestate", "x-request-id", PARENT_HEADER)
# What the callee blames on a row of the request: such a batch is retried member by member.
CALLER_FAULTS = (grpc.StatusCode.INVALID_ARGUMENT,)


class Counter(Protocol):
    """A counter of one label set (a Prometheus child counter)."""

    def inc(self, amount: float = 1) -> None: ...


_ROUTED: dict[tuple[Headers, Sequence[str]], tuple[tuple[str, str], ...]] = {}
_ROUTED_MAX = 4096  # entries kept (each request's headers are asked for at each of its stages)


def routing_headers(headers: Headers, drop: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """The headers that decide where a call goes (what members of one batch must share): the passed-on ones
    without those named in `drop` (the trace context and request id belong to a single request). Remembered per
    headers, since every stage of a request asks again."""
    if type(headers) is not tuple:  # not hashable as given: worked out each time
        return tuple(sorted((k, v) for k, v in headers if k not in drop))
    key = (headers, drop)
    routed = _ROUTED.get(key)
    if routed is None:
        if len(_ROUTED) >= _ROUTED_MAX:
            _ROUTED.clear()
        routed = _ROUTED[key] = tuple(sorted((k, v) for k, v in headers if k not in drop))
    return routed


async def one_by_one(
    call: BatchCall[T, R], items: Sequence[T], timeout_s: float, key: Hashable, counter: Counter
) -> list[R | BaseException]:
    """Each member's call on its own, concurrently: one result or exception per member (`counter` counts it)."""
    counter.inc()

    async def alone(item: T) -> R | BaseException:
        try:
            return (await call([item], timeout_s, key))[0]
        except MeshserveError as exc:
            return exc

    return list(await asyncio.gather(*(alone(item) for item in items)))


def _offsets(counts: Sequence[int]) -> list[tuple[int, int]]:
    out, at = [], 0
    for n in counts:
        out.append((at, at + n))
        at += n
    return out


# -- cache lookup -------------------------------------------------------------------------------------------


def lookup_call(cache: CacheUpstream, pipeline: str) -> BatchCall[list[bytes], list[CachedValue | None]]:
    """One Lookup for every member's keys (fresh or stale); each member gets the hits of its own keys."""

    async def call(items: Sequence[list[bytes]], timeout_s: float, key: Hashable) -> list[list[CachedValue | None]]:
        keys = [k for item in items for k in item]
        hits = await cache.lookup(keys, pipeline, allow_stale=True, timeout_s=timeout_s, metadata=_hop(key))
        return [hits[a:b] for a, b in _offsets([len(item) for item in items])]

    return call


# -- features -----------------------------------------------------------------------------------------------


def split_matrix(matrix: FeatureMatrix, counts: Sequence[int]) -> list[FeatureMatrix]:
    """Each member's rows of a feature matrix, with its own degraded rows."""
    if matrix.rows != sum(counts):
        raise Unavailable(f"the feature service answered {matrix.rows} rows for {sum(counts)}")
    if len(counts) == 1:
        return [matrix]
    width = matrix.columns * 4
    flags = matrix.row_degraded or (False,) * matrix.rows
    out = []
    for a, b in _offsets(counts):
        mine = flags[a:b]
        out.append(
            FeatureMatrix(
                matrix.features[a * width : b * width],
                b - a,
                matrix.columns,
                matrix.feature_names,
                sum(mine),
                mine,
                matrix.row_reasons[a:b],
            )
        )
    return out


def features_call(
    features: FeatureUpstream, pipeline: str, feature_set: str, budget_ms: float
) -> BatchCall[Rows, FeatureMatrix]:
    """One Compute for every member's rows; a row the service refuses fails only its own member."""
    resent = metrics.BATCH_RESENT.labels(pipeline, "features")

    async def call(items: Sequence[Rows], timeout_s: float, key: Hashable) -> list[FeatureMatrix | BaseException]:
        rows = [row for item in items for row in item]
        try:
            matrix = await features.compute(feature_set, rows, budget_ms, timeout_s=timeout_s, metadata=_hop(key))
        except MeshserveError as exc:
            if len(items) > 1 and exc.code in CALLER_FAULTS:
                return await one_by_one(call, items, timeout_s, key, resent)
            raise
        return list(split_matrix(matrix, [len(item) for item in items]))

    return call


# -- model --------------------------------------------------------------------------------------------------


def join_tensors(items: Sequence[Mapping[str, Wire]]) -> tuple[list[RawTensor], list[int]]:
    """Every member's tensors of each model input concatenated along the rows, and each member's row count."""
    counts = [next(iter(item.values()))[1][0] for item in items]
    joined = []
    for name, (datatype, shape, _) in items[0].items():
        raw = b"".join(item[name][2] for item in items)
        joined.append(RawTensor(name, datatype, [sum(counts), *shape[1:]], raw))
    return joined, counts


def split_tensor(tensor: RawTensor, counts: Sequence[int]) -> list[RawTensor]:
    """One output tensor cut into each member's rows."""
    total = sum(counts)
    if not tensor.shape or tensor.shape[0] != total:
        raise ValueError(f"output {tensor.name!r} has shape {tensor.shape}, not {total} rows")
    tail = list(tensor.shape[1:])
    if tensor.datatype == "BYTES":
        per_row = int(np.prod(tail)) if tail else 1
        values = deserialize_bytes(tensor.name, tensor.raw, total * per_row)
        return [
            RawTensor(tensor.name, "BYTES", [b - a, *tail], serialize_bytes(values[a * per_row : b * per_row]))
            for a, b in _offsets(counts)
        ]
    width = len(tensor.raw) // total if total else 0
    return [
        RawTensor(tensor.name, tensor.datatype, [b - a, *tail], tensor.raw[a * width : b * width])
        for a, b in _offsets(counts)
    ]


def model_call(model: ModelUpstream, pipeline: str) -> BatchCall[Mapping[str, Wire], InferResult]:
    """One ModelInfer for every member's rows (members share model, version and routing: the lane key);
    each member gets its rows of every output. A batch the model refuses, or answers without a row per
    input row, is sent again member by member."""
    resent = metrics.BATCH_RESENT.labels(pipeline, "model")

    async def call(
        items: Sequence[Mapping[str, Wire]], timeout_s: float, key: Hashable
    ) -> list[InferResult | BaseException]:
        name, version, routing = _model_key(key)
        inputs, counts = join_tensors(items)
        headers = (*routing, ("x-model-version", version)) if version else routing
        try:
            result = await model.infer(name, version, inputs, timeout_s=timeout_s, metadata=hop_headers(headers))
        except MeshserveError as exc:
            if len(items) > 1 and exc.code in CALLER_FAULTS:
                return await one_by_one(call, items, timeout_s, key, resent)
            raise
        try:
            parts = [split_tensor(t, counts) for t in result.outputs]
        except ValueError:
            if len(items) > 1:
                return await one_by_one(call, items, timeout_s, key, resent)
            parts = [[t] for t in result.outputs]
        return [InferResult(result.model_name, result.model_version, [p[i] for p in parts]) for i in range(len(items))]

    return call


def _model_key(key: Hashable) -> ModelKey:
    assert isinstance(key, tuple) and len(key) == 3, key
    return str(key[0]), str(key[1]), tuple(key[2])


# -- cache store --------------------------------------------------------------------------------------------


def store_call(cache: CacheUpstream) -> BatchCall[StoreItem, bool]:
    """One Store for every member's entry; True for each when all were written."""

    async def call(items: Sequence[StoreItem], timeout_s: float, key: Hashable) -> list[bool]:
        stored = await cache.store_many(items, timeout_s=timeout_s, metadata=_hop(key))
        return [stored == len(items)] * len(items)

    return call


def _hop(key: Hashable) -> tuple[tuple[str, str], ...]:
    """The hop's headers: the lane's routing headers and the current span's trace context."""
    return hop_headers(key if isinstance(key, tuple) else ())
