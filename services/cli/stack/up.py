"""`meshserve up`: the stack's secrets, then Valkey, the services and Envoy under the supervisor, until Ctrl-C or
SIGTERM."""

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

from services.cli.connect import STATE_FILE, Endpoint
from services.cli.stack.layout import StackLayout, mesh_topology
from services.cli.stack.specs import ProcessSpec, build_specs, busy_ports
from services.cli.stack.supervisor import BackoffPolicy, StackError, Supervisor, grpc_health
from services.cli.stack.credentials import StackSecrets

MESH_DIR = "mesh"  # under the log dir: Envoy's rendered config (LocalMesh.attach(log_dir / MESH_DIR))


def redact(url: str) -> str:
    """The URL without its password (redis://user:secret@host -> redis://user:***@host)."""
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)


def ports_table(specs: list[ProcessSpec], redis_url: str, title: str = "meshserve local stack") -> Table:
    table = Table(title=title)
    for column in ("service", "role", "address", "metrics", "depends on"):
        table.add_column(column)
    if not any(s.name == "valkey" for s in specs):
        table.add_row("redis", "external Redis for feature + cache", redact(redis_url), "", "")
    for s in specs:
        metrics = f":{s.metrics_port}/metrics" if s.metrics_port else ""
        deps = ", ".join(s.depends_on) if len(s.depends_on) <= 2 else f"{len(s.depends_on)} services"
        table.add_row(s.name, s.role, s.address or "", metrics, deps)
    return table


def write_state(
    path: Path,
    layout: StackLayout,
    specs: list[ProcessSpec],
    redis_url: str,
    sup: Supervisor,
    secrets: StackSecrets | None = None,
) -> None:
    """`<log-dir>/stack.json`: what `meshserve status`, the clients (and tests) read to find the running stack."""
    services = [
        {
            "name": s.name,
            "address": s.address,
            "metrics_port": s.metrics_port,
            "protocol": s.protocol,
            "health_url": s.health_url,
            "envoy_admin": s.envoy_admin,
            "pid": sup.procs[s.name].pid,
        }
        for s in specs
    ]
    secure = layout.mesh and not layout.insecure and secrets is not None
    state = {
        "redis_url": redact(redis_url),
        "valkey": layout.address(layout.valkey_port) if layout.valkey_port is not None else None,
        "gateway": layout.address(layout.gateway_port),
        "gateways": [layout.address(g.port) for g in layout.gateways],
        "ingress": layout.address(layout.ingress_port) if layout.mesh else None,
        "insecure": not secure,
        "tls_ca": str(secrets.ca_cert) if secure and secrets is not None else None,
        "secrets_dir": str(secrets.dir) if secrets is not None else None,
        "admin": layout.admin if layout.mesh else None,
        "mesh_dir": str(path.parent / MESH_DIR) if layout.mesh else None,
        "traces_ui": trace_ui_url(layout),
        "tracing_mode": layout.tracing_mode if layout.traces_port is not None else None,
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

    The stack's secrets (services.cli.stack.credentials) are made in `log_dir` unless they are there already. With
    `layout.valkey_port`, Valkey runs under the supervisor with the secrets' password (`redis_url` is then ignored);
    otherwise feature and cache use `redis_url`. With `demo_s`, synthetic traffic runs for that long once the stack
    is up, then a summary and how to call the endpoint are printed, and the stack keeps serving.

    Raises services.mesh.MeshConfigError when `istio/` cannot be rendered for the mesh.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, at start-up)
    state_path = log_dir / STATE_FILE
    secrets = StackSecrets.ensure(log_dir, hosts=[layout.host])
    envoy_command = render_mesh(layout, log_dir / MESH_DIR, secrets) if layout.mesh else None

    def notify(message: str) -> None:
        console.print(f"[dim]{_now()}[/] {message}", highlight=False, soft_wrap=True)

    supervisor: Supervisor | None = None
    try:
        if layout.valkey_port is not None:
            from services.common.embedded import redis_url as valkey_url
            from services.common.embedded import write_valkey_config

            password = secrets.valkey_password()
            write_valkey_config(layout.valkey_config, layout.host, layout.valkey_port, password)
            redis_url = valkey_url(layout.host, layout.valkey_port, password)
        if redis_url is None:
            raise ValueError("an external Redis needs its URL (or give the layout a Valkey port)")
        specs = build_specs(layout, redis_url, envoy_command, secrets)
        busy = busy_ports(layout, specs)
        if busy:
            console.print(f"[red]ports in use[/]: {'; '.join(busy)} (choose others with --port-base)")
            return 1
        url = redis_url

        def on_spawn(_: object) -> None:  # a restart changes a pid: keep stack.json current
            if state_path.exists():
                write_state(state_path, layout, specs, url, sup, secrets)

        sup = supervisor = Supervisor(specs, log_dir, policy, notify, stop_timeout_s=stop_timeout_s, on_spawn=on_spawn)
        console.print(ports_table(specs, redis_url))
        console.print(f"logs: {log_dir}/<service>.log; secrets: {secrets.dir}")
        if not await _until_stopped(supervisor.start(start_timeout_s), stop, console):
            return 0 if stop.is_set() else 1
        endpoint = Endpoint(layout.address(layout.gateway_port))
        if layout.mesh:
            secure = not layout.insecure
            address = layout.address(layout.ingress_port)
            endpoint = Endpoint(address, secrets.ca_pem(), secrets.mint("demo")) if secure else Endpoint(address)
            if not await _until_stopped(wait_grpc_serving(endpoint, 30.0), stop, console):
                return 0 if stop.is_set() else 1
            if not await _until_stopped(wait_in_rotation(layout, 30.0), stop, console):
                return 0 if stop.is_set() else 1
            how = "TLS, JWT" if secure else "plaintext, no token"
            notify(f"ingress {address} ({how}) reaches the gateway through Envoy")
        write_state(state_path, layout, specs, redis_url, supervisor, secrets)
        entry = endpoint.address
        custom_dir = _custom_log_dir(log_dir)
        console.print(
            f"[green]stack is up[/]: {'ingress' if layout.mesh else 'gateway'} at {entry} "
            f"(try `meshserve demo --address {entry}{_log_dir_flag(custom_dir)}`); Ctrl-C stops it",
            highlight=False,
            soft_wrap=True,
        )
        if (ui := trace_ui_url(layout)) is not None:
            kept = (
                "every request recorded; slow, failed, degraded and 1% kept"
                if layout.tracing_mode == "retroactive"
                else "head sampling"
            )
            console.print(f"trace UI at {ui} (search, waterfalls, hotspots; {kept})", highlight=False, soft_wrap=True)
        if demo_s > 0:
            ca = secrets.ca_cert if endpoint.tls else None
            await _until_stopped(run_demo_and_explain(endpoint, demo_s, console, ca, custom_dir), stop, console)
        await stop.wait()
        return 0
    finally:
        console.print("stopping the stack ...")
        if supervisor is not None:
            await supervisor.stop()
        state_path.unlink(missing_ok=True)
        console.print("stopped")


