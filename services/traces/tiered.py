"""Several trace stores read as one (a two-tier stack's edge and cloud stores): a trace's spans from all of them, each
labelled with the tier of the store it came from (`records.TIER`), its summary rows merged.

The first store is the home tier's (where requests enter): stages of the other tiers' spans are prefixed with their
tier and the hops between tiers are the stage `wan` (`services.traces.analysis`). A search keeps a trace when any
store's row of it matches; its row then merges every store's: earliest start, latest end, spans and errors added,
the first store's marks first (the root's code, the pipeline), triggers from all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from services.traces.records import TIER, SpanRecord
from services.traces.store import TraceFilter, TraceRow, TraceStore


def labelled(spans: Iterable[SpanRecord], tier: str) -> list[SpanRecord]:
    """The spans, each with the attribute `records.TIER` set to `tier`."""
    return [replace(s, attributes={**s.attributes, TIER: tier}) for s in spans]


def merge_rows(rows: Sequence[TraceRow]) -> TraceRow:
    """One trace's summary rows from several stores as one (the first store's marks first)."""
    first = rows[0]
    return TraceRow(
        first.trace_id,
        min(r.start_ns for r in rows),
        max(r.end_ns for r in rows),
        sum(r.span_count for r in rows),
        sum(r.errors for r in rows),
        next((r.pipeline for r in rows if r.pipeline is not None), None),
        tuple(dict.fromkeys(t for r in rows for t in r.triggers)),
        next((r.degraded for r in rows if r.degraded is not None), None),
        any(r.partial for r in rows),
        next((r.code for r in rows if r.code is not None), None),
    )


def _order(rows: list[TraceRow], what: TraceFilter) -> list[TraceRow]:
    """The rows in the order a store's search gives (latest first, or slowest), cut at the filter's limit."""
    if what.order == "slowest":
        rows.sort(key=lambda r: (-r.duration_ns, -r.start_ns, r.trace_id))
    else:
        rows.sort(key=lambda r: (-r.start_ns, r.trace_id))
    return rows if what.limit is None else rows[: what.limit]


class TieredStores:
    """The stores of several tiers, (tier, file) pairs, the home tier first; read like one `TraceStore` by
    `services.traces.query` and `meshserve traces` (the reading methods they use)."""

    def __init__(self, stores: Sequence[tuple[str, Path]]) -> None:
        if not stores:
            raise ValueError("no trace stores")
        self.home = stores[0][0]
        self.stores: list[tuple[str, TraceStore]] = []
        try:
            for tier, path in stores:
                self.stores.append((tier, TraceStore(path)))
        except BaseException:
            self.close()
            raise

    @property
    def tiers(self) -> list[str]:
        return [tier for tier, _ in self.stores]

    def close(self) -> None:
        for _, store in self.stores:
            store.close()

    def __enter__(self) -> TieredStores:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _rows(self, trace_ids: Iterable[str]) -> dict[str, TraceRow]:
        found: dict[str, list[TraceRow]] = {}
        for trace_id in dict.fromkeys(trace_ids):
            for _, store in self.stores:
                row = store.trace_row(trace_id)
                if row is not None:
                    found.setdefault(trace_id, []).append(row)
        return {trace_id: merge_rows(rows) for trace_id, rows in found.items()}

    def search(self, what: TraceFilter) -> list[TraceRow]:
        """The merged rows of the traces some store's search keeps, in the filter's order and limit."""
        ids = [r.trace_id for _, store in self.stores for r in store.search(what)]
        return _order(list(self._rows(ids).values()), what)

    def count(self, what: TraceFilter) -> int:
        """How many traces some store's search keeps (the limit aside)."""
        unlimited = replace(what, limit=None)
        return len({r.trace_id for _, store in self.stores for r in store.search(unlimited)})

    def trace_count(self) -> int:
        return self.count(TraceFilter())

    def trace_row(self, trace_id: str) -> TraceRow | None:
        return self._rows([trace_id]).get(trace_id)

    def find_traces(self, prefix: str) -> list[str]:
        """Trace ids starting with `prefix` in any store (at most 10)."""
        return sorted({t for _, store in self.stores for t in store.find_traces(prefix)})[:10]

    def facets(self) -> dict[str, list[str]]:
        merged: dict[str, set[str]] = {}
        for _, store in self.stores:
            for key, values in store.facets().items():
                merged.setdefault(key, set()).update(values)
        return {key: sorted(values) for key, values in merged.items()}

    def spans(self, trace_ids: Iterable[str]) -> list[SpanRecord]:
        """Every stored span of these traces in every store, labelled with its tier."""
        wanted = list(trace_ids)
        return [s for tier, store in self.stores for s in labelled(store.spans(wanted), tier)]

    def linked_by(self, trace_id: str, span_id: str) -> list[SpanRecord]:
        out = [s for tier, store in self.stores for s in labelled(store.linked_by(trace_id, span_id), tier)]
        return sorted(out, key=lambda r: (r.start_ns, r.span_id))

    def linking_spans(self, trace_ids: Iterable[str]) -> list[SpanRecord]:
        wanted = list(trace_ids)
        out = [s for tier, store in self.stores for s in labelled(store.linking_spans(wanted), tier)]
        return sorted(out, key=lambda r: (r.start_ns, r.trace_id, r.span_id))


Stores = TraceStore | TieredStores  # what the queries read: one store, or several as one


def home_tier(store: Stores) -> str | None:
    """The home tier of what is read (None for a single store: no tiers)."""
    return store.home if isinstance(store, TieredStores) else None
