"""Rich renderables for `meshserve traces`: the trace list, a span waterfall and its links, the stage table, critical
paths."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.table import Table
from rich.text import Text

from services.traces.analysis import Breakdown, Node, PathStep, Trace, is_batch, members
from services.traces.marks import code_name
from services.traces.records import (
    BATCH_INDEX,
    KIND_CLIENT,
    KIND_NAMES,
    KIND_SERVER,
    STATUS_ERROR,
    SpanLink,
    SpanRecord,
)
from services.traces.store import TraceRow

BAR_WIDTH = 40
LINKS_SHOWN = 4  # members named on a batched call's line; the rest are counted
LINKED = " ↔"  # after the name of a span that has links or is linked to: its line is under the waterfall


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds with two decimals."""
    return f"{ns / 1e6:.2f}"


def clock(ns: int) -> str:
    """A Unix-nanosecond time as local `YYYY-MM-DD HH:MM:SS.mmm`."""
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def trace_list(rows: Sequence[tuple[TraceRow, Trace | None]]) -> Table:
    """Traces: start, id, pipeline, root stage and span name, duration, span count, status and marks (the gRPC code
    when not OK, degraded, partial or incomplete), the triggers it was kept for."""
    table = Table(title="traces", title_justify="left")
    table.add_column("start")
    table.add_column("trace id", no_wrap=True)
    table.add_column("pipeline")
    table.add_column("root")
    table.add_column("ms", justify="right")
    table.add_column("spans", justify="right")
    table.add_column("status")
    table.add_column("kept for")
    for row, trace in rows:
        root = f"{trace.root.stage} ({trace.root.span.name})" if trace is not None else "?"
        status = Text("ERROR", style="red") if row.error else Text("OK", style="green")
        if row.code:
            status.append(f" {code_name(row.code)}", style="red")
        if row.degraded:
            status.append(f" degraded:{row.degraded}", style="yellow")
        if row.partial:
            status.append(" partial", style="yellow")
        elif trace is not None and not trace.complete:
            status.append(" incomplete", style="yellow")
        table.add_row(
            clock(row.start_ns),
            row.trace_id,
            row.pipeline or "",
            root,
            ms(row.duration_ns),
            str(row.span_count),
            status,
            ",".join(row.triggers),
        )
    return table


def bar(start_ns: int, end_ns: int, lo: int, hi: int, width: int = BAR_WIDTH, style: str = "cyan") -> Text:
    """A bar at the span's place in [lo, hi], `width` characters wide (at least one block)."""
    scale = width / max(1, hi - lo)
    a = min(width - 1, max(0, int((start_ns - lo) * scale)))
    b = min(width, max(a + 1, round((end_ns - lo) * scale)))
    text = Text(" " * a)
    text.append("█" * (b - a), style=style)
    text.append(" " * (width - b))
    return text


def waterfall(trace: Trace, total_width: int = 160, linking: Sequence[SpanRecord] = ()) -> Table:
    """The span tree, indented (server/client kind noted), with stage, service, offset, total and self time, and a
    bar scaled to the trace, laid out to fit `total_width` columns (the span names give way first). Spans with
    links, or linked to by one of `linking` (the spans that link to this trace's spans), are marked `↔`."""
    linked = {(link.trace_id, link.span_id) for s in linking for link in s.links}
    lo, hi = trace.start_ns, trace.end_ns
    title = f"trace {trace.trace_id}  {ms(trace.duration_ns)} ms  {len(trace.nodes)} spans"
    if not trace.complete:
        title += "  (incomplete: parent spans missing)"
    rows = list(trace.walk())
    stage_w = min(32, max(5, *(len(n.stage) for n, _ in rows)))
    service_w = min(20, max(7, *(len(n.span.service) for n, _ in rows)))
    numbers_w = max(5, *(len(ms(n.span.end_ns - lo)) for n, _ in rows))
    bar_w = max(8, min(BAR_WIDTH, total_width - 120))
    fixed = stage_w + service_w + 3 * max(numbers_w, 8) + bar_w + 3 * 7 + 1
    span_w = max(16, min(64, total_width - fixed))
    table = Table(title=title, title_justify="left")
    table.add_column("span", no_wrap=True, width=span_w)
    table.add_column("stage", no_wrap=True, width=stage_w)
    table.add_column("service", no_wrap=True, width=service_w)
    for header in ("+ms", "total ms", "self ms"):
        table.add_column(header, justify="right", no_wrap=True, width=max(numbers_w, len(header)))
    table.add_column("", no_wrap=True, width=bar_w)
    for node, depth in rows:
        span = node.span
        error = span.status == STATUS_ERROR
        name = Text("  " * depth + ("└ " if depth else "") + span.name, style="red" if error else "")
        if span.kind in (KIND_SERVER, KIND_CLIENT):
            name.append(f" ({KIND_NAMES[span.kind]})", style="dim")
        if span.links or (span.trace_id, span.span_id) in linked:
            name.append(LINKED, style="bold")
        name.truncate(span_w, overflow="ellipsis")
        table.add_row(
            name,
            _fit(node.stage, stage_w),
            _fit(span.service, service_w),
            ms(span.start_ns - lo),
            ms(span.duration_ns),
            ms(node.self_ns),
            bar(span.start_ns, span.end_ns, lo, hi, bar_w, "red" if error else "cyan"),
        )
    return table


