"""The trace store's queries, shared by the JSON API (`services.traces.web_api`) and `meshserve traces` (one source of
truth): a search of the trace summaries, one trace with the spans that link to it, and the hotspot and
slow-against-typical analyses over a search's traces; over one store, or several tiers' as one
(`services.traces.tiered`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from services.traces.analysis import Breakdown, Comparison, PathStep, Trace, assemble, breakdown, compare, critical_path
from services.traces.records import SpanRecord
from services.traces.store import TraceFilter, TraceRow
from services.traces.tiered import Stores, home_tier

UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
ANALYSED = 100  # traces a hotspot or comparison reads when the search sets no limit
MAX_ANALYSED = 5000  # most traces one analysis assembles (each is all its spans in memory)


def seconds(text: str) -> float:
    """`5m`, `30s`, `1.5h`, `250ms`, `2d` (a bare number is seconds) as seconds; ValueError otherwise."""
    match = DURATION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 1h")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


@dataclass(frozen=True)
class TraceSummary:
    """A search result: the trace's summary row and the trace assembled (None when its spans went meanwhile)."""

    row: TraceRow
    trace: Trace | None


@dataclass(frozen=True)
class TraceDetail:
    """One trace for a waterfall: its row, the trace (with batched calls of other traces attributed to its member
    spans), the spans anywhere that link to its spans, and its critical path."""

    row: TraceRow
    trace: Trace
    linking: list[SpanRecord]
    path: list[PathStep]


def with_batches(store: Stores, trace_ids: set[str]) -> dict[str, Trace]:
    """These traces assembled together with the traces of the batched calls that link to their spans, so that their
    member spans get their share of those calls (`analysis.attribute_batches`)."""
    batch_traces = {s.trace_id for s in store.linking_spans(trace_ids)} - trace_ids
    traces = assemble(store.spans(trace_ids) + store.spans(batch_traces), home_tier(store))
    return {t.trace_id: t for t in traces if t.trace_id in trace_ids}


def search(store: Stores, what: TraceFilter) -> list[TraceSummary]:
    """The summaries `what` keeps, in its order, each with its trace assembled."""
    rows = store.search(what)
    traces = {t.trace_id: t for t in assemble(store.spans(r.trace_id for r in rows), home_tier(store))}
    return [TraceSummary(row, traces.get(row.trace_id)) for row in rows]


def find(store: Stores, prefix: str) -> list[str]:
    """Trace ids starting with `prefix` (any case; at most 10)."""
    return store.find_traces(prefix)


def detail(store: Stores, trace_id: str) -> TraceDetail | None:
    """One trace by its full id; None when it is not (or no longer) in the store."""
    trace_id = trace_id.strip().lower()
    row = store.trace_row(trace_id)
    trace = with_batches(store, {trace_id}).get(trace_id) if row is not None else None
    if row is None or trace is None:
        return None
    return TraceDetail(row, trace, store.linking_spans([trace_id]), critical_path(trace))


def analysed(store: Stores, what: TraceFilter) -> list[Trace]:
    """The traces an analysis reads: what `what` keeps (at most its limit, else ANALYSED, never past MAX_ANALYSED),
    assembled with the batched calls linking to them, oldest first."""
    limit = min(MAX_ANALYSED, what.limit if what.limit is not None else ANALYSED)
    wanted = {r.trace_id for r in store.search(replace(what, limit=limit))}
    return sorted(with_batches(store, wanted).values(), key=lambda t: (t.start_ns, t.trace_id))


def hotspots(store: Stores, what: TraceFilter, slowest: int = 3) -> Breakdown:
    """Stage self-time shares (overall and over the p99-slowest) of the search's traces, and the critical paths of
    the `slowest` of them."""
    return breakdown(analysed(store, what), slowest)


def comparison(store: Stores, what: TraceFilter, slow_q: float = 90.0) -> Comparison:
    """The search's slow traces (at or above its `slow_q` percentile) against its typical ones, by stage."""
    return compare(analysed(store, what), slow_q)
