"""The Recorder as tracer provider: where ended spans go (the export queue, pinned, the buffer), and the keep
decision's bookkeeping (pinning, triggers, the rate limit, batches shared across traces, other processes' triggers);
then its installation by setup_tracing."""

from __future__ import annotations

import random

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, TraceFlags

from services.common.recording.propagation import ParentPropagator
from services.common.recording.provider import Recorder
from services.common.recording.settings import RecordingSettings
from services.common.recording.spans import TRIGGER, RecordedSpan
from services.common.tracing import child_span
from tests.unit.common.recording.recorders import PARENT, TRACE, make_recorder, remote


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
