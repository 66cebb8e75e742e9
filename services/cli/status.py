"""`meshserve status`: the grpc.health.v1 status of each service of the local stack."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console
from rich.table import Table

from services.cli.topology import Topology, build_specs
from services.cli.up import STATE_FILE


def health(address: str, timeout_s: float = 1.0) -> str:
    """SERVING, NOT_SERVING, ... or DOWN when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout_s)
        except grpc.RpcError as e:
            down = e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            return "DOWN" if down else e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def services(log_dir: Path, port_base: int) -> list[tuple[str, str]]:
    """(name, address) from the running stack's stack.json, else from the default layout of `port_base`."""
    state = log_dir / STATE_FILE
    if state.is_file():
        data = json.loads(state.read_text())
        return [(s["name"], s["address"]) for s in data["services"] if s.get("address")]
    specs = build_specs(Topology.local(port_base, models_dir=Path(".")), redis_url="")
    return [(s.name, s.address) for s in specs if s.address]


def check_all(log_dir: Path, port_base: int, console: Console) -> int:
    """Print a table; 0 when every service is SERVING, else 1."""
    table = Table(title="meshserve stack")
    table.add_column("service")
    table.add_column("address")
    table.add_column("health")
    worst = 0
    for name, address in services(log_dir, port_base):
        status = health(address)
        colour = "green" if status == "SERVING" else "red"
        worst = worst or int(status != "SERVING")
        table.add_row(name, address, f"[{colour}]{status}[/]")
    console.print(table)
    return worst