def _link_ref(link: SpanLink | SpanRecord) -> str:
    return f"{link.trace_id}/{link.span_id}"


def _links_text(span: SpanRecord) -> str:
    """`links: 8 members: <trace>/<span>, ... and 4 more` (batch order), or `links: 2 spans: ...` for other links."""
    links = sorted(span.links, key=_batch_index)
    total = members(span) if is_batch(span) else len(links)
    shown = ", ".join(_link_ref(ln) for ln in links[:LINKS_SHOWN])
    more = total - min(len(links), LINKS_SHOWN)
    what = "member" if is_batch(span) else "span"
    return f"links: {total} {what}{'' if total == 1 else 's'}: {shown}" + (f" and {more} more" if more > 0 else "")


def _batch_index(link: SpanLink) -> int:
    """The member's place in the batch (links without one last, in their order)."""
    index = link.attributes.get(BATCH_INDEX)
    return index if isinstance(index, int) else 1 << 62


def _linked_text(by: SpanRecord) -> str:
    """`batched with 7 others in <trace>/<span> (model.batch)`, or `linked from <trace>/<span> (<name>)`."""
    if not is_batch(by):
        return f"linked from {_link_ref(by)} ({by.name})"
    others = max(0, members(by) - 1)
    return f"batched with {others} other{'' if others == 1 else 's'} in {_link_ref(by)} ({by.name})"


def link_lines(trace: Trace, linking: Sequence[SpanRecord] = ()) -> list[Text]:
    """One line per span of the trace (in waterfall order) that has links or that one of `linking` links to: its
    members for a batched call, the batched call it was part of for a member."""
    by_target: dict[tuple[str, str], list[SpanRecord]] = {}
    for s in sorted(linking, key=lambda r: (r.start_ns, r.trace_id, r.span_id)):
        for target in dict.fromkeys((link.trace_id, link.span_id) for link in s.links):
            by_target.setdefault(target, []).append(s)
    lines: list[Text] = []
    for node, depth in trace.walk():
        notes = ([_links_text(node.span)] if node.span.links else []) + [
            _linked_text(by) for by in by_target.get((node.span.trace_id, node.span.span_id), [])
        ]
        for note in notes:
            lines.append(_span_label(node, depth).append(note))
    return lines


def _span_label(node: Node, depth: int) -> Text:
    label = Text("  " * depth + node.span.name, style="bold")
    label.append(f" {node.span.span_id}: ", style="dim")
    return label


def _fit(text: str, width: int) -> Text:
    t = Text(text)
    t.truncate(width, overflow="ellipsis")
    return t


def stage_table(result: Breakdown) -> Table:
    """Per stage: traces it occurs in, self p50/p99, share of end-to-end time, share of the p99-slowest traces."""
    title = (
        f"{len(result.traces)} traces, end-to-end p50 {ms(result.e2e_p50_ns)} ms, p99 {ms(result.e2e_p99_ns)} ms "
        f"({len(result.p99_traces)} at or above p99)"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("stage")
    table.add_column("traces", justify="right")
    table.add_column("self p50 ms", justify="right")
    table.add_column("self p99 ms", justify="right")
    table.add_column("share", justify="right")
    table.add_column("share of p99", justify="right")
    for s in result.stages:
        table.add_row(
            s.stage, str(s.traces), ms(s.self_p50_ns), ms(s.self_p99_ns), f"{s.share:.0%}", f"{s.p99_share:.0%}"
        )
    return table


def path_text(steps: Sequence[PathStep]) -> str:
    """`stage 0.20 ms → stage 1.10 ms → ...` for the spans that were critical for some time."""
    shown = [s for s in steps if s.critical_ns > 0 or s.depth == 0]
    return " → ".join(f"{s.stage} {ms(s.critical_ns)} ms" for s in shown)


def critical_paths(result: Breakdown) -> list[Text]:
    """One line per slow trace: its id, duration and critical path."""
    lines = []
    for trace, steps in result.slowest:
        line = Text(f"{trace.trace_id} {ms(trace.duration_ns)} ms: ", style="bold")
        line.append(path_text(steps), style="")
        lines.append(line)
    return lines
