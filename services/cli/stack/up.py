"""`meshserve up`: the stack's secrets, then Valkey, the services and Envoy under the supervisor, until Ctrl-C or
SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from services.cli.connect import Endpoint
from services.cli.stack.credentials import SecretsError, StackSecrets
from services.cli.stack.layout import MESH_DIR, ModelReplica, StackLayout, ensure_socket_dir
from services.cli.stack.mesh import prepare_mesh, wait_in_rotation
from services.cli.stack.specs import (
    RECORDING_PEERS_FILE,
    ProcessSpec,
    build_specs,
    busy_ports,
    model_spec,
    tracing_env,
)
from services.cli.stack.state import STATE_FILE, default_log_dir
from services.cli.stack.supervisor import BackoffPolicy, StackError, Supervisor, grpc_health

if TYPE_CHECKING:
    from services.cli.stack.autoscaler import Autoscaler
    from services.mesh import LocalMesh


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
            "metrics": layout.address(s.metrics_port) if s.metrics_port else None,
            "protocol": s.protocol,
            "health_url": s.health_url,
            "envoy_admin": s.envoy_admin,
            "pid": sup.procs[s.name].pid if s.name in sup.procs else None,
        }
        for s in specs
    ]
    running = {s.name for s in specs}
    secure = layout.mesh and not layout.insecure and secrets is not None
    state = {
        "pid": os.getpid(),  # `meshserve down` signals it
        "redis_url": redact(redis_url),
        "valkey": layout.address(layout.valkey_port) if layout.valkey_port is not None else None,
        "gateway": layout.service_address(layout.gateways[0].name, layout.gateway_port),
        "gateways": [layout.service_address(g.name, g.port) for g in layout.gateways],
        "sockets": str(layout.socket_dir) if layout.socket_dir is not None else None,
        "ingress": layout.address(layout.ingress_port) if layout.mesh else None,
        "insecure": not secure,
        "tls_ca": str(secrets.ca_cert) if secure and secrets is not None else None,
        "secrets_dir": str(secrets.dir) if secrets is not None else None,
        "admin": layout.admin if layout.mesh else None,
        "mesh_dir": str(path.parent / MESH_DIR) if layout.mesh else None,
        "traces_ui": trace_ui_url(layout),
        "tracing_mode": layout.tracing_mode if layout.traces_port is not None else None,
        "scaler": layout.service_address("scaler", layout.scaler_port) if layout.scaler_port is not None else None,
        "groups": [
            {
                "subset": g.subset,
                "model": g.model,
                "min": g.min_replicas,
                "max": g.max_replicas,
                "replicas": [r.name for r in layout.slots(g.subset) if r.name in running],
            }
            for g in layout.groups
        ],
        "services": services,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)


@dataclass
class StackRun:
    """One run of `meshserve up`: what its steps share, from the secrets to the supervisor."""

    layout: StackLayout
    log_dir: Path
    console: Console
    secrets: StackSecrets
    stop: asyncio.Event
    redis_url: str = ""
    specs: list[ProcessSpec] = field(default_factory=list)
    supervisor: Supervisor | None = None
    mesh: LocalMesh | None = None
    autoscaler: Autoscaler | None = None
    scaling: asyncio.Task[None] | None = None  # the autoscaler's task

    @property
    def state_path(self) -> Path:
        return self.log_dir / STATE_FILE

    def notify(self, message: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {message}", highlight=False, soft_wrap=True)

    def save_state(self) -> None:
        """stack.json, and the tracing peers file (the model replicas that run now)."""
        assert self.supervisor is not None
        write_state(self.state_path, self.layout, self.specs, self.redis_url, self.supervisor, self.secrets)
        self.write_peers()

    def write_peers(self) -> None:
        """`<log_dir>/recording-peers`: the /metrics addresses of the running replicas of groups that scale, which
        every service reads again every few seconds to collect retroactive traces from them."""
        if not self.layout.autoscaled:
            return
        running = {s.name for s in self.specs}
        scaled = {g.subset for g in self.layout.autoscaled}
        lines = [
            self.layout.address(r.metrics_port)
            for r in self.layout.replicas
            if r.subset in scaled and r.name in running
        ]
        path = self.log_dir / RECORDING_PEERS_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(f"{line}\n" for line in lines))
        tmp.replace(path)

    def replica_spec(self, replica: ModelReplica) -> ProcessSpec:
        """The spec of a model replica the autoscaler adds: as the initial ones are started."""
        depends_on = [s.name for s in self.specs if s.name == "traces"]
        return model_spec(self.layout, replica, tracing_env(self.layout), self.secrets, depends_on)

    async def until_stopped(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run `work` unless a signal comes first; False when it was interrupted or failed (and says why)."""
        return await _until_stopped(work, self.stop, self.console)

    def exit_code(self) -> int:
        """0 when a signal interrupted a step (a clean stop), 1 when the step failed."""
        return 0 if self.stop.is_set() else 1


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
    `layout.valkey_port`, two Valkeys run under the supervisor with the secrets' password, the feature store's
    (append-only file, noeviction) and the cache's (allkeys-lru), and `redis_url` is ignored; otherwise feature and
    cache both use `redis_url`. With `demo_s`, synthetic traffic runs for that long once the stack
    is up, then a summary and how to call the endpoint are printed, and the stack keeps serving. When a model group
    autoscales, the autoscaler runs from the moment the stack is up (services.cli.stack.autoscaler); after the demo
    a group that may sleep is shown going to zero and coming back.

    Raises services.mesh.MeshConfigError when `istio/` cannot be rendered for the mesh.
    """
    stop = stop_on_signals()
    log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (once, at start-up)
    if not socket_dir_ready(layout, console):
        return 1
    secrets = StackSecrets.ensure(log_dir, hosts=[layout.host])
    mesh = prepare_mesh(layout, log_dir / MESH_DIR, secrets) if layout.mesh else None
    envoy_command = mesh.envoy.command if mesh is not None else None
    run = StackRun(layout, log_dir, console, secrets, stop, mesh=mesh)
    try:
        run.redis_url = stack_redis_url(layout, secrets, redis_url)
        cache_url = stack_redis_url(layout, secrets, redis_url, cache=True)
        run.specs = build_specs(layout, run.redis_url, envoy_command, secrets, cache_redis_url=cache_url)
        if not nothing_busy(run):
            return 1
        run.supervisor = supervise(run, policy, stop_timeout_s)
        if not await run.until_stopped(run.supervisor.start(start_timeout_s)):
            return run.exit_code()
        endpoint = await reach_entry(run)
        if endpoint is None:
            return run.exit_code()
        start_autoscaler(run, start_timeout_s)  # autoscale.json before stack.json says the stack is up
        run.save_state()
        announce(run, endpoint, example=demo_s <= 0)
        if demo_s > 0:
            ca = secrets.ca_cert if endpoint.tls else None
            sleep = (lambda: show_scale_to_zero(run, endpoint)) if run.autoscaler is not None else None
            await run.until_stopped(
                run_demo_and_explain(endpoint, demo_s, console, ca, _custom_log_dir(log_dir), then=sleep)
            )
        await stop.wait()
        return 0
    finally:
        await shut_down(run)


def nothing_busy(run: StackRun) -> bool:
    """True when no port or socket of the stack is held by something else; otherwise False, naming them."""
    busy = busy_ports(run.layout, run.specs)
    if busy:
        run.console.print(
            f"[red]in use[/]: {'; '.join(busy)} (choose other ports with --port-base; a socket in use is a stack "
            "running in this --log-dir)",
            highlight=False,
            soft_wrap=True,
        )
    return not busy


def socket_dir_ready(layout: StackLayout, console: Console) -> bool:
    """The layout's sockets folder (the services bind their sockets in it) made or taken over: 0700 and this
    user's; False, saying why, when it cannot be."""
    if layout.socket_dir is None:
        return True
    try:
        ensure_socket_dir(layout.socket_dir)
    except OSError as e:
        console.print(f"[red]sockets[/]: {e}", highlight=False, soft_wrap=True)
        return False
    return True


