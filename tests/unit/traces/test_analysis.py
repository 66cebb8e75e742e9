"""Trace assembly, self time, shares, critical path, hotspot naming and batched calls' attribution to their members,
on synthetic traces."""

from __future__ import annotations

import dataclasses
import random

import pytest

from services.traces.analysis import (
    assemble,
    breakdown,
    critical_path,
    hotspot_line,
    percentile,
    select,
    self_time_ns,
    split_ns,
    union_ns,
)
from services.traces.records import KIND_SERVER, SpanLink, SpanRecord
from tests.unit.traces.synthetic import MS, batched, pipeline, span

T = "ab" * 16


def test_union_clips_and_merges() -> None:
    assert union_ns([(0, 10), (5, 15), (20, 30)], 0, 100) == 25
    assert union_ns([(-5, 5), (95, 200)], 0, 100) == 10
    assert union_ns([(50, 40), (10, 10)], 0, 100) == 0
    assert union_ns([], 0, 100) == 0


def test_self_time_with_overlapping_children() -> None:
    parent = span(T, "", "gateway", "root", 0, 10)
    a = span(T, parent.span_id, "gateway", "a", 1, 5)
    b = span(T, parent.span_id, "gateway", "b", 3, 7)  # overlaps a: union 1..7
    c = span(T, parent.span_id, "gateway", "c", 9, 12)  # sticks out: clipped to 9..10
    assert self_time_ns(parent, [a, b, c]) == (10 - 6 - 1) * MS
    trace = assemble([c, b, parent, a])[0]
    assert trace.root.span is parent
    assert [n.span.name for n in trace.root.children] == ["a", "b", "c"]
    assert trace.root.self_ns == 3 * MS
    assert trace.stage_self_ns()["gateway.root"] == 3 * MS


def test_assembly_tolerates_missing_parents_and_duplicates() -> None:
    root = span(T, "", "gateway", "inference.GRPCInferenceService/ModelInfer", 0, 10, KIND_SERVER)
    child = span(T, root.span_id, "gateway", "features", 1, 9)
    lost = span(T, "ffffffffffffffff", "feature", "feature.online_lookup", 2, 8)  # parent not arrived (yet)
    traces = assemble([lost, child, root, child])
    assert len(traces) == 1
    trace = traces[0]
    assert not trace.complete
    assert trace.root.span is root  # the true root wins over the orphan
    assert [r.span.name for r in trace.roots] == [root.name, lost.name]
    assert len(trace.nodes) == 3
    assert trace.duration_ns == 10 * MS
    # Once the parent arrives the tree is whole.
    parent = span(T, child.span_id, "feature", "meshserve.feature.FeatureService/Compute", 1.5, 8.5, KIND_SERVER)
    parent = dataclasses.replace(parent, span_id="ffffffffffffffff")
    whole = assemble([lost, child, root, parent])[0]
    assert whole.complete
    assert [(n.stage, d) for n, d in whole.walk()] == [
        ("gateway.rpc", 0),
        ("gateway.features", 1),
        ("feature.rpc", 2),
        ("feature.online_lookup", 3),
    ]
    assert whole.stage_self_ns() == {
        "gateway.rpc": 2 * MS,
        "gateway.features": 1 * MS,
        "feature.rpc": 1 * MS,
        "feature.online_lookup": 6 * MS,
    }


def test_self_times_sum_to_end_to_end_for_nested_sequential_spans() -> None:
    trace = assemble(pipeline(1, online_ms=3.0, forward_ms=2.0))[0]
    assert trace.complete
    assert sum(trace.stage_self_ns().values()) == pytest.approx(trace.duration_ns, abs=20)
    selfs = trace.stage_self_ns()
    assert selfs["feature.online_lookup"] == pytest.approx(3 * MS, abs=2)
    assert selfs["model.forward"] == pytest.approx(2 * MS, abs=2)
    assert selfs["gateway.features"] == pytest.approx(0.6 * MS, abs=2)  # the two network legs
    assert selfs["envoy.ingress"] == pytest.approx(0.2 * MS, abs=2)


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile([7], 99) == 7
    assert percentile([1, 2, 3], 99) == 3


def _traces(slow: str, n: int = 60, seed: int = 1) -> list:
    rng = random.Random(seed)
    spans = []
    for i in range(n):
        online, forward = rng.uniform(0.5, 1.0), rng.uniform(0.8, 1.2)
        if i % 20 == 7:  # the slow tail
            online, forward = (online + 30, forward) if slow == "feature" else (online, forward + 30)
        spans += pipeline(i, online_ms=online, forward_ms=forward)
    rng.shuffle(spans)  # arrival order does not matter
    return assemble(spans)


