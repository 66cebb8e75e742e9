"""The trace UI's JSON API: request parameters into a store search, the shared queries' answers (`services.traces.
query`) into JSON-ready dicts. Times are milliseconds: since the Unix epoch for starts (`*_at_ms`), else from the
trace's start (`start_ms`) or lengths (`duration_ms`, `self_ms`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from services.traces import query
from services.traces.analysis import Breakdown, Comparison, Node, PathStep, Trace, breakdown, compare, is_batch, members
from services.traces.marks import TRIGGERS, code_name
from services.traces.records import BATCH_INDEX, KIND_NAMES, STATUS_ERROR, SpanRecord
from services.traces.store import TraceFilter, TraceRow
from services.traces.tiered import Stores

MAX_LIMIT = 1000  # most summaries one search answers
DEFAULT_LIMIT = 50
ANALYSED = 500  # traces the hotspot view reads when the search sets no limit
MS = 1e6
YES, NO = {"yes", "true", "1"}, {"no", "false", "0"}


class BadRequest(ValueError):
    """A parameter the API does not accept (answered 400 with this message)."""


def _float(params: Mapping[str, str], name: str) -> float | None:
    text = params.get(name, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise BadRequest(f"{name}: {text!r} is not a number") from None
    if not 0 <= value < 1e15:
        raise BadRequest(f"{name}: {text!r} is out of range")
    return value


def _bool(params: Mapping[str, str], name: str) -> bool | None:
    text = params.get(name, "").strip().lower()
    if text in ("", "any"):
        return None
    if text in YES or text in NO:
        return text in YES
    raise BadRequest(f"{name}: {text!r} is not yes, no or any")


def _text(params: Mapping[str, str], name: str) -> str | None:
    text = params.get(name, "").strip()
    return text if text and text != "any" else None


def parse_filter(params: Mapping[str, str], now_ns: int | None = None, default_limit: int | None = None) -> TraceFilter:
    """A store search from query parameters: pipeline, status (ok / error), degraded, partial (yes / no), trigger,
    min_ms, max_ms, since (a window like 15m, back from now), from / to (Unix milliseconds), order (recent /
    slowest), limit (1..MAX_LIMIT); unknown parameters are ignored, bad values raise BadRequest."""
    status = (params.get("status") or "").strip().lower()
    if status not in ("", "any", "ok", "error"):
        raise BadRequest(f"status: {status!r} is not ok, error or any")
    order = (params.get("order") or "recent").strip().lower()
    if order not in ("recent", "slowest"):
        raise BadRequest(f"order: {order!r} is not recent or slowest")
    since_ns = None
    if since := _text(params, "since"):
        try:
            window = query.seconds(since)
        except ValueError as exc:
            raise BadRequest(f"since: {exc}") from None
        since_ns = (time.time_ns() if now_ns is None else now_ns) - int(window * 1e9)
    start, end = _float(params, "from"), _float(params, "to")
    if start is not None:
        since_ns = max(since_ns or 0, int(start * MS))
    limit = _float(params, "limit")
    if limit is not None and not (1 <= limit <= MAX_LIMIT and limit == int(limit)):
        raise BadRequest(f"limit: must be a whole number from 1 to {MAX_LIMIT}")
    min_ms, max_ms = _float(params, "min_ms"), _float(params, "max_ms")
    return TraceFilter(
        pipeline=_text(params, "pipeline"),
        error=None if status in ("", "any") else status == "error",
        degraded=_bool(params, "degraded"),
        trigger=_text(params, "trigger"),
        partial=_bool(params, "partial"),
        min_duration_ns=None if min_ms is None else int(min_ms * MS),
        max_duration_ns=None if max_ms is None else int(max_ms * MS),
        since_ns=since_ns,
        until_ns=None if end is None else int(end * MS),
        order=order,
        limit=int(limit) if limit is not None else default_limit,
    )


def _ms(ns: float) -> float:
    return round(ns / MS, 4)


def _root(trace: Trace | None) -> dict[str, Any] | None:
    if trace is None:
        return None
    root = trace.root.span
    return {"stage": trace.root.stage, "name": root.name, "service": root.service}


def _row(row: TraceRow, trace: Trace | None) -> dict[str, Any]:
    return {
        "trace_id": row.trace_id,
        "start_at_ms": _ms(row.start_ns),
        "duration_ms": _ms(row.duration_ns),
        "span_count": row.span_count,
        "errors": row.errors,
        "error": row.error,
        "code": row.code,
        "code_name": code_name(row.code),
        "pipeline": row.pipeline,
        "triggers": list(row.triggers),
        "degraded": row.degraded,
        "partial": row.partial,
        "complete": trace.complete if trace is not None else False,
        "root": _root(trace),
    }


def traces(store: Stores, params: Mapping[str, str]) -> dict[str, Any]:
    """`GET /api/traces`: the search's summaries and how many traces it matches in all."""
    what = parse_filter(params, default_limit=DEFAULT_LIMIT)
    found = query.search(store, what)
    return {"total": store.count(what), "traces": [_row(s.row, s.trace) for s in found]}


