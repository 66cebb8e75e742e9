"""Trace marks and the store's search: what spans say about their trace (pipeline, triggers, degraded, partial, the
root's gRPC code) merged into its row as spans arrive, every search filter, events kept, an older file upgraded."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from services.traces.marks import Marks, code_name, join_triggers, marks_by_trace, split_triggers, triggers_of
from services.traces.records import STATUS_ERROR, SpanEvent, SpanRecord
from services.traces.store import TraceFilter, TraceStore
from tests.unit.traces.synthetic import MS, pipeline, span
from tests.unit.traces.test_store import OLD_SCHEMA

NOW = 1_800_000_000_000_000_000


def marked(spans: list[SpanRecord], index: int = 0, **attributes: object) -> list[SpanRecord]:
    """`spans` with these attributes added to spans[index] (0: the root)."""
    out = list(spans)
    out[index] = dataclasses.replace(out[index], attributes={**out[index].attributes, **attributes})
    return out


def test_triggers_of_every_shape() -> None:
    assert triggers_of("latency") == {"latency"}
    assert triggers_of(" latency, degraded ,") == {"latency", "degraded"}
    assert triggers_of(["error", "baseline", {"x": 1}]) == {"error", "baseline"}
    assert triggers_of(None) == set() and triggers_of({"a": "b"}) == set()
    assert triggers_of("x" * 1000) == {"x" * 128}  # a mark is a short name
    assert join_triggers({"sampled", "latency"}) == ",latency,sampled," and join_triggers([]) == ""
    assert split_triggers(",latency,sampled,") == ("latency", "sampled") and split_triggers(None) == ()


def test_marks_by_trace() -> None:
    a = marked(pipeline(1), **{"meshserve.trigger": "latency", "rpc.grpc.status_code": 8, "meshserve.partial": True})
    a = marked(a, 3, **{"meshserve.pipeline": "fraud", "meshserve.degraded": "features_degraded"})
    b = marked(pipeline(2), 4, **{"cache.pipeline": "digits", "rpc.grpc.status_code": 14})  # not a root: no code
    c = pipeline(3)
    marks = marks_by_trace(a + b + c)
    assert marks[a[0].trace_id] == Marks("fraud", None, {"latency"}, "features_degraded", True, 8)
    assert marks[b[0].trace_id] == Marks(None, "digits", set(), None, False, None)
    assert c[0].trace_id not in marks  # says nothing
    assert marks_by_trace(marked(pipeline(4), **{"meshserve.degraded": True}))[f"{4:032x}"].degraded == "degraded"
    assert marks_by_trace(marked(pipeline(4), **{"grpc.status_code": "0"}))[f"{4:032x}"].code == 0  # Envoy's
    assert code_name(8) == "RESOURCE_EXHAUSTED" and code_name(None) is None and code_name(99) == "99"


def test_marks_merge_as_spans_arrive(tmp_path: Path) -> None:
    spans = pipeline(1)
    trace_id = spans[0].trace_id
    with TraceStore(tmp_path / "t.sqlite") as store:
        store.insert(marked(spans[5:], 0, **{"cache.pipeline": "hinted", "meshserve.trigger": "queue_wait"}), NOW)
        row = store.trace_row(trace_id)
        assert row is not None and (row.pipeline, row.triggers, row.code) == ("hinted", ("queue_wait",), None)
        root = marked(spans[:5], **{"meshserve.pipeline": "fraud", "meshserve.trigger": ["latency", "degraded"]})
        root = marked(root, **{"rpc.grpc.status_code": 4, "meshserve.degraded": "features_degraded"})
        store.insert(root, NOW)
        row = store.trace_row(trace_id)
        assert row is not None
        assert row.pipeline == "fraud"  # the named pipeline wins over the hint
        assert row.triggers == ("degraded", "latency", "queue_wait")
        assert (row.degraded, row.code, row.error, row.partial) == ("features_degraded", 4, True, False)
        late = span(trace_id, spans[0].span_id, "model", "late", 1, 2, **{"meshserve.partial": "true"})
        store.insert([dataclasses.replace(late, attributes={**late.attributes, "meshserve.degraded": "other"})], NOW)
        row = store.trace_row(trace_id)
        assert row is not None and row.partial and row.degraded == "features_degraded"  # the first reason stays
        assert row.span_count == len(spans) + 1
        assert store.trace_row("f" * 32) is None


@pytest.fixture()
def store(tmp_path: Path) -> TraceStore:
    """Ten traces a second apart: 3 slow (online lookup 40 ms), 6 of pipeline fraud, 2 degraded, 1 failed, 1 partial,
    triggers on some."""
    s = TraceStore(tmp_path / "t.sqlite")
    base = NOW - 100 * 10**9
    for i in range(10):
        spans = pipeline(i, online_ms=40.0 if i in (2, 5, 8) else 1.0, base_ns=base)
        attributes: dict[str, object] = {"meshserve.pipeline": "fraud" if i < 6 else "digits"}
        if i in (2, 5):
            attributes["meshserve.trigger"] = "latency"
        if i in (3, 4):
            attributes["meshserve.degraded"] = "features_degraded"
            attributes["meshserve.trigger"] = "degraded"
        if i == 7:
            attributes["meshserve.partial"] = True
        if i == 9:
            attributes["meshserve.trigger"] = "baseline"
        spans = marked(spans, **attributes)
        if i == 6:
            spans[3] = dataclasses.replace(spans[3], status=STATUS_ERROR)
        s.insert(spans, NOW)
    return s


def ids(rows: list) -> list[int]:
    return [int(r.trace_id, 16) for r in rows]


def test_every_filter(store: TraceStore) -> None:
    base = NOW - 100 * 10**9
    with store:
        assert ids(store.search(TraceFilter())) == [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]
        assert ids(store.search(TraceFilter(pipeline="digits"))) == [9, 8, 7, 6]
        assert ids(store.search(TraceFilter(error=True))) == [6]
        assert 6 not in ids(store.search(TraceFilter(error=False)))
        assert ids(store.search(TraceFilter(degraded=True))) == [4, 3]
        assert len(store.search(TraceFilter(degraded=False))) == 8
        assert ids(store.search(TraceFilter(trigger="latency"))) == [5, 2]
        assert ids(store.search(TraceFilter(trigger="late"))) == []  # a whole name, not a prefix
        assert ids(store.search(TraceFilter(partial=True))) == [7]
        assert ids(store.search(TraceFilter(min_duration_ns=40 * MS))) == [8, 5, 2]
        assert ids(store.search(TraceFilter(max_duration_ns=40 * MS))) == [9, 7, 6, 4, 3, 1, 0]
        window = TraceFilter(since_ns=base + 3 * 1000 * MS, until_ns=base + 6 * 1000 * MS)
        assert ids(store.search(window)) == [5, 4, 3]
        assert ids(store.search(TraceFilter(pipeline="fraud", min_duration_ns=40 * MS))) == [5, 2]
        slowest = store.search(TraceFilter(order="slowest", limit=4))
        assert ids(slowest)[:3] == [8, 5, 2] and len(slowest) == 4
        assert store.count(TraceFilter(pipeline="fraud")) == 6
        assert store.facets() == {
            "pipelines": ["digits", "fraud"],
            "triggers": ["baseline", "degraded", "latency"],
            "degraded": ["features_degraded"],
        }


def test_a_hostile_filter_value_is_data(store: TraceStore) -> None:
    with store:
        assert store.search(TraceFilter(pipeline="fraud' OR 1=1 --")) == []
        assert store.search(TraceFilter(trigger="%")) == [] and store.search(TraceFilter(trigger=",")) == []


def test_events_round_trip(tmp_path: Path) -> None:
    (record,) = pipeline(1)[:1]
    record = dataclasses.replace(
        record, events=(SpanEvent("retry", record.start_ns + 5, {"attempt": 2}),), status_message="shed"
    )
    with TraceStore(tmp_path / "t.sqlite") as store:
        store.insert([record], NOW)
        (back,) = store.spans([record.trace_id])
    assert back == record


def test_an_older_file_gets_the_new_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.close()
    with TraceStore(path) as store:
        (kept,) = store.spans(["00000000000000000000000000000abc"])
        assert (kept.events, kept.status_message) == ((), "")
        (row,) = store.search(TraceFilter())
        assert (row.pipeline, row.triggers, row.degraded, row.partial, row.code) == (None, (), None, False, None)
        store.insert(marked(pipeline(1), **{"meshserve.trigger": "latency"}), NOW)
        assert ids(store.search(TraceFilter(trigger="latency"))) == [1]
    spans_columns = [row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(spans)")]
    traces_columns = [row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(traces)")]
    assert spans_columns[-3:] == ["links", "events", "status_message"]
    assert traces_columns[-6:] == ["pipeline", "pipeline_hint", "triggers", "degraded", "partial", "code"]
