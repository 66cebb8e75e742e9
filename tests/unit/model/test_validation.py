"""Request inputs checked against a loaded version's config: each refusal names the tensor and what is wrong."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.validation import validate_inputs
from tests.helpers.models import Mlp, mlp_config, write_model


def ok_multi() -> dict[str, np.ndarray]:
    return {"a": np.zeros((2, 3), np.float32), "b": np.zeros(2, np.int64)}


def test_valid_inputs_return_the_batch_rows(manager: ModelManager) -> None:
    assert validate_inputs(manager.get("mlp"), {"x": np.zeros((5, 8), np.float32)}) == 5
    assert validate_inputs(manager.get("multi"), ok_multi()) == 1  # no batch dimension: one row


@pytest.mark.parametrize(
    ("model", "inputs", "fragment"),
    [
        ("mlp", {}, "missing input(s) ['x']; expected inputs ['x']"),
        ("mlp", {"x": np.zeros((1, 8), np.float32), "z": np.zeros(1)}, "unknown input(s) ['z']"),
        ("mlp", {"x": np.zeros((1, 8), np.float64)}, "input 'x' has datatype FP64, expected FP32"),
        ("mlp", {"x": np.zeros((1, 7), np.float32)}, "input 'x' has shape [1, 7], expected ['batch', 8]"),
        ("mlp", {"x": np.zeros((0, 8), np.float32)}, "input 'x' has 0 rows (shape [0, 8]); send at least one"),
        ("mlp", {"x": np.zeros((), np.float32)}, "needs a batch dimension first"),
        ("mlp", {"x": np.zeros((1, 8), np.float32), "z" * 5000: np.zeros(1)}, "unknown input(s) ['zzzz"),
        ("mlp", {"x": np.zeros((17, 8), np.float32)}, "batch of 17 rows is over max_batch_size 16"),
        ("mlp", {"x": np.full((2, 8), np.nan, np.float32)}, "input 'x' holds 16 NaN/Inf value(s)"),
        ("multi", {**ok_multi(), "b": np.zeros(3, np.int64)}, "input 'b' has shape [3], expected [2]"),
        ("batched", {"x": np.zeros((20, 8), np.float32)}, "over max_batch_size 16"),
    ],
)
def test_bad_inputs_are_refused_with_a_reason(
    manager: ModelManager, model: str, inputs: dict[str, np.ndarray], fragment: str
) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_inputs(manager.get(model), inputs)
    assert fragment in str(err.value)
    assert f"model '{model}' v" in str(err.value)


async def test_batch_sizes_must_agree_and_nan_is_accepted_where_allowed(tmp_path: Path) -> None:
    two = {
        "max_batch_size": 4,
        "inputs": [
            {"name": "x", "datatype": "FP32", "dims": [8]},
            {"name": "w", "datatype": "BF16", "dims": [-1], "allow_nan": True},
        ],
    }
    write_model(tmp_path, "two", {**mlp_config("two"), **two, "warmup": False}, {1: Mlp(1)})
    manager = ModelManager(ModelRepository(tmp_path))
    await manager.load_all()
    try:
        version = manager.get("two")
        nan = np.full((2, 3), np.nan, dtype=ml_dtypes.bfloat16)
        assert validate_inputs(version, {"x": np.zeros((2, 8), np.float32), "w": nan}) == 2
        with pytest.raises(InvalidArgument, match="input 'w' has batch size 3, but 'x' has 2"):
            validate_inputs(version, {"x": np.zeros((2, 8), np.float32), "w": np.zeros((3, 5), ml_dtypes.bfloat16)})
    finally:
        await manager.close()


def test_a_remembered_signature_still_checks_every_request_s_values(manager: ModelManager) -> None:
    mlp = manager.get("mlp")
    good = np.ones((3, 8), np.float32)
    assert validate_inputs(mlp, {"x": good}) == 3
    assert len(mlp.checked_signatures) == 1  # the shapes' verdict is kept
    bad = good.copy()
    bad[2, 5] = np.inf
    with pytest.raises(InvalidArgument, match="input 'x' holds 1 NaN/Inf value"):
        validate_inputs(mlp, {"x": bad})  # same signature: the values are checked all the same
    huge = good.copy()
    huge[0, 0] = -1e30
    with pytest.raises(InvalidArgument, match="holds 1 value\\(s\\) beyond"):
        validate_inputs(mlp, {"x": huge})
    with pytest.raises(InvalidArgument, match="expected FP32"):  # a refused signature is never remembered
        validate_inputs(mlp, {"x": good.astype(np.float64)})
    with pytest.raises(InvalidArgument, match="expected FP32"):
        validate_inputs(mlp, {"x": good.astype(np.float64)})
    assert len(mlp.checked_signatures) == 1