def test_hotspot_feature_stage_slow() -> None:
    result = breakdown(_traces("feature"))
    assert len(result.traces) == 60
    assert len(result.p99_traces) == 1
    assert result.hotspot is not None and result.hotspot.stage == "feature.online_lookup"
    line = hotspot_line(result)
    assert line.startswith("hotspot: feature.online_lookup (") and line.endswith("% of p99)")
    share = int(line.split("(")[1].split("%")[0])
    slow = result.p99_traces[0]
    expected = slow.stage_self_ns()["feature.online_lookup"] / slow.duration_ns
    assert share == round(expected * 100)
    assert 75 <= share <= 95


def test_hotspot_model_stage_slow() -> None:
    result = breakdown(_traces("model"))
    assert hotspot_line(result).startswith("hotspot: model.forward (")
    stages = {s.stage: s for s in result.stages}
    assert stages["model.forward"].self_p99_ns > 30 * MS
    assert stages["model.forward"].self_p50_ns < 1.3 * MS
    assert stages["feature.online_lookup"].p99_share < 0.05


def test_shares_are_fractions_of_end_to_end_time() -> None:
    traces = _traces("feature")
    result = breakdown(traces)
    total = sum(t.duration_ns for t in traces)
    online = sum(t.stage_self_ns()["feature.online_lookup"] for t in traces)
    stage = next(s for s in result.stages if s.stage == "feature.online_lookup")
    assert stage.share == pytest.approx(online / total)
    assert stage.traces == 60
    # Sequential children only: the shares add up to the whole.
    assert sum(s.share for s in result.stages) == pytest.approx(1.0, abs=1e-4)
    assert sum(s.p99_share for s in result.stages) == pytest.approx(1.0, abs=1e-4)
    assert result.stages == sorted(result.stages, key=lambda s: -s.p99_share)


def test_critical_path_follows_the_last_finishing_child() -> None:
    root = span(T, "", "gateway", "inference.GRPCInferenceService/ModelInfer", 0, 10, KIND_SERVER)
    fast = span(T, root.span_id, "gateway", "cache.lookup", 1, 3)
    slow = span(T, root.span_id, "gateway", "features", 1, 8)  # concurrent with fast, ends last
    inner = span(T, slow.span_id, "feature", "feature.online_lookup", 2, 7)
    trace = assemble([root, fast, slow, inner])[0]
    path = critical_path(trace)
    assert [(s.stage, s.critical_ns) for s in path] == [
        ("gateway.rpc", 3 * MS),  # 0..1 and 8..10
        ("gateway.features", 2 * MS),  # 1..2 and 7..8
        ("feature.online_lookup", 5 * MS),
    ]
    assert sum(s.critical_ns for s in path) == trace.duration_ns


def test_critical_path_of_a_pipeline_covers_the_trace() -> None:
    trace = assemble(pipeline(3, online_ms=5.0))[0]
    path = critical_path(trace)
    assert path[0].stage == "envoy.ingress"
    assert sum(s.critical_ns for s in path) == pytest.approx(trace.duration_ns, abs=20)
    assert max(path, key=lambda s: s.critical_ns).stage == "feature.online_lookup"


def test_breakdown_slowest_and_select() -> None:
    traces = _traces("feature")
    result = breakdown(traces, slowest=2)
    assert len(result.slowest) == 2
    assert result.slowest[0][0].duration_ns >= result.slowest[1][0].duration_ns
    assert result.slowest[0][0] is result.p99_traces[0]
    assert [t.trace_id for t in select(traces, last=5)] == [t.trace_id for t in traces[-5:]]
    since = traces[50].start_ns
    assert len(select(traces, since_ns=since)) == 10
    assert len(select(traces, last=3, since_ns=since)) == 3
    assert select(traces, last=0) == []


def test_empty() -> None:
    result = breakdown([])
    assert result.hotspot is None
    assert hotspot_line(result) == "hotspot: none (no traces)"


