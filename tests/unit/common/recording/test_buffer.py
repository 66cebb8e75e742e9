"""The bounded buffer by trace: the oldest traces evicted whole and remembered as lost."""

from __future__ import annotations

from services.common.recording.buffer import SpanBuffer
from tests.unit.common.recording.recorders import make_recorder


def test_the_buffer_evicts_the_oldest_traces_whole_and_remembers_them() -> None:
    rec = make_recorder(capacity=5)
    tracer = rec.get_tracer("t")
    roots = []
    for _ in range(4):
        with tracer.start_as_current_span("root") as root, tracer.start_as_current_span("child"):
            pass
        roots.append(root.trace_id)
    assert rec.buffer.size == 4 and rec.buffer.evictions == 2  # two traces of two spans each went, whole
    assert list(rec.buffer.traces) == roots[2:]
    spans, lost = rec.buffer.take(roots[0])
    assert spans == [] and lost
    spans, lost = rec.buffer.take(roots[3])
    assert len(spans) == 2 and not lost and rec.buffer.size == 2
    assert rec.buffer.take(12345) == ([], False)  # never seen here


def test_a_trace_evicted_while_it_was_recorded_is_lost_even_with_later_spans() -> None:
    buffer = SpanBuffer(capacity=2, remember=10)
    rec = make_recorder()
    rec.buffer = buffer
    tracer = rec.get_tracer("t")
    with tracer.start_as_current_span("root") as root:
        for _ in range(3):
            with tracer.start_as_current_span("child"):
                pass
    spans, lost = buffer.take(root.trace_id)
    assert lost and [s.name for s in spans] == ["root"]  # the children went with the whole trace at the third
