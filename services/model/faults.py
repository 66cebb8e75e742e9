"""Fault injection for drills and tests: a model whose every forward pass takes a fixed time longer."""

from __future__ import annotations

import time

import numpy as np

from services.model.backends.base import LoadedModel


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
