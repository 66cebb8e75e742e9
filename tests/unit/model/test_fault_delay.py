"""Fault injection: MESHSERVE_MODEL_FAULT_DELAY_MS makes every forward pass of every model that much longer."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from services.model.faults import DelayedModel
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from tests.helpers.models import Mlp, mlp_config, reference_output, write_model


async def test_every_forward_is_delayed_and_still_correct(tmp_path: Path) -> None:
    write_model(tmp_path, "m", mlp_config("m"), {1: Mlp(1)})
    manager = ModelManager(ModelRepository(tmp_path), fault_delay_ms=60)
    await manager.load_all()
    try:
        model = manager.get("m").model
        assert isinstance(model, DelayedModel)
        x = np.ones((2, 8), np.float32)
        start = time.perf_counter()
        out = model.forward({"x": x})
        assert time.perf_counter() - start >= 0.06
        np.testing.assert_allclose(out["y"], reference_output(Mlp(1), x), rtol=1e-5)
    finally:
        await manager.close()


async def test_no_delay_by_default(tmp_path: Path) -> None:
    write_model(tmp_path, "m", mlp_config("m"), {1: Mlp(1)})
    manager = ModelManager(ModelRepository(tmp_path))
    await manager.load_all()
    try:
        assert not isinstance(manager.get("m").model, DelayedModel)
    finally:
        await manager.close()
