"""The SQLite trace store: spans (with their links and events) by trace, one summary row per trace with its marks,
bounded by span count and age (oldest traces evicted whole); searching the summaries, the spans that link to a span
found through an index."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.traces.marks import Marks, join_triggers, marks_by_trace, split_triggers
from services.traces.records import STATUS_ERROR, SpanEvent, SpanLink, SpanRecord

SCHEMA = """
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    parent_span_id TEXT NOT NULL,
    service TEXT NOT NULL,
    name TEXT NOT NULL,
    kind INTEGER NOT NULL,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status INTEGER NOT NULL,
    attributes TEXT NOT NULL,
    links TEXT NOT NULL DEFAULT '[]',
    events TEXT NOT NULL DEFAULT '[]',
    status_message TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (trace_id, span_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS span_links (
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    linked_trace_id TEXT NOT NULL,
    linked_span_id TEXT NOT NULL,
    PRIMARY KEY (trace_id, span_id, position)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS span_links_by_target ON span_links (linked_trace_id, linked_span_id);
CREATE TABLE IF NOT EXISTS traces (
    trace_id TEXT PRIMARY KEY,
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    span_count INTEGER NOT NULL,
    errors INTEGER NOT NULL,
    received_ns INTEGER NOT NULL,
    updated_ns INTEGER NOT NULL,
    pipeline TEXT,
    pipeline_hint TEXT,
    triggers TEXT NOT NULL DEFAULT '',
    degraded TEXT,
    partial INTEGER NOT NULL DEFAULT 0,
    code INTEGER
);
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (start_ns);
CREATE INDEX IF NOT EXISTS traces_by_update ON traces (updated_ns);
"""
SPAN_COLUMNS = (
    "trace_id, span_id, parent_span_id, service, name, kind, start_ns, end_ns, status, attributes, links, events, "
    "status_message"
)
# Columns added since the first files were written: opening an older file adds them (its rows get the defaults).
ADDED_COLUMNS = {
    "spans": {
        "links": "TEXT NOT NULL DEFAULT '[]'",
        "events": "TEXT NOT NULL DEFAULT '[]'",
        "status_message": "TEXT NOT NULL DEFAULT ''",
    },
    "traces": {
        "pipeline": "TEXT",
        "pipeline_hint": "TEXT",
        "triggers": "TEXT NOT NULL DEFAULT ''",
        "degraded": "TEXT",
        "partial": "INTEGER NOT NULL DEFAULT 0",
        "code": "INTEGER",
    },
}
ROW_COLUMNS = (
    "trace_id, start_ns, end_ns, span_count, errors, coalesce(pipeline, pipeline_hint), triggers, degraded, partial, "
    "code"
)
LINKING_COLUMNS = ", ".join(f"s.{c.strip()}" for c in SPAN_COLUMNS.split(","))
DEFAULT_DB = Path(".logs/traces.sqlite")
LOW_WATERMARK = 0.9  # evicting by count goes down to this fraction of max_spans, so it does not run on every write
RECOUNT_S = 1.0  # how often the span count is read back even when this connection's estimate is under the bound


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One trace's summary row: time span of its spans, how many, how many with status ERROR, and its marks
    (`services.traces.marks`: pipeline, triggers, degraded reason, partial, the root's gRPC code)."""

    trace_id: str
    start_ns: int
    end_ns: int
    span_count: int
    errors: int
    pipeline: str | None = None
    triggers: tuple[str, ...] = ()
    degraded: str | None = None
    partial: bool = False
    code: int | None = None

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    @property
    def error(self) -> bool:
        """A span with status ERROR, or the request answered with a gRPC code other than OK."""
        return self.errors > 0 or bool(self.code)


@dataclass(frozen=True, slots=True)
class TraceFilter:
    """What a search of the summary rows keeps (None: any). Durations in nanoseconds, `since_ns` / `until_ns` bound
    the trace's start ([since, until)); `order` is `recent` (latest start first) or `slowest`."""

    pipeline: str | None = None
    error: bool | None = None
    degraded: bool | None = None
    trigger: str | None = None
    partial: bool | None = None
    min_duration_ns: int | None = None
    max_duration_ns: int | None = None
    since_ns: int | None = None
    until_ns: int | None = None
    order: str = "recent"
    limit: int | None = None

    def where(self) -> tuple[str, list[Any]]:
        """The SQL condition on `traces` and its arguments."""
        terms: list[str] = []
        args: list[Any] = []
        if self.pipeline is not None:
            terms.append("coalesce(pipeline, pipeline_hint) = ?")
            args.append(self.pipeline)
        if self.error is not None:
            terms.append(("" if self.error else "NOT ") + "(errors > 0 OR coalesce(code, 0) != 0)")
        if self.degraded is not None:
            terms.append("degraded IS NOT NULL" if self.degraded else "degraded IS NULL")
        if self.trigger is not None:
            terms.append("instr(triggers, ',' || ? || ',') > 0")
            args.append(self.trigger)
        if self.partial is not None:
            terms.append("partial != 0" if self.partial else "partial = 0")
        if self.min_duration_ns is not None:
            terms.append("end_ns - start_ns >= ?")
            args.append(self.min_duration_ns)
        if self.max_duration_ns is not None:
            terms.append("end_ns - start_ns <= ?")
            args.append(self.max_duration_ns)
        if self.since_ns is not None:
            terms.append("start_ns >= ?")
            args.append(self.since_ns)
        if self.until_ns is not None:
            terms.append("start_ns < ?")
            args.append(self.until_ns)
        return (" WHERE " + " AND ".join(terms)) if terms else "", args


class TraceStore:
    """One connection to the store (use one per thread); creates the file and schema on open, and adds the columns
    a file written by an older version lacks (ADDED_COLUMNS: its spans read back with no links or events, its traces
    with no marks).

    Each insert also merges what its spans say about their traces (`services.traces.marks`) into the traces' rows,
    which `search` filters on without reading spans.

    A span's links are kept twice: as JSON in its row (`[[trace_id, span_id, attributes], ...]`, read back with the
    span) and one row each in `span_links`, indexed by the span linked to, so that the spans linking to a span are
    found without reading every span (`linked_by`, `linking_spans`). Both go with the linking span's trace.

    Bounds, enforced in the same transaction as every insert (readers never see them exceeded): at most
    `max_spans` spans (on overflow the traces that started first are deleted, whole, down to 90% of the bound)
    and, when `max_age_s` > 0, no trace nothing arrived for in `max_age_s`. The count is this connection's
    running estimate, read back from the file on overflow and at least every second, so several writers on one
    file keep it bounded too.
    """

    def __init__(self, path: Path | str, max_spans: int = 200_000, max_age_s: float = 0.0) -> None:
        self.path = Path(path)
        self.max_spans = max_spans
        self.max_age_s = max_age_s
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(str(path), timeout=10.0, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        self._add_columns()
        self._estimate = self.span_total()
        self._counted_at = time.monotonic()
        self._data_version = self._version()

    def close(self) -> None:
        self.db.close()

    def _add_columns(self) -> None:
        """Give tables from an older file the columns added since (ADDED_COLUMNS; once, even with several openers at
        once; the write lock only when one is missing, so that opening a current file never waits for the writer)."""

        def missing() -> list[tuple[str, str, str]]:
            out = []
            for table, columns in ADDED_COLUMNS.items():
                have = {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}
                out += [(table, name, kind) for name, kind in columns.items() if name not in have]
            return out

        if missing():
            with self._transaction():
                for table, name, kind in missing():
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def __enter__(self) -> TraceStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- writing ------------------------------------------------------------------------------------

    def insert(self, records: Sequence[SpanRecord], now_ns: int | None = None) -> int:
        """Add spans (a span already stored is ignored), then enforce the bounds; returns spans added."""
        if not records:
            return 0
        now_ns = time.time_ns() if now_ns is None else now_ns
        rows = [_row(r) for r in records]
        links = [(r.trace_id, r.span_id, i, ln.trace_id, ln.span_id) for r in records for i, ln in enumerate(r.links)]
        trace_ids = sorted({r.trace_id for r in records})
        with self._transaction():
            cursor = self.db.executemany(
                f"INSERT OR IGNORE INTO spans ({SPAN_COLUMNS}) VALUES ({','.join('?' * len(rows[0]))})", rows
            )
            added = max(0, cursor.rowcount)
            if links:
                self.db.executemany(
                    """INSERT OR IGNORE INTO span_links (trace_id, span_id, position, linked_trace_id, linked_span_id)
                       VALUES (?,?,?,?,?)""",
                    links,
                )
            for chunk in _chunks(trace_ids, 500):
                marks = ",".join("?" * len(chunk))
                self.db.execute(
                    f"""INSERT INTO traces (trace_id, start_ns, end_ns, span_count, errors, received_ns, updated_ns)
                        SELECT trace_id, min(start_ns), max(end_ns), count(*), sum(status = {STATUS_ERROR}), ?, ?
                        FROM spans WHERE trace_id IN ({marks}) GROUP BY trace_id
                        ON CONFLICT (trace_id) DO UPDATE SET start_ns = excluded.start_ns,
                            end_ns = excluded.end_ns, span_count = excluded.span_count,
                            errors = excluded.errors, updated_ns = excluded.updated_ns""",
                    (now_ns, now_ns, *chunk),
                )
            self._mark(marks_by_trace(records))
            self._estimate += added
            self._evict(now_ns)  # in the same transaction: readers never see the store over its bounds
        return added

    def _mark(self, marks: dict[str, Marks]) -> None:
        """Merge what these spans say into their traces' rows (inside the caller's transaction): a pipeline, hint and
        degraded reason already kept stay, triggers add up, partial stays once set, a root's code replaces."""
        for chunk in _chunks(sorted(marks), 500):
            marked = ",".join("?" * len(chunk))
            kept = dict(self.db.execute(f"SELECT trace_id, triggers FROM traces WHERE trace_id IN ({marked})", chunk))
            self.db.executemany(
                """UPDATE traces SET pipeline = coalesce(pipeline, ?), pipeline_hint = coalesce(pipeline_hint, ?),
                       triggers = ?, degraded = coalesce(degraded, ?), partial = max(partial, ?),
                       code = coalesce(?, code)
                   WHERE trace_id = ?""",
                [
                    (
                        m.pipeline,
                        m.pipeline_hint,
                        join_triggers({*split_triggers(kept.get(t)), *m.triggers}),
                        m.degraded,
                        int(m.partial),
                        m.code,
                        t,
                    )
                    for t in chunk
                    for m in (marks[t],)
                ],
            )

    def enforce_bounds(self, now_ns: int | None = None) -> int:
        """Evict traces past the age bound and, over `max_spans`, the oldest traces; returns traces evicted."""
        with self._transaction():
            return self._evict(time.time_ns() if now_ns is None else now_ns)

    def _evict(self, now_ns: int) -> int:
        evicted = 0
        if self.max_age_s > 0:
            cutoff = now_ns - int(self.max_age_s * 1e9)
            old = [t for (t,) in self.db.execute("SELECT trace_id FROM traces WHERE updated_ns < ?", (cutoff,))]
            evicted += self._delete(old)
        others_wrote = self._version() != self._data_version
        if others_wrote or self._estimate > self.max_spans or time.monotonic() - self._counted_at > RECOUNT_S:
            # The estimate counts this connection's inserts; another connection's commit (SQLite's data_version
            # moves) means a recount.
            total = self.span_total()
            self._counted_at = time.monotonic()
            self._data_version = self._version()
            if total > self.max_spans:
                target = total - int(self.max_spans * LOW_WATERMARK)
                victims: list[str] = []
                removed = 0
                oldest = self.db.execute("SELECT trace_id, span_count FROM traces ORDER BY start_ns")
                for trace_id, count in oldest:
                    if removed >= target:
                        break
                    victims.append(trace_id)
                    removed += count
                oldest.close()
                evicted += self._delete(victims)
            self._estimate = self.span_total()
        return evicted

    def _version(self) -> int:
        """SQLite's data_version: it changes when another connection commits to the file."""
        (version,) = self.db.execute("PRAGMA data_version").fetchone()
        return int(version)

    def _delete(self, trace_ids: Sequence[str]) -> int:
        """Delete these traces' spans and rows (inside the caller's transaction)."""
        if not trace_ids:
            return 0
        for chunk in _chunks(list(trace_ids), 500):
            marks = ",".join("?" * len(chunk))
            self.db.execute(f"DELETE FROM spans WHERE trace_id IN ({marks})", chunk)
            self.db.execute(f"DELETE FROM span_links WHERE trace_id IN ({marks})", chunk)
            self.db.execute(f"DELETE FROM traces WHERE trace_id IN ({marks})", chunk)
        self._estimate = self.span_total()
        return len(trace_ids)

    def _transaction(self) -> _Transaction:
        return _Transaction(self.db)

    # -- reading ------------------------------------------------------------------------------------

    def span_total(self) -> int:
        (total,) = self.db.execute("SELECT coalesce(sum(span_count), 0) FROM traces").fetchone()
        return int(total)

    def trace_count(self) -> int:
        (count,) = self.db.execute("SELECT count(*) FROM traces").fetchone()
        return int(count)

    def recent_traces(self, limit: int | None = None, since_ns: int | None = None) -> list[TraceRow]:
        """The most recently started traces first (at most `limit`, started at or after `since_ns`)."""
        return self.search(TraceFilter(since_ns=since_ns, limit=limit))

    def search(self, what: TraceFilter) -> list[TraceRow]:
        """The summary rows `what` keeps: the latest started first, or the slowest (ties: the latest)."""
        where, args = what.where()
        order = "end_ns - start_ns DESC, start_ns DESC" if what.order == "slowest" else "start_ns DESC"
        sql = f"SELECT {ROW_COLUMNS} FROM traces{where} ORDER BY {order}, trace_id"
        if what.limit is not None:
            sql += " LIMIT ?"
            args.append(what.limit)
        return [_trace_row(row) for row in self.db.execute(sql, args)]

    def count(self, what: TraceFilter) -> int:
        """How many traces `what` keeps (its limit aside)."""
        where, args = what.where()
        (count,) = self.db.execute(f"SELECT count(*) FROM traces{where}", args).fetchone()
        return int(count)

    def trace_row(self, trace_id: str) -> TraceRow | None:
        """The summary row of one trace."""
        row = self.db.execute(f"SELECT {ROW_COLUMNS} FROM traces WHERE trace_id = ?", (trace_id,)).fetchone()
        return None if row is None else _trace_row(row)

    def facets(self) -> dict[str, list[str]]:
        """The pipelines, triggers and degraded reasons the kept traces carry (each sorted), for a search form."""
        pipelines = [p for (p,) in self.db.execute("SELECT DISTINCT coalesce(pipeline, pipeline_hint) FROM traces")]
        triggers = {t for (s,) in self.db.execute("SELECT DISTINCT triggers FROM traces") for t in split_triggers(s)}
        degraded = [d for (d,) in self.db.execute("SELECT DISTINCT degraded FROM traces")]
        return {
            "pipelines": sorted(p for p in pipelines if p is not None),
            "triggers": sorted(triggers),
            "degraded": sorted(d for d in degraded if d is not None),
        }

    def find_traces(self, prefix: str) -> list[str]:
        """Trace ids starting with `prefix` (lowercase hex)."""
        prefix = prefix.strip().lower()
        rows = self.db.execute(
            "SELECT trace_id FROM traces WHERE trace_id >= ? AND trace_id < ? ORDER BY trace_id LIMIT 10",
            (prefix, prefix + "\x7f"),
        )
        return [t for (t,) in rows]

    def spans(self, trace_ids: Iterable[str]) -> list[SpanRecord]:
        """Every stored span of these traces."""
        out: list[SpanRecord] = []
        for chunk in _chunks(list(trace_ids), 500):
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(f"SELECT {SPAN_COLUMNS} FROM spans WHERE trace_id IN ({marks})", chunk)
            out.extend(_record(row) for row in rows)
        return out

    def linked_by(self, trace_id: str, span_id: str) -> list[SpanRecord]:
        """The spans, in any trace, that have a link to this span (a batched call, for each member's span)."""
        rows = self.db.execute(
            f"""SELECT DISTINCT {LINKING_COLUMNS} FROM span_links l
                JOIN spans s ON s.trace_id = l.trace_id AND s.span_id = l.span_id
                WHERE l.linked_trace_id = ? AND l.linked_span_id = ? ORDER BY s.start_ns, s.span_id""",
            (trace_id, span_id),
        )
        return [_record(row) for row in rows]

    def linking_spans(self, trace_ids: Iterable[str]) -> list[SpanRecord]:
        """The spans, in any trace (these ones included), that have a link to some span of these traces."""
        out: dict[tuple[str, str], SpanRecord] = {}
        for chunk in _chunks(list(trace_ids), 500):
            marks = ",".join("?" * len(chunk))
            rows = self.db.execute(
                f"""SELECT DISTINCT {LINKING_COLUMNS} FROM span_links l
                    JOIN spans s ON s.trace_id = l.trace_id AND s.span_id = l.span_id
                    WHERE l.linked_trace_id IN ({marks})""",
                chunk,
            )
            for row in rows:
                record = _record(row)
                out[(record.trace_id, record.span_id)] = record
        return sorted(out.values(), key=lambda r: (r.start_ns, r.trace_id, r.span_id))


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error) on an autocommit connection."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)


def _row(s: SpanRecord) -> tuple[str, str, str, str, str, int, int, int, int, str, str, str, str]:
    """A span as the values of SPAN_COLUMNS (attributes, links and events as compact JSON)."""
    return (
        s.trace_id,
        s.span_id,
        s.parent_span_id,
        s.service,
        s.name,
        s.kind,
        s.start_ns,
        s.end_ns,
        s.status,
        _json(s.attributes),
        _json([[ln.trace_id, ln.span_id, ln.attributes] for ln in s.links]),
        _json([[ev.name, ev.time_ns, ev.attributes] for ev in s.events]),
        s.status_message,
    )


def _record(row: tuple[Any, ...]) -> SpanRecord:
    """A span from the values of SPAN_COLUMNS."""
    columns: tuple[str, str, str, str, str, int, int, int, int] = row[:9]
    attributes, links, events, status_message = row[9:]
    return SpanRecord(
        *columns,
        attributes=json.loads(attributes),
        links=tuple(SpanLink(t, s, a) for t, s, a in json.loads(links)),
        events=tuple(SpanEvent(n, t, a) for n, t, a in json.loads(events)),
        status_message=status_message,
    )


def _trace_row(row: tuple[Any, ...]) -> TraceRow:
    """A summary row from the values of ROW_COLUMNS."""
    trace_id, start_ns, end_ns, span_count, errors, pipeline, triggers, degraded, partial, code = row
    return TraceRow(
        trace_id,
        start_ns,
        end_ns,
        span_count,
        errors,
        pipeline,
        split_triggers(triggers),
        degraded,
        bool(partial),
        code,
    )


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
