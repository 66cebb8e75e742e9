"""The benchmarks' model (`models.heavy_mlp`) as `models.build` writes it: both versions, the INT8 one quantized."""

from __future__ import annotations

from pathlib import Path

from models import heavy_mlp
from models.build import folder, write_config
from services.model.backends.onnx_io import quantization_of, read_onnx


def test_heavy_model_builds_both_versions(tmp_path: Path) -> None:
    """The benchmarks' model, at a small width: FP32 ONNX verified against torch, version 2 static INT8."""
    write_config(heavy_mlp.NAME, tmp_path)
    model_dir = tmp_path / folder(heavy_mlp.NAME)
    checks = heavy_mlp.build(model_dir, hidden=64)
    assert checks[heavy_mlp.METRIC] <= 1e-5 and 0 < checks["INT8 max |diff| vs FP32 (1,000 fresh rows)"] < 0.05
    assert {p.name for p in (model_dir / "2").iterdir()} == {"model.pt", "model.onnx", "calibration.npz"}
    assert quantization_of(read_onnx(model_dir / "2" / "model.onnx")) == "static"
