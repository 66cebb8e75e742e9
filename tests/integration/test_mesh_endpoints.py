"""The real Envoy follows `LocalMesh.set_endpoints` live: a dynamic service's configuration passes `envoy --mode
validate`; replicas join and leave without a restart and without failing a call, one in flight to a removed replica
included; with no replica a call fails at once with "no healthy upstream", and works again once one is back."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.mesh import LocalMesh, MeshEndpoint, MeshService, MeshTopology
from services.mesh.topology import HealthCheck
from tests.helpers.servers import free_port
from tests.mesh.fakes import INFER, FakeReplica
from tests.unit.mesh.conftest import ISTIO, topology

ALL, V1 = "outbound|grpc||model", "outbound|grpc|v1|model"


def test_a_dynamic_service_passes_envoy_validate(tmp_path: Path) -> None:
    topo = topology()
    topo.services["model"].dynamic = True
    LocalMesh(topo, [ISTIO], tmp_path).validate()
    assert sorted(p.name for p in (tmp_path / "endpoints").iterdir()) == sorted(
        f"outbound|grpc|{s}|model.yaml" for s in ("", "v1", "v2")
    )


class Named:
    """A replica's handler: answers with the replica's name; a call with `x-hold: 1` first waits for `release`."""

    def __init__(self, name: str, release: threading.Event) -> None:
        self.name = name
        self.release = release
        self.holding = threading.Event()

    def __call__(self, method: str, request: bytes, context: grpc.ServicerContext) -> bytes:
        if dict(context.invocation_metadata()).get("x-hold") == "1":
            self.holding.set()
            self.release.wait(10)
        return self.name.encode()


@pytest.fixture()
def release() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # never leave a replica's worker waiting


@pytest.fixture()
def backends(release: threading.Event) -> Iterator[dict[str, tuple[FakeReplica, Named]]]:
    """Two in-process grpc replicas, `a` and `b`, answering with their names."""
    out = {}
    for name in ("a", "b"):
        handler = Named(name, release)
        out[name] = (FakeReplica(handler).start(), handler)
    yield out
    for replica, _ in out.values():
        replica.stop()


@pytest.fixture()
def mesh(tmp_path: Path) -> Iterator[LocalMesh]:
    """The mesh with `model` dynamic and no replica yet; all of the split on subset v1."""
    service = MeshService(listen=f"127.0.0.1:{free_port()}", replicas=[], dynamic=True)
    topo = MeshTopology(
        services={"model": service}, ingress=None, admin=f"127.0.0.1:{free_port()}", health_check=HealthCheck()
    )
    local = LocalMesh(topo, [ISTIO], tmp_path / "mesh", weights={"model": {"v1": 100}}, concurrency=1)
    local.start()
    yield local
    local.stop()


def caller(mesh: LocalMesh) -> Iterator[Callable[..., bytes]]:
    channel = grpc.insecure_channel(mesh.address("model"))
    call: Callable[..., Any] = channel.unary_unary(INFER)
    try:
        yield lambda hold=False: call(b"", timeout=10, metadata=(("x-hold", "1"),) if hold else ())
    finally:
        channel.close()


@pytest.fixture()
def infer(mesh: LocalMesh) -> Iterator[Callable[..., bytes]]:
    """One call to `model` through the mesh; the name of the replica that answered."""
    yield from caller(mesh)


def replica(fake: FakeReplica) -> MeshEndpoint:
    return MeshEndpoint(address=fake.address, labels={"version": "v1"})


def server_info(mesh: LocalMesh) -> tuple[int, int]:
    """(restart epoch, uptime of all epochs in seconds) from Envoy's /server_info."""
    info = json.loads(mesh.admin.get("/server_info"))
    return int(info["command_line_options"]["restart_epoch"]), int(info["uptime_all_epochs"].rstrip("s"))


def test_replicas_join_and_leave_live_and_a_call_in_flight_to_a_removed_one_completes(
    mesh: LocalMesh,
    backends: dict[str, tuple[FakeReplica, Named]],
    infer: Callable[..., bytes],
    release: threading.Event,
) -> None:
    (a, held_by_a), (b, _) = backends["a"], backends["b"]
    assert mesh.envoy.process is not None
    pid, (epoch, uptime) = mesh.envoy.process.pid, server_info(mesh)
    mesh.set_endpoints("model", [replica(a)], healthy=True)
    assert infer() == b"a"
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(infer, True)  # a is the only replica: the held call is on a
        assert held_by_a.holding.wait(5)
        mesh.set_endpoints("model", [replica(a), replica(b)])
        answers = [infer() for _ in range(200)]
        assert b"b" in answers and set(answers) <= {b"a", b"b"}  # b joined; nothing failed meanwhile
        mesh.set_endpoints("model", [replica(b)])  # a leaves while its call is in flight
        assert set(mesh.admin.hosts(V1)) == {b.address}
        assert {infer() for _ in range(20)} == {b"b"}
        assert not slow.done()
        release.set()
        assert slow.result(timeout=5) == b"a"  # the call in flight to the removed replica completed OK
    assert mesh.envoy.running() and mesh.envoy.process.pid == pid
    now_epoch, now_uptime = server_info(mesh)
    assert now_epoch == epoch and now_uptime >= uptime  # the same Envoy, never restarted
    assert mesh.admin.stat(f"cluster.{V1}.membership_change") >= 3
    assert LocalMesh.attach(mesh.workdir).topology.services["model"].replicas == [replica(b)]


def test_no_replica_is_no_healthy_upstream_at_once_and_one_back_serves_again(
    mesh: LocalMesh, backends: dict[str, tuple[FakeReplica, Named]], infer: Callable[..., bytes]
) -> None:
    a, _ = backends["a"]
    mesh.set_endpoints("model", [replica(a)], healthy=True)
    assert infer() == b"a"
    mesh.set_endpoints("model", [])
    assert mesh.admin.hosts(ALL) == {} and mesh.admin.hosts(V1) == {}
    with pytest.raises(grpc.RpcError) as info:
        infer()
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no healthy upstream" in (info.value.details() or "")
    mesh.set_endpoints("model", [replica(a)], healthy=True)  # returns once Envoy would route to it
    assert [infer() for _ in range(5)] == [b"a"] * 5
