"""`meshserve status`: the health of each process of the local stack (grpc.health.v1, or Envoy's /ready)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from services.cli.layout import StackLayout
from services.cli.specs import build_specs
from services.cli.stack import http_ok
from services.cli.up import STATE_FILE


def grpc_status(address: str, timeout_s: float = 1.0) -> str:
    """SERVING, NOT_SERVING, ... or DOWN when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            down = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            return "DOWN" if down else e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def targets(log_dir: Path, port_base: int) -> list[tuple[str, str, str]]:
    """(name, "grpc"|"http", address or URL) from the running stack's stack.json, else the default layout."""
    state = log_dir / STATE_FILE
    if state.is_file():
        data = json.loads(state.read_text())
        out = [
            (s["name"], "http", s["health_url"]) if s.get("health_url") else (s["name"], "grpc", s["address"])
            for s in data["services"]
            if s.get("address") or s.get("health_url")
        ]
        if data.get("ingress"):
            out.append(("ingress", "grpc", data["ingress"]))
        return out
    specs = build_specs(StackLayout.local(port_base, models_dir=Path(".")), redis_url="")
    return [(s.name, "grpc", s.address) for s in specs if s.address]


def check_all(log_dir: Path, port_base: int, console: Console) -> int:
    """Print a table; 0 when every process is healthy, else 1."""
    table = Table(title="meshserve stack")
    for column in ("service", "address", "health"):
        table.add_column(column)
    unhealthy = 0
    for name, kind, target in targets(log_dir, port_base):
        if kind == "http":
            status = "READY" if http_ok(target, 1.0) else "DOWN"
        else:
            status = grpc_status(target)
        ok = status in ("SERVING", "READY")
        unhealthy += not ok
        table.add_row(name, target, f"[{'green' if ok else 'red'}]{status}[/]")
    console.print(table)
    return int(unhealthy > 0)
