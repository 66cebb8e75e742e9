"""The trace UI's JSON API over a temporary store: parameters into a search (bad ones refused), the list, one trace's
waterfall with attributes, events and links both ways, hotspots and slow-against-typical traces, and the shared
queries the CLI reads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from services.traces import query, web_api
from services.traces.analysis import assemble, compare
from services.traces.records import SpanEvent
from services.traces.store import TraceFilter, TraceStore
from tests.unit.traces.synthetic import MS, batched, pipeline

NOW = 1_800_000_000_000_000_000


@pytest.fixture()
def store(tmp_path: Path) -> TraceStore:
    """40 traces a second apart ending 10 s before NOW; 13 and 27 slow (online lookup 25 ms); 2 batched members."""
    s = TraceStore(tmp_path / "t.sqlite")
    base = NOW - 50 * 10**9
    for i in range(40):
        spans = pipeline(i, online_ms=25.0 if i in (13, 27) else 1.0, base_ns=base)
        root = spans[0]
        spans[0] = dataclasses.replace(
            root,
            attributes={**root.attributes, "meshserve.pipeline": "fraud", "meshserve.trigger": "baseline"},
            events=(SpanEvent("admitted", root.start_ns + MS // 10, {"inflight": 3}),),
        )
        s.insert(spans, NOW)
    for member in batched(members=3, online_ms=4.0, base_ns=NOW - 5 * 10**9):
        s.insert(member, NOW)
    return s


def test_parse_filter() -> None:
    f = web_api.parse_filter(
        {
            "pipeline": "fraud",
            "status": "error",
            "degraded": "no",
            "trigger": "latency",
            "partial": "yes",
            "min_ms": "40",
            "max_ms": "1500.5",
            "since": "5m",
            "to": "1800000000000",
            "order": "slowest",
            "limit": "20",
            "unknown": "ignored",
        },
        now_ns=NOW,
    )
    assert f == TraceFilter(
        pipeline="fraud",
        error=True,
        degraded=False,
        trigger="latency",
        partial=True,
        min_duration_ns=40 * MS,
        max_duration_ns=int(1500.5 * MS),
        since_ns=NOW - 300 * 10**9,
        until_ns=NOW,
        order="slowest",
        limit=20,
    )
    assert web_api.parse_filter({}, now_ns=NOW, default_limit=7) == TraceFilter(limit=7)
    assert web_api.parse_filter({"status": "any", "degraded": "any", "pipeline": ""}) == TraceFilter()
    later = web_api.parse_filter({"since": "1h", "from": str((NOW - 60 * 10**9) // 10**6)}, now_ns=NOW)
    assert later.since_ns == NOW - 60 * 10**9  # the later of the two bounds


@pytest.mark.parametrize(
    "params",
    [
        {"status": "bad"},
        {"order": "oldest"},
        {"min_ms": "fast"},
        {"min_ms": "-1"},
        {"max_ms": "nan"},
        {"max_ms": "inf"},
        {"limit": "0"},
        {"limit": "1001"},
        {"limit": "2.5"},
        {"since": "soon"},
        {"degraded": "maybe"},
        {"from": "1e300"},
    ],
)
def test_bad_parameters_are_refused(params: dict[str, str]) -> None:
    with pytest.raises(web_api.BadRequest):
        web_api.parse_filter(params)


def test_traces_list(store: TraceStore) -> None:
    with store:
        answer = web_api.traces(store, {"min_ms": "25", "order": "slowest"})
        assert answer["total"] == 2
        first, second = answer["traces"]
        assert {first["trace_id"], second["trace_id"]} == {f"{13:032x}", f"{27:032x}"}
        assert first["pipeline"] == "fraud" and first["triggers"] == ["baseline"]
        assert first["root"] == {"stage": "envoy.ingress", "name": "127.0.0.1:8000", "service": "meshserve-ingress"}
        assert first["complete"] and not first["error"] and first["duration_ms"] > 25
        assert first["start_at_ms"] == pytest.approx((NOW - 50 * 10**9) / 1e6 + int(first["trace_id"], 16) * 1000)
        assert (
            web_api.traces(store, {})["total"] == 43
            and len(web_api.traces(store, {})["traces"]) == web_api.DEFAULT_LIMIT - 7
        )
        json.dumps(answer)  # JSON as it is


def test_one_trace(store: TraceStore) -> None:
    with store:
        t = web_api.trace(store, f"{13:032x}")
        assert web_api.trace(store, "f" * 32) is None
    assert t is not None
    assert [s["stage"] for s in t["spans"]][:3] == ["envoy.ingress", "envoy.ingress.upstream", "gateway.rpc"]
    assert t["stages"][0] == {"stage": "feature.online_lookup", "self_ms": 25.0}
    (lookup,) = [s for s in t["spans"] if s["stage"] == "feature.online_lookup"]
    assert t["largest_self_span"] == lookup["span_id"] and lookup["depth"] == 5 and lookup["self_ms"] == 25.0
    assert lookup["critical_ms"] == 25.0 and lookup["kind"] == "internal" and not lookup["error"]
    root = t["spans"][0]
    assert root["attributes"]["meshserve.pipeline"] == "fraud" and root["start_ms"] == 0
    assert root["events"] == [{"name": "admitted", "at_ms": 0.1, "attributes": {"inflight": 3}}]
    assert t["critical_path"][0]["stage"] == "envoy.ingress"
    assert "feature.online_lookup" in [p["stage"] for p in t["critical_path"]]
    json.dumps(t)


def test_batched_members_link_both_ways_and_share_the_call(store: TraceStore) -> None:
    first_id, second_id = f"{0xBA7C4:032x}", f"{0xBA7C5:032x}"
    with store:
        first = web_api.trace(store, first_id)
        second = web_api.trace(store, second_id)
    assert first is not None and second is not None
    (batch,) = [s for s in first["spans"] if s["name"] == "features.batch"]
    assert batch["batch"] and batch["members"] == 3
    assert [(ln["trace_id"], ln["attributes"]["batch.index"]) for ln in batch["links"]][:2] == [
        (first_id, 0),
        (second_id, 1),
    ]
    (member,) = [s for s in second["spans"] if s["name"] == "features"]
    (by,) = member["linked_by"]
    assert (by["trace_id"], by["span_id"], by["batch"], by["members"]) == (first_id, batch["span_id"], True, 3)
    # The member's wait inside the batched call is attributed to the call's stages (its own trace lacks them).
    assert member["shared_ms"]["feature.online_lookup"] == pytest.approx(4.0, abs=0.01)
    assert dict((s["stage"], s["self_ms"]) for s in second["stages"])["feature.online_lookup"] == pytest.approx(4.0)


def test_hotspots_and_comparison(store: TraceStore) -> None:
    with store:
        answer = web_api.analysis(store, {"pipeline": "fraud", "slowest": "2"})
        slow_only = web_api.analysis(store, {"min_ms": "25"})
        with pytest.raises(web_api.BadRequest):
            web_api.analysis(store, {"slow_q": "10"})
        with pytest.raises(web_api.BadRequest):
            web_api.analysis(store, {"limit": str(query.MAX_ANALYSED + 1)})
    assert answer["traces"] == 40 and answer["hotspot"]["stage"] == "feature.online_lookup"
    assert [t["trace_id"] for t in answer["slowest"]] in ([f"{13:032x}", f"{27:032x}"], [f"{27:032x}", f"{13:032x}"])
    c = answer["comparison"]
    assert c["slow"]["traces"] == 2 and c["typical"]["traces"] == 38  # the other 38 take the same time
    assert c["stages"][0]["stage"] == "feature.online_lookup"
    assert c["stages"][0]["delta_ms"] == pytest.approx(c["stages"][0]["slow_ms"] - c["stages"][0]["typical_ms"])
    assert slow_only["traces"] == 2 and slow_only["stages"][0]["stage"] == "feature.online_lookup"
    assert slow_only["stages"][0]["p99_share"] > 0.5
    json.dumps(answer)


def test_compare_without_traces_or_with_one() -> None:
    assert compare([]).stages == []
    (one,) = assemble(pipeline(1))
    result = compare([one])
    assert result.slow == [] and result.typical == [one]  # one trace is its own typical
    assert all(s.slow_ns == 0 and s.delta_ns == -s.typical_ns for s in result.stages)
    slow, *typical = assemble(pipeline(1, online_ms=30.0) + [s for i in range(2, 12) for s in pipeline(i)])
    result = compare([slow, *typical])
    assert result.slow == [slow] and len(result.typical) == 10
    assert result.stages[0].stage == "feature.online_lookup" and result.stages[0].delta_ns == pytest.approx(29 * MS)


def test_the_shared_queries(store: TraceStore) -> None:
    with store:
        found = query.search(store, TraceFilter(min_duration_ns=25 * MS))
        assert {s.row.trace_id for s in found} == {f"{13:032x}", f"{27:032x}"}
        assert all(s.trace is not None and s.trace.complete for s in found)
        assert len(query.analysed(store, TraceFilter())) == query.ANALYSED - 57  # every trace: 43
        assert query.hotspots(store, TraceFilter(limit=5)).traces[-1].trace_id == f"{0xBA7C6:032x}"
        assert query.comparison(store, TraceFilter()).stages
        detail = query.detail(store, f"{13:032x}".upper())
        assert detail is not None and detail.path[0].depth == 0
        assert query.find(store, f"{0xBA7C5:032x}".upper()) == [f"{0xBA7C5:032x}"]
    assert query.seconds("250ms") == 0.25
    with pytest.raises(ValueError, match="not a duration"):
        query.seconds("soon")
