"""Rich renderables for `meshserve traces`: the trace list, a span waterfall, the stage table, critical paths."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from rich.table import Table
from rich.text import Text

from services.traces.analysis import Breakdown, PathStep, Trace
from services.traces.records import KIND_CLIENT, KIND_NAMES, KIND_SERVER, STATUS_ERROR
from services.traces.store import TraceRow

BAR_WIDTH = 40


def ms(ns: float) -> str:
    """Nanoseconds as milliseconds with two decimals."""
    return f"{ns / 1e6:.2f}"


def clock(ns: int) -> str:
    """A Unix-nanosecond time as local `YYYY-MM-DD HH:MM:SS.mmm`."""
    return datetime.fromtimestamp(ns / 1e9).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def trace_list(rows: Sequence[tuple[TraceRow, Trace | None]]) -> Table:
    """Recent traces: start, id, root stage and span name, duration, span count, status."""
    table = Table(title="recent traces", title_justify="left")
    table.add_column("start")
    table.add_column("trace id", no_wrap=True)
    table.add_column("root")
    table.add_column("ms", justify="right")
    table.add_column("spans", justify="right")
    table.add_column("status")
    for row, trace in rows:
        root = f"{trace.root.stage} ({trace.root.span.name})" if trace is not None else "?"
        status = Text("ERROR", style="red") if row.errors else Text("OK", style="green")
        if trace is not None and not trace.complete:
            status.append(" partial", style="yellow")
        table.add_row(clock(row.start_ns), row.trace_id, root, ms(row.duration_ns), str(row.span_count), status)
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


def waterfall(trace: Trace, total_width: int = 160) -> Table:
    """The span tree, indented (server/client kind noted), with stage, service, offset, total and self time, and a
    bar scaled to the trace, laid out to fit `total_width` columns (the span names give way first)."""
    lo, hi = trace.start_ns, trace.end_ns
    title = f"trace {trace.trace_id}  {ms(trace.duration_ns)} ms  {len(trace.nodes)} spans"
    if not trace.complete:
        title += "  (partial: parent spans missing)"
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
