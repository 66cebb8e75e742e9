"""The models the GPU check measures, gathered in one work repository: fraud_mlp as given, heavy_mlp rebuilt from its
seed where its weights did not travel, and an FP16 TorchScript file beside each version's model.pt.

heavy_mlp's FP32 weights are 65 MiB per file, more than a device run can carry, and they are a seeded draw: a bundle
carries the recipe (seed, sizes, fingerprints, the scores of a few rows) instead, and the GPU machine rebuilds the
files with the code `make models` uses, then checks that it got the very same weights and scores.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.gpu.variants import FP16_FILE

RECIPE_FILE = "recipe.json"  # in a bundle's bench/heavy_mlp/ where its version 1 is not carried
RECIPE_ROWS = 16
RECIPE_ROWS_SEED = 99
HEAVY_FOLDER = Path("bench") / "heavy_mlp"
FRAUD_FOLDER = Path("fraud_mlp")


def weights_sha256(module: Any) -> str:
    """A fingerprint of a torch module's parameters and buffers: names and raw bytes, in state-dict order."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def recipe_rows() -> np.ndarray:
    return np.random.default_rng(RECIPE_ROWS_SEED).standard_normal((RECIPE_ROWS, 64)).astype(np.float32)


def heavy_recipe(heavy_dir: Path) -> dict[str, Any]:
    """What rebuilds and checks heavy_mlp v1 elsewhere, read off the files `make models` wrote in `heavy_dir`."""
    import torch

    from models import heavy_mlp
    from services.model.export import onnx_session

    version = heavy_dir / "1"
    scores = onnx_session(version / "model.onnx").run(None, {"features": recipe_rows()})[0]
    return {
        "model": heavy_mlp.NAME,
        "seed": heavy_mlp.SEED,
        "hidden": heavy_mlp.HIDDEN,
        "weights_sha256": weights_sha256(torch.jit.load(str(version / "model.pt"), map_location="cpu")),
        "onnx_sha256": file_sha256(version / "model.onnx"),
        "rows_seed": RECIPE_ROWS_SEED,
        "scores": [float(v) for v in scores.reshape(-1)],
    }


def rebuild_heavy(recipe: dict[str, Any], version_dir: Path) -> list[str]:
    """Write heavy_mlp's model.pt and model.onnx into `version_dir` from `recipe`; lines saying what matched (a
    GPU run is too rare to lose: weights that differ from the recipe's are said loudly, not refused)."""
    from models import heavy_mlp
    from services.model.config import load_model_config
    from services.model.export import export_onnx, onnx_session

    started = time.perf_counter()
    module = heavy_mlp.heavy_module(int(recipe["hidden"]), int(recipe["seed"]))
    got = weights_sha256(module)
    same = got == recipe["weights_sha256"]
    heavy_mlp.save_torchscript(module, version_dir / "model.pt")
    config = load_model_config(version_dir.parent / "config.yaml")
    export_onnx(module, config, version_dir / "model.onnx")
    scores = onnx_session(version_dir / "model.onnx").run(None, {"features": recipe_rows()})[0].reshape(-1)
    diff = float(np.abs(scores - np.asarray(recipe["scores"], np.float32)).max())
    same_onnx = file_sha256(version_dir / "model.onnx") == recipe["onnx_sha256"]
    weights = (
        f"weights identical (sha256 {got[:12]})"
        if same
        else f"WEIGHTS DIFFER (sha256 {got[:12]}, the bundle's {recipe['weights_sha256'][:12]}): this torch draws "
        "them differently, so the figures are of a model of the same shape, not of the same model"
    )
    return [
        f"heavy_mlp v1 rebuilt from seed {recipe['seed']} in {time.perf_counter() - started:.1f} s: {weights}",
        f"heavy_mlp model.onnx {'byte-identical to' if same_onnx else 'exported differently from'} the bundle "
        f"machine's; ONNX Runtime's scores of {RECIPE_ROWS} recipe rows: max |diff| {diff:.2g} against its",
    ]


def write_half(version_dir: Path) -> Path:
    """`FP16_FILE` beside `version_dir`/model.pt: the same module with FP16 weights, taking and giving FP32."""
    import torch

    class Half(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, features: torch.Tensor) -> torch.Tensor:
            return self.inner(features.half()).float()

    inner = torch.jit.load(str(version_dir / "model.pt"), map_location="cpu").half()
    path = version_dir / FP16_FILE
    torch.jit.save(torch.jit.script(Half(inner).eval()), str(path))
    return path


def prepare(source: Path, work: Path) -> tuple[Path, list[str]]:
    """A model repository under `work` holding version 1 of fraud_mlp and heavy_mlp from `source` (a models/ folder
    or a bundle's), heavy_mlp rebuilt where `source` carries its recipe only, each with its FP16 file; with what
    was done, line by line."""
    root = work / "models"
    lines: list[str] = []
    for folder in (FRAUD_FOLDER, HEAVY_FOLDER):
        src, dst = source / folder, root / folder
        (dst / "1").mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / "config.yaml", dst / "config.yaml")
        given = src / "1"
        if (given / "model.pt").is_file():
            for item in given.iterdir():
                if item.is_file() and item.name != FP16_FILE:
                    shutil.copy2(item, dst / "1" / item.name)
            lines.append(f"{folder.name} v1 from {given}")
        else:
            recipe_path = src / RECIPE_FILE
            if not recipe_path.is_file():
                raise FileNotFoundError(f"{given} has no model.pt and {recipe_path} is missing: run `make models`")
            lines.extend(rebuild_heavy(json.loads(recipe_path.read_text()), dst / "1"))
        write_half(dst / "1")
    lines.append(f"FP16 TorchScript files written beside each model.pt ({FP16_FILE})")
    return root, lines
