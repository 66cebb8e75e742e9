"""Small real TorchScript models and repository folders for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml
from torch import nn


class Mlp(nn.Module):
    """A seeded MLP whose outputs differ per seed, so versions are distinguishable."""

    def __init__(self, seed: int, width: int = 8, hidden: int = 16) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Slow(nn.Module):
    """Returns x * 2 after `rounds` large matmuls (tens of ms on CPU): a model whose compute dominates."""

    def __init__(self, rounds: int = 20, size: int = 384) -> None:
        super().__init__()
        self.rounds = rounds
        self.register_buffer("w", torch.eye(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        acc = self.w
        for _ in range(self.rounds):
            acc = acc @ self.w
        return x * 2.0 + (acc.sum() - acc.sum())


class MultiIO(nn.Module):
    """Two inputs (FP32 and INT64) to two outputs, exercising dtype mapping and tuple outputs."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a * 2.0, b + 1


def save_scripted(module: nn.Module, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(module.eval()), str(path))


def mlp_config(name: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": name,
        "max_batch_size": 16,
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [8]}],
        "outputs": [{"name": "y", "datatype": "FP32", "dims": [1]}],
    }
    config.update(extra)
    return config


def multi_io_config(name: str) -> dict[str, Any]:
    """The config of a MultiIO model: no batch dimension, FP32 and INT64 in and out."""
    return {
        "name": name,
        "max_batch_size": 0,
        "inputs": [{"name": "a", "datatype": "FP32", "dims": [2, 3]}, {"name": "b", "datatype": "INT64", "dims": [2]}],
        "outputs": [
            {"name": "a2", "datatype": "FP32", "dims": [2, 3]},
            {"name": "b1", "datatype": "INT64", "dims": [2]},
        ],
    }


def write_model(repo: Path, name: str, config: dict[str, Any], versions: dict[int, nn.Module]) -> Path:
    """`repo/<name>/config.yaml` and one scripted `model.pt` per version folder."""
    folder = repo / name
    folder.mkdir(parents=True, exist_ok=True)
    for version, module in versions.items():
        save_scripted(module, folder / str(version) / "model.pt")
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    return folder


def reference_output(module: nn.Module, x: Any) -> Any:
    """What eager torch answers for a numpy input: the value the service must return."""
    with torch.inference_mode():
        return module.eval()(torch.from_numpy(x)).numpy()
