"""A topology on Unix sockets: listeners Envoy binds as owner-only pipes, clusters and EDS files that reach replicas
on sockets, /clusters hosts named by their path, and addresses that cannot be a socket refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from services.mesh.admin import EnvoyAdmin
from services.mesh.bootstrap import render
from services.mesh.loader import load_istio
from services.mesh.local import LocalMesh
from services.mesh.topology import MeshEndpoint, MeshService, MeshTopology, host_key
from tests.unit.mesh.conftest import ISTIO
from tests.unit.mesh.test_dynamic_endpoints import FakeClusters, admin_address, clusters_text

__all__ = ["admin_address"]  # the fixture, from the dynamic endpoints' tests
RUN = Path("/run/stack/sockets")
ALL, V1 = "outbound|grpc||model", "outbound|grpc|v1|model"


def socket_topology(dynamic: bool = False, admin: str = f"unix:{RUN}/admin.sock") -> MeshTopology:
    """Every service's listener and replicas on sockets in RUN; the ingress on TCP."""

    def svc(name: str, versions: list[str]) -> MeshService:
        replicas = [
            MeshEndpoint(address=f"unix:{RUN}/{name}-{i}.sock", labels={"version": v}) for i, v in enumerate(versions)
        ]
        return MeshService(listen=f"unix:{RUN}/mesh-{name}.sock", replicas=replicas, dynamic=dynamic)

    services = {"gateway": svc("gateway", ["v1"]), "model": svc("model", ["v1", "v2"])}
    services |= {"feature": svc("feature", ["v1"]), "cache": svc("cache", ["v1"])}
    return MeshTopology(services=services, ingress="127.0.0.1:8080", admin=admin)


def bootstrap(topo: MeshTopology) -> dict[str, Any]:
    return render(load_istio([ISTIO]), topo, Path("/w/routes"), endpoints_dir=Path("/w/endpoints")).bootstrap


def test_listeners_of_services_are_owner_only_pipes_and_the_ingress_stays_tcp() -> None:
    rendered = bootstrap(socket_topology())["static_resources"]["listeners"]
    listeners = {item["name"]: item["address"] for item in rendered}
    assert listeners["ingress"] == {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}
    for name in ("gateway", "model", "feature", "cache"):
        assert listeners[name] == {"pipe": {"path": f"{RUN}/mesh-{name}.sock", "mode": 0o600}}


def test_static_clusters_reach_replicas_on_pipes() -> None:
    clusters = {c["name"]: c for c in bootstrap(socket_topology())["static_resources"]["clusters"]}
    hosts = [e["endpoint"]["address"] for e in clusters[V1]["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert hosts == [{"pipe": {"path": f"{RUN}/model-0.sock"}}]  # the v1 subset: only the v1 replica
    every = clusters[ALL]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [e["endpoint"]["address"]["pipe"]["path"] for e in every] == [f"{RUN}/model-0.sock", f"{RUN}/model-1.sock"]
    assert clusters[ALL]["health_checks"][0]["grpc_health_check"] == {"service_name": ""}


def test_endpoint_files_of_a_dynamic_service_hold_pipes(tmp_path: Path) -> None:
    mesh = LocalMesh(socket_topology(dynamic=True, admin="127.0.0.1:9901"), [ISTIO], tmp_path)
    mesh.render()
    added = MeshEndpoint(address=f"unix:{RUN}/model-7.sock", labels={"version": "v1"})
    mesh.set_endpoints("model", [added], wait=False)
    doc = yaml.safe_load((mesh.endpoints_dir / f"{V1}.yaml").read_text())
    [resource] = doc["resources"]
    assert [e["endpoint"]["address"] for e in resource["endpoints"][0]["lb_endpoints"]] == [
        {"pipe": {"path": f"{RUN}/model-7.sock"}}
    ]
    assert LocalMesh.attach(tmp_path).topology.services["model"].replicas == [added]


def test_set_endpoints_waits_for_the_socket_paths_envoy_lists(tmp_path: Path, admin_address: str) -> None:
    mesh = LocalMesh(socket_topology(dynamic=True, admin=admin_address), [ISTIO], tmp_path)
    mesh.render()
    new = [MeshEndpoint(address=f"unix:{RUN}/model-7.sock")]
    path = host_key(new[0].address)
    assert path == f"{RUN}/model-7.sock"
    FakeClusters.body = clusters_text({ALL: {path: "healthy"}})
    with pytest.raises(TimeoutError, match=r"cluster 'outbound\|grpc\|v1\|model'"):
        mesh.set_endpoints("model", new, timeout=0.2, healthy=True)
    FakeClusters.body = clusters_text({ALL: {path: "healthy"}, V1: {path: "healthy"}})
    mesh.set_endpoints("model", new, timeout=0.5, healthy=True)
    assert EnvoyAdmin(admin_address).hosts(V1) == {path: {"health_flags": "healthy"}}


@pytest.mark.parametrize(
    "address", ["unix:relative.sock", "unix:/" + "d" * 100 + ".sock", "/abs/no-prefix.sock", "unix:"]
)
def test_addresses_that_cannot_be_sockets_are_refused(address: str) -> None:
    with pytest.raises(ValidationError):
        MeshEndpoint(address=address)
    with pytest.raises(ValidationError):
        MeshService(listen=address)
