"""The backend registry: the config's `backend` choices are its keys, and an unknown name lists the registered ones."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.common.errors import InvalidArgument
from services.model.backends import BACKENDS, get_backend, registered
from services.model.backends.base import Backend
from services.model.config import ModelConfig, load_model_config
from tests.helpers.models import mlp_config


def test_config_choices_are_the_registry_keys() -> None:
    schema = ModelConfig.model_json_schema()["properties"]["backend"]
    assert schema["enum"] == list(BACKENDS) == registered()
    assert schema["default"] in BACKENDS
    for name in BACKENDS:
        assert ModelConfig.model_validate(mlp_config("m", backend=name)).backend == name


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_registered_backend_loads_under_its_name(name: str) -> None:
    backend = get_backend(name)
    assert isinstance(backend, Backend)
    assert backend.name == name and backend.platform and backend.triton_backend
    assert get_backend(name) is not backend  # a new instance per call


@pytest.mark.parametrize("name", ["tensorflow", "onnx", "TorchScript", "tensorrt_plan", ""])
def test_unknown_backend_in_a_config_names_the_registered_ones(tmp_path: Path, name: str) -> None:
    path = tmp_path / "m" / "config.yaml"
    path.parent.mkdir()
    path.write_text(yaml.safe_dump(mlp_config("m", backend=name)))
    with pytest.raises(InvalidArgument) as err:
        load_model_config(path, expected_name="m")
    message = str(err.value)
    assert message.startswith(f"{path}: invalid model config: backend: unknown backend {name!r}")
    assert message.endswith(f"registered backends: {', '.join(BACKENDS)}")


def test_unknown_backend_by_name_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match=r"unknown backend 'tensorflow'; registered backends: torchscript, onnx"):
        get_backend("tensorflow")
