"""The stage micro-batcher on a real event loop: who joins which batch, per-member deadlines, cancellation and
errors, the row cap, the optional wait, and the batch span with its links (the real OpenTelemetry SDK)."""

from __future__ import annotations

import asyncio
import doctest
from collections.abc import Hashable, Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from services.gateway import batching
from services.gateway.batching import StageBatcher


class Downstream:
    """A downstream stage that doubles each item; `gate` holds calls until set; `fail` raises for a whole
    call, `bad` items come back as their own error."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []
        self.timeouts: list[float] = []
        self.keys: list[Hashable] = []
        self.gate: asyncio.Event | None = None
        self.fail: Exception | None = None
        self.bad: set[int] = set()
        self.tasks: list[asyncio.Task | None] = []  # the task each call ran in

    async def __call__(self, items: Sequence[int], timeout_s: float, key: Hashable) -> list[int | BaseException]:
        self.calls.append(list(items))
        self.tasks.append(asyncio.current_task())
        self.timeouts.append(timeout_s)
        self.keys.append(key)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        return [InvalidArgument(f"bad item {i}") if i in self.bad else 2 * i for i in items]


def batcher(down: Downstream, **kwargs: object) -> StageBatcher[int, int]:
    options: dict = {"max_rows": 64, **kwargs}
    return StageBatcher("p", "features", "features", down, **options)


async def steps(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_lone_request_is_sent_in_the_next_loop_step_not_after_a_timer() -> None:
    down = Downstream()
    task = asyncio.ensure_future(batcher(down).submit(3, 1, 1.0))
    await steps(3)  # the caller's step, the launch, the batch task's first step
    assert down.calls == [[3]]
    assert await task == 6


async def test_requests_of_one_loop_step_share_a_call() -> None:
    down = Downstream()
    b = batcher(down)
    results = await asyncio.gather(*(b.submit(i, 1, 1.0) for i in range(5)))
    assert results == [0, 2, 4, 6, 8]
    assert down.calls == [[0, 1, 2, 3, 4]]


async def test_requests_arriving_while_a_batch_is_in_flight_form_the_next_batch() -> None:
    down = Downstream()
    down.gate = asyncio.Event()
    b = batcher(down)
    first = asyncio.ensure_future(b.submit(1, 1, 1.0))
    await steps(2)
    later = [asyncio.ensure_future(b.submit(i, 1, 1.0)) for i in (10, 11, 12)]
    await steps(3)
    assert down.calls == [[1]]  # one batch in flight at a time: the others wait for it
    down.gate.set()
    assert await first == 2
    assert await asyncio.gather(*later) == [20, 22, 24]
    assert down.calls == [[1], [10, 11, 12]]


async def test_two_batches_in_flight_when_allowed() -> None:
    down = Downstream()
    down.gate = asyncio.Event()
    b = batcher(down, max_inflight=2)
    first = asyncio.ensure_future(b.submit(1, 1, 1.0))
    await steps(3)
    second = asyncio.ensure_future(b.submit(2, 1, 1.0))
    await steps(3)
    assert down.calls == [[1], [2]]
    down.gate.set()
    assert await asyncio.gather(first, second) == [2, 4]


async def test_the_row_cap_splits_batches_and_multi_row_members_count_as_their_rows() -> None:
    down = Downstream()
    b = batcher(down, max_rows=4)
    results = await asyncio.gather(b.submit(1, 3, 1.0), b.submit(2, 1, 1.0), b.submit(3, 2, 1.0), b.submit(4, 5, 1.0))
    assert results == [2, 4, 6, 8]
    assert down.calls == [[1, 2], [3], [4]]  # 3+1 rows; 2 (+5 would pass 4); 5 alone (bigger than the cap)


async def test_lanes_never_mix_and_each_call_gets_its_lane_key() -> None:
    down = Downstream()
    b = batcher(down)
    await asyncio.gather(b.submit(1, 1, 1.0, key="a"), b.submit(2, 1, 1.0, key="b"), b.submit(3, 1, 1.0, key="a"))
    assert sorted(zip(down.keys, down.calls, strict=True)) == [("a", [1, 3]), ("b", [2])]


async def test_one_members_deadline_expires_and_the_others_are_answered() -> None:
    down = Downstream()
    down.gate = asyncio.Event()
    b = batcher(down)
    short = asyncio.ensure_future(b.submit(1, 1, 0.02))
    long = asyncio.ensure_future(b.submit(2, 1, 5.0))
    with pytest.raises(DeadlineExceeded, match="within 20 ms"):
        await short
    assert not long.done()
    down.gate.set()
    assert await long == 4
    assert down.timeouts[0] == pytest.approx(5.0, abs=0.1)  # the batch honours its latest member's deadline


async def test_a_member_that_expired_while_queued_is_not_sent() -> None:
    down = Downstream()
    down.gate = asyncio.Event()
    b = batcher(down)
    first = asyncio.ensure_future(b.submit(1, 1, 5.0))
    await steps(2)
    queued = asyncio.ensure_future(b.submit(2, 1, 0.01))
    other = asyncio.ensure_future(b.submit(3, 1, 5.0))
    with pytest.raises(DeadlineExceeded):
        await queued
    down.gate.set()
    assert await asyncio.gather(first, other) == [2, 6]
    assert down.calls == [[1], [3]]


async def test_a_cancelled_member_never_cancels_the_batch() -> None:
    down = Downstream()
    down.gate = asyncio.Event()
    b = batcher(down)
    leaving = asyncio.ensure_future(b.submit(1, 1, 5.0))
    staying = asyncio.ensure_future(b.submit(2, 1, 5.0))
    await steps(3)
    leaving.cancel()
    await steps(2)
    down.gate.set()
    assert await staying == 4
    assert leaving.cancelled()
    assert down.calls == [[1, 2]]


async def test_a_failed_call_fails_every_member_and_a_bad_item_only_its_own() -> None:
    down = Downstream()
    b = batcher(down)
    down.bad = {2}
    results = await asyncio.gather(b.submit(1, 1, 1.0), b.submit(2, 1, 1.0), return_exceptions=True)
    assert results[0] == 2 and isinstance(results[1], InvalidArgument)
    down.fail = Unavailable("down")
    results = await asyncio.gather(b.submit(3, 1, 1.0), b.submit(4, 1, 1.0), return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)
    down.fail = None
    assert await b.submit(5, 1, 1.0) == 10  # the lane still serves


async def test_disabled_each_request_calls_alone_in_its_own_task() -> None:
    down = Downstream()
    b = batcher(down, enabled=False)
    assert await asyncio.gather(b.submit(1, 1, 1.0, key="k"), b.submit(2, 1, 1.0, key="k")) == [2, 4]
    assert down.calls == [[1], [2]]


async def test_a_configured_delay_waits_for_company_unless_the_batch_is_full() -> None:
    down = Downstream()
    b = batcher(down, max_delay_s=0.05, max_rows=3)
    first = asyncio.ensure_future(b.submit(1, 1, 1.0))
    await asyncio.sleep(0.01)
    assert down.calls == []  # waiting for company
    second = asyncio.ensure_future(b.submit(2, 1, 1.0))
    assert await asyncio.gather(first, second) == [2, 4]
    assert down.calls == [[1, 2]]
    full = await asyncio.wait_for(asyncio.gather(*(b.submit(i, 1, 1.0) for i in (7, 8, 9))), 0.04)
    assert full == [14, 16, 18]  # three rows fill the cap: sent at once


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> tuple[TracerProvider, InMemorySpanExporter]:
    """A real SDK provider with an in-memory exporter, used by the batcher and by the test's member spans."""
    import services.gateway.batching as batching

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(batching, "tracer", provider.get_tracer("meshserve.gateway"))
    return provider, exporter


