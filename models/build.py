"""Builds the demo model repository (`make models`): trains each model, writes its TorchScript and verified ONNX
files and configs, and the benchmarks' heavy model under models/bench/."""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from models import digits_cnn, fraud_mlp, heavy_mlp
from services.model.config import load_model_config

MODELS_DIR = Path(__file__).resolve().parent
BUILDERS: dict[str, ModuleType] = {fraud_mlp.NAME: fraud_mlp, digits_cnn.NAME: digits_cnn, heavy_mlp.NAME: heavy_mlp}
TRAIN_THREADS = 1  # fixed, not the core count: float reductions depend on it; 1 avoids OpenMP stalls under load


@dataclass(frozen=True)
class BuiltModel:
    """One model written into the repository, with its quality metric and the checks of its exports."""

    name: str
    metric: str
    checks: dict[str, float]
    seconds: float
    path: Path

    @property
    def value(self) -> float:
        """The model's quality metric (held-out AUC or accuracy)."""
        return self.checks[self.metric]


def folder(name: str) -> str:
    """A model's folder under the repository root: its name, or the builder's FOLDER (models/bench/ for the
    benchmarks' models, which the demo stack does not serve)."""
    return str(getattr(BUILDERS[name], "FOLDER", name))


@contextmanager
def deterministic(seed: int, threads: int = TRAIN_THREADS) -> Iterator[None]:
    """Seed numpy and torch, use deterministic kernels and a fixed thread count; restore all on exit."""
    numpy_state = np.random.get_state()
    torch_state = torch.random.get_rng_state()
    prev_threads = torch.get_num_threads()
    prev_deterministic = torch.are_deterministic_algorithms_enabled()
    prev_warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev_deterministic, warn_only=prev_warn_only)
        torch.set_num_threads(prev_threads)
        torch.random.set_rng_state(torch_state)
        np.random.set_state(numpy_state)


def write_config(name: str, out: Path) -> Path:
    """Copy the committed `models/<folder>/config.yaml` into `<out>/<folder>/` and validate it there."""
    src = MODELS_DIR / folder(name) / "config.yaml"
    dst = out / folder(name) / "config.yaml"
    dst.parent.mkdir(parents=True, exist_ok=True)
    if src.resolve() != dst.resolve():
        tmp = dst.with_name(dst.name + ".tmp")
        shutil.copyfile(src, tmp)
        tmp.replace(dst)
    load_model_config(dst, expected_name=name)
    return dst


def build_models(out: Path = MODELS_DIR, only: Sequence[str] | None = None) -> dict[str, BuiltModel]:
    """Train and write every model (or those in `only`) into the repository at `out`."""
    names = list(only) if only else list(BUILDERS)
    unknown = sorted(set(names) - set(BUILDERS))
    if unknown:
        raise ValueError(f"unknown models {unknown}; known: {sorted(BUILDERS)}")
    built: dict[str, BuiltModel] = {}
    for name in names:
        builder = BUILDERS[name]
        started = time.perf_counter()
        write_config(name, out)  # first, so that a broken config fails before training
        with deterministic(builder.SEED):
            checks = builder.build(out / folder(name))
        built[name] = BuiltModel(name, builder.METRIC, checks, time.perf_counter() - started, out / folder(name))
    return built


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m models.build", description=__doc__)
    parser.add_argument("--out", type=Path, default=MODELS_DIR, help="repository root (default: models/)")
    parser.add_argument("--only", choices=sorted(BUILDERS), action="append", help="build only this model")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    for name in args.only or list(BUILDERS):
        model = build_models(args.out, [name])[name]
        print(f"{name}: {model.metric}: {model.value:.4g} ({model.seconds:.1f} s) -> {model.path}", flush=True)
        for check, value in model.checks.items():
            if check != model.metric:
                print(f"  {check}: {value:.4g}", flush=True)
    print(f"built in {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
