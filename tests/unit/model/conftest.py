"""Fixtures for model tests: a repository of small real TorchScript models, its ModelManager and ModelHandler."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from services.common.server import Lifecycle
from services.model.backends.torchscript import CALIBRATION_FILE
from services.model.handler import ModelHandler
from services.model.manager import ModelManager
from services.model.repository import ModelRepository
from tests.helpers.models import Mlp, MultiIO, mlp_config, multi_io_config, write_model


def write_calibration(version_dir: Path, **rows: np.ndarray) -> Path:
    """The calibration rows an INT8 TorchScript version ships (one array per input)."""
    path = version_dir / CALIBRATION_FILE
    np.savez(path, **rows)
    return path


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """mlp: versions 1-3, the latest two served; batched: dynamic batching padded to 4 or 16; multi: two inputs and
    outputs, no batch dimension; int8: version 2 static INT8, calibrated on the rows it ships; broken: a backend nobody
    registered."""
    root = tmp_path / "repo"
    latest_two = {"latest": {"num_versions": 2}}
    write_model(root, "mlp", mlp_config("mlp", version_policy=latest_two), {1: Mlp(1), 2: Mlp(2), 3: Mlp(3)})
    batching = {"max_queue_delay_us": 0, "allowed_batch_sizes": [4, 16], "max_queue_size": 64}
    write_model(root, "batched", mlp_config("batched", dynamic_batching=batching, instance_count=2), {1: Mlp(7)})
    write_model(root, "multi", multi_io_config("multi"), {1: MultiIO()})
    int8 = {
        "device": "cpu",
        "version_policy": {"all": {}},
        "version_overrides": {2: {"optimization": {"quantization": "int8"}}},
    }
    write_model(root, "int8", mlp_config("int8", **int8), {1: Mlp(4), 2: Mlp(4)})
    write_calibration(root / "int8" / "2", x=np.random.default_rng(4).standard_normal((256, 8)).astype(np.float32))
    write_model(root, "broken", mlp_config("broken", backend="tensorflow"), {1: Mlp(5)})
    return root


@pytest.fixture()
async def manager(repo: Path) -> AsyncIterator[ModelManager]:
    """Every model of `repo` loaded (broken fails, as it would at start); everything unloaded at the end."""
    models = ModelManager(ModelRepository(repo), drain_timeout_s=5.0)
    await models.load_all()
    yield models
    await models.close()


@pytest.fixture()
def lifecycle() -> Lifecycle:
    """A lifecycle that says SERVING, as GrpcService leaves it once the models loaded."""
    state = Lifecycle()
    state.ready = True
    return state


@pytest.fixture()
def handler(manager: ModelManager, lifecycle: Lifecycle) -> ModelHandler:
    return ModelHandler(manager, lifecycle)
