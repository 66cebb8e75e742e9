"""The SQLite trace store: round trip, bounds by span count and age (whole traces), concurrent writers."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from services.traces.records import STATUS_ERROR
from services.traces.store import TraceStore
from tests.unit.traces.synthetic import pipeline, span

NOW = 1_800_000_000_000_000_000


def test_round_trip_and_summary(tmp_path: Path) -> None:
    spans = pipeline(1) + pipeline(2)
    with TraceStore(tmp_path / "t.sqlite") as store:
        assert store.insert(spans, NOW) == len(spans)
        assert store.insert(spans[:3], NOW) == 0  # duplicates ignored
        assert store.span_total() == len(spans)
        rows = store.recent_traces()
        assert [r.trace_id for r in rows] == [f"{2:032x}", f"{1:032x}"]
        assert rows[0].span_count == 13 and rows[0].errors == 0
        assert rows[0].duration_ns == max(s.end_ns for s in pipeline(2)) - min(s.start_ns for s in pipeline(2))
        back = sorted(store.spans([f"{1:032x}"]), key=lambda s: s.span_id)
        assert back == sorted(spans[:13], key=lambda s: s.span_id)
        assert back[-1].attributes == {"batch.size": 4}
        assert store.find_traces(f"{1:032x}".upper()) == [f"{1:032x}"]
        assert store.find_traces("00000000") == [f"{1:032x}", f"{2:032x}"]
        assert store.find_traces("zz") == []
        assert store.recent_traces(limit=1)[0].trace_id == f"{2:032x}"
        assert [r.trace_id for r in store.recent_traces(since_ns=rows[0].start_ns)] == [f"{2:032x}"]


def test_wal_mode(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.sqlite"):
        pass
    db = sqlite3.connect(tmp_path / "t.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_late_spans_update_the_trace_row(tmp_path: Path) -> None:
    t = "cd" * 16
    root = span(t, "", "gateway", "root", 0, 10)
    late = span(t, root.span_id, "gateway", "child", 5, 12, status=STATUS_ERROR)
    with TraceStore(tmp_path / "t.sqlite") as store:
        store.insert([root], NOW)
        store.insert([late], NOW + 1)
        (row,) = store.recent_traces()
        assert (row.span_count, row.errors, row.end_ns) == (2, 1, late.end_ns)


def test_bounded_by_span_count_evicting_oldest_traces_whole(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.sqlite", max_spans=100) as store:
        for i in range(20):  # 13 spans each, inserted newest-start last
            store.insert(pipeline(i), NOW)
            assert store.span_total() <= 100
        kept = {r.trace_id for r in store.recent_traces()}
        # 90 (the low watermark) / 13 spans per trace: the newest traces survive, whole.
        assert kept == {f"{i:032x}" for i in range(20 - len(kept), 20)}
        assert 6 <= len(kept) <= 7
        for trace_id in kept:
            assert len(store.spans([trace_id])) == 13
        (orphans,) = store.db.execute(
            "SELECT count(*) FROM spans WHERE trace_id NOT IN (SELECT trace_id FROM traces)"
        ).fetchone()
        assert orphans == 0


def test_eviction_is_by_start_time_not_arrival(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.sqlite", max_spans=30) as store:
        store.insert(pipeline(5), NOW)
        store.insert(pipeline(9), NOW)
        store.insert(pipeline(1), NOW)  # arrives last but started first: evicted first
        assert {r.trace_id for r in store.recent_traces()} == {f"{5:032x}", f"{9:032x}"}


def test_bounded_by_age(tmp_path: Path) -> None:
    with TraceStore(tmp_path / "t.sqlite", max_age_s=60) as store:
        store.insert(pipeline(1), NOW)
        store.insert(pipeline(2), NOW + 30 * 10**9)
        store.insert(pipeline(3), NOW + 70 * 10**9)  # trace 1 is now 70 s old
        assert {r.trace_id for r in store.recent_traces()} == {f"{2:032x}", f"{3:032x}"}
        assert store.enforce_bounds(NOW + 200 * 10**9) == 2
        assert store.trace_count() == 0 and store.span_total() == 0


def test_concurrent_inserts_from_several_connections(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    TraceStore(path).close()
    errors: list[BaseException] = []

    def writer(k: int) -> None:
        try:
            with TraceStore(path, max_spans=10_000) as store:
                for i in range(10):
                    store.insert(pipeline(k * 100 + i))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with TraceStore(path) as store:
        assert store.trace_count() == 40
        assert store.span_total() == 40 * 13
        assert all(r.span_count == 13 for r in store.recent_traces())


def test_concurrent_inserts_respect_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    TraceStore(path).close()

    def writer(k: int) -> None:
        with TraceStore(path, max_spans=100) as store:
            for i in range(15):
                store.insert(pipeline(k * 100 + i))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with TraceStore(path) as store:
        assert store.span_total() <= 100
        assert store.span_total() == sum(len(store.spans([r.trace_id])) for r in store.recent_traces())
        assert all(len(store.spans([r.trace_id])) == 13 for r in store.recent_traces())
