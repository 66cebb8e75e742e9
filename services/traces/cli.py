"""`meshserve traces`: the typer sub-app (list, show, hotspots) over the local trace store; importing it is inert."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from services.traces.analysis import Trace, assemble, breakdown, hotspot_line, select
from services.traces.store import DEFAULT_DB, TraceStore

app = typer.Typer(
    name="traces",
    help="Recent traces from the local trace store (python -m services.traces): list, waterfall, hotspots.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Db = Annotated[Path, typer.Option("--db", help="The trace store's SQLite file.")]
UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")


def parse_duration(text: str) -> float:
    """`5m`, `30s`, `1.5h`, `250ms`, `2d` (a bare number is seconds) as seconds."""
    match = DURATION.match(text)
    if match is None:
        raise typer.BadParameter(f"{text!r} is not a duration like 30s, 5m, 1h")
    return float(match.group(1)) * UNITS[match.group(2) or "s"]


def _console() -> Console:
    # Piped or captured output gets wide tables instead of 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=200)


def _open(db: Path) -> TraceStore:
    if not db.exists():
        Console(stderr=True).print(
            f"no trace store at {db} (run `python -m services.traces` and point OTEL_EXPORTER_OTLP_ENDPOINT at it)",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(1)
    return TraceStore(db)


def load_traces(store: TraceStore, last: int | None = None, since_s: float | None = None) -> list[Trace]:
    """The `last` most recent traces (started in the last `since_s` seconds), assembled, oldest first; assembled
    with the traces of the batched calls that link to their spans, so that members get their share of them."""
    since_ns = None if since_s is None else time.time_ns() - int(since_s * 1e9)
    wanted = {r.trace_id for r in store.recent_traces(last, since_ns)}
    batch_traces = {s.trace_id for s in store.linking_spans(wanted)} - wanted
    traces = assemble(store.spans(wanted) + store.spans(batch_traces))
    return select([t for t in traces if t.trace_id in wanted], last, since_ns)


@app.command("list")
def list_(
    db: Db = DEFAULT_DB,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many traces.")] = 20,
) -> None:
    """Recent traces, newest first: start time, root, duration, span count, status."""
    from services.traces.render import trace_list

    with _open(db) as store:
        rows = store.recent_traces(limit)
        traces = {t.trace_id: t for t in assemble(store.spans(r.trace_id for r in rows))}
    console = _console()
    if not rows:
        console.print(f"no traces in {db}", highlight=False, markup=False)
        return
    console.print(trace_list([(r, traces.get(r.trace_id)) for r in rows]))


@app.command()
def show(
    trace_id: Annotated[str, typer.Argument(help="Trace id, or a unique prefix of one.")],
    db: Db = DEFAULT_DB,
) -> None:
    """A trace as a waterfall: the indented span tree with service, total and self time, bars to scale; then the
    links: a batched call's members, and for a member span the batched call it was part of."""
    from services.traces.render import link_lines, waterfall

    with _open(db) as store:
        matches = store.find_traces(trace_id)
        if len(matches) != 1:
            Console(stderr=True).print(
                f"no trace {trace_id}" if not matches else f"{trace_id} matches several: {', '.join(matches)}",
                highlight=False,
                markup=False,
            )
            raise typer.Exit(1 if not matches else 2)
        traces = assemble(store.spans(matches))
        linking = store.linking_spans(matches)
    console = _console()
    console.print(waterfall(traces[0], console.width, linking))
    lines = link_lines(traces[0], linking)
    if lines:
        console.print("links:", highlight=False)
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True)


@app.command()
def hotspots(
    db: Db = DEFAULT_DB,
    last: Annotated[int | None, typer.Option("--last", min=1, help="The most recent N traces (default 100).")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Traces started in this window: 30s, 5m, 1h.")] = None,
    slowest: Annotated[int, typer.Option("--slowest", min=0, help="Critical paths shown (slowest first).")] = 3,
    html: Annotated[Path | None, typer.Option("--html", help="Also write this self-contained HTML page.")] = None,
) -> None:
    """Per-stage self time p50/p99 and share, critical paths of the slowest traces, and the hotspot line."""
    from services.traces.render import critical_paths, stage_table

    since_s = parse_duration(since) if since is not None else None
    if last is None and since_s is None:
        last = 100
    with _open(db) as store:
        traces = load_traces(store, last, since_s)
    console = _console()
    if not traces:
        console.print(f"no traces in {db}" + (f" in the last {since}" if since else ""), highlight=False, markup=False)
        raise typer.Exit(1)
    result = breakdown(traces, slowest)
    console.print(stage_table(result))
    if result.slowest:
        console.print("critical path of the slowest traces:", highlight=False)
        for line in critical_paths(result):
            console.print(line, highlight=False, soft_wrap=True)
    if html is not None:
        from services.traces.html_report import report

        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(report(result), encoding="utf-8")
        console.print(f"wrote {html}", highlight=False, markup=False)
    console.print(hotspot_line(result), highlight=False, markup=False)
