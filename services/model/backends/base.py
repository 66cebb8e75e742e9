"""The small interface every model backend implements (TorchScript, INT8, later TensorRT)."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path

import numpy as np

from services.model.config import ModelConfig


class LoadedModel(ABC):
    """A model version loaded in memory; `forward` runs on a worker thread, never on the event loop."""

    device: str = "cpu"

    @abstractmethod
    def forward(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; inputs and outputs are keyed by the config's tensor names."""

    def unload(self) -> None:  # noqa: B027 - optional hook
        """Free memory (GPU buffers, engines); the default has nothing to free."""


class DelayedModel(LoadedModel):
    """Fault injection: a model whose every forward pass takes `delay_s` longer (drills, tracing tests)."""

    def __init__(self, model: LoadedModel, delay_s: float) -> None:
        self.model = model
        self.delay_s = delay_s
        self.device = model.device

    def forward(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.delay_s)  # a worker thread, never the event loop
        return self.model.forward(inputs)

    def unload(self) -> None:
        self.model.unload()


class Backend(ABC):
    """Loads a version folder into a LoadedModel according to the model config."""

    name: str
    platform: str  # Triton's platform string, reported by ModelMetadata/ModelConfig

    @abstractmethod
    def load(self, version_dir: Path, config: ModelConfig, version: int) -> LoadedModel:
        """Load (and optimise) one version; raise on bad weights so the version is reported broken."""


def get_backend(name: str) -> Backend:
    """The backend registered under a config's `backend` name (imported lazily: torch is heavy)."""
    if name == "torchscript":
        from services.model.backends.torchscript import TorchScriptBackend

        return TorchScriptBackend()
    if name == "tensorrt":
        raise ValueError("backend tensorrt is not part of this build yet; use torchscript")
    raise ValueError(f"unknown backend {name!r}")