def test_each_member_of_a_batch_gets_the_first_members_stage_breakdown() -> None:
    first, second = batched(members=2, online_ms=4.0)
    alone = assemble(first)[0].stage_self_ns()
    a, b = assemble(first + second)
    assert (a.trace_id, b.trace_id) == (first[0].trace_id, second[0].trace_id)
    assert a.stage_self_ns() == alone  # in the first member's trace nothing changes: the subtree is there
    assert b.stage_self_ns() == a.stage_self_ns()
    assert b.stage_self_ns()["feature.online_lookup"] == 4 * MS
    assert b.stage_self_ns()["gateway.features.batch"] == pytest.approx(0.2 * MS, abs=2)
    # The waterfall's numbers stay the spans' own: the second member's features span has no children here.
    features = next(n for n in b.nodes if n.span.name == "features")
    assert features.self_ns == features.span.duration_ns
    assert sum(features.shared.values()) == 5.2 * MS  # the batched call's whole interval
    assert sum(b.stage_self_ns().values()) == sum(n.self_ns for n in b.nodes)


def test_a_later_member_keeps_its_longer_wait_as_its_own() -> None:
    traces = assemble([s for t in batched(members=3, online_ms=2.0, late_ms=0.3) for s in t])
    first, *later = (t.stage_self_ns() for t in traces)
    for i, selfs in enumerate(later, start=1):
        assert set(selfs) == set(first)
        for stage, ns in first.items():
            if stage == "gateway.features":
                # It joined 0.3 ms later per place in the batch, so it waited that much less for the batch to leave.
                assert selfs[stage] == pytest.approx(ns - i * 0.3 * MS, abs=2)
            else:
                assert selfs[stage] == pytest.approx(ns, abs=2), stage


def test_a_batch_in_its_own_trace_counts_as_it_is_wherever_it_hangs() -> None:
    first, second = batched(members=2)
    gateway = next(s for s in first if s.name == "inference.GRPCInferenceService/ModelInfer")
    # The batch span under the gateway's server span instead of the member's: its subtree still counts once.
    moved = [dataclasses.replace(s, parent_span_id=gateway.span_id) if s.name == "features.batch" else s for s in first]
    unlinked = [dataclasses.replace(s, links=()) for s in moved]
    a = assemble(moved + second)[0]
    assert a.stage_self_ns() == assemble(unlinked)[0].stage_self_ns()
    assert sum(a.stage_self_ns().values()) == sum(n.self_ns for n in a.nodes)


def test_a_member_without_the_batch_trace_keeps_its_self_time() -> None:
    _, second = batched(members=2)
    (b,) = assemble(second)
    assert not any(stage.startswith("feature.") for stage in b.stage_self_ns())
    features = next(n for n in b.nodes if n.span.name == "features")
    assert features.shared == {} and b.stage_self_ns()["gateway.features"] == features.span.duration_ns


@pytest.mark.parametrize(
    ("members_attribute", "index_attribute", "attributed"),
    [(False, False, False), (True, False, True), (False, True, True)],
)
def test_a_batch_is_known_by_batch_members_or_the_links_batch_index(
    members_attribute: bool, index_attribute: bool, attributed: bool
) -> None:
    first, second = batched(members=2)

    def strip(s: SpanRecord) -> SpanRecord:
        if not s.links:
            return s
        links = s.links if index_attribute else tuple(dataclasses.replace(ln, attributes={}) for ln in s.links)
        return dataclasses.replace(s, attributes=s.attributes if members_attribute else {}, links=links)

    b = assemble([strip(s) for s in first] + second)[1]
    assert ("feature.online_lookup" in b.stage_self_ns()) is attributed


def test_a_member_in_two_batches_gives_each_only_the_time_not_yet_taken() -> None:
    root = span(T, "", "gateway", "features", 0, 10)
    other = "cd" * 16
    parent = span(other, "", "gateway", "features", 0, 10)
    member = SpanLink(T, root.span_id, {"batch.index": 1})
    one = dataclasses.replace(span(other, parent.span_id, "gateway", "features.batch", 1, 5), links=(member,))
    two = dataclasses.replace(span(other, parent.span_id, "gateway", "model.batch", 4, 8), links=(member,))
    inner = span(other, two.span_id, "model", "model.forward", 4, 7)
    trace = next(t for t in assemble([root, parent, one, two, inner]) if t.trace_id == T)
    # 1..5 to the first batch (all its own time), 5..8 to the second: 3 ms over its 1 ms own + 3 ms forward.
    assert trace.root.shared == {
        "gateway.features.batch": 4 * MS,
        "gateway.model.batch": 750_000,
        "model.forward": 2_250_000,
    }
    assert trace.stage_self_ns()["gateway.features"] == 3 * MS


def test_split_ns_adds_up() -> None:
    assert split_ns(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert split_ns(7, {"a": 0, "b": 5}) == {"b": 7}
    parts = split_ns(1_000_003, {"x": 3, "y": 7, "z": 11})
    assert sum(parts.values()) == 1_000_003
