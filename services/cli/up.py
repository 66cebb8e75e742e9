"""`meshserve up`: one embedded Valkey plus the supervised services, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path

from rich.console import Console
from rich.table import Table

from services.cli.stack import BackoffPolicy, StackError, Supervisor
from services.cli.topology import ProcessSpec, Topology, build_specs, busy_ports

STATE_FILE = "stack.json"


def ports_table(specs: list[ProcessSpec], redis_url: str, title: str = "meshserve local stack") -> Table:
    table = Table(title=title)
    for column in ("service", "role", "gRPC", "metrics", "depends on"):
        table.add_column(column)
    table.add_row("valkey", "Redis for feature + cache", redis_url, "", "")
    for s in specs:
        metrics = f":{s.metrics_port}/metrics" if s.metrics_port else ""
        deps = ", ".join(s.depends_on) if len(s.depends_on) <= 2 else f"{len(s.depends_on)} services"
        table.add_row(s.name, s.role, s.address or "", metrics, deps)
    return table


def write_state(path: Path, specs: list[ProcessSpec], redis_url: str, supervisor: Supervisor) -> None:
    """`<log-dir>/stack.json`: what `meshserve status` (and tests) read to find the running stack."""
    state = {
        "redis_url": redis_url,
        "services": [
            {"name": s.name, "address": s.address, "metrics_port": s.metrics_port, "pid": supervisor.procs[s.name].pid}
            for s in specs
        ],
    }
    path.write_text(json.dumps(state, indent=2))


async def run_stack(
    topology: Topology,
    log_dir: Path,
    console: Console,
    redis_url: str | None = None,
    start_timeout_s: float = 120.0,
    stop_timeout_s: float = 15.0,
    policy: BackoffPolicy | None = None,
) -> int:
    """Run the stack until a signal; 0 after a clean stop, 1 when it could not start."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, at start-up)
    state_path = log_dir / STATE_FILE

    def notify(message: str) -> None:
        console.print(f"[dim]{_now()}[/] {message}", highlight=False)

    valkey = None
    if redis_url is None:
        from services.common.embedded import EmbeddedValkey

        valkey = EmbeddedValkey()
        redis_url = await valkey.start()
    specs = build_specs(topology, redis_url)
    started = False

    def on_spawn(_: object) -> None:  # a restart changes a pid: keep stack.json current
        if started:
            write_state(state_path, specs, redis_url, supervisor)

    supervisor = Supervisor(specs, log_dir, policy, notify=notify, stop_timeout_s=stop_timeout_s, on_spawn=on_spawn)
    code = 0
    try:
        busy = busy_ports(specs)
        if busy:
            console.print(f"[red]ports in use[/]: {'; '.join(busy)} (choose others with --port-base)")
            return 1
        console.print(ports_table(specs, redis_url))
        console.print(f"logs: {log_dir}/<service>.log")
        starting = asyncio.create_task(supervisor.start(start_timeout_s))
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done() and not stop.is_set():
            try:
                starting.result()
            except StackError as e:
                console.print(f"[red]stack did not start[/]: {e}", highlight=False)
                return 1
            started = True
            write_state(state_path, specs, redis_url, supervisor)
            gateway = next((s for s in specs if s.name == "gateway"), specs[-1])
            console.print(
                f"[green]stack is up[/]: gateway at {gateway.address} "
                f"(try `meshserve demo --address {gateway.address}`); Ctrl-C stops it"
            )
            await stopped
        else:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, StackError):
                await starting
        stopped.cancel()
        return code
    finally:
        console.print("stopping the stack ...")
        await supervisor.stop()
        if valkey is not None:
            await valkey.stop()
        state_path.unlink(missing_ok=True)
        console.print("stopped")


def _now() -> str:
    import time

    return time.strftime("%H:%M:%S")
