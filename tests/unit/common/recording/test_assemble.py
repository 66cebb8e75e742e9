"""A collected trace made whole or marked partial: a callee behind an unrecorded hop hung on its caller's span, the
root freed of its unrecorded caller, a lost or unanswered part, a kept trace with no spans left."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.trace import SpanKind, TraceFlags

from services.common.recording.assemble import COLLECTION_SPAN, Part, assemble
from services.common.recording.otlp import VIA, resource_spans
from services.common.recording.spans import RecordedSpan
from tests.unit.common.recording.recorders import CALLER, ENVOY, TRACE, attrs, caller, recorder


def part_of(label: str, spans: Sequence[RecordedSpan], service: str, lost: set[int] = frozenset()) -> Part:  # type: ignore[assignment]
    return Part(
        label, resource_spans(spans, {"service.name": service}, via=True), {t.to_bytes(16, "big") for t in lost}
    )


def a_request_through_an_unsampled_mesh() -> tuple[list[RecordedSpan], list[RecordedSpan]]:
    """The gateway's root under an unsampled caller, its hop, and the feature service's server span whose parent is
    an (unrecorded) Envoy span, with the gateway's hop in x-meshserve-parent."""
    gateway, feature = recorder("gateway"), recorder("feature")
    tracer = gateway.get_tracer("meshserve.grpc")
    with tracer.start_as_current_span("rpc", context=caller(), kind=SpanKind.SERVER) as root:  # type: ignore[arg-type]
        with tracer.start_as_current_span("features.batch", kind=SpanKind.CLIENT) as hop:
            envoy = trace.set_span_in_context(
                trace.NonRecordingSpan(trace.SpanContext(TRACE, ENVOY, is_remote=True, trace_flags=TraceFlags(0)))
            )
            served = feature.get_tracer("meshserve.grpc").start_span("Compute", envoy, kind=SpanKind.SERVER)  # type: ignore[arg-type]
            served.via = hop.span_id
            served.end()
    assert root.trace_id == TRACE
    return gateway.take([TRACE])[0], feature.take([TRACE])[0]


def test_a_callee_behind_an_unrecorded_hop_hangs_on_the_callers_span_and_the_root_is_freed() -> None:
    own, theirs = a_request_through_an_unsampled_mesh()
    parts = [part_of("gateway@self", own, "gateway"), part_of("feature@127.0.0.1:9002", theirs, "feature")]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"latency"}})[TRACE.to_bytes(16, "big")]
    assert outcome.spans == 3 and not outcome.partial
    spans = {s.name: s for p in parts for sc in p.resource.scope_spans for s in sc.spans}  # type: ignore[union-attr]
    assert spans["Compute"].parent_span_id == spans["features.batch"].span_id
    assert attrs(spans["Compute"])["meshserve.unrecorded_parent"] == f"{ENVOY:016x}"
    assert spans["rpc"].parent_span_id == b""
    assert attrs(spans["rpc"]) == {"meshserve.unrecorded_parent": f"{CALLER:016x}", "meshserve.trigger": "latency"}
    assert all(VIA not in attrs(s) for s in spans.values())


def test_a_process_that_lost_its_part_makes_the_trace_partial() -> None:
    own, _ = a_request_through_an_unsampled_mesh()
    parts = [part_of("gateway@self", own, "gateway"), part_of("feature@127.0.0.1:9002", [], "feature", {TRACE})]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"error"}})[TRACE.to_bytes(16, "big")]
    assert outcome.missing == ["feature@127.0.0.1:9002: buffer rolled over"]
    (root,) = [s for sc in parts[0].resource.scope_spans for s in sc.spans if s.name == "rpc"]  # type: ignore[union-attr]
    assert attrs(root)["meshserve.partial"] is True
    assert attrs(root)["meshserve.partial.processes"] == ["feature@127.0.0.1:9002: buffer rolled over"]


def test_a_missing_callee_while_a_process_did_not_answer_is_partial() -> None:
    own, _ = a_request_through_an_unsampled_mesh()
    parts = [part_of("gateway@self", own, "gateway"), Part("127.0.0.1:9002", None)]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"latency"}})[TRACE.to_bytes(16, "big")]
    assert outcome.missing == ["callee of features.batch: not collected (127.0.0.1:9002)"]


def test_a_kept_trace_with_no_spans_left_still_arrives_marked() -> None:
    parts = [part_of("gateway@self", [], "gateway", {TRACE})]
    outcome = assemble(parts, {TRACE.to_bytes(16, "big"): {"latency"}})[TRACE.to_bytes(16, "big")]
    assert outcome.partial
    (marker,) = [s for sc in parts[0].resource.scope_spans for s in sc.spans]  # type: ignore[union-attr]
    assert marker.name == COLLECTION_SPAN and attrs(marker)["meshserve.partial"] is True
    assert attrs(marker)["meshserve.trigger"] == "latency"
    linked_only = [part_of("gateway@self", [], "gateway")]
    assert assemble(linked_only, {TRACE.to_bytes(16, "big"): {"linked"}})[TRACE.to_bytes(16, "big")].spans == 0
    assert not linked_only[0].resource.scope_spans  # type: ignore[union-attr]
