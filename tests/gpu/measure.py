"""The GPU check's in-process half: a model version loaded through a path's backend, its rows/s by batch size, how
far two paths' answers lie apart, whether a row's answer depends on the batch it came in, and the GPU memory left
in use after repeated loads and unloads."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import yaml

from services.model.backends.base import LoadedModel
from tests.gpu.variants import HEAVY, Variant, variant_config

RELOADS = 20
INVARIANCE_ROWS = 256
INVARIANCE_BATCHES = (32, 256)
COMPARE_ROWS = 4096


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)


@contextmanager
def loaded(model_dir: Path, variant: Variant, version: int = 1) -> Iterator[LoadedModel]:
    """Version `version` of the model in `model_dir` loaded through `variant`'s backend, unloaded after."""
    from services.model.backends import get_backend
    from services.model.config import ModelConfig

    config = ModelConfig.model_validate(variant_config(model_dir, variant, version))
    model = get_backend(config.backend).load(model_dir / str(version), config, version)
    try:
        yield model
    finally:
        model.unload()


def scores(model: LoadedModel, x: np.ndarray, batch: int | None = None) -> np.ndarray:
    """The model's scores for `x`, sent `batch` rows at a time (all at once when None)."""
    step = batch or len(x)
    return np.concatenate([model.forward({"features": x[i : i + step]})["score"] for i in range(0, len(x), step)])


def rows_per_second(model: LoadedModel, batches: tuple[int, ...], repeats: int, window_s: float) -> dict[int, float]:
    """Median rows/s of the model's forward at each batch size (bench.lib.rates: a warm-up, then timed windows)."""
    from bench.lib.rates import rows_per_second as rate

    found = {}
    for batch in batches:
        x = rows(batch, seed=batch)
        found[batch] = rate(lambda x=x: model.forward({"features": x}), batch, repeats=repeats, min_window_s=window_s)
    return found


def max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


def batch_invariance(model: LoadedModel) -> dict[int, float]:
    """max |diff| between each row answered alone and the same row answered inside a batch of each size in
    INVARIANCE_BATCHES (0.0: bit-identical). GPU libraries may pick other kernels by batch size: reported as is."""
    x = rows(INVARIANCE_ROWS, seed=5)
    alone = scores(model, x, batch=1)
    return {batch: max_diff(scores(model, x, batch=batch), alone) for batch in INVARIANCE_BATCHES}


async def reload_memory(variant: Variant, tmp: Path, cycles: int = RELOADS, model_dir: Path = HEAVY) -> tuple[int, int]:
    """GPU memory in use (bytes, NVML) after one load and unload of version 1 of `model_dir` through the model
    manager, and after `cycles` more."""
    from services.model.backends.gpu import memory_used
    from services.model.manager import ModelManager
    from services.model.repository import ModelRepository

    name = model_dir.name
    repo = tmp / f"reload-{variant.name.replace(' ', '_')}"
    shutil.copytree(model_dir / "1", repo / name / "1")
    (repo / name / "config.yaml").write_text(yaml.safe_dump(variant_config(model_dir, variant, 1)))
    manager = ModelManager(ModelRepository(repo), drain_timeout_s=5.0)
    await manager.load(name)
    await manager.unload(name)
    await asyncio.sleep(0.5)
    baseline = memory_used()
    for _ in range(cycles):
        await manager.load(name)
        await manager.unload(name)
    await asyncio.sleep(0.5)
    after = memory_used()
    shutil.rmtree(repo, ignore_errors=True)
    return baseline, after
