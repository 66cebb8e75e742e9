"""Retries and ejection through the real Envoy: a replica failing with UNAVAILABLE, a killed one, an unhealthy one."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from services.mesh import LocalMesh
from tests.helpers.servers import ServiceProcess
from tests.mesh.conftest import FAST_HEALTH, MeshFactory, client_of, infer
from tests.mesh.fakes import INFER, FakeReplica, echo, forward_to, unavailable

V1 = "outbound|grpc|v1|model"


@pytest.fixture()
def fakes() -> Iterator[list[FakeReplica]]:
    started: list[FakeReplica] = []
    yield started
    for fake in started:
        fake.stop()


def ejections(mesh: LocalMesh, cluster: str = V1) -> int:
    return mesh.admin.stat(f"cluster.{cluster}.outlier_detection.ejections_active")


def test_unavailable_replica_is_retried_then_ejected(
    replicas: dict[str, list[ServiceProcess]], make_mesh: MeshFactory, fakes: list[FakeReplica]
) -> None:
    bad = FakeReplica(unavailable).start()
    fakes.append(bad)
    real = replicas["v1"][0].address
    mesh = make_mesh([(real, "v1"), (bad.address, "v1"), (replicas["v2"][0].address, "v2")], health_check=None)
    with client_of(mesh.address("model")) as client:
        answers = [infer(client, {"x-canary": "false"}) for _ in range(60)]  # no request fails
    assert set(answers) <= {"1", "2"}
    tried = sum(1 for method, _ in bad.calls if method == INFER)
    assert 1 <= tried <= 10  # ejected at its 5th consecutive failure (consecutiveGatewayErrors: 5)
    assert ejections(mesh) == 1
    assert "failed_outlier_check" in mesh.admin.hosts(V1)[bad.address]["health_flags"]
    assert mesh.admin.stat(f"cluster.{V1}.upstream_rq_retry") >= 1


def test_killed_replica_is_hidden_and_ejected(
    replicas: dict[str, list[ServiceProcess]], make_mesh: MeshFactory, fakes: list[FakeReplica]
) -> None:
    doomed = FakeReplica(forward_to(replicas["v1"][1].address)).start()
    fakes.append(doomed)
    v2 = replicas["v2"][0].address
    mesh = make_mesh([(replicas["v1"][0].address, "v1"), (doomed.address, "v1"), (v2, "v2")], health_check=None)
    with client_of(mesh.address("model")) as client:
        before = [infer(client) for _ in range(20)]
        assert any(method == INFER for method, _ in doomed.calls)  # it served before being killed
        doomed.stop()
        after = [infer(client) for _ in range(40)]
    assert set(before) | set(after) <= {"1", "2"}  # every call answered
    assert ejections(mesh) == 1
    assert "failed_outlier_check" in mesh.admin.hosts(V1)[doomed.address]["health_flags"]


def test_not_serving_replica_fails_active_health_checks(
    replicas: dict[str, list[ServiceProcess]], make_mesh: MeshFactory, fakes: list[FakeReplica]
) -> None:
    sick = FakeReplica(echo, serving=False).start()
    fakes.append(sick)
    v2 = replicas["v2"][0].address
    mesh = make_mesh([(replicas["v1"][0].address, "v1"), (sick.address, "v1"), (v2, "v2")], health_check=FAST_HEALTH)
    deadline = time.monotonic() + 5
    while "failed_active_hc" not in mesh.admin.hosts(V1).get(sick.address, {}).get("health_flags", ""):
        assert time.monotonic() < deadline, mesh.admin.hosts(V1)
        time.sleep(0.05)
    with client_of(mesh.address("model")) as client:
        answers = [infer(client, {"x-canary": "false"}) for _ in range(30)]
    assert set(answers) <= {"1", "2"}
    assert not any(method == INFER for method, _ in sick.calls)
    sick.set_serving(True)  # back in rotation once a check passes (healthy_threshold 1)
    deadline = time.monotonic() + 5
    while mesh.admin.hosts(V1)[sick.address]["health_flags"] != "healthy":
        assert time.monotonic() < deadline, mesh.admin.hosts(V1)
        time.sleep(0.05)