def _custom_log_dir(log_dir: Path) -> Path | None:
    """`log_dir` unless it is the default `.logs` of the current folder (which the commands find themselves)."""
    return None if log_dir == Path(".logs").resolve() else log_dir


def _log_dir_flag(log_dir: Path | None) -> str:
    return "" if log_dir is None else f" --log-dir {log_dir}"


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


async def run_demo_and_explain(
    endpoint: Endpoint, seconds: float, console: Console, ca: Path | None = None, log_dir: Path | None = None
) -> None:
    """The demo's live view for `seconds`, its summary, then how to call the endpoint; keeps serving after."""
    from services.cli.demo import render, run_demo
    from services.cli.howto import how_to_call

    console.rule(f"demo: {seconds:.0f} s of synthetic card transactions to the fraud pipeline")
    summary = await run_demo(endpoint, seconds, concurrency=8, console=console)
    if not console.is_terminal:
        console.print(render(summary))
    console.print(
        f"[bold]summary[/]: {summary.ok}/{summary.requests} ok, {summary.rps:.0f} req/s, p50 {summary.p50_ms:.1f} ms, "
        f"p99 {summary.p99_ms:.1f} ms, cache hits {summary.cache_hit_ratio:.0%}, degraded {summary.degraded}, "
        f"errors {sum(summary.errors.values())}",
        highlight=False,
    )
    console.rule()
    console.print(how_to_call(endpoint.address, ca, log_dir), highlight=False, markup=False, soft_wrap=True)
    console.print(f"[green]still serving at {endpoint.address}[/]; Ctrl-C stops everything", highlight=False)


def trace_ui_url(layout: StackLayout) -> str | None:
    """The trace store's web UI, when the stack runs one."""
    if layout.traces_ui_port is None:
        return None
    return f"http://{layout.address(layout.traces_ui_port)}/"


def render_mesh(layout: StackLayout, workdir: Path, secrets: StackSecrets | None = None) -> list[str]:
    """Render Envoy's configuration from istio/ for the stack into `workdir`; Envoy's command line."""
    from services.mesh import LocalMesh

    mesh = LocalMesh(mesh_topology(layout, secrets), layout.istio_paths, workdir)
    mesh.render()
    return mesh.envoy.command


async def wait_grpc_serving(endpoint: Endpoint, timeout_s: float) -> None:
    """Until the endpoint answers grpc.health.v1 SERVING; StackError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await grpc_health(endpoint.address, root_certificates=endpoint.root_certificates):
        if loop.time() > deadline:
            raise StackError(f"{endpoint.address} not SERVING after {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


def endpoints(layout: StackLayout) -> dict[str, set[str]]:
    """Per service of the mesh, the addresses of its replicas."""
    t = layout
    return {
        "gateway": {t.address(g.port) for g in t.gateways},
        "model": {t.address(r.port) for r in t.replicas},
        "feature": {t.address(t.feature_port)},
        "cache": {t.address(t.cache_port)},
    }


def out_of_rotation(admin_address: str, expected: dict[str, set[str]]) -> list[str]:
    """'service address' of every replica that Envoy's active health checks do not (yet) count healthy."""
    from services.mesh.admin import EnvoyAdmin
    from services.mesh.hosts import cluster_name

    admin = EnvoyAdmin(admin_address)
    out = []
    for service, addresses in expected.items():
        try:
            hosts = admin.hosts(cluster_name(service, None))
        except OSError:
            hosts = {}
        out += [f"{service} {a}" for a in sorted(addresses) if hosts.get(a, {}).get("health_flags") != "healthy"]
    return out


async def wait_in_rotation(layout: StackLayout, timeout_s: float) -> None:
    """Until Envoy counts every replica of every service healthy, so that the ingress and the gateway's calls
    spread over all of them from the first request; StackError naming the others after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    expected = endpoints(layout)
    while missing := await asyncio.to_thread(out_of_rotation, layout.admin, expected):
        if loop.time() > deadline:
            raise StackError(f"not in Envoy's rotation after {timeout_s:.0f}s: {', '.join(missing)}")
        await asyncio.sleep(0.2)


def _now() -> str:
    import time

    return time.strftime("%H:%M:%S")
