"""`meshserve traces`: the typer sub-app (list, show, hotspots, ui) over the local trace store, reading it through the
queries the UI's JSON API uses (`services.traces.query`); over a two-tier stack's stores as one (list, show,
hotspots: `services.traces.tiered`); importing it is inert."""

from __future__ import annotations

import errno
import sys
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from services.cli.stack.state import default_log_dir, read_state
from services.traces import query
from services.traces.analysis import hotspot_line, missing_line
from services.traces.store import TraceFilter, TraceStore
from services.traces.tiered import Stores, TieredStores

app = typer.Typer(
    name="traces",
    help="Recent traces from the local trace store (python -m services.traces): list, waterfall, hotspots, web UI.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_DB = default_log_dir() / "traces.sqlite"  # where `meshserve up` keeps it by default, from any folder
Db = Annotated[
    Path, typer.Option("--db", help="The trace store's SQLite file (`meshserve up --log-dir`'s traces.sqlite).")
]
Dbs = Annotated[
    list[Path] | None,
    typer.Option(
        "--db",
        help="A trace store's SQLite file; several (--db A --db B) are read as one, each the tier its folder names, "
        "the first the home tier (default: the stack of --log-dir, both tiers' stores for a two-tier stack).",
    ),
]
LogDir = Annotated[
    Path | None,
    typer.Option("--log-dir", help="The stack's log dir (`meshserve up --log-dir`; default: the default log dir)."),
]
Pipeline = Annotated[str | None, typer.Option("--pipeline", help="Only this pipeline's traces.")]
Status = Annotated[str | None, typer.Option("--status", help="ok or error.")]
Degraded = Annotated[bool | None, typer.Option("--degraded/--not-degraded", help="Only degraded (or other) answers.")]
Trigger = Annotated[str | None, typer.Option("--trigger", help="Kept for this trigger: latency, error, degraded, ...")]
MinMs = Annotated[float | None, typer.Option("--min-ms", min=0, help="At least this long end to end.")]
MaxMs = Annotated[float | None, typer.Option("--max-ms", min=0, help="At most this long end to end.")]
Since = Annotated[str | None, typer.Option("--since", help="Traces started in this window: 30s, 5m, 1h.")]


def parse_duration(text: str) -> float:
    """`5m`, `30s`, `1.5h`, `250ms`, `2d` (a bare number is seconds) as seconds."""
    try:
        return query.seconds(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def search_filter(
    pipeline: str | None = None,
    status: str | None = None,
    degraded: bool | None = None,
    trigger: str | None = None,
    min_ms: float | None = None,
    max_ms: float | None = None,
    since: str | None = None,
    limit: int | None = None,
    order: str = "recent",
) -> TraceFilter:
    """The store search these options ask for (as the UI's search form would)."""
    if status is not None and status not in ("ok", "error"):
        raise typer.BadParameter(f"{status!r} is not ok or error", param_hint="--status")
    since_ns = time.time_ns() - int(parse_duration(since) * 1e9) if since is not None else None
    return TraceFilter(
        pipeline=pipeline,
        error=None if status is None else status == "error",
        degraded=degraded,
        trigger=trigger,
        min_duration_ns=None if min_ms is None else int(min_ms * 1e6),
        max_duration_ns=None if max_ms is None else int(max_ms * 1e6),
        since_ns=since_ns,
        order=order,
        limit=limit,
    )


def _console() -> Console:
    # Piped or captured output gets wide tables instead of 80 columns.
    return Console() if sys.stdout.isatty() else Console(width=200)


def _missing(db: Path) -> None:
    Console(stderr=True).print(
        f"no trace store at {db} (run `python -m services.traces` and point OTEL_EXPORTER_OTLP_ENDPOINT at it)",
        highlight=False,
        markup=False,
    )
    raise typer.Exit(1)


def tier_stores(log_dir: Path) -> list[tuple[str, Path]] | None:
    """(tier, store file) of the two-tier stack whose stack.json is in `log_dir`, the tier clients call first; None
    when no such stack runs there."""
    state = read_state(log_dir)
    tiers = state.get("tiers") if state is not None else None
    if not isinstance(tiers, dict) or not tiers:
        return None
    entry = str(state.get("secrets_dir") or state.get("mesh_dir") or "") if state is not None else ""
    stores = [(str(name), Path(folder) / "traces.sqlite") for name, folder in tiers.items()]
    stores.sort(key=lambda ts: not entry.startswith(str(ts[1].parent) + "/"))
    return stores


def stores_of(dbs: list[Path] | None, log_dir: Path | None) -> list[tuple[str, Path]]:
    """What to read: the `--db` files (several: each the tier its folder names, made unique), or the stack of
    `log_dir` (its tiers' stores, or its one store)."""
    if dbs:
        if len(dbs) == 1:
            return [("", dbs[0])]
        out: list[tuple[str, Path]] = []
        for i, db in enumerate(dbs):
            name = db.resolve().parent.name or f"store{i + 1}"
            out.append((name if name not in {t for t, _ in out} else f"{name}{i + 1}", db))
        return out
    folder = log_dir if log_dir is not None else default_log_dir()
    return tier_stores(folder) or [("", folder / "traces.sqlite")]


def _open(db: Path | list[tuple[str, Path]]) -> Stores:
    """One store, or several as one; exits 1 when the first is missing, leaves out (and says) any other missing."""
    stores = [("", db)] if isinstance(db, Path) else db
    if not stores[0][1].exists():
        _missing(stores[0][1])
    if len(stores) == 1:
        return TraceStore(stores[0][1])
    for tier, path in stores[1:]:
        if not path.exists():
            Console(stderr=True).print(f"no {tier} trace store at {path}: read without it", markup=False)
    return TieredStores([(tier, path) for tier, path in stores if path.exists()])


def described(stores: list[tuple[str, Path]]) -> str:
    """The stores read, for messages: a file, or `edge (A), cloud (B)`."""
    if len(stores) == 1:
        return str(stores[0][1])
    return ", ".join(f"{tier} ({path})" for tier, path in stores)


@app.command("list")
def list_(
    db: Dbs = None,
    log_dir: LogDir = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="How many traces.")] = 20,
    pipeline: Pipeline = None,
    status: Status = None,
    degraded: Degraded = None,
    trigger: Trigger = None,
    min_ms: MinMs = None,
    max_ms: MaxMs = None,
    since: Since = None,
    slowest: Annotated[bool, typer.Option("--slowest", help="Slowest first instead of newest first.")] = False,
) -> None:
    """Traces, newest (or slowest) first: start time, root, duration, span count, status and marks."""
    from services.traces.render import trace_list

    what = search_filter(
        pipeline, status, degraded, trigger, min_ms, max_ms, since, limit, "slowest" if slowest else "recent"
    )
    stores = stores_of(db, log_dir)
    with _open(stores) as store:
        found = query.search(store, what)
    console = _console()
    if not found:
        console.print(f"no traces in {described(stores)} match", highlight=False, markup=False)
        return
    console.print(trace_list([(s.row, s.trace) for s in found]))