async def test_the_batch_span_is_a_child_of_the_first_member_and_links_every_member(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    sdk, exporter = provider
    down = Downstream()
    b = batcher(down)
    members = []

    async def member(i: int) -> int:
        with sdk.get_tracer("test").start_as_current_span(f"features {i}") as span:
            members.append(span.get_span_context())
            return await b.submit(i, 2, 1.0)

    assert await asyncio.gather(member(1), member(2), member(3)) == [2, 4, 6]
    (batch,) = [s for s in exporter.get_finished_spans() if s.name == "features.batch"]
    assert batch.kind == trace.SpanKind.CLIENT
    assert batch.parent is not None and batch.parent.span_id == members[0].span_id
    assert batch.context.trace_id == members[0].trace_id
    assert [(link.context.trace_id, link.context.span_id) for link in batch.links] == [
        (m.trace_id, m.span_id) for m in members
    ]
    assert [link.attributes["batch.index"] for link in batch.links] == [0, 1, 2]
    assert (batch.attributes["batch.members"], batch.attributes["batch.rows"]) == (3, 6)


async def test_an_unsampled_first_member_gives_no_batch_span(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, exporter = provider
    b = batcher(Downstream())
    assert await asyncio.gather(b.submit(1, 1, 1.0), b.submit(2, 1, 1.0)) == [2, 4]
    assert exporter.get_finished_spans() == ()


async def test_gathering_a_lone_request_goes_as_soon_as_the_loop_is_idle_not_at_the_bound() -> None:
    down = Downstream()
    b = batcher(down, max_gather_s=5.0)
    assert await asyncio.wait_for(b.submit(4, 1, 10.0), 1.0) == 8  # far sooner than the 5 s bound
    assert down.calls == [[4]]


async def test_gathering_callers_join_while_the_loop_is_busy() -> None:
    down = Downstream()
    b = batcher(down, max_gather_s=5.0)
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Future[int]] = []
    arrived = asyncio.Event()

    def arrive(i: int) -> None:  # one caller per loop step: the loop never runs out of work meanwhile
        tasks.append(asyncio.ensure_future(b.submit(i, 1, 10.0)))
        if i < 5:
            loop.call_soon(arrive, i + 1)
        else:
            arrived.set()

    arrive(1)
    await arrived.wait()
    assert await asyncio.gather(*tasks) == [2, 4, 6, 8, 10]
    assert down.calls == [[1, 2, 3, 4, 5]]


async def test_gathering_stops_at_the_bound_when_the_loop_never_idles() -> None:
    down = Downstream()
    b = batcher(down, max_gather_s=0.02)
    loop = asyncio.get_running_loop()
    busy = True

    def spin() -> None:  # keeps a callback ready in every loop step
        if busy:
            loop.call_soon(spin)

    spin()
    try:
        assert await asyncio.wait_for(b.submit(1, 1, 10.0), 2.0) == 2
    finally:
        busy = False
    assert down.calls == [[1]]


async def test_gathering_sends_at_once_when_the_batch_is_full() -> None:
    down = Downstream()
    b = batcher(down, max_gather_s=5.0, max_rows=2)
    loop = asyncio.get_running_loop()
    busy = True

    def spin() -> None:
        if busy:
            loop.call_soon(spin)

    spin()
    try:
        assert await asyncio.wait_for(asyncio.gather(b.submit(1, 1, 10.0), b.submit(2, 1, 10.0)), 1.0) == [2, 4]
    finally:
        busy = False


async def test_a_lone_request_with_nothing_else_due_calls_from_its_own_task() -> None:
    down = Downstream()
    b = batcher(down, max_gather_s=5.0)
    await asyncio.sleep(0.01)  # nothing else is due on the loop now
    assert await b.submit(3, 1, 1.0) == 6
    assert down.tasks == [asyncio.current_task()]  # no batch task, no loop step waited


async def test_callers_behind_a_lone_call_form_the_next_batch() -> None:
    down = Downstream()
    down.gate = asyncio.Event()
    b = batcher(down, max_gather_s=5.0)
    await asyncio.sleep(0.01)
    lone = asyncio.ensure_future(b.submit(1, 1, 5.0))
    await asyncio.sleep(0.01)
    assert down.calls == [[1]] and down.tasks == [lone]
    later = [asyncio.ensure_future(b.submit(i, 1, 5.0)) for i in (2, 3)]
    await asyncio.sleep(0.01)
    assert down.calls == [[1]]  # the lone call holds the lane's one slot
    down.gate.set()
    assert await asyncio.gather(lone, *later) == [2, 4, 6]
    assert down.calls == [[1], [2, 3]]


async def test_a_lone_call_has_its_batch_span_with_one_link(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    sdk, exporter = provider
    b = batcher(Downstream(), max_gather_s=5.0)
    await asyncio.sleep(0.01)
    with sdk.get_tracer("test").start_as_current_span("features") as span:
        assert await b.submit(1, 1, 1.0) == 2
    (batch,) = [s for s in exporter.get_finished_spans() if s.name == "features.batch"]
    assert batch.parent is not None and batch.parent.span_id == span.get_span_context().span_id
    assert [link.context.span_id for link in batch.links] == [span.get_span_context().span_id]


def test_the_usage_example_in_the_docstring_runs_as_shown() -> None:
    failed, tried = doctest.testmod(batching, raise_on_error=False)
    assert tried > 0 and failed == 0


async def test_posted_items_join_the_callers_batch_and_nobody_waits_for_them() -> None:
    down = Downstream()
    down.gate = asyncio.Event()
    stage = batcher(down)
    first = asyncio.ensure_future(stage.submit(1, 1, 1.0))
    await steps(3)  # the first call is in flight: the next ones queue
    stage.post(2, 1, 1.0)
    waiting = asyncio.ensure_future(stage.submit(3, 1, 1.0))
    stage.post(4, 1, 1.0)
    await steps(2)
    down.gate.set()
    assert await first == 2 and await waiting == 6
    await stage.drain(1.0)
    assert down.calls[0] == [1] and sorted(down.calls[1]) == [2, 3, 4] and len(down.calls) == 2


async def test_a_posted_items_failed_batch_fails_no_one_else_and_drain_sends_what_is_queued() -> None:
    down = Downstream()
    down.fail = Unavailable("down")
    stage = batcher(down, max_gather_s=0.5)
    stage.post(5, 1, 1.0)
    stage.post(6, 1, 1.0)
    await stage.drain(1.0)  # nothing queued is left behind at shutdown, and the error is nobody's
    assert down.calls == [[5, 6]]
    down.fail = None
    assert await stage.submit(7, 1, 1.0) == 14


async def test_a_posted_item_without_batching_is_its_own_call() -> None:
    down = Downstream()
    stage = batcher(down, enabled=False)
    stage.post(8, 1, 1.0)
    stage.post(9, 1, 1.0)
    await stage.drain(1.0)
    assert sorted(down.calls) == [[8], [9]]
