"""The TorchScript backend on real scripted models: outputs by config order, dtypes, static INT8 at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from services.model.backends import get_backend
from services.model.backends.torchscript import TorchScriptBackend, TorchScriptModel
from services.model.config import ModelConfig
from tests.unit.model.conftest import write_calibration


class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def config(**extra) -> ModelConfig:
    return ModelConfig.model_validate(
        {
            "name": "wide",
            "max_batch_size": 8,
            "inputs": [{"name": "x", "datatype": "FP32", "dims": [32]}],
            "outputs": [{"name": "score", "datatype": "FP32", "dims": [1]}],
            **extra,
        }
    )


def save(tmp_path: Path) -> Path:
    folder = tmp_path / "1"
    folder.mkdir()
    torch.jit.save(torch.jit.script(Wide().eval()), str(folder / "model.pt"))
    return folder


def test_fp32_forward_equals_torch(tmp_path: Path) -> None:
    backend = get_backend("torchscript")
    assert isinstance(backend, TorchScriptBackend)
    model = backend.load(save(tmp_path), config(), 1)
    assert isinstance(model, TorchScriptModel)
    assert model.device == ("cuda" if torch.cuda.is_available() else "cpu")  # device: auto
    x = np.random.default_rng(0).standard_normal((5, 32)).astype(np.float32)
    out = model.forward({"x": x})
    with torch.inference_mode():
        expected = Wide().eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(out["score"], expected, rtol=1e-6)
    assert out["score"].dtype == np.float32


def test_static_int8_at_load_is_close_really_quantized_and_batch_invariant(tmp_path: Path) -> None:
    folder = save(tmp_path)
    write_calibration(folder, x=np.random.default_rng(2).standard_normal((512, 32)).astype(np.float32))
    cfg = config(version_overrides={2: {"optimization": {"quantization": "int8"}}})
    fp32 = get_backend("torchscript").load(folder, cfg, 1)
    int8 = get_backend("torchscript").load(folder, cfg, 2)
    graph = str(int8.module.inlined_graph)
    assert "quantized::linear" in graph and "linear_dynamic" not in graph  # static scales, in the graph
    assert "quantized::" not in str(fp32.module.inlined_graph)
    x = np.random.default_rng(1).standard_normal((256, 32)).astype(np.float32)
    diff = np.abs(fp32.forward({"x": x})["score"] - int8.forward({"x": x})["score"]).max()
    assert 0 < diff < 0.02
    alone = np.concatenate([int8.forward({"x": x[i : i + 1]})["score"] for i in range(len(x))])
    assert np.abs(int8.forward({"x": x})["score"] - alone).max() <= 1e-5


def test_int8_without_calibration_rows_is_refused(tmp_path: Path) -> None:
    cfg = config(version_overrides={2: {"optimization": {"quantization": "int8"}}})
    with pytest.raises(FileNotFoundError, match=r"calibration\.npz not found: quantization int8 on the torchscript"):
        get_backend("torchscript").load(save(tmp_path), cfg, 2)


def test_the_process_s_torch_thread_count_applies_to_an_imported_torch() -> None:
    import torch

    from services.model.backends import set_torch_threads, torch_threads

    before = torch.get_num_threads()
    try:
        set_torch_threads(2)
        assert torch_threads() == 2 and torch.get_num_threads() == 2
    finally:
        set_torch_threads(0)
        torch.set_num_threads(before)
