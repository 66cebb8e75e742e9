"""Model config validation (errors name the file and field) and version policies."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.common.errors import InvalidArgument
from services.model.config import VersionPolicy, load_model_config

BASE = {
    "max_batch_size": 8,
    "inputs": [{"name": "x", "datatype": "FP32", "dims": [4]}],
    "outputs": [{"name": "y", "datatype": "FP32", "dims": [1]}],
}


def write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "m" / "config.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_valid_config_gets_its_folder_name(tmp_path: Path) -> None:
    config = load_model_config(write(tmp_path, BASE), expected_name="m")
    assert config.name == "m" and config.backend == "torchscript" and config.dynamic_batching is None


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"inputs": [{"name": "x", "datatype": "FP33", "dims": [4]}]}, "inputs.0.datatype"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "dims": [0]}]}, "dims must be positive or -1"),
        ({"max_batch_size": 0, "dynamic_batching": {}}, "dynamic_batching needs max_batch_size >= 1"),
        ({"dynamic_batching": {"preferred_batch_sizes": [16]}}, "preferred_batch_sizes [16] outside"),
        ({"version_policy": {"latest": {"num_versions": 1}, "all": {}}}, "choose one of latest/all/specific"),
        ({"optimisation": {"quantization": "int8"}}, "optimisation: unknown field"),
        ({"name": "other"}, "differs from its folder"),
        ({"outputs": [{"name": "y", "datatype": "FP32", "dims": [1]}] * 2}, "duplicate output names"),
    ],
)
def test_invalid_configs_name_file_and_field(tmp_path: Path, change: dict, fragment: str) -> None:
    path = write(tmp_path, {**BASE, **change})
    with pytest.raises(InvalidArgument) as err:
        load_model_config(path, expected_name="m")
    assert str(path) in str(err.value)
    assert fragment in str(err.value)


def test_unreadable_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("inputs: [unclosed")
    with pytest.raises(InvalidArgument, match="cannot read model config"):
        load_model_config(path)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({}, [7]),
        ({"latest": {"num_versions": 2}}, [3, 7]),
        ({"all": {}}, [1, 3, 7]),
        ({"specific": {"versions": [1, 7, 9]}}, [1, 7]),
    ],
)
def test_version_policy_select(policy: dict, expected: list[int]) -> None:
    assert VersionPolicy.model_validate(policy).select([3, 1, 7]) == expected


def test_version_override_applies_to_one_version(tmp_path: Path) -> None:
    doc = {**BASE, "version_overrides": {2: {"optimization": {"quantization": "int8"}}}}
    config = load_model_config(write(tmp_path, doc), expected_name="m")
    assert config.optimization_for(1).quantization == "none"
    assert config.optimization_for(2).quantization == "int8"
