"""`meshserve up`: one embedded Valkey plus the supervised services, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from services.cli.layout import StackLayout, mesh_topology
from services.cli.specs import ProcessSpec, build_specs, busy_ports
from services.cli.stack import BackoffPolicy, StackError, Supervisor, grpc_health

STATE_FILE = "stack.json"
MESH_DIR = "mesh"  # under the log dir: Envoy's rendered config (LocalMesh.attach(log_dir / MESH_DIR))


def redact(url: str) -> str:
    """The URL without its password (redis://user:secret@host -> redis://user:***@host)."""
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)


def ports_table(specs: list[ProcessSpec], redis_url: str, title: str = "meshserve local stack") -> Table:
    table = Table(title=title)
    for column in ("service", "role", "gRPC", "metrics", "depends on"):
        table.add_column(column)
    table.add_row("valkey", "Redis for feature + cache", redact(redis_url), "", "")
    for s in specs:
        metrics = f":{s.metrics_port}/metrics" if s.metrics_port else ""
        deps = ", ".join(s.depends_on) if len(s.depends_on) <= 2 else f"{len(s.depends_on)} services"
        table.add_row(s.name, s.role, s.address or "", metrics, deps)
    return table


def write_state(path: Path, layout: StackLayout, specs: list[ProcessSpec], redis_url: str, sup: Supervisor) -> None:
    """`<log-dir>/stack.json`: what `meshserve status` (and tests) read to find the running stack."""
    services = [
        {"name": s.name, "address": s.address, "health_url": s.health_url, "pid": sup.procs[s.name].pid} for s in specs
    ]
    state = {
        "redis_url": redact(redis_url),
        "gateway": layout.address(layout.gateway_port),
        "ingress": layout.address(layout.ingress_port) if layout.mesh else None,
        "mesh_dir": str(path.parent / MESH_DIR) if layout.mesh else None,
        "services": services,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


async def run_stack(
    layout: StackLayout,
    log_dir: Path,
    console: Console,
    redis_url: str | None = None,
    start_timeout_s: float = 120.0,
    stop_timeout_s: float = 15.0,
    policy: BackoffPolicy | None = None,
    demo_s: float = 0.0,
) -> int:
    """Run the stack until a signal; 0 after a clean stop, 1 when it could not start.

    With `demo_s`, synthetic traffic runs for that long once the stack is up, then a summary and how to
    call the endpoint are printed, and the stack keeps serving.

    Raises services.mesh.MeshConfigError when `istio/` cannot be rendered for the mesh.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, at start-up)
    state_path = log_dir / STATE_FILE
    envoy_command = render_mesh(layout, log_dir / MESH_DIR) if layout.mesh else None

    def notify(message: str) -> None:
        console.print(f"[dim]{_now()}[/] {message}", highlight=False, soft_wrap=True)

    valkey = None
    supervisor: Supervisor | None = None
    try:
        if redis_url is None:
            from services.common.embedded import EmbeddedValkey

            valkey = EmbeddedValkey()
            redis_url = await valkey.start()
        specs = build_specs(layout, redis_url, envoy_command)
        busy = busy_ports(layout, specs)
        if busy:
            console.print(f"[red]ports in use[/]: {'; '.join(busy)} (choose others with --port-base)")
            return 1
        url = redis_url

        def on_spawn(_: object) -> None:  # a restart changes a pid: keep stack.json current
            if state_path.exists():
                write_state(state_path, layout, specs, url, sup)

        sup = supervisor = Supervisor(specs, log_dir, policy, notify, stop_timeout_s=stop_timeout_s, on_spawn=on_spawn)
        console.print(ports_table(specs, redis_url))
        console.print(f"logs: {log_dir}/<service>.log")
        if not await _until_stopped(supervisor.start(start_timeout_s), stop, console):
            return 0 if stop.is_set() else 1
        entry = layout.address(layout.gateway_port)
        if layout.mesh:
            entry = layout.address(layout.ingress_port)
            if not await _until_stopped(wait_grpc_serving(entry, 30.0), stop, console):
                return 0 if stop.is_set() else 1
            notify(f"ingress {entry} reaches the gateway through Envoy")
        write_state(state_path, layout, specs, redis_url, supervisor)
        console.print(
            f"[green]stack is up[/]: {'ingress' if layout.mesh else 'gateway'} at {entry} "
            f"(try `meshserve demo --address {entry}`); Ctrl-C stops it",
            highlight=False,
            soft_wrap=True,
        )
        if demo_s > 0:
            await _until_stopped(run_demo_and_explain(entry, demo_s, console), stop, console)
        await stop.wait()
        return 0
    finally:
        console.print("stopping the stack ...")
        if supervisor is not None:
            await supervisor.stop()
        if valkey is not None:
            await valkey.stop()
        state_path.unlink(missing_ok=True)
        console.print("stopped")


async def _until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event, console: Console) -> bool:
    """Run `work` unless a signal comes first; False when it was interrupted or failed (and says why)."""
    task = asyncio.create_task(work)
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, StackError):
            await task
        return False
    try:
        task.result()
    except StackError as e:
        console.print(f"[red]stack did not start[/]: {e}", highlight=False, soft_wrap=True)
        return False
    return True


async def run_demo_and_explain(address: str, seconds: float, console: Console) -> None:
    """The demo's live view for `seconds`, its summary, then how to call the endpoint; keeps serving after."""
    from services.cli.demo import render, run_demo
    from services.cli.howto import how_to_call

    console.rule(f"demo: {seconds:.0f} s of synthetic card transactions to the fraud pipeline")
    summary = await run_demo(address, seconds, concurrency=8, console=console)
    if not console.is_terminal:
        console.print(render(summary))
    console.print(
        f"[bold]summary[/]: {summary.ok}/{summary.requests} ok, {summary.rps:.0f} req/s, p50 {summary.p50_ms:.1f} ms, "
        f"p99 {summary.p99_ms:.1f} ms, cache hits {summary.cache_hit_ratio:.0%}, degraded {summary.degraded}, "
        f"errors {sum(summary.errors.values())}",
        highlight=False,
    )
    console.rule()
    console.print(how_to_call(address), highlight=False, markup=False, soft_wrap=True)
    console.print(f"[green]still serving at {address}[/]; Ctrl-C stops everything", highlight=False)


def render_mesh(layout: StackLayout, workdir: Path) -> list[str]:
    """Render Envoy's configuration from istio/ for the stack into `workdir`; Envoy's command line."""
    from services.mesh import LocalMesh

    mesh = LocalMesh(mesh_topology(layout), layout.istio_paths, workdir)
    mesh.render()
    return mesh.envoy.command


async def wait_grpc_serving(address: str, timeout_s: float) -> None:
    """Until `address` answers grpc.health.v1 SERVING; StackError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await grpc_health(address):
        if loop.time() > deadline:
            raise StackError(f"{address} not SERVING after {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


def _now() -> str:
    import time

    return time.strftime("%H:%M:%S")
