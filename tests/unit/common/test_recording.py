"""Always-on recording: lightweight spans behind the OTel API, the bounded buffer by trace, the keep decision's
bookkeeping (pinning, triggers, the rate limit, other processes' triggers), child_span and the propagator."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import get_global_textmap
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, TraceFlags

from services.common import recording
from services.common.recording import (
    PARENT_HEADER,
    TRIGGER,
    ParentPropagator,
    RecordedSpan,
    Recorder,
    SpanBuffer,
    parse_traceparent,
)
from services.common.recording_settings import RecordingSettings
from services.common.tracing import child_span

TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT = 0x00F067AA0BA902B7


def make_recorder(capacity: int = 100, **kwargs: float) -> Recorder:
    return Recorder("gateway", {"service.name": "gateway"}, capacity, 1000, **kwargs)  # type: ignore[arg-type]


def remote(flags: int = 0) -> otel_context.Context:
    """A caller's context, as the propagator extracts it."""
    parent = trace.SpanContext(TRACE, PARENT, is_remote=True, trace_flags=TraceFlags(flags))
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


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


def test_head_sampled_spans_go_to_the_export_queue_not_the_buffer() -> None:
    rec = make_recorder(export_max_spans=1)
    tracer = rec.get_tracer("t")
    with tracer.start_as_current_span("rpc", context=remote(flags=1)), tracer.start_as_current_span("stage"):
        pass
    assert [s.name for s in rec.drain_sampled()] == ["stage"] and rec.sampled_dropped == 1
    assert rec.buffer.size == 0


def test_the_edge_keeps_a_trace_pins_it_and_marks_its_root() -> None:
    rec = make_recorder()
    kept = []
    rec.on_keep = kept.append
    rec.edge = lambda root: ["latency"] if root.name == "slow" else []
    tracer = rec.get_tracer("t")
    with tracer.start_as_current_span("fast"):
        pass
    with tracer.start_as_current_span("slow") as slow, tracer.start_as_current_span("stage"):
        pass
    (k,) = kept
    assert k.trace_id == slow.trace_id and k.triggers == {"latency"}
    assert slow.attributes[TRIGGER] == "latency"
    assert [s.name for s in rec.kept[slow.trace_id].spans] == ["stage", "slow"]
    with trace.use_span(slow), child_span(tracer, "cache.store"):  # after the request: still its trace's, pinned
        pass
    spans, lost = rec.take([slow.trace_id])
    assert [s.name for s in spans] == ["stage", "slow", "cache.store"] and lost == []
    assert rec.kept == {} and rec.kept_total == {"latency": 1}


def test_keeps_past_the_rate_limit_are_dropped_and_counted() -> None:
    rec = make_recorder(max_kept_per_s=2.0)
    rec.edge = lambda root: ["error"]
    tracer = rec.get_tracer("t")
    for _ in range(5):
        with tracer.start_as_current_span("rpc"):
            pass
    assert len(rec.kept) == 2 and rec.keep_dropped == 3


def test_a_head_sampled_trace_is_marked_but_not_pinned() -> None:
    rec = make_recorder()
    rec.edge = lambda root: ["sampled"] if root.sampled else []
    with rec.get_tracer("t").start_as_current_span("rpc", context=remote(flags=1)) as root:
        pass
    assert root.attributes[TRIGGER] == "sampled" and rec.kept == {} and rec.drain_sampled() == [root]


def test_a_trace_that_waited_on_another_traces_batch_brings_it_along() -> None:
    rec = make_recorder()
    kept = []
    rec.on_keep = kept.append
    rec.edge = lambda root: ["latency"] if root.name == "member" else []
    tracer = rec.get_tracer("t")
    with tracer.start_as_current_span("leader") as leader:
        pass
    with tracer.start_as_current_span("member") as member:
        batch = tracer.start_span(
            "features.batch",
            context=trace.set_span_in_context(leader),
            links=[Link(leader.get_span_context()), Link(member.get_span_context())],
        )
        batch.end()
    assert kept[0].leaders == [leader.trace_id]