def facets(store: Stores) -> dict[str, Any]:
    """`GET /api/facets`: the values the search form offers (known triggers always, with those seen)."""
    seen = store.facets()
    return {**seen, "triggers": sorted({*TRIGGERS, *seen["triggers"]}), "traces": store.trace_count()}


def _link_target(trace_id: str, span_id: str, attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {"trace_id": trace_id, "span_id": span_id, "attributes": dict(attributes)}


def _linked_by(span: SpanRecord) -> dict[str, Any]:
    return {
        "trace_id": span.trace_id,
        "span_id": span.span_id,
        "name": span.name,
        "service": span.service,
        "batch": is_batch(span),
        "members": members(span) if is_batch(span) else len(span.links),
    }


def _span(node: Node, depth: int, lo: int, critical: dict[str, int], linking: list[SpanRecord]) -> dict[str, Any]:
    s = node.span
    links = sorted(s.links, key=lambda ln: ln.attributes.get(BATCH_INDEX, 1 << 62) if is_batch(s) else 0)
    return {
        "span_id": s.span_id,
        "parent_span_id": s.parent_span_id,
        "depth": depth,
        "name": s.name,
        "service": s.service,
        "stage": node.stage,
        "kind": KIND_NAMES.get(s.kind, str(s.kind)),
        "start_ms": _ms(s.start_ns - lo),
        "duration_ms": _ms(s.duration_ns),
        "self_ms": _ms(node.self_ns),
        "shared_ms": {stage: _ms(ns) for stage, ns in sorted(node.shared.items())},
        "critical_ms": _ms(critical[s.span_id]) if s.span_id in critical else None,
        "error": s.status == STATUS_ERROR,
        "status_message": s.status_message,
        "orphan": node.orphan,
        "attributes": s.attributes,
        "events": [{"name": e.name, "at_ms": _ms(e.time_ns - lo), "attributes": e.attributes} for e in s.events],
        "batch": is_batch(s),
        "members": members(s) if is_batch(s) else None,
        "links": [_link_target(ln.trace_id, ln.span_id, ln.attributes) for ln in links],
        "linked_by": [_linked_by(by) for by in linking],
    }


def _path(steps: list[PathStep]) -> list[dict[str, Any]]:
    return [
        {"stage": p.stage, "span_id": p.span_id, "depth": p.depth, "critical_ms": _ms(p.critical_ns)}
        for p in steps
        if p.critical_ns > 0 or p.depth == 0
    ]


def trace(store: Stores, trace_id: str) -> dict[str, Any] | None:
    """`GET /api/traces/<id>`: the waterfall (spans depth first, with attributes, events, links both ways), self
    time by stage (largest first; member spans' shares of batched calls under those calls' stages) and the critical
    path; None when the trace is not in the store."""
    found = query.detail(store, trace_id)
    if found is None:
        return None
    t, lo = found.trace, found.trace.start_ns
    critical = {p.span_id: p.critical_ns for p in found.path}
    by_target: dict[str, list[SpanRecord]] = {}
    for by in found.linking:
        for ln in by.links:
            if ln.trace_id == t.trace_id:
                by_target.setdefault(ln.span_id, []).append(by)
    spans = [_span(node, depth, lo, critical, by_target.get(node.span.span_id, [])) for node, depth in t.walk()]
    stages = sorted(t.stage_self_ns().items(), key=lambda kv: (-kv[1], kv[0]))
    largest = max(t.nodes, key=lambda n: (n.self_ns, -n.span.start_ns))
    return {
        **_row(found.row, t),
        "largest_self_span": largest.span.span_id,
        "remote_missing": t.remote_missing,
        "stages": [{"stage": stage, "self_ms": _ms(ns)} for stage, ns in stages],
        "critical_path": _path(found.path),
        "spans": spans,
    }


def hotspots_json(result: Breakdown) -> dict[str, Any]:
    """A breakdown: stage self-time shares (overall, of the p99-slowest), the hotspot, the slowest critical paths."""
    top = result.hotspot
    return {
        "traces": len(result.traces),
        "e2e_p50_ms": _ms(result.e2e_p50_ns),
        "e2e_p99_ms": _ms(result.e2e_p99_ns),
        "p99_traces": len(result.p99_traces),
        "remote_missing": result.remote_missing,
        "hotspot": None if top is None else {"stage": top.stage, "p99_share": top.p99_share},
        "stages": [
            {
                "stage": s.stage,
                "traces": s.traces,
                "self_p50_ms": _ms(s.self_p50_ns),
                "self_p99_ms": _ms(s.self_p99_ns),
                "share": s.share,
                "p99_share": s.p99_share,
            }
            for s in result.stages
        ],
        "slowest": [
            {"trace_id": t.trace_id, "duration_ms": _ms(t.duration_ns), "path": _path(steps)}
            for t, steps in result.slowest
        ],
    }


def comparison_json(result: Comparison) -> dict[str, Any]:
    """Slow against typical traces, by stage (mean self time per trace in each group, the largest difference
    first)."""
    return {
        "slow": {"traces": len(result.slow), "from_ms": _ms(result.slow_from_ns), "mean_ms": _ms(result.slow_mean_ns)},
        "typical": {
            "traces": len(result.typical),
            "from_ms": _ms(result.typical_range_ns[0]),
            "to_ms": _ms(result.typical_range_ns[1]),
            "mean_ms": _ms(result.typical_mean_ns),
        },
        "stages": [
            {
                "stage": c.stage,
                "slow_ms": _ms(c.slow_ns),
                "typical_ms": _ms(c.typical_ns),
                "delta_ms": _ms(c.delta_ns),
            }
            for c in result.stages
        ],
    }


def _whole(params: Mapping[str, str], name: str, default: int, most: int) -> int:
    value = _float(params, name)
    if value is None:
        return default
    if not (0 <= value <= most and value == int(value)):
        raise BadRequest(f"{name}: must be a whole number from 0 to {most}")
    return int(value)


def analysis(store: Stores, params: Mapping[str, str]) -> dict[str, Any]:
    """`GET /api/hotspots`: over the search's traces (by default its 500 most recent matches; `limit` up to
    query.MAX_ANALYSED), the breakdown with the `slowest` critical paths (default 5) and the slow-against-typical
    comparison (slow from the `slow_q` percentile, default 90)."""
    what = parse_filter({k: v for k, v in params.items() if k != "limit"}, default_limit=ANALYSED)
    limit = _float(params, "limit")
    if limit is not None:
        if not (1 <= limit <= query.MAX_ANALYSED and limit == int(limit)):
            raise BadRequest(f"limit: must be a whole number from 1 to {query.MAX_ANALYSED}")
        what = replace(what, limit=int(limit))
    slow_q = _float(params, "slow_q")
    if slow_q is not None and not 50 <= slow_q <= 99.9:
        raise BadRequest("slow_q: must be from 50 to 99.9")
    slowest = _whole(params, "slowest", 5, 50)
    traces_ = query.analysed(store, what)
    return {
        **hotspots_json(breakdown(traces_, slowest)),
        "comparison": comparison_json(compare(traces_, 90.0 if slow_q is None else slow_q)),
    }
