"""Model spans: every request of a batch gets its queue-wait and forward spans, under its own trace."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.model import spans
from tests.unit.model.test_batcher import AffineModel, make, rows


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: provider)
    monkeypatch.setattr(spans, "_tracer", None)
    return memory


async def test_each_batched_request_gets_queue_wait_and_forward_spans_in_its_trace(
    exporter: InMemorySpanExporter,
) -> None:
    model = AffineModel()
    batcher = make(model)
    tracer = trace.get_tracer_provider().get_tracer("test")
    model.gate.clear()  # hold the first batch so the next two are batched together
    first = batcher.submit(rows(1), 1, None)
    futures, roots = [], []
    for i in range(2):
        with tracer.start_as_current_span(f"rpc-{i}") as root:
            roots.append(root)
            futures.append(batcher.submit(rows(2, i), 2, None))
    model.gate.set()
    await asyncio.gather(first, *futures)
    finished = exporter.get_finished_spans()
    for root in roots:
        mine = {
            s.name: s for s in finished if s.context.trace_id == root.context.trace_id and s.name.startswith("model.")
        }
        assert set(mine) == {"model.queue_wait", "model.forward"}
        wait, forward = mine["model.queue_wait"], mine["model.forward"]
        assert wait.parent.span_id == root.context.span_id and forward.parent.span_id == root.context.span_id
        assert wait.start_time <= wait.end_time == forward.start_time <= forward.end_time
        assert forward.attributes["batch.size"] == 4 and forward.attributes["batch.requests"] == 2


def test_nothing_is_captured_without_an_sdk_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: trace.NoOpTracerProvider())
    assert spans.capture() is None
    spans.record(otel_context.get_current(), 0, 1, 1, 1, 1)  # no tracer: a no-op, not an error
