"""Finite float inputs too large for a model's arithmetic are bad input, found by the RPC fuzzer
(tests/fuzz): fraud_mlp's raw features with their last four bytes changed to 00 00 00 7f
(1.7e38) made version 2's dynamic INT8 quantization raise ("min should be less than or equal to max"), answered
INTERNAL for every request of the batch, and version 1 answer NaN."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from services.common.errors import InvalidArgument
from services.common.server import Lifecycle
from services.model.domain import InferenceRequest
from services.model.handler import ModelHandler
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from services.model.validation import LARGEST_INPUT, validate_inputs

FUZZED = struct.unpack("<f", b"\x00\x00\x00\x7f")[0]  # 1.7014118e38: finite, past every activation's range
DEMO = Path(__file__).resolve().parents[3] / "models"


def fuzzed_rows(value: float = FUZZED, width: int = 8) -> np.ndarray:
    """The fuzzer's example: two rows of zeros whose very last value is `value`."""
    x = np.zeros((2, width), np.float32)
    x[1, -1] = value
    return x


@pytest.fixture()
async def demo() -> AsyncIterator[ModelHandler]:
    """The demo repository's fraud_mlp (version 2: static INT8), as the fuzzed model service serves it."""
    manager = ModelManager(ModelRepository(DEMO), drain_timeout_s=5.0)
    await manager.load("fraud_mlp")
    state = Lifecycle()
    state.ready = True
    yield ModelHandler(manager, state)
    await manager.close()


@pytest.mark.parametrize("version", ["1", "2"])
async def test_a_value_whose_square_overflows_is_refused_before_the_forward(demo: ModelHandler, version: str) -> None:
    request = InferenceRequest("fraud_mlp", version, {"features": fuzzed_rows(width=64)})
    with pytest.raises(InvalidArgument, match=r"input 'features' holds 1 value\(s\) beyond \+-1.84e\+19"):
        await demo.infer(request, None)
    # What the old check let through: FP32 answers NaN. (Dynamic INT8 raised on it, INTERNAL for the whole batch;
    # static INT8's scales are fixed, so its forward computes, saturating, whatever the batch holds.)
    model = demo.manager.get("fraud_mlp", version).model
    scores = model.forward({"features": fuzzed_rows(width=64)})["score"]
    if version == "1":
        assert np.isnan(scores).any()


async def test_values_up_to_the_bound_are_computed(handler: ModelHandler) -> None:
    largest = np.float32(LARGEST_INPUT["FP32"])
    response = await handler.infer(InferenceRequest("int8", "1", {"x": fuzzed_rows(float(-largest))}), None)
    assert np.isfinite(response.outputs["y"]).all()


def test_nan_and_inf_keep_their_own_message_and_fp16_keeps_its_range(manager: ModelManager) -> None:
    mv = manager.get("int8", "1")
    with pytest.raises(InvalidArgument, match="holds 1 NaN/Inf value"):
        validate_inputs(mv, {"x": fuzzed_rows(np.inf)})
    assert "FP16" not in LARGEST_INPUT  # its root (256) is below ordinary inputs: only NaN/Inf are refused there