@app.command()
def show(
    trace_id: Annotated[str, typer.Argument(help="Trace id, or a unique prefix of one.")],
    db: Dbs = None,
    log_dir: LogDir = None,
) -> None:
    """A trace as a waterfall: the indented span tree with service, total and self time, bars to scale; then the
    links: a batched call's members, and for a member span the batched call it was part of. On a two-tier stack,
    the spans of both tiers' stores, the hop between them as the stage `wan`."""
    from services.traces.render import link_lines, waterfall

    with _open(stores_of(db, log_dir)) as store:
        matches = query.find(store, trace_id)
        if len(matches) != 1:
            Console(stderr=True).print(
                f"no trace {trace_id}" if not matches else f"{trace_id} matches several: {', '.join(matches)}",
                highlight=False,
                markup=False,
            )
            raise typer.Exit(1 if not matches else 2)
        found = query.detail(store, matches[0])
    if found is None:  # evicted between the two reads
        Console(stderr=True).print(f"no trace {trace_id}", highlight=False, markup=False)
        raise typer.Exit(1)
    console = _console()
    console.print(waterfall(found.trace, console.width, found.linking))
    lines = link_lines(found.trace, found.linking)
    if lines:
        console.print("links:", highlight=False)
        for line in lines:
            console.print(line, highlight=False, soft_wrap=True)
    missing = missing_line(found.trace.remote_missing)
    if missing is not None:
        console.print(missing, highlight=False, markup=False, soft_wrap=True)


