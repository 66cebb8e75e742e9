"""`meshserve up --topology edge_cloud`: the cloud stack, then the edge stack that calls it, each under its own
supervisor in its own state dir, until Ctrl-C or SIGTERM; then the edge stops first."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from services.cli.connect import Endpoint
from services.cli.stack.credentials import StackSecrets
from services.cli.stack.layout import MESH_DIR
from services.cli.stack.mesh import mesh_topology, served_splits
from services.cli.stack.specs import build_specs, busy_ports
from services.cli.stack.state import STATE_FILE
from services.cli.stack.supervisor import BackoffPolicy
from services.cli.stack.tiers.layout import (
    CLOUD_TOKEN_SUBJECT,
    CLOUD_TOKEN_TTL_S,
    TIERS,
    TierLayouts,
    state_summary,
    tier_env,
    write_cloud_token,
)
from services.cli.stack.up import (
    StackRun,
    _custom_log_dir,
    _log_dir_flag,
    announce,
    reach_entry,
    shut_down,
    stack_redis_url,
    stop_on_signals,
    supervise,
)

if TYPE_CHECKING:
    from services.mesh import LocalMesh


@dataclass
class TierRun(StackRun):
    """One tier's run: a StackRun whose messages say which tier they are about."""

    tier: str = ""

    def notify(self, message: str) -> None:
        self.console.print(
            f"[dim]{time.strftime('%H:%M:%S')}[/] [bold]{self.tier}[/] {message}", highlight=False, soft_wrap=True
        )


def egress_mesh(layouts: TierLayouts, secrets: StackSecrets, cloud: StackSecrets) -> LocalMesh:
    """The edge's mesh: its own services, plus the egress listener to the cloud's ingress (the WAN delay on its
    route) when services.mesh renders one."""
    from services.mesh import LocalMesh, MeshTopology

    edge = layouts.edge
    topology = mesh_topology(edge, secrets)
    if "egress" in MeshTopology.model_fields:
        topology = topology.model_copy(update={"egress": egress_settings(layouts, cloud)})
    mesh = LocalMesh(topology, edge.istio_paths, layouts.tier_dir("edge") / MESH_DIR)
    mesh.overrides.update(served_splits(mesh, {"model": {g.subset for g in edge.groups}}))
    mesh.render()
    return mesh


def egress_settings(layouts: TierLayouts, cloud: StackSecrets) -> Any:
    """The edge Envoy's egress listener as services.mesh takes it: where it listens and the cloud ingress it leads
    to, over TLS trusting the cloud's CA unless the cloud is insecure (the WAN delay is its route's, istio/edge)."""
    from services.mesh.topology import Egress

    secure = not layouts.cloud.insecure
    return Egress(
        listen=layouts.egress,
        cloud_ingress=layouts.cloud.address(layouts.cloud.ingress_port),
        tls_ca=cloud.ca_cert if secure else None,
    )


def cloud_mesh(layouts: TierLayouts, secrets: StackSecrets) -> LocalMesh:
    """The cloud's mesh: a single-tier stack's."""
    from services.cli.stack.mesh import prepare_mesh

    return prepare_mesh(layouts.cloud, layouts.tier_dir("cloud") / MESH_DIR, secrets)


def gateway_tier_settings(layouts: TierLayouts, tier: str, runs: dict[str, TierRun], egress: bool) -> dict[str, Any]:
    """The tier settings of a tier's gateways: `cloud`; or `edge` with the cloud's URL (the egress listener, or
    the cloud ingress itself when the mesh renders no egress), a token minted from the cloud's signing key, and
    the cloud's CA when the gateway itself speaks TLS to the cloud ingress."""
    if tier == "cloud":
        return {"tier": "cloud"}
    cloud = runs["cloud"]
    token = write_cloud_token(
        StackSecrets.of(layouts.tier_dir("edge")).dir, cloud.secrets.mint(CLOUD_TOKEN_SUBJECT, CLOUD_TOKEN_TTL_S)
    )
    direct_tls = not layouts.cloud.insecure and not egress
    return {
        "tier": "edge",
        "cloud_url": layouts.egress if egress else layouts.cloud.address(layouts.cloud.ingress_port),
        "cloud_token_file": str(token),
        "cloud_tls_ca_file": str(cloud.secrets.ca_cert) if direct_tls else None,
    }


