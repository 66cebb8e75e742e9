"""The TorchScript backend on real scripted models: outputs by config order, dtypes, INT8 at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from services.model.backends import get_backend
from services.model.backends.torchscript import TorchScriptBackend, TorchScriptModel
from services.model.config import ModelConfig


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


def test_int8_quantization_at_load_is_close_and_really_quantized(tmp_path: Path) -> None:
    folder = save(tmp_path)
    cfg = config(version_overrides={2: {"optimization": {"quantization": "int8"}}})
    fp32 = get_backend("torchscript").load(folder, cfg, 1)
    int8 = get_backend("torchscript").load(folder, cfg, 2)
    assert "quantized::linear_dynamic" in str(int8.module.inlined_graph)
    assert "quantized::linear_dynamic" not in str(fp32.module.inlined_graph)
    x = np.random.default_rng(1).standard_normal((256, 32)).astype(np.float32)
    diff = np.abs(fp32.forward({"x": x})["score"] - int8.forward({"x": x})["score"]).max()
    assert 0 < diff < 0.02
