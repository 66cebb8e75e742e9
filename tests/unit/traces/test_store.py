"""The SQLite trace store: round trip, links and the spans linking to a span, bounds by span count and age (whole
traces), concurrent writers, a file from before links."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from services.traces.records import STATUS_ERROR, SpanLink
from services.traces.store import TraceStore
from tests.unit.traces.synthetic import batched, pipeline, span

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


def test_links_round_trip_and_the_spans_linking_to_a_span(tmp_path: Path) -> None:
    first, second = batched(members=2)
    batch = next(s for s in first if s.name == "features.batch")
    a_features, b_features = (next(s for s in t if s.name == "features") for t in (first, second))
    with TraceStore(tmp_path / "t.sqlite") as store:
        store.insert(first + second + pipeline(3), NOW)
        (back,) = [s for s in store.spans([batch.trace_id]) if s.span_id == batch.span_id]
        assert back == batch
        assert back.links == (
            SpanLink(a_features.trace_id, a_features.span_id, {"batch.index": 0}),
            SpanLink(b_features.trace_id, b_features.span_id, {"batch.index": 1}),
        )
        assert back.attributes == {"batch.members": 2, "batch.rows": 2}
        # Found from either member, across traces; a span nothing links to has none.
        assert store.linked_by(b_features.trace_id, b_features.span_id) == [batch]
        assert store.linked_by(a_features.trace_id, a_features.span_id) == [batch]
        assert store.linked_by(b_features.trace_id, second[0].span_id) == []
        assert store.linking_spans([second[0].trace_id]) == [batch]
        assert store.linking_spans([second[0].trace_id, first[0].trace_id, f"{3:032x}"]) == [batch]
        assert store.linking_spans([f"{3:032x}"]) == []
        store.insert([batch], NOW)  # a duplicate adds no second link row
        assert store.linked_by(b_features.trace_id, b_features.span_id) == [batch]
        (rows,) = store.db.execute("SELECT count(*) FROM span_links").fetchone()
        assert rows == 2


def test_evicting_a_batch_trace_takes_its_links(tmp_path: Path) -> None:
    first, second = batched(members=2)
    with TraceStore(tmp_path / "t.sqlite", max_age_s=60) as store:
        store.insert(first, NOW)
        store.insert(second, NOW + 50 * 10**9)
        store.insert(pipeline(1), NOW + 70 * 10**9)  # the first member's trace, with the batch span, is now too old
        assert store.linking_spans([second[0].trace_id]) == []
        assert store.db.execute("SELECT count(*) FROM span_links").fetchone() == (0,)
        assert len(store.spans([second[0].trace_id])) == len(second)


OLD_SCHEMA = """
CREATE TABLE spans (
    trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT NOT NULL, service TEXT NOT NULL,
    name TEXT NOT NULL, kind INTEGER NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
    status INTEGER NOT NULL, attributes TEXT NOT NULL, PRIMARY KEY (trace_id, span_id)
) WITHOUT ROWID;
CREATE TABLE traces (
    trace_id TEXT PRIMARY KEY, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, span_count INTEGER NOT NULL,
    errors INTEGER NOT NULL, received_ns INTEGER NOT NULL, updated_ns INTEGER NOT NULL
);
INSERT INTO spans VALUES ('00000000000000000000000000000abc', '0000000000000001', '', 'gateway', 'root', 2, 10, 20,
    0, '{"a":1}');
INSERT INTO traces VALUES ('00000000000000000000000000000abc', 10, 20, 1, 0, 10, 10);
"""


def test_a_store_file_from_before_links_opens_and_takes_linked_spans(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.close()
    with TraceStore(path) as store:
        (kept,) = store.spans(["00000000000000000000000000000abc"])
        assert (kept.name, kept.attributes, kept.links) == ("root", {"a": 1}, ())
        first, second = batched(members=2)
        assert store.insert(first + second, NOW) == len(first) + len(second)
        assert [s.name for s in store.linking_spans([second[0].trace_id])] == ["features.batch"]
    with TraceStore(path) as again:  # opening it once more changes nothing
        assert again.span_total() == 1 + len(first) + len(second)
    columns = [row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(spans)")]
    assert columns.count("links") == 1


def test_an_opener_that_loses_the_race_to_add_the_links_column_still_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.executescript(OLD_SCHEMA)
    old.close()
    transaction = TraceStore._transaction

    def after_another_opener(self: TraceStore) -> object:
        # Between this opener's check and its write lock, another one adds the column.
        monkeypatch.setattr(TraceStore, "_transaction", transaction)
        TraceStore(path).close()
        return transaction(self)

    monkeypatch.setattr(TraceStore, "_transaction", after_another_opener)
    with TraceStore(path) as store:
        assert store.span_total() == 1
    columns = [row[1] for row in sqlite3.connect(path).execute("PRAGMA table_info(spans)")]
    assert columns.count("links") == 1
