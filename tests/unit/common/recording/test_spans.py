"""The recorded span behind the OTel API: its parent and attributes, the API's semantics of status, events, links
and end, an exception in its `with` block, child_span under it, the fast current-span functions, and its cost."""

from __future__ import annotations

import time

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.common import recording
from services.common.recording.spans import RecordedSpan, enter, leave
from services.common.tracing import child_span
from tests.unit.common.recording.recorders import PARENT, TRACE, make_recorder, recorder, remote


def test_a_span_under_a_callers_context_records_its_parent_and_attributes() -> None:
    rec = make_recorder()
    tracer = rec.get_tracer("meshserve.test")
    with tracer.start_as_current_span("rpc", context=remote(), kind=SpanKind.SERVER, attributes={"a": 1}) as span:
        assert trace.get_current_span() is span
        span.set_attribute("b", "two")
        with tracer.start_as_current_span("stage") as child:
            context = child.get_span_context()
            assert (context.trace_id, context.is_remote, context.trace_flags) == (TRACE, False, 0)
    spans, lost = rec.buffer.take(TRACE)
    assert not lost
    stage, rpc = spans
    assert (rpc.name, rpc.parent_id, rpc.remote_parent, rpc.kind) == ("rpc", PARENT, True, SpanKind.SERVER)
    assert rpc.attributes == {"a": 1, "b": "two"} and rpc.scope == "meshserve.test"
    assert (stage.parent_id, stage.remote_parent) == (rpc.span_id, False)
    assert rpc.start_ns <= stage.start_ns <= stage.end_ns <= rpc.end_ns
    assert not rpc.is_recording()


def test_a_span_without_a_parent_starts_a_new_unsampled_trace() -> None:
    rec = make_recorder()
    span = rec.get_tracer("t").start_span("root")
    assert span.parent_id == 0 and span.remote_parent and span.trace_id and not span.sampled


def test_the_api_semantics_of_status_events_links_and_end() -> None:
    rec = make_recorder()
    span = rec.get_tracer("t").start_span("s")
    span.set_status(StatusCode.UNSET)
    assert span.status_code is StatusCode.UNSET
    span.set_status(Status(StatusCode.ERROR, "boom"))
    assert (span.status_code, span.status_message) == (StatusCode.ERROR, "boom")
    span.set_status(StatusCode.OK)
    span.set_status(Status(StatusCode.ERROR, "later"))
    assert (span.status_code, span.status_message) == (StatusCode.OK, None)  # OK is final
    span.record_exception(ValueError("bad"), {"extra": 1})
    other = trace.SpanContext(TRACE, PARENT, is_remote=False)
    span.add_link(other, {"batch.index": 0})
    span.add_link(trace.INVALID_SPAN_CONTEXT)
    span.end(end_time=span.start_ns + 5)
    span.end()  # a second end changes nothing
    assert span.end_ns == span.start_ns + 5
    ((name, _, attributes),) = span.events or []
    assert name == "exception"
    assert attributes == {
        "exception.type": "ValueError",
        "exception.message": "bad",
        "exception.escaped": "False",
        "extra": 1,
    }
    assert [(ln.context.trace_id, ln.attributes) for ln in span.links or []] == [(TRACE, {"batch.index": 0})]
    assert len(rec.buffer.traces[span.trace_id]) == 1


def test_an_exception_in_the_with_block_marks_the_span_as_the_sdk_does() -> None:
    rec = make_recorder()
    with pytest.raises(KeyError), rec.get_tracer("t").start_as_current_span("s") as span:
        raise KeyError("k")
    assert span.status_code is StatusCode.ERROR and span.status_message == "KeyError: 'k'"
    assert span.events and span.events[0][2]["exception.escaped"] == "True"  # type: ignore[index]
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_child_span_records_under_a_recorded_span_whatever_the_sampled_flag() -> None:
    rec = make_recorder()
    with rec.get_tracer("t").start_as_current_span("rpc", context=remote(flags=0)) as rpc:
        with child_span(trace.get_tracer("meshserve.cache"), "cache.lookup", {"keys": 2}) as child:
            assert isinstance(child, RecordedSpan)
    assert (child.parent_id, child.attributes, child.scope) == (rpc.span_id, {"keys": 2}, "meshserve.cache")


def test_the_fast_context_functions_agree_with_the_api() -> None:
    rec = make_recorder()
    span = rec.get_tracer("t").start_span("s")
    token = recording.enter(span)
    assert trace.get_current_span() is span and recording.current_span() is span
    recording.leave(token)
    assert recording.current_span() is trace.INVALID_SPAN


def test_enter_and_leave_nest() -> None:
    rec = recorder("x")
    a, b = rec.get_tracer("t").start_span("a"), rec.get_tracer("t").start_span("b")
    ta = enter(a)
    tb = enter(b)
    assert trace.get_current_span() is b
    leave(tb)
    assert trace.get_current_span() is a
    leave(ta)


def test_a_span_costs_a_few_microseconds() -> None:
    """Not a benchmark: a guard against a slow path creeping in (the bound is below what the SDK's own span costs;
    measured: see bench/README.md)."""
    rec = make_recorder(capacity=10_000)
    tracer = rec.get_tracer("t")
    with tracer.start_as_current_span("rpc", context=remote()):
        start = time.process_time()
        for _ in range(2000):
            with tracer.start_as_current_span("stage", attributes={"rows": 1}):
                pass
        per_span = (time.process_time() - start) / 2000
    assert per_span < 25e-6
