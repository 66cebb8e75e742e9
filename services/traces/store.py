"""The SQLite trace store: spans and their links by trace, bounded by span count and age (oldest traces evicted
whole), the spans that link to a span found through an index."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.traces.records import STATUS_ERROR, SpanLink, SpanRecord

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
    updated_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_by_start ON traces (start_ns);
CREATE INDEX IF NOT EXISTS traces_by_update ON traces (updated_ns);
"""
SPAN_COLUMNS = "trace_id, span_id, parent_span_id, service, name, kind, start_ns, end_ns, status, attributes, links"
LINKING_COLUMNS = ", ".join(f"s.{c.strip()}" for c in SPAN_COLUMNS.split(","))
DEFAULT_DB = Path(".logs/traces.sqlite")
LOW_WATERMARK = 0.9  # evicting by count goes down to this fraction of max_spans, so it does not run on every write
RECOUNT_S = 1.0  # how often the span count is read back even when this connection's estimate is under the bound


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One trace's summary row: time span of its spans, how many, how many with status ERROR."""

    trace_id: str
    start_ns: int
    end_ns: int
    span_count: int
    errors: int

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


class TraceStore:
    """One connection to the store (use one per thread); creates the file and schema on open, and adds the `links`
    column to a file written before spans kept their links (its spans read back with no links).

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
        self._add_links_column()
        self._estimate = self.span_total()
        self._counted_at = time.monotonic()

    def close(self) -> None:
        self.db.close()

    def _add_links_column(self) -> None:
        """Give a `spans` table from before links its `links` column (once, even with several openers at once; the
        write lock only when it is missing, so that opening a current file never waits for the writer)."""

        def missing() -> bool:
            return "links" not in {row[1] for row in self.db.execute("PRAGMA table_info(spans)")}

        if missing():
            with self._transaction():
                if missing():
                    self.db.execute("ALTER TABLE spans ADD COLUMN links TEXT NOT NULL DEFAULT '[]'")

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
                f"INSERT OR IGNORE INTO spans ({SPAN_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows
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
            self._estimate += added
            self._evict(now_ns)  # in the same transaction: readers never see the store over its bounds
        return added

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
        if self._estimate > self.max_spans or time.monotonic() - self._counted_at > RECOUNT_S:
            # The estimate counts this connection's inserts; other writers' are seen on a recount.
            total = self.span_total()
            self._counted_at = time.monotonic()
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
        sql = "SELECT trace_id, start_ns, end_ns, span_count, errors FROM traces"
        args: list[int] = []
        if since_ns is not None:
            sql += " WHERE start_ns >= ?"
            args.append(since_ns)
        sql += " ORDER BY start_ns DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        return [TraceRow(*row) for row in self.db.execute(sql, args)]

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


def _row(s: SpanRecord) -> tuple[str, str, str, str, str, int, int, int, int, str, str]:
    """A span as the values of SPAN_COLUMNS (attributes and links as compact JSON)."""
    attributes = json.dumps(s.attributes, separators=(",", ":"), default=str)
    links = json.dumps([[ln.trace_id, ln.span_id, ln.attributes] for ln in s.links], separators=(",", ":"), default=str)
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
        attributes,
        links,
    )


def _record(row: tuple[Any, ...]) -> SpanRecord:
    """A span from the values of SPAN_COLUMNS."""
    columns: tuple[str, str, str, str, str, int, int, int, int] = row[:-2]
    links = tuple(SpanLink(t, s, a) for t, s, a in json.loads(row[-1]))
    return SpanRecord(*columns, attributes=json.loads(row[-2]), links=links)


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