async def shut_down(run: StackRun) -> None:
    """The autoscaler first (no replica starts while the stack stops), then every process in reverse order."""
    run.console.print("stopping the stack ...")
    if run.scaling is not None:
        run.scaling.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run.scaling
    if run.supervisor is not None:
        await run.supervisor.stop()
    run.state_path.unlink(missing_ok=True)
    run.console.print("stopped")


def start_autoscaler(run: StackRun, start_timeout_s: float) -> None:
    """The autoscaler of the groups that scale, as the task `run.scaling` (none when no group scales): a client of
    the stack's scaler, adding and retiring replicas through the supervisor and the mesh's endpoints."""
    from services.cli.stack.autoscaler import Autoscaler, StackReplicas

    layout = run.layout
    if not layout.autoscaled or run.mesh is None or layout.scaler_port is None:
        return
    control = StackReplicas(run, run.mesh, start_timeout_s)
    scaler = layout.service_address("scaler", layout.scaler_port)
    run.autoscaler = Autoscaler(layout, control, scaler, run.log_dir, run.notify)
    for g in layout.autoscaled:
        run.notify(
            f"autoscaling {g.subset}: {g.min_replicas}..{g.max_replicas} replicas on {g.model}'s demand, "
            f"{g.target_per_replica:g} per replica, down after {g.scale_down_window_s:g} s "
            f"(decisions in {run.log_dir / 'autoscale.json'})"
        )
    run.scaling = asyncio.create_task(run.autoscaler.run(), name="autoscaler")


