"""How stage calls join and split: feature matrices and tensors cut per member (BYTES too), the routing headers
that decide who may share a call, and the member-by-member resend when a batch is refused or mis-shaped."""

from __future__ import annotations

from collections.abc import Sequence

import grpc
import numpy as np
import pytest

from services.common.errors import MeshserveError, error_with_code
from services.common.tensor_codec import deserialize_bytes, serialize_bytes
from services.feature.api import FeatureMatrix
from services.gateway.joins import join_tensors, model_call, routing_headers, split_matrix, split_tensor
from services.model.api import InferResult, RawTensor


def test_a_matrix_splits_into_each_members_rows_and_degraded_flags() -> None:
    features = np.arange(12, dtype=np.float32).reshape(6, 2)
    flags = (False, True, False, False, False, True)
    matrix = FeatureMatrix(features.tobytes(), 6, 2, ["a", "b"], 2, flags)
    parts = split_matrix(matrix, [1, 3, 2])
    assert [p.rows for p in parts] == [1, 3, 2]
    assert [p.degraded_rows for p in parts] == [0, 1, 1]
    assert np.frombuffer(parts[1].features, np.float32).reshape(3, 2).tolist() == features[1:4].tolist()
    with pytest.raises(MeshserveError, match="answered 6 rows for 5"):
        split_matrix(matrix, [2, 3])


def test_tensors_join_along_rows_and_split_back_bytes_included() -> None:
    a = {"x": ("FP32", [1, 2], np.ones((1, 2), np.float32).tobytes())}
    b = {"x": ("FP32", [2, 2], np.zeros((2, 2), np.float32).tobytes())}
    (joined,), counts = join_tensors([a, b])
    assert (joined.shape, counts) == ([3, 2], [1, 2])
    back = split_tensor(joined, counts)
    assert [t.shape for t in back] == [[1, 2], [2, 2]] and back[0].raw == a["x"][2]
    words = RawTensor("w", "BYTES", [3, 1], serialize_bytes(np.array([b"one", b"", b"three"], dtype=object)))
    first, second = split_tensor(words, [2, 1])
    assert deserialize_bytes("w", first.raw, 2).tolist() == [b"one", b""]
    assert deserialize_bytes("w", second.raw, 1).tolist() == [b"three"] and second.shape == [1, 1]
    with pytest.raises(ValueError, match="not 4 rows"):
        split_tensor(words, [2, 2])


def test_only_routing_headers_decide_who_shares_a_call() -> None:
    drop = ("traceparent", "x-request-id")
    one = routing_headers([("x-canary", "true"), ("traceparent", "00-a"), ("x-request-id", "1")], drop)
    two = routing_headers([("x-request-id", "2"), ("x-canary", "true")], drop)
    assert one == two == (("x-canary", "true"),)
    assert routing_headers([("traceparent", "00-b")], drop) != one


class Model:
    """A model upstream: answers one score per row (the row's first value), or `refuse` when a call holds a
    row equal to it, or a single unbatched row when `flat`."""

    def __init__(self, refuse: float | None = None, flat: bool = False) -> None:
        self.calls: list[int] = []
        self.refuse, self.flat = refuse, flat

    async def infer(
        self, model: str, version: str, inputs: Sequence[RawTensor], *, timeout_s: float | None = None, metadata=()
    ) -> InferResult:
        x = np.frombuffer(inputs[0].raw, np.float32).reshape(inputs[0].shape)
        self.calls.append(x.shape[0])
        if self.refuse is not None and (x[:, 0] == self.refuse).any():
            raise error_with_code(grpc.StatusCode.INVALID_ARGUMENT, "bad row")
        scores = x[:1, :1] if self.flat else x[:, :1]
        return InferResult(model, "1", [RawTensor("score", "FP32", list(scores.shape), scores.tobytes())])


def member(value: float) -> dict[str, tuple[str, list[int], bytes]]:
    return {"x": ("FP32", [1, 2], np.full((1, 2), value, np.float32).tobytes())}


async def test_a_refused_batch_is_resent_member_by_member() -> None:
    model = Model(refuse=2.0)
    results = await model_call(model, "p")([member(1.0), member(2.0), member(3.0)], 1.0, ("m", "", ()))
    assert model.calls == [3, 1, 1, 1]
    assert isinstance(results[1], MeshserveError) and results[1].code == grpc.StatusCode.INVALID_ARGUMENT
    assert [np.frombuffer(r.outputs[0].raw, np.float32).tolist() for r in (results[0], results[2])] == [[1.0], [3.0]]


async def test_an_answer_without_a_row_per_input_row_is_resent_member_by_member() -> None:
    model = Model(flat=True)
    results = await model_call(model, "p")([member(1.0), member(5.0)], 1.0, ("m", "", ()))
    assert model.calls == [2, 1, 1]
    assert [np.frombuffer(r.outputs[0].raw, np.float32).tolist() for r in results] == [[1.0], [5.0]]
