"""One loaded, servable model version: its weights, worker threads, scheduler, statistics and drain."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from services.common.tensor_codec import NUMPY_DTYPES
from services.model.backends.base import Backend, LoadedModel
from services.model.batcher import DirectRunner, DynamicBatcher, Outputs, Scheduler
from services.model.config import ModelConfig
from services.model.stats import VersionStats

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = 1024


def warmup_inputs(config: ModelConfig, rows: int) -> dict[str, np.ndarray] | None:
    """Zero inputs of `rows` rows (variable dims as 1); None when an input is BYTES (nothing generic to send)."""
    inputs: dict[str, np.ndarray] = {}
    for spec in config.inputs:
        if spec.datatype == "BYTES":
            return None
        dims = [1 if d == -1 else d for d in spec.dims]
        shape = [rows, *dims] if config.max_batch_size > 0 else dims
        inputs[spec.name] = np.zeros(shape, dtype=NUMPY_DTYPES[spec.datatype])
    return inputs


def warm_up(model: LoadedModel, config: ModelConfig) -> None:
    """Run the model at batch 1 and at its largest batch before it takes traffic (worker thread)."""
    if not config.warmup:
        return
    sizes = [1] if config.max_batch_size <= 1 else [1, config.max_batch_size]
    for rows in sizes:
        inputs = warmup_inputs(config, rows)
        if inputs is None:
            return
        model.forward(inputs)


class ModelVersion:
    """Created on the event loop after the weights were loaded and warmed up on a worker thread."""

    def __init__(self, config: ModelConfig, version: int, model: LoadedModel, backend: Backend) -> None:
        self.config = config
        self.name = config.name
        self.version = version
        self.version_str = str(version)
        self.model = model
        self.platform = backend.platform
        self.triton_backend = backend.triton_backend
        self.stats = VersionStats(config.name, version)
        self.executor = ThreadPoolExecutor(
            max_workers=config.instance_count, thread_name_prefix=f"{config.name}-v{version}"
        )
        self.scheduler: Scheduler
        if config.dynamic_batching is not None:
            batcher = DynamicBatcher(
                model, self.executor, config.instance_count, config.max_batch_size, config.dynamic_batching, self.stats
            )
            self.max_rows = batcher.max_rows
            self.scheduler = batcher
        else:
            self.max_rows = config.max_batch_size
            self.scheduler = DirectRunner(model, self.executor, DEFAULT_MAX_PENDING, self.stats)
        self.inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    async def infer(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> Outputs:
        self.inflight += 1
        self._idle.clear()
        self.stats.pending.inc()
        try:
            return await self.scheduler.submit(inputs, rows, deadline)
        finally:
            self.inflight -= 1
            self.stats.pending.dec()
            if self.inflight == 0:
                self._idle.set()

    async def drain(self, within_s: float) -> bool:
        """Wait until no request is in flight; True if it drained within the timeout."""
        try:
            await asyncio.wait_for(self._idle.wait(), within_s)
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        """Refuse new work, free the weights, stop the worker threads."""
        self.scheduler.close()
        self.executor.shutdown(wait=True)
        self.model.unload()
