"""Tests of the demo model repository builder (`models.build`): determinism, quality, configs, shapes."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import roc_auc_score

from models.build import BUILDERS, MODELS_DIR, BuiltModel, build_models
from models.fraud_mlp import make_dataset
from services.model.config import ModelConfig, load_model_config

TORCH_DTYPES = {"FP32": torch.float32, "INT64": torch.int64}
EXPECTED_VERSIONS = {"fraud_mlp": [1, 2], "digits_cnn": [1]}


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, BuiltModel], dict[str, BuiltModel]]:
    """The whole repository built twice, into two different folders."""
    first = build_models(tmp_path_factory.mktemp("repo_a"))
    second = build_models(tmp_path_factory.mktemp("repo_b"))
    return first, second


def _load(built: BuiltModel, version: int) -> torch.jit.ScriptModule:
    return torch.jit.load(str(built.path / str(version) / "model.pt"), map_location="cpu")


def _config(built: BuiltModel) -> ModelConfig:
    return load_model_config(built.path / "config.yaml", expected_name=built.name)


def test_builds_every_model_and_version(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    for built in builds:
        assert sorted(built) == sorted(BUILDERS) == sorted(EXPECTED_VERSIONS)
        for name, model in built.items():
            versions = sorted(int(p.name) for p in model.path.iterdir() if p.is_dir())
            assert versions == EXPECTED_VERSIONS[name]
            assert not list(model.path.rglob("*.tmp"))


def test_build_is_deterministic(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    first, second = builds
    assert first["fraud_mlp"].path.parent != second["fraud_mlp"].path.parent
    for name, versions in EXPECTED_VERSIONS.items():
        assert first[name].value == second[name].value
        for version in versions:
            state_a = _load(first[name], version).state_dict()
            state_b = _load(second[name], version).state_dict()
            assert state_a.keys() == state_b.keys()
            for key, tensor in state_a.items():
                assert torch.equal(tensor, state_b[key]), f"{name}/{version}: {key} differs between builds"


def test_fraud_versions_share_weights(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    fraud = builds[0]["fraud_mlp"]
    v1, v2 = _load(fraud, 1).state_dict(), _load(fraud, 2).state_dict()
    assert all(torch.equal(v1[key], v2[key]) for key in v1)


def test_configs_validate(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    fraud, digits = _config(builds[0]["fraud_mlp"]), _config(builds[0]["digits_cnn"])
    assert fraud.version_policy.select([1, 2]) == [1, 2]
    assert fraud.optimization_for(1).quantization == "none"
    assert fraud.optimization_for(2).quantization == "int8"
    assert digits.version_policy.select([1]) == [1]
    for name in EXPECTED_VERSIONS:
        committed = load_model_config(MODELS_DIR / name / "config.yaml", expected_name=name)
        assert committed == _config(builds[0][name])


def test_quality(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    assert builds[0]["fraud_mlp"].value >= 0.90
    assert builds[0]["digits_cnn"].value >= 0.95


@pytest.mark.parametrize(("name", "version"), [("fraud_mlp", 1), ("fraud_mlp", 2), ("digits_cnn", 1)])
def test_outputs_match_config(builds: tuple[dict[str, BuiltModel], ...], name: str, version: int) -> None:
    built = builds[0][name]
    config = _config(built)
    module = _load(built, version)
    batch = 5
    generator = torch.Generator().manual_seed(0)
    inputs = []
    for spec in config.inputs:
        assert spec.datatype == "FP32"
        inputs.append(torch.rand([batch, *spec.dims], generator=generator, dtype=torch.float32))
    with torch.no_grad():
        result = module(*inputs)
    outputs = result if isinstance(result, tuple) else (result,)
    assert len(outputs) == len(config.outputs)
    for spec, tensor in zip(config.outputs, outputs, strict=True):
        assert tensor.dtype == TORCH_DTYPES[spec.datatype], spec.name
        assert list(tensor.shape) == [batch, *spec.dims], spec.name
    if name == "digits_cnn":
        probabilities, label = outputs
        assert torch.allclose(probabilities.sum(dim=1), torch.ones(batch))
        assert torch.equal(label.squeeze(1), probabilities.argmax(dim=1))


def test_fraud_scores_are_probabilities(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    module = _load(builds[0]["fraud_mlp"], 1)
    data = make_dataset(seed=7, users=300, days=10, episodes=25)  # a fresh, smaller stream
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y)
    extreme = torch.tensor([[-1e3] * 64, [1e3] * 64, [0.0] * 64])
    with torch.no_grad():
        scores = module(torch.cat([x, extreme]))
    assert scores.dtype == torch.float32 and scores.shape == (len(x) + 3, 1)
    assert torch.isfinite(scores).all()
    assert float(scores.min()) >= 0.0 and float(scores.max()) <= 1.0
    # a fresh stream from the same generator, through the same feature code, still ranks fraud above the rest
    assert roc_auc_score(y.numpy(), scores[: len(x), 0].numpy()) >= 0.85