@app.command()
def hotspots(
    db: Dbs = None,
    log_dir: LogDir = None,
    last: Annotated[
        int | None,
        typer.Option(
            "--last",
            min=1,
            max=query.MAX_ANALYSED,
            help=f"The most recent N traces the filters keep (default: {query.ANALYSED}; with --since, every trace in "
            f"the window up to {query.MAX_ANALYSED}).",
        ),
    ] = None,
    since: Since = None,
    slowest: Annotated[int, typer.Option("--slowest", min=0, help="Critical paths shown (slowest first).")] = 3,
    html: Annotated[Path | None, typer.Option("--html", help="Also write this self-contained HTML page.")] = None,
    pipeline: Pipeline = None,
    status: Status = None,
    degraded: Degraded = None,
    trigger: Trigger = None,
    min_ms: MinMs = None,
    max_ms: MaxMs = None,
) -> None:
    """Per-stage self time p50/p99 and share, critical paths of the slowest traces, and the hotspot line (over the
    traces the filters keep: `--min-ms 40` reads the slow ones alone). On a two-tier stack, both tiers' stores as
    one: the other tier's stages prefixed with it (`cloud:gateway.model`), the hop between them the stage `wan`."""
    from services.traces.render import critical_paths, stage_table

    if last is None:
        last = query.ANALYSED if since is None else query.MAX_ANALYSED
    what = search_filter(pipeline, status, degraded, trigger, min_ms, max_ms, since, last)
    stores = stores_of(db, log_dir)
    with _open(stores) as store:
        result = query.hotspots(store, what, slowest)
        matching = store.count(what)
    console = _console()
    if not result.traces:
        where = described(stores)
        window = f" in the last {since}" if since else ""
        console.print(f"no traces in {where}{window}", highlight=False, markup=False)
        raise typer.Exit(1)
    console.print(stage_table(result))
    console.print(considered(len(result.traces), matching, last), highlight=False, markup=False)
    if result.slowest:
        console.print("critical path of the slowest traces:", highlight=False)
        for line in critical_paths(result):
            console.print(line, highlight=False, soft_wrap=True)
    if html is not None:
        from services.traces.html_report import report

        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(report(result), encoding="utf-8")
        console.print(f"wrote {html}", highlight=False, markup=False)
    missing = missing_line(result.remote_missing, len(result.traces))
    if missing is not None:
        console.print(missing, highlight=False, markup=False, soft_wrap=True)
    console.print(hotspot_line(result), highlight=False, markup=False)


def considered(read: int, matching: int, last: int) -> str:
    """How many of the matching traces an analysis read, and how to read more when it did not read them all."""
    if read >= matching:
        return f"considered all {read} matching traces"
    more = f"--last {min(matching, query.MAX_ANALYSED)} reads more" if last < query.MAX_ANALYSED else "narrow --since"
    return f"considered the latest {read} of {matching} matching traces ({more})"


@app.command()
def ui(
    db: Db = DEFAULT_DB,
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="HTTP port (0: a free one).")] = 8091,
    serve: Annotated[
        bool, typer.Option("--serve", help="Serve a UI of its own even when the running stack serves one.")
    ] = False,
    browser: Annotated[bool, typer.Option("--browser/--no-browser", help="Open the address in a browser.")] = True,
) -> None:
    """Open the trace UI (search, waterfall, hotspots): the running stack's, at the address with the token its
    `meshserve up` made; without one (or with --serve), serve it over the store until Ctrl-C, with a fresh token."""
    from services.traces.web import TraceUI

    running = None if serve else stack_ui(db)
    if running is not None:
        folder, url = running
        Console().print(f"trace UI of the stack in {folder}: {url}", highlight=False, markup=False, soft_wrap=True)
        if browser:
            open_in_browser(url)
        return
    if not db.exists():
        _missing(db)
    try:
        server = TraceUI(db, host, port)
    except OSError as exc:
        _cannot_bind(host, port, db, exc)
    Console().print(
        f"trace UI at {server.login_url} (store {db}); Ctrl-C stops", highlight=False, markup=False, soft_wrap=True
    )
    if browser:
        open_in_browser(server.login_url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def stack_ui(db: Path) -> tuple[Path, str] | None:
    """(log dir, address with its token) of the trace UI of a running stack that keeps `db` or runs from the default
    log dir; None when none runs one (or its token cannot be read: another user's stack)."""
    from services.cli.stack.credentials import SecretsError, StackSecrets
    from services.traces.web import with_token

    for folder in dict.fromkeys((db.parent, default_log_dir())):
        state = read_state(folder)
        if state is None or not state.get("traces_ui") or not state.get("secrets_dir"):
            continue
        try:
            token = StackSecrets(Path(state["secrets_dir"])).ui_token()
        except SecretsError:
            continue
        return folder, with_token(str(state["traces_ui"]), token)
    return None


def open_in_browser(url: str) -> None:
    """Open `url` in the desktop's browser, where there is a desktop (a text browser would take the terminal)."""
    import os
    import webbrowser

    if sys.platform == "darwin" or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        webbrowser.open(url, new=2)


def _cannot_bind(host: str, port: int, db: Path, exc: OSError) -> NoReturn:
    """Say why the UI cannot listen (the port in use: by the running stack's own UI, if it is), what to do, exit 1."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if exc.errno != errno.EADDRINUSE:
        err.print(f"cannot serve the trace UI on {host}:{port}: {exc.strerror or exc}", markup=False)
        raise typer.Exit(1)
    err.print(f"port {port} on {host} is in use.", markup=False)
    for folder in dict.fromkeys((db.parent, default_log_dir())):
        state = read_state(folder)
        if state is not None and state.get("traces_ui"):
            err.print(
                f"The running stack (log dir {folder}) already serves this UI at {state['traces_ui']}", markup=False
            )
            break
    err.print("Choose another port with --port N (--port 0 picks a free one).", markup=False)
    raise typer.Exit(1)
