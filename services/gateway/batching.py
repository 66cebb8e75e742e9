"""Work-conserving micro-batching of one pipeline stage: concurrent callers join one downstream call, and each
gets back its own part of the answer.

A lane (one per stage and routing key: the model version asked for, the passed-on routing headers) sends when
it has a free slot and the event loop runs out of other work (services/common/loop_idle.py): a lone caller's
call goes at once, and under load callers keep joining while the gateway is busy with other requests anyway,
up to the stage's row cap or `max_gather_s` of a loop that never idles. Callers that arrive while the lane's
batches are in flight queue up and form the next batch when one returns. An idle loop never waits on a timer
unless `max_delay_s` says so. Each caller keeps its own deadline (a timer answers it
`DEADLINE_EXCEEDED`, the batch goes on for the others) and its own cancellation (a cancelled caller's future is
dropped; the batch is never cancelled for it). The batch's own timeout is the latest of its members'. Work off the
critical path that nobody waits for (the cache store) is `post`ed: it joins a batch with no future, timer or task
of its own.

Traces stay per request: each caller waits inside its own stage span; the batched call has a span of its own,
`<stage span>.batch`, a child of the first member's stage span, with one link per member. The downstream hop
carries that span's trace context.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from opentelemetry import trace

from services.common import recording
from services.common.errors import DeadlineExceeded
from services.common.loop_idle import idle_hooks
from services.common.recording.spans import DEFAULT_CURRENT
from services.gateway import metrics

T = TypeVar("T")  # what one caller hands the stage
R = TypeVar("R")  # what it gets back
SCOPE = "meshserve.gateway"
tracer = trace.get_tracer(SCOPE)

# One downstream call for a batch: the members' items, the call's timeout and its lane key -> one result or
# exception per member, in order. Raising fails every member with that error.
BatchCall = Callable[[Sequence[T], float, Hashable], Awaitable[Sequence["R | BaseException"]]]


@dataclass(eq=False)
class _Member(Generic[T, R]):
    item: T
    rows: int
    end: float  # monotonic time of this caller's deadline for the hop
    future: asyncio.Future[R] | None  # None: posted, nobody waits for the result
    span: trace.SpanContext
    timer: asyncio.TimerHandle | None = None
    shared: dict[str, int] | None = None  # where to say how many requests the call served


@dataclass(eq=False)
class _Lane(Generic[T, R]):
    key: Hashable
    queue: deque[_Member[T, R]] = field(default_factory=deque)
    inflight: int = 0
    rows: int = 0  # rows queued (members that expired while queued included, until the next launch)
    pending: int = 0  # token of the scheduled launch (0: none); a launch with another token is stale
    soon: bool = False  # the scheduled launch is for the next loop step (not waiting for company)
    handle: asyncio.Handle | None = None  # its timer or call_soon handle


class StageBatcher(Generic[T, R]):
    """The micro-batcher of one stage of one pipeline: callers `submit` one item each, concurrent callers of one
    lane share one downstream `call`, and each gets back its own result (or its own error).

    Example (a stage whose downstream call doubles numbers; three concurrent callers, one call)::

        >>> import asyncio
        >>> calls = []
        >>> async def double(items, timeout_s, key):
        ...     calls.append(list(items))
        ...     return [2 * item for item in items]
        >>> async def three_callers():
        ...     batcher = StageBatcher("fraud", "model", "model", double, max_rows=32)
        ...     return await asyncio.gather(*(batcher.submit(i, rows=1, timeout_s=1.0) for i in range(3)))
        >>> asyncio.run(three_callers())
        [0, 2, 4]
        >>> calls
        [[0, 1, 2]]

    The gateway builds one per stage of each pipeline (services/gateway/runner.py, `stage_batcher`), with a
    join of services/gateway/joins.py as `call`.

    Args:
        pipeline: the pipeline's name (a label of the batch metrics).
        stage: the stage's name (`cache`, `features`, `model`, `store`): a label of the batch metrics, and the
            key its callers' `shared` maps get.
        span: the stage's span name; each batched call has a span `<span>.batch`.
        call: the downstream call of one batch (`BatchCall`): the members' items, the call's timeout (the
            latest of its members' deadlines) and the lane key, to one result or exception per member, in order;
            raising fails every member with that error.
        max_rows: the most rows in one batch (a lone caller with more still goes, alone).
        max_inflight: batches of one lane in flight at once; callers arriving meanwhile form the next batch.
        max_delay_s: wait this long for company before sending; 0: never wait on a timer.
        max_gather_s: without `max_delay_s`, a batch goes when the event loop runs out of other work or after
            this long, whichever comes first; 0: in the next loop step.
        enabled: False sends each caller's item in a call of its own, at once (no lanes, no queue).
    """

    def __init__(
        self,
        pipeline: str,
        stage: str,
        span: str,
        call: BatchCall[T, R],
        *,
        max_rows: int,
        max_inflight: int = 1,
        max_delay_s: float = 0.0,
        max_gather_s: float = 0.0,
        enabled: bool = True,
    ) -> None:
        self.pipeline = pipeline
        self.stage = stage
        self.span_name = f"{span}.batch"
        self.call = call
        self.max_rows = max_rows
        self.max_inflight = max_inflight
        self.max_delay_s = max_delay_s
        self.max_gather_s = max_gather_s
        self.enabled = enabled
        self._tokens = 0
        self._lanes: dict[Hashable, _Lane[T, R]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._members = metrics.BATCH_MEMBERS.labels(pipeline, stage)
        self._rows = metrics.BATCH_ROWS.labels(pipeline, stage)

    async def submit(
        self, item: T, rows: int, timeout_s: float, key: Hashable = (), shared: dict[str, int] | None = None
    ) -> R:
        """This caller's part of the stage's answer; raises the call's error, or DeadlineExceeded once
        `timeout_s` has passed (the batch goes on). `shared[stage]` is set to the requests its call served."""
        if shared is not None:
            shared[self.stage] = 1
        if not self.enabled:
            result = (await self.call([item], timeout_s, key))[0]
            if isinstance(result, BaseException):
                raise result
            return result
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(key)
        if self._alone_now(lane, loop):
            return await self._alone(lane, item, rows, timeout_s, loop)
        member: _Member[T, R] = _Member(
            item,
            rows,
            time.monotonic() + timeout_s,
            loop.create_future(),
            recording.current_span().get_span_context(),
            shared=shared,
        )
        future = member.future
        assert future is not None
        member.timer = loop.call_later(timeout_s, self._expire, member, timeout_s)
        lane.queue.append(member)
        lane.rows += rows
        self._schedule(lane, loop)
        try:
            return await future
        finally:
            member.timer.cancel()

    def post(self, item: T, rows: int, timeout_s: float, key: Hashable = ()) -> None:
        """Hand the stage an item whose answer nobody waits for: it joins the lane's next batch (sent as `submit`'s
        are) with no future, timer or task of its own; the batch's timeout covers it, and errors are dropped."""
        if not self.enabled:
            task = asyncio.create_task(self._posted_alone(item, timeout_s, key))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(key)
        span = recording.current_span().get_span_context()
        lane.queue.append(_Member(item, rows, time.monotonic() + timeout_s, None, span))
        lane.rows += rows
        self._schedule(lane, loop)

    async def _posted_alone(self, item: T, timeout_s: float, key: Hashable) -> None:
        """A posted item's own call (batching off); its error is nobody's."""
        with contextlib.suppress(Exception):
            await self.call([item], timeout_s, key)

    def _alone_now(self, lane: _Lane[T, R], loop: asyncio.AbstractEventLoop) -> bool:
        """Whether this caller's call can go now, in its own task: a slot is free, nobody waits, no wait is
        configured, and nothing else is due in this loop step (so nobody could join before the loop idles)."""
        if self.max_delay_s or lane.queue or lane.pending or lane.inflight >= self.max_inflight:
            return False
        hooks = idle_hooks(loop)
        return hooks is not None and hooks.nothing_ready()

    async def _alone(
        self, lane: _Lane[T, R], item: T, rows: int, timeout_s: float, loop: asyncio.AbstractEventLoop
    ) -> R:
        """A lone caller's call, sent from its own task (its timeout is the call's own); later callers queue."""
        lane.inflight += 1
        self._members.observe(1)
        self._rows.observe(rows)
        try:
            with self._span([recording.current_span().get_span_context()], rows):
                result = (await self.call([item], timeout_s, lane.key))[0]
        finally:
            lane.inflight -= 1
            self._schedule(lane, loop)
        if isinstance(result, BaseException):
            raise result
        return result

    def _expire(self, member: _Member[T, R], timeout_s: float) -> None:
        if member.future is not None and not member.future.done():
            member.future.set_exception(
                DeadlineExceeded(f"{self.stage} did not answer within {timeout_s * 1e3:.0f} ms")
            )

    # -- forming batches -----------------------------------------------------------------------------------

    def _schedule(self, lane: _Lane[T, R], loop: asyncio.AbstractEventLoop) -> None:
        """Schedule the lane's next batch when a slot is free: at once (the next loop step) when the queue holds a
        full batch; else after `max_delay_s` when one is configured; else, with `max_gather_s`, when the loop
        runs out of other work (under load, callers keep joining while the gateway is busy anyway) or after
        `max_gather_s`, whichever comes first; else in the next loop step."""
        if lane.inflight >= self.max_inflight or not lane.queue:
            return
        full = lane.rows >= self.max_rows
        if lane.pending:
            if lane.soon or not full:
                return
            assert lane.handle is not None
            lane.handle.cancel()  # the batch filled up while it waited for company
        self._tokens += 1
        token = lane.pending = self._tokens
        hooks = idle_hooks(loop) if self.max_gather_s > 0 and not self.max_delay_s else None
        lane.soon = full or (not self.max_delay_s and hooks is None)
        if lane.soon:
            lane.handle = loop.call_soon(self._launch, lane, token)
        elif hooks is None:
            lane.handle = loop.call_later(self.max_delay_s, self._launch, lane, token)
        else:
            lane.handle = loop.call_later(self.max_gather_s, self._launch, lane, token)
            hooks.call_when_idle(lambda: self._launch(lane, token))

    def _launch(self, lane: _Lane[T, R], token: int) -> None:
        if lane.pending != token:
            return  # launched already by another of its conditions
        lane.pending = 0
        if lane.handle is not None:
            lane.handle.cancel()
            lane.handle = None
        members: list[_Member[T, R]] = []
        rows = 0
        while lane.queue:
            member = lane.queue[0]
            if member.future is not None and member.future.done():  # expired or cancelled while queued
                lane.queue.popleft()
                continue
            if members and rows + member.rows > self.max_rows:
                break
            lane.queue.popleft()
            members.append(member)
            rows += member.rows
        lane.rows = sum(m.rows for m in lane.queue)
        if not members:
            return
        lane.inflight += 1
        task = asyncio.create_task(self._run(lane, members, rows))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, lane: _Lane[T, R], members: list[_Member[T, R]], rows: int) -> None:
        self._members.observe(len(members))
        self._rows.observe(rows)
        timeout = max(m.end for m in members) - time.monotonic()
        results: Sequence[R | BaseException]
        try:
            with self._span([m.span for m in members], rows):
                results = await self.call([m.item for m in members], max(timeout, 0.001), lane.key)
            if len(results) != len(members):
                raise RuntimeError(f"{self.stage}: {len(results)} results for {len(members)} members")
        except Exception as exc:  # the whole call failed: every member gets its error
            results = [exc] * len(members)
        finally:
            lane.inflight -= 1
            self._schedule(lane, asyncio.get_running_loop())
        for member, result in zip(members, results, strict=True):
            if member.future is None or member.future.done():  # posted, or expired or cancelled
                continue
            if member.shared is not None:
                member.shared[self.stage] = len(members)
            if isinstance(result, BaseException):
                member.future.set_exception(result)
            else:
                member.future.set_result(result)

    def _span(self, members: Sequence[trace.SpanContext], rows: int) -> AbstractContextManager[object]:
        """The batch's span, a child of the first member's stage span and linked to every member's; when the
        first member is neither sampled nor recorded, no span, but the hop still carries that member's (unsampled)
        context."""
        first = members[0]
        recorder = recording.recorder()
        if not first.trace_flags.sampled and recorder is None:
            return trace.use_span(trace.NonRecordingSpan(first))
        links = [trace.Link(m, {"batch.index": i}) for i, m in enumerate(members) if m.is_valid]
        attributes = {"batch.members": len(members), "batch.rows": rows}
        if recorder is not None and first.is_valid:  # what the tracer would make, without its layers of calls
            span = recording.RecordedSpan(
                recorder,
                SCOPE,
                self.span_name,
                first.trace_id,
                first.span_id,
                int(first.trace_flags),
                first.trace_state,
                trace.SpanKind.CLIENT,
                time.time_ns(),
                attributes,
                links,
                first.is_remote,
            )
            span._current = DEFAULT_CURRENT
            return span
        return tracer.start_as_current_span(
            self.span_name,
            context=trace.set_span_in_context(trace.NonRecordingSpan(first)),
            kind=trace.SpanKind.CLIENT,
            links=links,
            attributes=attributes,
        )

    async def drain(self, timeout_s: float = 2.0) -> None:
        """Wait for the batches queued (posted items included) and in flight (at shutdown)."""
        end = time.monotonic() + timeout_s
        while (left := end - time.monotonic()) > 0:
            if self._tasks:
                await asyncio.wait(list(self._tasks), timeout=left, return_when=asyncio.FIRST_COMPLETED)
            elif any(lane.queue for lane in self._lanes.values()):
                await asyncio.sleep(0)  # a queued batch launches on its lane's schedule (at most the next loop steps)
            else:
                return