def test_a_sampled_leader_is_not_collected_and_a_sampled_member_only_brings_its_unsampled_leader() -> None:
    rec = make_recorder()
    kept = []
    rec.on_keep = kept.append
    rec.edge = lambda root: ["sampled"] if root.sampled else []  # as the gateway's triggers
    tracer = rec.get_tracer("t")

    def batched(leader_flags: int, member_flags: int) -> tuple[RecordedSpan, RecordedSpan]:
        def caller(flags: int) -> otel_context.Context:
            context = trace.SpanContext(random.getrandbits(128), PARENT, is_remote=True, trace_flags=TraceFlags(flags))
            return trace.set_span_in_context(trace.NonRecordingSpan(context))

        with tracer.start_as_current_span("leader", context=caller(leader_flags), kind=SpanKind.SERVER) as leader:
            pass
        with tracer.start_as_current_span("member", context=caller(member_flags), kind=SpanKind.SERVER) as member:
            tracer.start_span(
                "features.batch",
                context=trace.set_span_in_context(leader),
                links=[Link(leader.get_span_context()), Link(member.get_span_context())],
            ).end()
        return leader, member

    batched(1, 1)
    assert kept == [] and len(rec.drain_sampled()) == 3  # both exported on their own: no collection at all
    leader, member = batched(0, 1)
    (only,) = [k for k in kept if k.trace_id == member.trace_id]
    assert only.sampled and only.leaders == [leader.trace_id]


def test_another_processs_trigger_keeps_an_ended_request_or_waits_for_its_end() -> None:
    rec = make_recorder()
    kept = []
    rec.on_keep = kept.append
    rec.edge = lambda root: []
    tracer = rec.get_tracer("t")
    with tracer.start_as_current_span("ended") as ended:
        pass
    assert rec.external_trigger(ended.trace_id, "queue_wait")
    assert kept[-1].trace_id == ended.trace_id and ended.attributes[TRIGGER] == "queue_wait"
    with tracer.start_as_current_span("in flight") as flight:
        with tracer.start_as_current_span("stage"):
            pass
        assert rec.external_trigger(flight.trace_id, "queue_wait")  # it has spans here, not its end
        assert kept[-1].trace_id != flight.trace_id
    assert kept[-1].trace_id == flight.trace_id and flight.attributes[TRIGGER] == "queue_wait"
    assert not rec.external_trigger(999, "queue_wait")  # another edge's request


def test_a_trigger_off_the_edge_is_handed_on() -> None:
    rec = make_recorder()
    told = []
    rec.on_trigger = lambda trace_id, name: told.append((trace_id, name))
    rec.trigger(TRACE, "queue_wait")
    assert told == [(TRACE, "queue_wait")]


def test_child_span_records_under_a_recorded_span_whatever_the_sampled_flag() -> None:
    rec = make_recorder()
    with rec.get_tracer("t").start_as_current_span("rpc", context=remote(flags=0)) as rpc:
        with child_span(trace.get_tracer("meshserve.cache"), "cache.lookup", {"keys": 2}) as child:
            assert isinstance(child, RecordedSpan)
    assert (child.parent_id, child.attributes, child.scope) == (rpc.span_id, {"keys": 2}, "meshserve.cache")


