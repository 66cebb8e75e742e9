"""`meshserve status`: the health of each process of the local stack (grpc.health.v1, Envoy's /ready, Valkey's
PING with its password, and the ingress, over TLS when it is secure), and the model replicas per subset with the
autoscaler's last decision."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from services.cli.connect import read_state
from services.cli.stack.autoscaler import read_autoscale
from services.cli.stack.credentials import SecretsError, StackSecrets
from services.cli.stack.layout import StackLayout
from services.cli.stack.specs import build_specs
from services.cli.stack.supervisor import http_ok
from services.common.embedded import ping
from services.mesh.admin import EnvoyAdmin

HEALTHY = ("SERVING", "READY", "PONG")


def grpc_status(address: str, timeout_s: float = 1.0, root_certificates: bytes | None = None) -> str:
    """SERVING, NOT_SERVING, ... or DOWN when nothing answers (over TLS trusting `root_certificates` when given)."""
    if root_certificates is not None:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=root_certificates))
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            down = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            return "DOWN" if down else e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@dataclass(frozen=True)
class Probe:
    """One row of the table: what to ask (`kind`: grpc, http, envoy or redis) at `target` (host:port, URL, or
    Envoy's admin address, which may be unix:/path)."""

    name: str
    kind: str
    target: str
    password: str = ""
    root_certificates: bytes | None = None

    def check(self) -> str:
        if self.kind == "http":
            return "READY" if http_ok(self.target, 1.0) else "DOWN"
        if self.kind == "envoy":
            return "READY" if EnvoyAdmin(self.target, 1.0).ready() else "DOWN"
        if self.kind == "redis":
            host, _, port = self.target.rpartition(":")
            return ping(host, int(port), self.password)
        return grpc_status(self.target, root_certificates=self.root_certificates)


def _password(secrets_dir: str | None) -> str:
    if not secrets_dir:
        return ""
    try:
        return StackSecrets(Path(secrets_dir)).valkey_password()
    except SecretsError:
        return ""


def targets(log_dir: Path, port_base: int) -> list[Probe]:
    """What to probe, from the running stack's stack.json, else the default layout of `port_base`."""
    state = read_state(log_dir)
    if state is not None:
        out = []
        for s in state["services"]:
            if s.get("health_url"):
                out.append(Probe(s["name"], "http", s["health_url"]))
            elif s.get("envoy_admin"):
                out.append(Probe(s["name"], "envoy", s["envoy_admin"]))
            elif s.get("protocol") == "redis" and s.get("address"):
                out.append(Probe(s["name"], "redis", s["address"], password=_password(state.get("secrets_dir"))))
            elif s.get("address"):
                out.append(Probe(s["name"], "grpc", s["address"]))
        if state.get("ingress"):
            root = None
            if state.get("tls_ca") and not state.get("insecure", True):
                try:
                    root = Path(state["tls_ca"]).read_bytes()
                except OSError:
                    root = b""  # an unreadable CA fails the TLS handshake: the row says so
            out.append(Probe("ingress", "grpc", state["ingress"], root_certificates=root))
        return out
    layout = StackLayout.local(port_base, models_dir=Path("."), valkey=True, log_dir=log_dir)
    password = _password(str(StackSecrets.of(log_dir).dir))
    return [
        Probe(s.name, s.protocol, s.address, password=password if s.protocol == "redis" else "")
        for s in build_specs(layout, redis_url="")
        if s.address
    ]


def replica_rows(log_dir: Path) -> list[tuple[str, str, str, str]]:
    """(subset, "current / min / max", model, last decision) of each model group of the stack running in
    `log_dir`: its count from the autoscaler when the group scales, else from stack.json."""
    state = read_state(log_dir)
    if state is None:
        return []
    scaling = read_autoscale(log_dir) or {}
    scaled = scaling.get("groups") or {}
    decisions = scaling.get("decisions") or []
    rows = []
    for g in state.get("groups") or []:
        subset = str(g.get("subset"))
        live = scaled.get(subset) or {}
        current = live.get("replicas", len(g.get("replicas") or []))
        last = next((d for d in reversed(decisions) if d.get("subset") == subset), None)
        said = f"{last['time']}: {last['from']} -> {last['to']} ({last['reason']})" if last else ""
        if not said and g.get("min") != g.get("max"):
            said = "none yet"
        scales_on = str(g.get("model") or "") if g.get("min") != g.get("max") else "(fixed)"
        rows.append((subset, f"{current} / {g.get('min')} / {g.get('max')}", scales_on, said))
    return rows


def starting(log_dir: Path) -> set[str]:
    """The model replicas of groups that scale which stack.json lists (spawned) but the autoscaler does not count
    yet: still starting, not failing."""
    state = read_state(log_dir) or {}
    scaled = (read_autoscale(log_dir) or {}).get("groups") or {}
    out: set[str] = set()
    for g in state.get("groups") or []:
        group = scaled.get(str(g.get("subset")))
        if group is not None:
            out |= set(g.get("replicas") or []) - set(group.get("running") or [])
    return out


def check_all(log_dir: Path, port_base: int, console: Console) -> int:
    """Print the health table, then the replicas per subset; 0 when every process is healthy (or a replica the
    autoscaler is starting), else 1. A stack of tiers (`up --topology edge_cloud`): a table per tier."""
    tiers = (read_state(log_dir) or {}).get("tiers")
    if isinstance(tiers, dict) and tiers:
        codes = [check_stack(Path(str(d)), port_base, console, f"{name} tier") for name, d in tiers.items()]
        return int(any(codes))
    return check_stack(log_dir, port_base, console)


def check_stack(log_dir: Path, port_base: int, console: Console, title: str = "meshserve stack") -> int:
    """One stack's health table and replicas per subset; 0 when healthy, else 1."""
    table = Table(title=title)
    for column in ("service", "address", "health"):
        table.add_column(column)
    unhealthy = 0
    coming = starting(log_dir)
    for probe in targets(log_dir, port_base):
        status = probe.check()
        if status not in HEALTHY and probe.name in coming:
            status = "STARTING"
        ok = status in (*HEALTHY, "STARTING")
        unhealthy += not ok
        color = "yellow" if status == "STARTING" else "green" if ok else "red"
        table.add_row(probe.name, probe.target, f"[{color}]{status}[/]")
    console.print(table)
    rows = replica_rows(log_dir)
    if rows:
        replicas = Table(title="model replicas")
        for column in ("subset", "replicas (current / min / max)", "scales on", "last scaling decision"):
            replicas.add_column(column)
        for row in rows:
            replicas.add_row(*row)
        console.print(replicas)
    return int(unhealthy > 0)
