"""The GPU paths of the model service against ONNX Runtime on the CPU (FP32 within 1e-4, FP16 within 1e-2), INT8
batch invariance on every GPU backend, the TensorRT plan cache and shipped plans, and GPU memory across 20 reloads.

Each test skips, saying why, where its library is missing (see tests/gpu/variants.py); `make gpu-check` runs them.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from services.model.backends import get_backend
from services.model.backends.base import LoadedModel
from services.model.config import ModelConfig
from services.model.export import onnx_session
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from tests.gpu.measure import RELOADS, reload_memory
from tests.gpu.variants import FRAUD, HEAVY, INT8_VARIANTS, TOLERANCE, VARIANTS, Variant, missing, variant_config

MEMORY_SLACK = 64 << 20  # allocator and driver bookkeeping: a leak of buffers or engines is far larger


def need(variant: Variant) -> None:
    reason = missing(variant)
    if reason is not None:
        pytest.skip(f"{variant.name}: {reason}")


def built(model_dir: Path, version: int) -> None:
    if not (model_dir / str(version) / "model.onnx").is_file():
        pytest.skip(f"{model_dir.name} v{version} is not built (`make models`)")


def load(model_dir: Path, variant: Variant, version: int) -> tuple[ModelConfig, LoadedModel]:
    config = ModelConfig.model_validate(variant_config(model_dir, variant, version))
    return config, get_backend(config.backend).load(model_dir / str(version), config, version)


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)


@pytest.fixture(autouse=True)
def plan_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MESHSERVE_MODEL_PLAN_CACHE", str(tmp_path / "plans"))
    return tmp_path / "plans"


@pytest.mark.parametrize("variant", VARIANTS, ids=[v.name for v in VARIANTS])
def test_each_gpu_path_answers_as_the_cpu_does(variant: Variant) -> None:
    need(variant)
    built(HEAVY, 1)
    reference = onnx_session(HEAVY / "1" / "model.onnx")
    _, model = load(HEAVY, variant, 1)
    try:
        assert model.device.startswith("cuda")
        for batch in (1, 7, 32, 128):
            x = rows(batch, seed=batch)
            got = model.forward({"features": x})["score"]
            want = reference.run(None, {"features": x})[0]
            assert got.shape == want.shape == (batch, 1)
            diff = float(np.abs(got - want).max())
            assert diff <= TOLERANCE[variant.precision], f"{variant.name} at batch {batch}: |diff| {diff}"
    finally:
        model.unload()


@pytest.mark.parametrize("variant", INT8_VARIANTS, ids=[v.name for v in INT8_VARIANTS])
@pytest.mark.parametrize("model_dir", [FRAUD, HEAVY], ids=["fraud_mlp", "heavy_mlp"])
def test_int8_answers_never_depend_on_the_batch_on_a_gpu(variant: Variant, model_dir: Path) -> None:
    need(variant)
    built(model_dir, 2)
    _, model = load(model_dir, variant, 2)
    try:
        x = rows(200, seed=5)
        alone = np.concatenate([model.forward({"features": x[i : i + 1]})["score"] for i in range(len(x))])
        for batch in (8, 32):
            order = np.random.default_rng(batch).permutation(len(x))
            together = np.empty_like(alone)
            for start in range(0, len(x), batch):
                index = order[start : start + batch]
                together[index] = model.forward({"features": x[index]})["score"]
            assert float(np.abs(together - alone).max()) <= 1e-5, f"{variant.name}: batch {batch}"
        cpu = onnx_session(model_dir / "2" / "model.onnx").run(None, {"features": x})[0]
        assert float(np.abs(alone - cpu).max()) <= 0.02  # INT8 kernels differ by device, within one score step
    finally:
        model.unload()


TENSORRT = next(v for v in VARIANTS if v.name == "tensorrt")


def test_a_plan_is_built_once_then_loaded_from_the_cache(plan_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    need(TENSORRT)
    built(HEAVY, 1)
    caplog.set_level(logging.INFO, logger="services.model.backends.tensorrt")
    _, first = load(HEAVY, TENSORRT, 1)
    first.unload()
    plans = sorted(plan_cache.glob("*.plan"))
    assert len(plans) == 1 and "plan built" in caplog.text
    mtime = plans[0].stat().st_mtime_ns
    caplog.clear()
    _, second = load(HEAVY, TENSORRT, 1)
    second.unload()
    assert "plan from the cache" in caplog.text and plans[0].stat().st_mtime_ns == mtime


def shipped_plans(plan_cache: Path, repo: Path) -> Path:
    """heavy_mlp with version 1 the cached plan and its key, version 2 the same plan said to be from another GPU."""
    _, model = load(HEAVY, TENSORRT, 1)
    model.unload()
    (plan,) = plan_cache.glob("*.plan")
    for version, gpu in ((1, None), (2, "NVIDIA elsewhere")):
        folder = repo / "heavy_mlp" / str(version)
        folder.mkdir(parents=True)
        shutil.copy2(plan, folder / "model.plan")
        meta = json.loads(plan.with_suffix(".json").read_text())
        if gpu:
            meta["gpu_name"] = gpu
        (folder / "model.plan.json").write_text(json.dumps(meta))
    config = variant_config(HEAVY, TENSORRT, 1)
    config["version_policy"] = {"all": {}}
    (repo / "heavy_mlp" / "config.yaml").write_text(yaml.safe_dump(config))
    return repo


async def test_a_shipped_plan_loads_and_one_from_another_gpu_is_reported_broken(
    plan_cache: Path, tmp_path: Path
) -> None:
    need(TENSORRT)
    built(HEAVY, 1)
    repo = shipped_plans(plan_cache, tmp_path / "repo")
    manager = ModelManager(ModelRepository(repo))
    await manager.load_all()
    try:
        index = {(e.name, e.version): e for e in manager.index()}
        assert index[("heavy_mlp", "1")].state == "READY"
        assert index[("heavy_mlp", "2")].state == "UNAVAILABLE"
        assert "the plan was built with TensorRT" in index[("heavy_mlp", "2")].reason
        out = manager.get("heavy_mlp", "1").model.forward({"features": rows(4)})["score"]
        want = onnx_session(HEAVY / "1" / "model.onnx").run(None, {"features": rows(4)})[0]
        assert float(np.abs(out - want).max()) <= TOLERANCE["FP32"]
    finally:
        await manager.close()


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.precision == "FP32"], ids=lambda v: v.name)
async def test_twenty_reloads_leave_gpu_memory_where_it_started(variant: Variant, tmp_path: Path) -> None:
    need(variant)
    built(HEAVY, 1)
    baseline, after = await reload_memory(variant, tmp_path, RELOADS)
    grown = after - baseline
    assert grown <= MEMORY_SLACK, f"{variant.name}: {RELOADS} reloads left {grown / 2**20:.0f} MiB more in use"
