"""The `heavy_mlp` benchmark model: a seeded, untrained 64-4096-4096-1 MLP whose forward costs far more than its I/O.

It is no demo (the stack does not serve it): `make models` writes it under `models/bench/` so that the benchmarks
and `make gpu-check` compare backends on one compute-bound model. Version 1 is FP32 (model.pt, model.onnx);
version 2 the static Q/DQ INT8 ONNX of the same weights, calibrated on the rows it ships (calibration.npz), beside
the TorchScript file the torchscript backend quantizes at load from those rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from services.model.export import FP32_TOLERANCE, Int8Recipe, export_version, onnx_session, save_rows

NAME = "heavy_mlp"
FOLDER = "bench/heavy_mlp"  # under models/, beside no demo: the demo stack loads every model in models/
METRIC = "FP32 ONNX max |diff| vs torch"
SEED = 1234
HIDDEN = 4096
FEATURES = 64
VERSIONS = (1, 2)
VERIFY_ROWS = 1000
CALIBRATION_ROWS = 1024
CALIBRATION_FILE = "calibration.npz"
# The first layer sees the raw rows, whose tails no calibration set bounds (INT8 there moved fresh rows' scores by up
# to 0.06), and the last makes the score: both stay FP32, 1.6% of the MACs; the 4096x4096 layer, the rest, is INT8
# with its output quantized too, the form ONNX Runtime runs as one integer kernel.
INT8_RECIPE = Int8Recipe(float_ends=True)


def heavy_module(hidden: int = HIDDEN, seed: int = SEED) -> torch.nn.Module:
    """Linear(64, hidden) -> ReLU -> Linear(hidden, hidden) -> ReLU -> Linear(hidden, 1), seeded, in eval mode;
    the global RNG state is left as it was."""
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        module = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, hidden),
            torch.nn.ReLU(),
            torch.nn.Linear(hidden, 1),
        ).eval()
    finally:
        torch.random.set_rng_state(state)
    return module


def save_torchscript(model: torch.nn.Module, path: Path) -> None:
    """Script `model` and save it to `path` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.jit.save(torch.jit.script(model.eval()), str(tmp))
    tmp.replace(path)


def rows(n: int, seed: int) -> dict[str, np.ndarray]:
    """`n` standard-normal feature rows: the distribution the benchmarks send."""
    return {"features": np.random.default_rng(seed).standard_normal((n, FEATURES)).astype(np.float32)}


def build(model_dir: Path, hidden: int = HIDDEN) -> dict[str, float]:
    """Write both versions into `model_dir` (its config.yaml already there); returns the export's checks."""
    module = heavy_module(hidden)
    for version in VERSIONS:
        save_torchscript(module, model_dir / str(version) / "model.pt")
    calibration = rows(CALIBRATION_ROWS, SEED + 1)
    save_rows(model_dir / "2" / CALIBRATION_FILE, calibration)
    report = export_version(
        module,
        model_dir.parent,
        NAME,
        1,
        rows=rows(VERIFY_ROWS, SEED + 2),
        int8_calibration=calibration,
        int8_version=2,
        int8_recipe=INT8_RECIPE,
    )
    assert report.int8_verification is not None and report.int8_path is not None
    fp32, int8 = onnx_session(report.onnx_path), onnx_session(report.int8_path)
    held_out = rows(VERIFY_ROWS, SEED + 3)["features"]
    int8_diff = float(
        np.abs(fp32.run(None, {"features": held_out})[0] - int8.run(None, {"features": held_out})[0]).max()
    )
    return {
        METRIC: report.verification.max_abs_diff["score"],
        "FP32 ONNX tolerance": FP32_TOLERANCE,
        "INT8 max |diff| vs FP32 (1,000 fresh rows)": int8_diff,
    }
