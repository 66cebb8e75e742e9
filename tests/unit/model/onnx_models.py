"""Small real ONNX models for tests: eager test modules exported by services.model.export into repository folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from torch import nn

from services.model.config import ModelConfig
from services.model.export import export_onnx


def onnx_config(name: str, **extra: Any) -> dict[str, Any]:
    """An Mlp's config (x: FP32 [8] -> y: FP32 [1], batches up to 16) served by the onnxruntime backend."""
    config: dict[str, Any] = {
        "name": name,
        "backend": "onnxruntime",
        "max_batch_size": 16,
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [8]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [1]}],
    }
    config.update(extra)
    return config


def write_onnx_model(repo: Path, name: str, config: dict[str, Any], versions: dict[int, nn.Module]) -> Path:
    """`repo/<name>/config.yaml` and one exported `model.onnx` per version folder."""
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    parsed = ModelConfig.model_validate(config)
    for version, module in versions.items():
        export_onnx(module.eval(), parsed, folder / str(version) / "model.onnx")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder
