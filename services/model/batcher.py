"""Per model-version schedulers: a dynamic batcher that gathers concurrent requests into one forward pass,
and a direct runner for models without batching. Compute always runs on the version's worker threads.

The dynamic batcher is work-conserving: when an execution slot is free it dispatches what is queued at
once, so a lone request on an idle model never waits for company. `max_queue_delay_us` only applies
while another batch of the same version is computing (instance_count > 1), when waiting briefly for a
preferred batch size costs nothing. Under load, requests that arrive while a batch computes are
gathered into the next one.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from opentelemetry.context import Context

from services.common.errors import DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from services.model import spans
from services.model.backends.base import LoadedModel
from services.model.config import DynamicBatching
from services.model.stats import VersionStats

Outputs = dict[str, np.ndarray]


@dataclass(slots=True)
class _Request:
    inputs: dict[str, np.ndarray]
    rows: int
    future: asyncio.Future[Outputs]
    deadline: float | None  # time.monotonic() seconds
    enqueued_ns: int
    trace_context: Context | None = None  # the caller's OTel context when tracing is on


def _shape_key(inputs: dict[str, np.ndarray]) -> tuple[tuple[int, ...], ...]:
    return tuple(a.shape[1:] for a in inputs.values())


class Scheduler(ABC):
    """Common interface: submit a request's inputs, get its outputs; close when the version retires."""

    @abstractmethod
    def submit(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> asyncio.Future[Outputs]:
        """Queue one request of `rows` rows; the future resolves to its outputs (or a MeshserveError)."""

    @abstractmethod
    def close(self) -> None:
        """Refuse new requests from now on."""


class DynamicBatcher(Scheduler):
    """Gathers requests of one model version into batches (created inside the running event loop)."""

    def __init__(
        self,
        model: LoadedModel,
        executor: Executor,
        instances: int,
        max_batch_size: int,
        settings: DynamicBatching,
        stats: VersionStats,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._model = model
        self._executor = executor
        self._instances = instances
        self._stats = stats
        self._allowed = sorted(settings.allowed_batch_sizes)
        self._preferred = sorted(settings.preferred_batch_sizes)
        self._limit = min(max_batch_size, self._allowed[-1]) if self._allowed else max_batch_size
        self._delay_s = settings.max_queue_delay_us / 1e6
        self._max_queue = settings.max_queue_size
        self._target = self._preferred[-1] if self._preferred else self._limit
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._busy = 0
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def max_rows(self) -> int:
        """The largest request (in rows) this batcher can execute."""
        return self._limit

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def submit(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> asyncio.Future[Outputs]:
        if self._closed:
            raise Unavailable(f"{self._stats.model} v{self._stats.version} is unloading; retry")
        if len(self._queue) >= self._max_queue:
            raise ResourceExhausted(
                f"{self._stats.model} v{self._stats.version}: batch queue full ({self._max_queue} requests); "
                "retry later or on another replica"
            )
        future: asyncio.Future[Outputs] = self._loop.create_future()
        self._queue.append(_Request(inputs, rows, future, deadline, time.perf_counter_ns(), spans.capture()))
        self._queued_rows += rows
        self._schedule()
        return future

    def close(self) -> None:
        """Refuse new requests; queued ones still run (the version drains before it closes)."""
        self._closed = True

    # -- scheduling (event loop thread) --------------------------------------------------------------

    def _schedule(self) -> None:
        while self._queue and self._busy < self._instances:
            if self._busy > 0 and self._delay_s > 0 and self._queued_rows < self._target:
                wait = self._queue[0].enqueued_ns / 1e9 + self._delay_s - time.perf_counter_ns() / 1e9
                if wait > 0:
                    if self._timer is None:
                        self._timer = self._loop.call_later(wait, self._on_timer)
                    return
            if not self._dispatch():
                return

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _cap(self) -> int:
        if self._preferred:
            fitting = [p for p in self._preferred if p <= self._queued_rows]
            if fitting:
                return fitting[-1]
        return self._limit

    def _dispatch(self) -> bool:
        """Take one batch off the queue and start it on a worker thread; False if nothing was runnable."""
        cap = self._cap()
        now = time.monotonic()
        batch: list[_Request] = []
        rows = 0
        key = None
        kept: deque[_Request] = deque()
        while self._queue:
            req = self._queue.popleft()
            if req.future.done():  # cancelled by the client
                self._queued_rows -= req.rows
                continue
            if req.deadline is not None and now >= req.deadline:
                self._queued_rows -= req.rows
                req.future.set_exception(DeadlineExceeded("deadline passed while queued for a batch"))
                continue
            req_key = _shape_key(req.inputs)
            if key is None:
                key = req_key
            if req_key != key:  # other item shapes (-1 dims) wait for a batch of their own
                kept.append(req)
                continue
            if batch and rows + req.rows > cap:
                kept.append(req)
                break
            batch.append(req)
            rows += req.rows
            self._queued_rows -= req.rows
        kept.extend(self._queue)
        self._queue = kept
        if not batch:
            return False
        self._busy += 1
        started = time.perf_counter_ns()
        future = self._loop.run_in_executor(self._executor, self._run, batch, rows)
        future.add_done_callback(lambda f: self._complete(batch, rows, started, f))
        return True

    def _complete(self, batch: list[_Request], rows: int, started_ns: int, done: asyncio.Future) -> None:
        self._busy -= 1
        exc = done.exception()
        if exc is not None:
            error = exc if isinstance(exc, DeadlineExceeded) else Internal(f"model forward failed: {exc!r}")
            for req in batch:
                if not req.future.done():
                    req.future.set_exception(error)
        else:
            outputs, input_ns, infer_ns = done.result()
            t0 = time.perf_counter_ns()
            offset = 0
            for req in batch:
                end = offset + req.rows
                if not req.future.done():
                    if len(batch) == 1:
                        req.future.set_result(outputs)
                    else:
                        req.future.set_result({k: v[offset:end] for k, v in outputs.items()})
                offset = end
            output_ns = time.perf_counter_ns() - t0
            self._stats.record_batch(rows, input_ns, infer_ns, output_ns, [started_ns - r.enqueued_ns for r in batch])
            for req in batch:
                spans.record(req.trace_context, req.enqueued_ns, started_ns, input_ns + infer_ns, rows, len(batch))
        self._schedule()

    # -- compute (worker thread) ----------------------------------------------------------------------

    def _run(self, batch: list[_Request], rows: int) -> tuple[Outputs, int, int]:
        t0 = time.perf_counter_ns()
        if len(batch) == 1:
            inputs = batch[0].inputs
        else:
            names = batch[0].inputs.keys()
            inputs = {n: np.concatenate([r.inputs[n] for r in batch]) for n in names}
        padded = rows
        if self._allowed:
            padded = next(s for s in self._allowed if s >= rows)
            if padded > rows:
                inputs = {
                    n: np.concatenate([a, np.zeros((padded - rows, *a.shape[1:]), dtype=a.dtype)])
                    for n, a in inputs.items()
                }
        t1 = time.perf_counter_ns()
        outputs = self._model.forward(inputs)
        t2 = time.perf_counter_ns()
        if padded > rows:
            outputs = {k: v[:rows] for k, v in outputs.items()}
        return outputs, t1 - t0, t2 - t1


class DirectRunner(Scheduler):
    """No batching: each request is one forward pass on a worker thread (bounded pending count)."""

    def __init__(self, model: LoadedModel, executor: Executor, max_pending: int, stats: VersionStats) -> None:
        self._loop = asyncio.get_running_loop()
        self._model = model
        self._executor = executor
        self._max_pending = max_pending
        self._stats = stats
        self._pending = 0
        self._closed = False

    def submit(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> asyncio.Future[Outputs]:
        if self._closed:
            raise Unavailable(f"{self._stats.model} v{self._stats.version} is unloading; retry")
        if self._pending >= self._max_pending:
            raise ResourceExhausted(
                f"{self._stats.model} v{self._stats.version}: {self._max_pending} requests pending; retry later"
            )
        self._pending += 1
        result: asyncio.Future[Outputs] = self._loop.create_future()
        enqueued = time.perf_counter_ns()
        work = self._loop.run_in_executor(self._executor, self._run, inputs, deadline, enqueued)
        ctx = spans.capture()
        work.add_done_callback(lambda f: self._done(f, result, rows, enqueued, ctx))
        return result

    def _done(
        self, work: asyncio.Future, result: asyncio.Future[Outputs], rows: int, enqueued: int, ctx: Context | None
    ) -> None:
        self._pending -= 1
        exc = work.exception()
        if exc is None:
            outputs, queue_ns, infer_ns = work.result()
            self._stats.record_batch(rows, 0, infer_ns, 0, [queue_ns])
            spans.record(ctx, enqueued, enqueued + queue_ns, infer_ns, rows, 1)
        if result.done():  # the caller went away
            return
        if exc is None:
            result.set_result(outputs)
        else:
            result.set_exception(
                exc if isinstance(exc, DeadlineExceeded) else Internal(f"model forward failed: {exc!r}")
            )

    def _run(self, inputs: dict[str, np.ndarray], deadline: float | None, enqueued: int) -> tuple[Outputs, int, int]:
        start = time.perf_counter_ns()
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("deadline passed while waiting for a worker")
        outputs = self._model.forward(inputs)
        return outputs, start - enqueued, time.perf_counter_ns() - start

    def close(self) -> None:
        self._closed = True
