"""The small interface every model backend implements: load a version folder into a model that runs batches."""

from __future__ import annotations

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

    def executes(self, inline: bool) -> bool:
        """Told, after warm-up and before traffic, whether forwards run on the event loop (`inline`) or on worker
        threads, so that a backend with its own thread pool can size it; True when that changed the model (it is
        warmed up again). The default changes nothing."""
        return False


class Backend(ABC):
    """Loads a version folder into a LoadedModel according to the model config."""

    name: str  # its key in services.model.backends.BACKENDS
    platform: str  # Triton's platform string, reported by ModelMetadata/ModelConfig (e.g. pytorch_libtorch)
    triton_backend: str  # Triton's backend name, reported by ModelConfig (e.g. pytorch)

    @abstractmethod
    def load(self, version_dir: Path, config: ModelConfig, version: int) -> LoadedModel:
        """Load (and optimise) one version; raise on bad weights so the version is reported broken."""
