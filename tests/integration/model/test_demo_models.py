"""Tests of the demo model repository builder (`models.build`): determinism, quality, configs, shapes, and the ONNX
exports it verifies (FP32 against torch, static INT8 against FP32). Building the fraud model replays its training
stream through the feature code on an embedded Valkey (a process), hence here; the benchmarks' model, built without
one, is tested in tests/unit/model/test_heavy_model.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from models import heavy_mlp
from models.build import BUILDERS, MODELS_DIR, BuiltModel, build_models, folder
from models.fraud_mlp import make_dataset
from services.model.backends.onnx_io import check_io, quantization_of, read_onnx
from services.model.config import ModelConfig, load_model_config
from services.model.export import onnx_session

TORCH_DTYPES = {"FP32": torch.float32, "INT64": torch.int64}
EXPECTED_VERSIONS = {"fraud_mlp": [1, 2], "digits_cnn": [1]}
DEMO = sorted(EXPECTED_VERSIONS)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, BuiltModel], dict[str, BuiltModel]]:
    """The demo models built twice, into two different folders."""
    first = build_models(tmp_path_factory.mktemp("repo_a"), DEMO)
    second = build_models(tmp_path_factory.mktemp("repo_b"), DEMO)
    return first, second


def _load(built: BuiltModel, version: int) -> torch.jit.ScriptModule:
    return torch.jit.load(str(built.path / str(version) / "model.pt"), map_location="cpu")


def _config(built: BuiltModel) -> ModelConfig:
    return load_model_config(built.path / "config.yaml", expected_name=built.name)


def test_builds_every_model_and_version(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    assert sorted(BUILDERS) == sorted([*EXPECTED_VERSIONS, heavy_mlp.NAME])
    assert folder(heavy_mlp.NAME) == "bench/heavy_mlp"  # beside the demo, which the stack serves whole
    for built in builds:
        assert sorted(built) == DEMO
        for name, model in built.items():
            versions = sorted(int(p.name) for p in model.path.iterdir() if p.is_dir())
            assert versions == EXPECTED_VERSIONS[name]
            assert not list(model.path.rglob("*.tmp"))
            for version in versions:
                assert {p.name for p in (model.path / str(version)).iterdir()} >= {"model.pt", "model.onnx"}


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


def test_fraud_versions_compute_the_same_function(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    """Version 2's TorchScript file is the equalised copy of version 1 (channels rescaled for INT8): other weights,
    the same scores."""
    fraud = builds[0]["fraud_mlp"]
    v1, v2 = _load(fraud, 1), _load(fraud, 2)
    assert not torch.equal(v1.state_dict()["layers.0.weight"], v2.state_dict()["layers.0.weight"])
    x = torch.from_numpy(make_dataset(seed=7, users=300, days=10, episodes=25).x)
    with torch.no_grad():
        assert (v1(x) - v2(x)).abs().max() <= 1e-5


def test_exports_answer_as_torch_and_int8_stays_close(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    fraud, digits = builds[0]["fraud_mlp"].checks, builds[0]["digits_cnn"].checks
    assert fraud["FP32 ONNX max |diff| vs torch"] <= 1e-5 and digits["FP32 ONNX max |diff| vs torch"] <= 1e-5
    assert digits["ONNX labels differing from torch"] == 0
    assert fraud["INT8 max |diff| vs FP32 (held-out)"] <= 0.02
    assert fraud["FP32 ONNX held-out ROC AUC"] - fraud["INT8 held-out ROC AUC"] <= 0.005
    path = builds[0]["fraud_mlp"].path
    config = load_model_config(path / "config.yaml")
    for version, kind in ((1, "none"), (2, "static")):
        model = read_onnx(path / str(version) / "model.onnx")
        check_io(model, config, f"fraud_mlp/{version}")
        assert quantization_of(model) == kind
    assert (path / "2" / "calibration.npz").is_file()


def test_onnx_exports_are_deterministic(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    first, second = builds
    x = make_dataset(seed=7, users=300, days=10, episodes=25).x
    for version in (1, 2):
        a = onnx_session(first["fraud_mlp"].path / str(version) / "model.onnx").run(None, {"features": x})[0]
        b = onnx_session(second["fraud_mlp"].path / str(version) / "model.onnx").run(None, {"features": x})[0]
        assert np.array_equal(a, b), f"fraud_mlp/{version}/model.onnx differs between builds"


def test_configs_validate(builds: tuple[dict[str, BuiltModel], ...]) -> None:
    fraud, digits = _config(builds[0]["fraud_mlp"]), _config(builds[0]["digits_cnn"])
    assert fraud.version_policy.select([1, 2]) == [1, 2]
    assert fraud.optimization_for(1).quantization == "none"
    assert fraud.optimization_for(2).quantization == "int8"
    assert digits.version_policy.select([1]) == [1]
    for name in [*EXPECTED_VERSIONS, heavy_mlp.NAME]:
        committed = load_model_config(MODELS_DIR / folder(name) / "config.yaml", expected_name=name)
        if name in builds[0]:
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
