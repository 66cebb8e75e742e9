"""The `meshserve traces hotspots --html` page: one self-contained file (inline CSS and SVG, no external assets)."""

from __future__ import annotations

from html import escape

from services.traces.analysis import Breakdown, Trace, hotspot_line
from services.traces.render import clock, ms, path_text

CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#1d2433;background:#fff}
h1{font-size:1.4em}h2{font-size:1.1em;margin-top:2em}
.hot{font:600 1.2em ui-monospace,Menlo,Consolas,monospace;background:#fff3e0;border-left:4px solid #e65100;
padding:.5em 1em}
table{border-collapse:collapse}td,th{padding:.2em .8em;text-align:right;border-bottom:1px solid #e3e6ee}
td:first-child,th:first-child{text-align:left;font-family:ui-monospace,Menlo,Consolas,monospace}
.path{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
svg text{font:12px ui-monospace,Menlo,Consolas,monospace;fill:#1d2433}
"""
PALETTE = ["#1565c0", "#2e7d32", "#e65100", "#6a1b9a", "#00838f", "#ad1457", "#4e342e", "#546e7a", "#9e9d24"]


def _colours(result: Breakdown) -> dict[str, str]:
    return {stage: PALETTE[i % len(PALETTE)] for i, stage in enumerate(sorted(s.stage for s in result.stages))}


def stage_chart(result: Breakdown, width: int = 900) -> str:
    """Horizontal bars: each stage's share of the p99-slowest traces' end-to-end time."""
    colours = _colours(result)
    label_w, row_h = 260, 22
    bar_w = width - label_w - 70
    top = max((s.p99_share for s in result.stages), default=0.0) or 1.0
    rows = []
    for i, s in enumerate(result.stages):
        y = i * row_h
        w = max(1.0, bar_w * s.p99_share / top)
        rows.append(
            f'<text x="0" y="{y + 15}">{escape(s.stage)}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{colours[s.stage]}">'
            f"<title>{escape(s.stage)}: {s.p99_share:.1%} of p99, self p99 {ms(s.self_p99_ns)} ms</title></rect>"
            f'<text x="{label_w + w + 6:.1f}" y="{y + 15}">{s.p99_share:.0%}</text>'
        )
    height = max(row_h, row_h * len(result.stages))
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">{"".join(rows)}</svg>'


def waterfall_svg(trace: Trace, colours: dict[str, str], width: int = 900) -> str:
    """The trace's spans as indented rows with bars on a shared time axis."""
    label_w, row_h = 330, 20
    bar_w = width - label_w - 90
    lo, span = trace.start_ns, max(1, trace.duration_ns)
    rows = []
    for i, (node, depth) in enumerate(trace.walk()):
        s = node.span
        y = i * row_h
        x = label_w + bar_w * (s.start_ns - lo) / span
        w = max(1.0, bar_w * s.duration_ns / span)
        colour = "#c62828" if s.status == 2 else colours.get(node.stage, "#78909c")
        label = escape(("  " * depth) + node.stage)
        rows.append(
            f'<text x="0" y="{y + 14}" xml:space="preserve">{label}</text>'
            f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{colour}">'
            f"<title>{escape(s.name)} ({escape(s.service)}): total {ms(s.duration_ns)} ms, "
            f"self {ms(node.self_ns)} ms</title></rect>"
            f'<text x="{x + w + 4:.1f}" y="{y + 14}">{ms(s.duration_ns)}</text>'
        )
    height = row_h * max(1, len(trace.nodes))
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">{"".join(rows)}</svg>'


def report(result: Breakdown, title: str = "meshserve traces: hotspots") -> str:
    """The whole page: hotspot line, stage chart and table, critical paths, waterfall of the slowest trace."""
    colours = _colours(result)
    rows = "".join(
        f"<tr><td>{escape(s.stage)}</td><td>{s.traces}</td><td>{ms(s.self_p50_ns)}</td><td>{ms(s.self_p99_ns)}</td>"
        f"<td>{s.share:.0%}</td><td>{s.p99_share:.0%}</td></tr>"
        for s in result.stages
    )
    paths = "".join(
        f'<li class="path">{escape(t.trace_id)} ({ms(t.duration_ns)} ms): {escape(path_text(steps))}</li>'
        for t, steps in result.slowest
    )
    slowest = ""
    if result.slowest:
        trace = result.slowest[0][0]
        slowest = (
            f"<h2>Slowest trace {escape(trace.trace_id)}: {ms(trace.duration_ns)} ms, started "
            f"{escape(clock(trace.start_ns))}</h2>{waterfall_svg(trace, colours)}"
        )
    summary = (
        f"{len(result.traces)} traces; end-to-end p50 {ms(result.e2e_p50_ns)} ms, p99 {ms(result.e2e_p99_ns)} ms; "
        f"{len(result.p99_traces)} at or above p99"
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title><style>{CSS}</style></head>
<body><h1>{escape(title)}</h1>
<p>{escape(summary)}</p>
<p class="hot">{escape(hotspot_line(result))}</p>
<h2>Share of the p99-slowest traces' end-to-end time, by stage (self time)</h2>
{stage_chart(result)}
<h2>Stages</h2>
<table><tr><th>stage</th><th>traces</th><th>self p50 ms</th><th>self p99 ms</th><th>share</th>
<th>share of p99</th></tr>{rows}</table>
<h2>Critical paths of the slowest traces</h2><ul>{paths}</ul>
{slowest}
</body></html>
"""