def prepare_tier(
    layouts: TierLayouts, tier: str, console: Console, stop: asyncio.Event, runs: dict[str, TierRun]
) -> TierRun:
    """A tier's run before it starts: its secrets, its mesh rendered, Valkey's config, its process specs."""
    from services.mesh import MeshTopology

    layout, tier_dir = layouts.layout(tier), layouts.tier_dir(tier)
    tier_dir.mkdir(parents=True, exist_ok=True)
    if layout.socket_dir is not None:  # as run_stack: the services bind their sockets in it, this user only
        from services.cli.stack.layout import ensure_socket_dir

        ensure_socket_dir(layout.socket_dir)
    secrets = StackSecrets.ensure(tier_dir, hosts=[layout.host])
    egress = tier == "edge" and "egress" in MeshTopology.model_fields
    mesh = egress_mesh(layouts, secrets, runs["cloud"].secrets) if tier == "edge" else cloud_mesh(layouts, secrets)
    run = TierRun(layout, tier_dir, console, secrets, stop, mesh=mesh, tier=tier)
    run.redis_url = stack_redis_url(layout, secrets, None)
    cache_url = stack_redis_url(layout, secrets, run.redis_url, cache=True)  # the cache's own Valkey, if any
    run.specs = build_specs(layout, run.redis_url, mesh.envoy.command, secrets, cache_redis_url=cache_url)
    tier_env(run.specs, layouts.topology.tier(tier), gateway_tier_settings(layouts, tier, runs, egress))
    return run


async def start_tier(run: TierRun, policy: BackoffPolicy | None, start_timeout_s: float, stop_s: float) -> bool:
    """Start a tier's processes and wait until its ingress reaches its gateway; its stack.json written. False
    when a port is taken, a process did not start, or a signal came first."""
    busy = busy_ports(run.layout, run.specs)
    if busy:
        run.console.print(f"[red]{run.tier}: ports in use[/]: {'; '.join(busy)} (choose others with --port-base)")
        return False
    run.console.rule(f"{run.tier} tier")
    run.supervisor = supervise(run, policy, stop_s)
    if not await run.until_stopped(run.supervisor.start(start_timeout_s)):
        return False
    if await reach_entry(run) is None:
        return False
    run.save_state()
    return True


def write_top_state(layouts: TierLayouts) -> dict[str, Any]:
    """`<log_dir>/stack.json` for the clients and `meshserve status`/`down`: the edge's entry, both tiers' dirs."""
    states = {name: json.loads((layouts.tier_dir(name) / STATE_FILE).read_text()) for name in TIERS}
    state = state_summary(layouts, states)
    path = layouts.log_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(path)
    return state


async def run_tiers(
    layouts: TierLayouts,
    console: Console,
    start_timeout_s: float = 120.0,
    stop_timeout_s: float = 15.0,
    policy: BackoffPolicy | None = None,
    demo_s: float = 0.0,
) -> int:
    """Run the cloud tier, then the edge tier, until a signal; 0 after a clean stop, 1 when a tier could not
    start. With `demo_s`, a mix of sensitive and general traffic to the edge's ingress for that long once both
    are up, and its summary per tier (services.cli.tier_demo).

    Raises services.mesh.MeshConfigError when `istio/` cannot be rendered for a tier's mesh.
    """
    stop = stop_on_signals()
    layouts.log_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, TierRun] = {}
    try:
        for tier in TIERS:
            runs[tier] = prepare_tier(layouts, tier, console, stop, runs)
            if not await start_tier(runs[tier], policy, start_timeout_s, stop_timeout_s):
                return runs[tier].exit_code()
        state = write_top_state(layouts)
        edge = runs["edge"]
        endpoint = Endpoint(state["ingress"], edge.secrets.ca_pem(), edge.secrets.mint("demo"))
        if layouts.edge.insecure:
            endpoint = Endpoint(state["ingress"])
        announce(edge, endpoint, example=demo_s <= 0)
        console.print(
            f"cloud ingress at {state['cloud_ingress']}; the edge reaches it through {state['egress']} "
            f"(+{state['wan_delay_ms']} ms WAN, istio/edge); `meshserve status` shows both tiers, `meshserve demo "
            f"--tier-mix 0.5{_log_dir_flag(_custom_log_dir(layouts.log_dir))}` sends sensitive and general requests",
            highlight=False,
            soft_wrap=True,
        )
        if demo_s > 0:
            from services.cli.tier_demo import run_tier_demo_and_explain

            await edge.until_stopped(run_tier_demo_and_explain(endpoint, demo_s, console, layouts.log_dir))
        await stop.wait()
        return 0
    finally:
        for tier in reversed(TIERS):
            if tier in runs:
                await shut_down(runs[tier])
        (layouts.log_dir / STATE_FILE).unlink(missing_ok=True)


def stop_running(log_dir: Path, timeout_s: float = 60.0) -> str:
    """`meshserve down`: SIGTERM to the `meshserve up` whose stack.json is in `log_dir`, then wait until it has
    stopped (its stack.json gone); what happened, in words. ProcessLookupError when it is not running."""
    import os
    import signal

    from services.cli.stack.state import read_state

    state = read_state(log_dir)
    if state is None or not isinstance(state.get("pid"), int):
        raise ProcessLookupError(f"no running stack in {log_dir} (no stack.json with the pid of `meshserve up`)")
    pid = int(state["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while (log_dir / STATE_FILE).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if (log_dir / STATE_FILE).exists():
        return f"sent SIGTERM to {pid}; still stopping after {timeout_s:.0f} s"
    tiers = ", ".join(state.get("tiers") or {}) or "the stack"
    return f"stopped {tiers} ({pid})"
