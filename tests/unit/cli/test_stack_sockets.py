"""The local stack on Unix sockets (the default with a log dir): where each service listens and its callers reach it,
what the mesh renders, the sockets' folder, and health probes over a socket."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2_grpc

from services.cli.stack.credentials import StackSecrets
from services.cli.stack.layout import StackLayout, ensure_socket_dir
from services.cli.stack.mesh import mesh_topology, prepare_mesh
from services.cli.stack.specs import build_specs
from services.cli.stack.supervisor import check_health
from services.cli.stack.topology import StackTopology

SERVICES = ("gateway", "model-v1-a", "model-v1-b", "model-v2", "feature", "cache")


def layout(tmp_path: Path, **options: object) -> StackLayout:
    return StackLayout.local(0, models_dir=tmp_path, mesh=True, log_dir=tmp_path / "logs", **options)  # type: ignore[arg-type]


def test_every_service_listens_on_a_socket_of_the_state_dir_and_only_tcp_ports_are_outside(tmp_path: Path) -> None:
    t = layout(tmp_path, valkey=True, traces=True, admin_socket=True)
    sockets = (tmp_path / "logs").resolve() / "sockets"
    specs = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy"])}
    for name in SERVICES:
        spec = specs[name]
        service = "model" if name.startswith("model") else name
        assert spec.address == f"unix:{sockets}/{name}.sock" and spec.port is None
        assert spec.env[f"MESHSERVE_{service.upper()}_UNIX_SOCKET"] == str(sockets / f"{name}.sock")
    owners = {owner for owner, _ in t.ports()}
    assert not owners & set(SERVICES) and not t.listen_ports  # no gRPC port of a service, no mesh listener port
    assert {"envoy ingress", "valkey", "traces", "gateway metrics"} <= owners


def test_the_gateway_calls_through_the_meshs_sockets_and_without_the_mesh_the_services_sockets(tmp_path: Path) -> None:
    sockets = (tmp_path / "logs").resolve() / "sockets"
    env = {s.name: s.env for s in build_specs(layout(tmp_path), "redis://x:1", envoy_command=["envoy"])}["gateway"]
    for service in ("model", "feature", "cache"):
        assert env[f"MESHSERVE_GATEWAY_{service.upper()}_ADDRESS"] == f"unix:{sockets}/mesh-{service}.sock"
    bare = StackLayout.local(0, models_dir=tmp_path, log_dir=tmp_path / "logs")
    env = {s.name: s.env for s in build_specs(bare, "redis://x:1")}["gateway"]
    assert env["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == f"unix:{sockets}/model-v1-a.sock"
    assert env["MESHSERVE_GATEWAY_FEATURE_ADDRESS"] == f"unix:{sockets}/feature.sock"


def test_the_scaler_of_a_scaling_stack_is_a_socket_too(tmp_path: Path) -> None:
    topology = StackTopology.load(Path(__file__).resolve().parents[3] / "services/cli/stack/elastic_topology.yaml")
    t = layout(tmp_path, topology=topology)
    specs = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy"])}
    scaler = f"unix:{t.socket_dir}/scaler.sock"
    assert specs["scaler"].address == scaler and specs["gateway"].env["MESHSERVE_GATEWAY_SCALER_ADDRESS"] == scaler


def test_the_mesh_renders_pipes_for_listeners_and_replicas(tmp_path: Path) -> None:
    t = layout(tmp_path, admin_socket=True)
    secrets = StackSecrets.ensure(tmp_path / "logs", hosts=[t.host])
    topo = mesh_topology(t, secrets)
    assert topo.services["model"].listen == f"unix:{t.socket_dir}/mesh-model.sock"
    assert {r.address for r in topo.services["model"].replicas} == {
        f"unix:{t.socket_dir}/{name}.sock" for name in ("model-v1-a", "model-v1-b", "model-v2")
    }
    mesh = prepare_mesh(t, tmp_path / "logs" / "mesh", secrets)
    boot = yaml.safe_load(mesh.config_path.read_text())
    listeners = {item["name"]: item["address"] for item in boot["static_resources"]["listeners"]}
    assert "socket_address" in listeners.pop("ingress")
    assert listeners == {
        s: {"pipe": {"path": f"{t.socket_dir}/mesh-{s}.sock", "mode": 0o600}}
        for s in ("gateway", "model", "feature", "cache")
    }


def test_a_tcp_layout_stays_available(tmp_path: Path) -> None:
    t = layout(tmp_path, sockets=False)
    specs = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy"])}
    assert t.socket_dir is None and specs["feature"].address == f"127.0.0.1:{t.feature_port}"
    assert specs["gateway"].env["MESHSERVE_GATEWAY_MODEL_ADDRESS"] == f"127.0.0.1:{t.listen_ports['model']}"
    assert "MESHSERVE_FEATURE_UNIX_SOCKET" not in specs["feature"].env


def test_the_sockets_folder_is_the_owners_alone(tmp_path: Path) -> None:
    folder = tmp_path / "logs" / "sockets"
    ensure_socket_dir(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    folder.chmod(0o755)  # a leftover opened up
    ensure_socket_dir(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "link")
    with pytest.raises(PermissionError):
        ensure_socket_dir(tmp_path / "link")


async def test_health_probes_reach_a_service_on_its_socket(tmp_path: Path) -> None:
    t = layout(tmp_path)
    assert t.socket_dir is not None
    ensure_socket_dir(t.socket_dir)
    spec = {s.name: s for s in build_specs(t, "redis://x:1", envoy_command=["envoy"])}["cache"]
    assert not await check_health(spec)  # nothing listens yet
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    server.add_insecure_port(spec.address or "")
    await server.start()
    try:
        assert await check_health(spec)
    finally:
        await server.stop(0)


def test_up_refuses_a_sockets_folder_that_is_not_its_users(tmp_path: Path) -> None:
    from rich.console import Console

    from services.cli.stack.up import socket_dir_ready

    t = layout(tmp_path)
    assert t.socket_dir is not None
    t.socket_dir.parent.mkdir(parents=True)
    os.symlink(tmp_path, t.socket_dir)  # planted: its target may be anyone's
    console = Console(record=True, width=200)
    assert not socket_dir_ready(t, console) and "not a folder of this user's" in console.export_text()
    os.unlink(t.socket_dir)
    assert socket_dir_ready(t, console) and t.socket_dir.is_dir()


def test_a_socket_something_answers_on_is_busy_and_a_leftover_one_is_not(tmp_path: Path) -> None:
    import socket

    from services.cli.stack.specs import busy_ports

    t = layout(tmp_path)
    assert t.socket_dir is not None
    ensure_socket_dir(t.socket_dir)
    specs = build_specs(t, "redis://x:1", envoy_command=["envoy"])
    feature = t.socket_dir / "feature.sock"
    with socket.socket(socket.AF_UNIX) as leftover:  # a crashed run's file: nobody listens
        leftover.bind(str(feature))
    assert not [b for b in busy_ports(t, specs) if b.startswith("socket")]
    feature.unlink()
    with socket.socket(socket.AF_UNIX) as running:  # a stack running in this log dir
        running.bind(str(feature))
        running.listen()
        assert [b for b in busy_ports(t, specs) if b.startswith("socket")] == [f"socket {feature}"]
