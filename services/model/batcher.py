"""Per model-version schedulers: a dynamic batcher that gathers concurrent requests into one forward pass,
and a direct runner for models without batching; each runs its forwards inline or on the version's workers.

Where compute runs is the version's `Execution`. Inline, a forward runs on the event loop itself: a short
forward costs less than the cross-thread wake-ups and GIL handoffs a worker thread needs. An inline batch
closes when the loop runs out of work (`services.common.loop_idle`): every request that reached the loop by
then joins, and a lone request on an idle loop runs at once. On worker threads (long forwards, whose compute
releases the GIL), a batch's results come back in one wake-up of the loop, not one per request.

Both are work-conserving for a lone request. `max_queue_delay_us` bounds how long a request waits for
company, and it is only spent when company is due: inline, while the loop is still busy with requests on
their way in; on workers, while another instance computes, or while fewer rows are queued than the model
held a moment ago (the rows just answered are expected back, and a long forward is far cheaper per row in
one large batch than in several small ones). Once such a wait times out, the batcher stops expecting them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from opentelemetry.context import Context

from services.common.errors import DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from services.common.loop_idle import idle_hooks
from services.model import spans
from services.model.backends.base import LoadedModel
from services.model.config import DynamicBatching
from services.model.stats import VersionStats

log = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]
_Result = tuple[Outputs, int, int]  # outputs, input gather ns, forward ns


@dataclass(frozen=True, slots=True)
class Execution:
    """Where a version's forward passes run: on the event loop (`inline`) or on its worker threads.

    `demote_above_ns` is set when the choice was automatic: once inline forwards take longer than that on
    average, the version moves to its worker threads for good (a slow model never keeps the loop).
    """

    inline: bool
    demote_above_ns: int | None = None

    @property
    def name(self) -> str:
        return "inline" if self.inline else "thread"


THREAD = Execution(inline=False)
_EWMA_WEIGHT = 0.1  # the recent forwards that judge whether an automatically inline version stays inline


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


def _forward_error(exc: BaseException) -> Exception:
    return exc if isinstance(exc, DeadlineExceeded) else Internal(f"model forward failed: {exc!r}")


class _InlineWatch:
    """Keeps an automatically inline version inline only while its forwards stay short."""

    def __init__(self, execution: Execution, stats: VersionStats) -> None:
        self.inline = execution.inline
        self._limit_ns = execution.demote_above_ns
        self._stats = stats
        self._average_ns = 0.0

    @property
    def name(self) -> str:
        return "inline" if self.inline else "thread"

    def observe(self, forward_ns: int) -> None:
        if self._limit_ns is None:
            return
        if self._average_ns == 0:
            self._average_ns = forward_ns
        else:
            self._average_ns += _EWMA_WEIGHT * (forward_ns - self._average_ns)
        if self._average_ns > self._limit_ns:
            self.inline = False
            log.warning(
                "%s v%d: inline forwards average %.0f us, over the %.0f us limit; running on worker threads from now",
                self._stats.model,
                self._stats.version,
                self._average_ns / 1e3,
                self._limit_ns / 1e3,
            )
            self._limit_ns = None


class Scheduler(ABC):
    """Common interface: submit a request's inputs, get its outputs; close when the version retires."""

    @abstractmethod
    def submit(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> asyncio.Future[Outputs]:
        """Queue one request of `rows` rows; the future resolves to its outputs (or a MeshserveError)."""

    @abstractmethod
    def close(self) -> None:
        """Refuse new requests from now on."""

    @property
    @abstractmethod
    def execution(self) -> str:
        """Where forwards run now: "inline" or "thread"."""


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
        execution: Execution = THREAD,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._model = model
        self._executor = executor
        self._instances = instances
        self._stats = stats
        self._watch = _InlineWatch(execution, stats)
        self._allowed = sorted(settings.allowed_batch_sizes)
        self._preferred = sorted(settings.preferred_batch_sizes)
        self._limit = min(max_batch_size, self._allowed[-1]) if self._allowed else max_batch_size
        self._delay_s = settings.max_queue_delay_us / 1e6
        self._max_queue = settings.max_queue_size
        self._target = self._preferred[-1] if self._preferred else self._limit
        self._queue: deque[_Request] = deque()
        self._queued_rows = 0
        self._busy = 0
        self._computing_rows = 0
        # The most rows queued and computing at once under the recent load: while more rows than are queued were
        # there recently, a free instance waits (up to max_queue_delay_us) for them to come back as one batch.
        self._peak = 0
        self._timer: asyncio.TimerHandle | None = None
        self._flush_pending = False
        self._flush_soon = False
        self._hooks = idle_hooks(self._loop)
        self._closed = False

    @property
    def max_rows(self) -> int:
        """The largest request (in rows) this batcher can execute."""
        return self._limit

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def execution(self) -> str:
        return self._watch.name

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
        if not self._watch.inline:
            self._peak = max(self._peak, self._queued_rows + self._computing_rows)
            self._schedule()
        else:
            self._gather()
        return future

    def _gather(self) -> None:
        """Inline: close the batch when the loop runs out of work (every request that reached the loop by then
        joins; a lone request on an idle loop runs at once), when it reaches the preferred size, or when its
        oldest request waited max_queue_delay_us. With no delay allowed, or on a loop without idle hooks, what
        was submitted in this loop iteration runs in the next."""
        if not self._flush_pending:
            if self._hooks is not None and len(self._queue) == 1 and self._hooks.nothing_ready():
                self._flush()  # a lone request and nothing else to run: its forward runs in the caller's step
                return
            self._flush_pending = True
            if self._hooks is not None and self._delay_s > 0:
                self._hooks.call_when_idle(self._flush)
            else:
                self._flush_soon = True
                self._loop.call_soon(self._flush)
            return
        if not self._flush_soon and (
            self._queued_rows >= self._target
            or time.perf_counter_ns() - self._queue[0].enqueued_ns >= self._delay_s * 1e9
        ):
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    def close(self) -> None:
        """Refuse new requests; queued ones still run (the version drains before it closes)."""
        self._closed = True

    # -- inline (event loop thread) -------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_pending = self._flush_soon = False
        while self._queue and self._watch.inline and self._busy == 0:
            batch, rows = self._take()
            if not batch:
                return
            started = time.perf_counter_ns()
            try:
                result = self._run(batch, rows)
            except Exception as exc:
                self._fail(batch, exc)
                continue
            self._deliver(batch, rows, started, result)
            self._watch.observe(result[2])
        if self._queue and not self._watch.inline:
            self._schedule()  # demoted mid-flush: the rest goes to the workers

    # -- worker threads (event loop side) -------------------------------------------------------------

    def _schedule(self) -> None:
        while self._queue and self._busy < self._instances:
            want = min(self._target, self._peak)
            if self._delay_s > 0 and self._queued_rows < want:
                wait = self._queue[0].enqueued_ns / 1e9 + self._delay_s - time.perf_counter_ns() / 1e9
                if wait > 0:
                    if self._timer is None:
                        self._timer = self._loop.call_later(wait, self._on_timer)
                    return
                self._peak = self._queued_rows + self._computing_rows  # the load fell: stop waiting for it
            batch, rows = self._take()
            if not batch:
                return
            self._busy += 1
            self._computing_rows += rows
            self._executor.submit(self._work, batch, rows, time.perf_counter_ns())

    def _on_timer(self) -> None:
        self._timer = None
        self._schedule()

    def _finished(
        self, batch: list[_Request], rows: int, started_ns: int, result: _Result | None, exc: BaseException | None
    ) -> None:
        self._busy -= 1
        self._computing_rows -= rows
        if result is None:
            self._fail(batch, exc or RuntimeError("no result"))
        else:
            self._deliver(batch, rows, started_ns, result)
        self._schedule()

    # -- batches ---------------------------------------------------------------------------------------

    def _cap(self) -> int:
        if self._preferred:
            fitting = [p for p in self._preferred if p <= self._queued_rows]
            if fitting:
                return fitting[-1]
        return self._limit

    def _take(self) -> tuple[list[_Request], int]:
        """The next batch off the queue (empty when nothing runnable was left), dropping cancelled and expired
        requests on the way; requests of other item shapes (-1 dims) keep their place for a batch of their own."""
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
            if req_key != key:
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
        return batch, rows

    def _fail(self, batch: list[_Request], exc: BaseException) -> None:
        error = _forward_error(exc)
        for req in batch:
            if not req.future.done():
                req.future.set_exception(error)

    def _deliver(self, batch: list[_Request], rows: int, started_ns: int, result: _Result) -> None:
        """Each request's slice of the batch's outputs, then the batch's statistics and spans, once."""
        outputs, input_ns, infer_ns = result
        t0 = time.perf_counter_ns()
        if len(batch) == 1:
            if not batch[0].future.done():
                batch[0].future.set_result(outputs)
        else:
            offset = 0
            for req in batch:
                end = offset + req.rows
                if not req.future.done():
                    req.future.set_result({k: v[offset:end] for k, v in outputs.items()})
                offset = end
        output_ns = time.perf_counter_ns() - t0
        self._stats.record_batch(rows, input_ns, infer_ns, output_ns, [started_ns - r.enqueued_ns for r in batch])
        for req in batch:
            if req.trace_context is not None:
                spans.record(req.trace_context, req.enqueued_ns, started_ns, input_ns + infer_ns, rows, len(batch))

    # -- compute (the loop when inline, else a worker thread) -------------------------------------------

    def _work(self, batch: list[_Request], rows: int, started_ns: int) -> None:
        """A worker thread's whole job for one batch: compute, then hand everything back in one wake-up."""
        result: _Result | None = None
        error: BaseException | None = None
        try:
            result = self._run(batch, rows)
        except BaseException as exc:  # handed to the loop, which fails the batch's requests
            error = exc
        try:
            self._loop.call_soon_threadsafe(self._finished, batch, rows, started_ns, result, error)
        except RuntimeError:  # the loop closed while this batch computed (process exit): nobody is waiting
            pass

    def _run(self, batch: list[_Request], rows: int) -> _Result:
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
    """No batching: each request is one forward pass, inline or on a worker thread (bounded pending count)."""

    def __init__(
        self,
        model: LoadedModel,
        executor: Executor,
        max_pending: int,
        stats: VersionStats,
        execution: Execution = THREAD,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._model = model
        self._executor = executor
        self._max_pending = max_pending
        self._stats = stats
        self._watch = _InlineWatch(execution, stats)
        self._pending = 0
        self._closed = False

    @property
    def execution(self) -> str:
        return self._watch.name

    def submit(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> asyncio.Future[Outputs]:
        if self._closed:
            raise Unavailable(f"{self._stats.model} v{self._stats.version} is unloading; retry")
        if self._watch.inline:
            return self._inline(inputs, rows, deadline)
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

    def _inline(self, inputs: dict[str, np.ndarray], rows: int, deadline: float | None) -> asyncio.Future[Outputs]:
        """The forward in the caller's own step: nothing queues, so nothing waits (a past deadline is refused)."""
        result: asyncio.Future[Outputs] = self._loop.create_future()
        if deadline is not None and time.monotonic() >= deadline:
            result.set_exception(DeadlineExceeded("deadline passed before the forward started"))
            return result
        start = time.perf_counter_ns()
        try:
            outputs = self._model.forward(inputs)
        except Exception as exc:
            result.set_exception(_forward_error(exc))
            return result
        infer_ns = time.perf_counter_ns() - start
        self._stats.record_batch(rows, 0, infer_ns, 0, [0])
        spans.record(spans.capture(), start, start, infer_ns, rows, 1)
        self._watch.observe(infer_ns)
        result.set_result(outputs)
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
            result.set_exception(_forward_error(exc))

    def _run(self, inputs: dict[str, np.ndarray], deadline: float | None, enqueued: int) -> tuple[Outputs, int, int]:
        start = time.perf_counter_ns()
        if deadline is not None and time.monotonic() >= deadline:
            raise DeadlineExceeded("deadline passed while waiting for a worker")
        outputs = self._model.forward(inputs)
        return outputs, start - enqueued, time.perf_counter_ns() - start

    def close(self) -> None:
        self._closed = True
