"""Requests to the gateway's pipelines with tritonclient, as a user writes them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as triton
from tritonclient.utils import np_to_triton_dtype


def transaction(i: int = 0, *, rows: int = 1, user: str | None = None, amount: float = 42.5, t: int = 1_760_000_000):
    """A fraud pipeline request: one dict of [rows, 1] arrays (one column per raw field)."""

    def text(value: str) -> np.ndarray:
        return np.array([[value.encode()]] * rows, dtype=object)

    return {
        "event_time": np.full((rows, 1), t + i, np.int64),
        "user_id": text(user or f"user-{i}"),
        "merchant_id": text(f"merchant-{i % 7}"),
        "device_id": text(f"device-{i % 5}"),
        "amount": np.full((rows, 1), amount, np.float32),
        "country": text("US"),
        "channel": text("web"),
        "mcc": text("5411"),
        "card_present": np.full((rows, 1), i % 2 == 0),
        "account_age_days": np.full((rows, 1), 400.0, np.float32),
    }


def infer_inputs(arrays: Mapping[str, np.ndarray]) -> list[triton.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def params(result: triton.InferResult) -> dict[str, Any]:
    """Response parameters as plain values."""
    raw = result.get_response(as_json=True).get("parameters", {})
    return {k: next(iter(v.values())) for k, v in raw.items()}


def perf_analyzer_data(path: Path, count: int = 16) -> Path:
    """An --input-data file of real-looking transactions (perf_analyzer's random bytes are not valid ids/times)."""
    entries = []
    for i in range(count):
        row = transaction(i)
        entries.append(
            {
                name: [v.decode() if isinstance(v, bytes) else v.item() for v in array.reshape(-1)]
                for name, array in row.items()
            }
        )
    path.write_text(json.dumps({"data": entries}))
    return path