def stop_on_signals() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets (the running loop's handlers)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def stack_redis_url(layout: StackLayout, secrets: StackSecrets, external: str | None, cache: bool = False) -> str:
    """The Redis URL the feature service (`cache`: the cache service) gets: its supervised Valkey's (its config
    written, with the secrets' password: services.common.embedded.FEATURE_STORE or CACHE), else `external`."""
    port = layout.valkey_cache_port if cache else layout.valkey_port
    if port is None:
        if external is None:
            raise ValueError("an external Redis needs its URL (or give the layout a Valkey port)")
        return external
    from services.common.embedded import CACHE, FEATURE_STORE, write_valkey_config
    from services.common.embedded import redis_url as valkey_url

    password = secrets.valkey_password()
    config = layout.valkey_cache_config if cache else layout.valkey_config
    write_valkey_config(config, layout.host, port, password, CACHE if cache else FEATURE_STORE)
    return valkey_url(layout.host, port, password)


def supervise(run: StackRun, policy: BackoffPolicy | None, stop_timeout_s: float) -> Supervisor:
    """The supervisor of the run's processes (stack.json kept current across restarts); prints the ports table."""

    def on_spawn(_: object) -> None:  # a restart changes a pid: keep stack.json current
        if run.state_path.exists():
            run.save_state()

    supervisor = Supervisor(
        run.specs, run.log_dir, policy, run.notify, stop_timeout_s=stop_timeout_s, on_spawn=on_spawn
    )
    run.console.print(ports_table(run.specs, run.redis_url))
    run.console.print(f"logs: {run.log_dir}/<service>.log; secrets: {run.secrets.dir}")
    return supervisor


async def reach_entry(run: StackRun) -> Endpoint | None:
    """The stack's entry: the gateway, or with the mesh the ingress once it answers SERVING and Envoy counts every
    replica healthy; None when a signal or a failure came first."""
    layout = run.layout
    if not layout.mesh:
        return Endpoint(layout.service_address(layout.gateways[0].name, layout.gateway_port))
    secure = not layout.insecure
    address = layout.address(layout.ingress_port)
    endpoint = Endpoint(address, run.secrets.ca_pem(), run.secrets.mint("demo")) if secure else Endpoint(address)
    if not await run.until_stopped(wait_grpc_serving(endpoint, 30.0)):
        return None
    if not await run.until_stopped(wait_in_rotation(layout, 30.0)):
        return None
    how = "TLS, JWT" if secure else "plaintext, no token"
    run.notify(f"ingress {address} ({how}) reaches the gateway through Envoy")
    return endpoint


def announce(run: StackRun, endpoint: Endpoint, example: bool = True) -> None:
    """`stack is up` with the entry and the demo command, where the trace UI is, and with `example` how to call the
    entry yourself (a run with a demo prints that after the demo instead)."""
    layout, console = run.layout, run.console
    entry = endpoint.address
    console.print(
        f"[green]stack is up[/]: {'ingress' if layout.mesh else 'gateway'} at {entry} "
        f"(try `meshserve demo --address {entry}{_log_dir_flag(_custom_log_dir(run.log_dir))}`); Ctrl-C stops it",
        highlight=False,
        soft_wrap=True,
    )
    if (ui := trace_ui_url(layout)) is not None:
        kept = (
            "every request recorded; slow, failed, degraded and 1% kept"
            if layout.tracing_mode == "retroactive"
            else "head sampling"
        )
        from services.traces.web import with_token

        try:  # the stack's specs made it; `meshserve traces ui` opens it
            login = with_token(ui, run.secrets.ui_token())
        except SecretsError:
            login = ui
        console.print(f"trace UI at {login} (search, waterfalls, hotspots; {kept})", highlight=False, soft_wrap=True)
    if example:
        from services.cli.howto import how_to_call

        ca = run.secrets.ca_cert if endpoint.tls else None
        console.rule()
        console.print(
            how_to_call(entry, ca, _custom_log_dir(run.log_dir)), highlight=False, markup=False, soft_wrap=True
        )


def _custom_log_dir(log_dir: Path) -> Path | None:
    """`log_dir` unless it is the default one (which the commands find themselves, from any folder)."""
    return None if log_dir.resolve() == default_log_dir().resolve() else log_dir


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
    endpoint: Endpoint,
    seconds: float,
    console: Console,
    ca: Path | None = None,
    log_dir: Path | None = None,
    then: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """The demo's live view for `seconds`, its summary, `then` (the scale-to-zero show), then how to call the
    endpoint; keeps serving after."""
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
    if then is not None:
        await then()
    console.rule()
    console.print(how_to_call(endpoint.address, ca, log_dir), highlight=False, markup=False, soft_wrap=True)
    console.print(f"[green]still serving at {endpoint.address}[/]; Ctrl-C stops everything", highlight=False)


async def show_scale_to_zero(run: StackRun, endpoint: Endpoint) -> None:
    """After the demo: a group that may sleep (the canary when there is one) going to zero once its window passes
    without demand, then coming back on a few requests (services.cli.demo.scale_to_zero_demo)."""
    from services.cli.demo import scale_to_zero_demo

    sleepers = [g for g in run.layout.autoscaled if g.min_replicas == 0]
    if run.autoscaler is None or not sleepers:
        return
    await scale_to_zero_demo(run.autoscaler, sleepers[-1], endpoint, run.console)


def trace_ui_url(layout: StackLayout) -> str | None:
    """The trace store's web UI, when the stack runs one."""
    if layout.traces_ui_port is None:
        return None
    return f"http://{layout.address(layout.traces_ui_port)}/"


async def wait_grpc_serving(endpoint: Endpoint, timeout_s: float) -> None:
    """Until the endpoint answers grpc.health.v1 SERVING; StackError after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await grpc_health(endpoint.address, root_certificates=endpoint.root_certificates):
        if loop.time() > deadline:
            raise StackError(f"{endpoint.address} not SERVING after {timeout_s:.0f}s")
        await asyncio.sleep(0.2)