def test_the_propagator_adds_the_current_spans_id_beside_traceparent() -> None:
    rec = make_recorder()
    propagator = ParentPropagator(get_global_textmap())
    carrier: dict[str, str] = {}
    with rec.get_tracer("t").start_as_current_span("hop", context=remote()) as hop:
        propagator.inject(carrier)
    assert carrier["traceparent"] == f"00-{TRACE:032x}-{hop.span_id:016x}-00"
    assert carrier[PARENT_HEADER] == f"{hop.span_id:016x}"
    untraced: dict[str, str] = {}
    propagator.inject(untraced)
    assert untraced == {}
    assert PARENT_HEADER in propagator.fields and "traceparent" in propagator.fields


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        (f"00-{TRACE:032x}-{PARENT:016x}-01", (TRACE, PARENT, 1)),
        (f"00-{TRACE:032x}-{PARENT:016x}-00", (TRACE, PARENT, 0)),
        (f"00-{0:032x}-{PARENT:016x}-01", None),
        (f"01-{TRACE:032x}-{PARENT:016x}-01", None),
        (f"00-{TRACE:032x}-{PARENT:016x}-0z", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_traceparent_parsing(header: str | None, parsed: tuple[int, int, int] | None) -> None:
    assert parse_traceparent(header) == parsed


def test_the_fast_context_functions_agree_with_the_api() -> None:
    rec = make_recorder()
    span = rec.get_tracer("t").start_span("s")
    token = recording.enter(span)
    assert trace.get_current_span() is span and recording.current_span() is span
    recording.leave(token)
    assert recording.current_span() is trace.INVALID_SPAN


def test_settings_peers_and_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_TRACING_PEERS", "a:9000, b:9001")
    assert RecordingSettings().peers == ["a:9000", "b:9001"] and RecordingSettings().retroactive
    monkeypatch.setenv("MESHSERVE_TRACING_PEERS", '["c:9002"]')
    assert RecordingSettings().peers == ["c:9002"]
    monkeypatch.setenv("MESHSERVE_TRACING_MODE", "head")
    assert not RecordingSettings().retroactive
    monkeypatch.delenv("MESHSERVE_TRACING_PEERS")
    monkeypatch.setenv("MESHSERVE_TRACING_MODE", "auto")
    assert not RecordingSettings().retroactive
    monkeypatch.setenv("MESHSERVE_TRACING_MODE", "retroactive")
    assert RecordingSettings().retroactive


def test_a_peers_file_is_read_each_time(tmp_path: Path) -> None:
    listed = tmp_path / "peers"
    settings = RecordingSettings(peers=["a:1"], peers_file=listed)
    assert settings.retroactive and settings.all_peers() == ["a:1"]  # not written yet
    listed.write_text("b:2\nc:3, a:1\n")
    assert settings.all_peers() == ["a:1", "b:2", "c:3"]
    listed.write_text('["d:4"]')
    assert settings.all_peers() == ["a:1", "d:4"]


def test_retroactive_setup_installs_the_recorder_its_propagator_and_gc_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from services.common import tracing

    installed: list[object] = []
    textmaps: list[object] = []
    thresholds: list[tuple[int, ...]] = []
    monkeypatch.setattr(tracing.trace, "set_tracer_provider", installed.append)
    monkeypatch.setattr(tracing.propagate, "set_global_textmap", textmaps.append)
    monkeypatch.setattr(tracing.gc, "set_threshold", lambda *t: thresholds.append(t))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "feature")
    recorder = tracing.setup_tracing("x", RecordingSettings(mode="retroactive", buffer_spans=7))
    assert isinstance(recorder, Recorder) and installed == [recorder]
    assert recorder.service == "feature" and recorder.resource["service.name"] == "feature"
    assert recorder.buffer.capacity == 7
    (textmap,) = textmaps
    assert isinstance(textmap, ParentPropagator)
    assert thresholds and thresholds[0][0] == 10_000
    textmaps.clear()
    tracing.setup_tracing("x", RecordingSettings(mode="retroactive", parent_header=False, gc_young_threshold=0))
    assert textmaps == []


def test_a_span_costs_a_few_microseconds() -> None:
    """Not a benchmark: a guard against a slow path creeping in (the SDK's span costs about 30 µs here)."""
    rec = make_recorder(capacity=10_000)
    tracer = rec.get_tracer("t")
    with tracer.start_as_current_span("rpc", context=remote()):
        start = time.process_time()
        for _ in range(2000):
            with tracer.start_as_current_span("stage", attributes={"rows": 1}):
                pass
        per_span = (time.process_time() - start) / 2000
    assert per_span < 25e-6
