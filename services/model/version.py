"""One loaded, servable model version: its weights, worker threads, scheduler, statistics and drain."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from services.common.tensor_codec import NUMPY_DTYPES
from services.model.backends.base import Backend, LoadedModel
from services.model.batcher import THREAD, DirectRunner, DynamicBatcher, Execution, Outputs, Scheduler
from services.model.config import ModelConfig
from services.model.stats import VersionStats

log = logging.getLogger(__name__)

DEFAULT_MAX_PENDING = 1024
WARMUP_RUNS = 3  # per batch size: TorchScript's profiling executor optimises a graph after its first runs
DEMOTE_FACTOR = 2  # an automatically inline version goes to its threads once forwards average this x the limit


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


def warm_up(model: LoadedModel, config: ModelConfig) -> int | None:
    """Run the model at batch 1 and at its largest batch before it takes traffic (worker thread); return the
    fastest of the later forwards at the largest batch, in ns (None when nothing could be run)."""
    if not config.warmup:
        return None
    sizes = [1] if config.max_batch_size <= 1 else [1, config.max_batch_size]
    fastest: int | None = None
    for rows in sizes:
        inputs = warmup_inputs(config, rows)
        if inputs is None:
            return None
        times = []
        for _ in range(WARMUP_RUNS):
            start = time.perf_counter_ns()
            model.forward(inputs)
            times.append(time.perf_counter_ns() - start)
        fastest = min(times[1:])
    return fastest


def choose_execution(config: ModelConfig, warm_forward_ns: int | None, inline_max_forward_us: int) -> Execution:
    """The config's `execution`; for `auto`, inline when the warm-up forward at the largest batch was short."""
    if config.execution == "inline":
        return Execution(inline=True)
    if config.execution == "thread" or warm_forward_ns is None or inline_max_forward_us <= 0:
        return THREAD
    limit_ns = inline_max_forward_us * 1000
    if warm_forward_ns > limit_ns:
        return THREAD
    return Execution(inline=True, demote_above_ns=DEMOTE_FACTOR * limit_ns)


class ModelVersion:
    """Created on the event loop after the weights were loaded and warmed up on a worker thread."""

    def __init__(
        self,
        config: ModelConfig,
        version: int,
        model: LoadedModel,
        backend: Backend,
        execution: Execution = THREAD,
        load_s: float = 0.0,
    ) -> None:
        self.config = config
        self.load_s = load_s  # reading the weights and warming up, on its worker thread: part of a cold start
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
                model,
                self.executor,
                config.instance_count,
                config.max_batch_size,
                config.dynamic_batching,
                self.stats,
                execution,
            )
            self.max_rows = batcher.max_rows
            self.scheduler = batcher
        else:
            self.max_rows = config.max_batch_size
            self.scheduler = DirectRunner(model, self.executor, DEFAULT_MAX_PENDING, self.stats, execution)
        self.inflight = 0
        # input signature -> (rows, float inputs to check): services/model/validation.py fills it
        self.checked_signatures: dict[
            tuple[tuple[str, str, tuple[int, ...]], ...], tuple[int, tuple[tuple[str, str], ...]]
        ] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def execution(self) -> str:
        """Where this version's forwards run now: "inline" (the event loop) or "thread" (its workers)."""
        return self.scheduler.execution

    async def infer(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> Outputs:
        self.inflight += 1
        self._idle.clear()
        self.stats.pending += 1
        try:
            return await self.scheduler.submit(inputs, rows, deadline)
        finally:
            self.inflight -= 1
            self.stats.pending -= 1
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
