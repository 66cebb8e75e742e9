"""Private model repositories for the benchmarks: one model, version 1 only, its committed config with a change."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from bench.lib.serving import ROOT

MODELS = ROOT / "models"
FRAUD = "fraud_mlp"
DIGITS = "digits_cnn"
HEAVY = "heavy_mlp"
HEAVY_FOLDER = Path("bench") / HEAVY  # under the repository root, beside the demo (built by `make models`)
HEAVY_DELAY_US = 8000


def _serve_v1_only(config: dict[str, Any]) -> dict[str, Any]:
    config["version_policy"] = {"specific": {"versions": [1]}}
    config.pop("version_overrides", None)
    return config


def _write_config(model_dir: Path, config: dict[str, Any]) -> None:
    (model_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def model_dir(model: str, models: Path = MODELS) -> Path:
    """Where `model` lives in the repository at `models` (the heavy one under bench/)."""
    return models / HEAVY_FOLDER if model == HEAVY else models / model


def with_backend(config: dict[str, Any], backend: str | None) -> dict[str, Any]:
    """`config` served by `backend` (None: the config's own), with the backend's own model file."""
    if backend is not None:
        config["backend"] = backend
        config.pop("default_model_filename", None)  # the backend's own file
    return config


def default_backend(model: str, models: Path = MODELS) -> str:
    """The backend `model`'s committed config serves it with."""
    return str(yaml.safe_load((model_dir(model, models) / "config.yaml").read_text()).get("backend", "torchscript"))


def copy_fraud(repo: Path, batching: bool, models: Path = MODELS, backend: str | None = None) -> None:
    """Copy models/fraud_mlp (config and version 1 only) into `repo`; drop dynamic_batching when off; `backend`
    overrides the config's."""
    copy_model(repo, FRAUD, batching, models, backend)


def copy_model(repo: Path, model: str, batching: bool, models: Path = MODELS, backend: str | None = None) -> None:
    """A demo model's config and version 1 in `repo` (see copy_fraud)."""
    src = model_dir(model, models)
    dst = repo / model
    (dst / "1").mkdir(parents=True)
    for item in (src / "1").iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, dst / "1" / item.name)
    config = yaml.safe_load((src / "config.yaml").read_text())
    if not batching:
        config.pop("dynamic_batching", None)
    _write_config(dst, _serve_v1_only(with_backend(config, backend)))


def heavy_file(models: Path = MODELS) -> Path:
    """The heavy model's TorchScript file (model.onnx beside it), as `make models` writes it."""
    return model_dir(HEAVY, models) / "1" / "model.pt"


def write_heavy(
    repo: Path, batching: bool, model_file: Path, models: Path = MODELS, backend: str | None = None
) -> None:
    """The heavy model's repository entry: its committed config (backend overridden by `backend`), version 1 =
    `model_file` with the model.onnx beside it when there is one; without batching, no dynamic_batching."""
    dst = repo / HEAVY
    (dst / "1").mkdir(parents=True)
    shutil.copy2(model_file, dst / "1" / "model.pt")
    onnx_file = model_file.with_name("model.onnx")
    if onnx_file.is_file():
        shutil.copy2(onnx_file, dst / "1" / "model.onnx")
    committed = model_dir(HEAVY, models) / "config.yaml"
    config: dict[str, Any] = yaml.safe_load(committed.read_text()) if committed.is_file() else {}
    config.setdefault("name", HEAVY)
    config.setdefault("max_batch_size", 128)
    config.setdefault("inputs", [{"name": "features", "datatype": "FP32", "dims": [64]}])
    config.setdefault("outputs", [{"name": "score", "datatype": "FP32", "dims": [1]}])
    if batching:
        # A long forward is far cheaper per row in one large batch: wait up to 8 ms for the rows just answered.
        config["dynamic_batching"] = {
            "max_queue_size": 4096,
            **(config.get("dynamic_batching") or {}),
            "max_queue_delay_us": HEAVY_DELAY_US,
        }
    else:
        config.pop("dynamic_batching", None)
    _write_config(dst, _serve_v1_only(with_backend(config, backend)))


def write_variant(repo: Path, model: str, heavy_file: Path, config: dict[str, Any]) -> None:
    """`model` alone in `repo` (one model per server, as bench.model_service serves them), with a variant's config
    changes applied: `<key>` replaces a top-level key, `dynamic_batching.<knob>` one batching knob."""
    if model == FRAUD:
        copy_fraud(repo, batching=True)
    else:
        write_heavy(repo, batching=True, model_file=heavy_file)
    path = repo / model / "config.yaml"
    document = yaml.safe_load(path.read_text())
    for key, value in config.items():
        if key.startswith("dynamic_batching."):
            document["dynamic_batching"][key.removeprefix("dynamic_batching.")] = value
        else:
            document[key] = value
    path.write_text(yaml.safe_dump(document, sort_keys=False))
