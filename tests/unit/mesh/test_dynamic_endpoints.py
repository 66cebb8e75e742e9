"""Dynamic services without a running Envoy: their EDS clusters, the endpoint files per subset, `set_endpoints` (files,
state.json, errors) and its wait on Envoy's /clusters (against an in-process stand-in of the admin interface)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.mesh.bootstrap import render
from services.mesh.errors import MeshConfigError
from services.mesh.loader import load_istio
from services.mesh.local import LocalMesh
from services.mesh.topology import MeshEndpoint, MeshTopology
from tests.unit.mesh.conftest import ISTIO, topology

ALL, V1, V2 = "outbound|grpc||model", "outbound|grpc|v1|model", "outbound|grpc|v2|model"
EDS_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def dynamic_topology(replicas: list[tuple[str, str]] | None = None, **extra: Any) -> MeshTopology:
    """The unit topology with `model` dynamic, holding `replicas` (address, version) if given."""
    topo = topology(**extra)
    topo.services["model"].dynamic = True
    if replicas is not None:
        topo.services["model"].replicas = [MeshEndpoint(address=a, labels={"version": v}) for a, v in replicas]
    return topo


def clusters_of(topo: MeshTopology, endpoints_dir: Path = Path("/w/endpoints")) -> dict[str, dict[str, Any]]:
    boot = render(load_istio([ISTIO]), topo, Path("/w/routes"), endpoints_dir=endpoints_dir).bootstrap
    return {c["name"]: c for c in boot["static_resources"]["clusters"]}


def hosts_in(path: Path) -> list[str]:
    doc = yaml.safe_load(path.read_text())
    [resource] = doc["resources"]
    assert resource["@type"] == EDS_TYPE and doc["version_info"]
    assert resource["cluster_name"] == path.name.removesuffix(".yaml")
    sockets = [e["endpoint"]["address"]["socket_address"] for e in resource["endpoints"][0]["lb_endpoints"]]
    return [f"{s['address']}:{s['port_value']}" for s in sockets]


@pytest.mark.parametrize("name", [ALL, V1, V2])
def test_every_cluster_of_a_dynamic_service_reads_its_endpoints_from_a_watched_file(name: str) -> None:
    out = clusters_of(dynamic_topology(replicas=[]))[name]
    assert out["type"] == "EDS" and "load_assignment" not in out
    assert out["eds_cluster_config"] == {
        "eds_config": {
            "resource_api_version": "V3",
            "path_config_source": {
                "path": f"/w/endpoints/{name}.yaml",
                "watched_directory": {"path": "/w/endpoints"},
            },
        }
    }
    # checked with no endpoint at all, so that a host added later is checked at once; a removed host leaves at once
    [check] = out["health_checks"]
    assert check["grpc_health_check"] == {"service_name": ""}
    assert check["unhealthy_interval"] == check["no_traffic_interval"] == "0.25s"
    assert check["no_traffic_healthy_interval"] == "2s" and check["interval"] == "2s"
    assert out["ignore_health_on_host_removal"] is True
    # health changes are not held back for Envoy's 1 s merge window; Istio's panic threshold from outlierDetection stays
    assert out["common_lb_config"] == {"healthy_panic_threshold": {"value": 0}, "update_merge_window": "0s"}
    assert out["outlier_detection"]["consecutive_5xx"] == 5


def test_other_services_stay_static_and_unchanged() -> None:
    static, dynamic = clusters_of(topology()), clusters_of(dynamic_topology())
    for name in ("outbound|grpc||feature", "outbound|grpc|v1|feature", "outbound|grpc||gateway"):
        assert dynamic[name] == static[name]
        assert static[name]["type"] == "STATIC" and "ignore_health_on_host_removal" not in static[name]
    assert "unhealthy_interval" not in static[V1]["health_checks"][0]
    assert "update_merge_window" not in static[V1]["common_lb_config"]


def test_without_health_checks_a_dynamic_cluster_has_none() -> None:
    out = clusters_of(dynamic_topology(replicas=[], health_check=None))[V1]
    assert out["type"] == "EDS" and "health_checks" not in out


def test_render_writes_each_subsets_endpoint_file(tmp_path: Path) -> None:
    replicas = [("127.0.0.1:7001", "v1"), ("127.0.0.1:7002", "v2"), ("127.0.0.1:7003", "v1")]
    LocalMesh(dynamic_topology(replicas), [ISTIO], tmp_path).render()
    folder = tmp_path / "endpoints"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{n}.yaml" for n in (ALL, V1, V2))  # model only
    assert hosts_in(folder / f"{ALL}.yaml") == ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]
    assert hosts_in(folder / f"{V1}.yaml") == ["127.0.0.1:7001", "127.0.0.1:7003"]
    assert hosts_in(folder / f"{V2}.yaml") == ["127.0.0.1:7002"]


def test_set_endpoints_rewrites_the_files_and_another_process_sees_the_replicas(tmp_path: Path) -> None:
    mesh = LocalMesh(dynamic_topology([("127.0.0.1:7001", "v1")]), [ISTIO], tmp_path)
    mesh.render()
    before = (tmp_path / "endpoints" / f"{V1}.yaml").read_text()
    new = [MeshEndpoint(address="127.0.0.1:7005", labels={"version": "v2"}), MeshEndpoint(address="127.0.0.1:7006")]
    mesh.set_endpoints("model", new, wait=False)
    folder = tmp_path / "endpoints"
    assert hosts_in(folder / f"{ALL}.yaml") == ["127.0.0.1:7005", "127.0.0.1:7006"]
    assert hosts_in(folder / f"{V1}.yaml") == ["127.0.0.1:7006"]
    assert hosts_in(folder / f"{V2}.yaml") == ["127.0.0.1:7005"]
    assert yaml.safe_load(before)["version_info"] != yaml.safe_load((folder / f"{V1}.yaml").read_text())["version_info"]
    assert not list((tmp_path / ".endpoints.staging").iterdir())  # written then renamed into place
    assert LocalMesh.attach(tmp_path).topology.services["model"].replicas == new
    mesh.set_endpoints("model", [], wait=False)  # out of service: every cluster empty
    assert [hosts_in(folder / f"{n}.yaml") for n in (ALL, V1, V2)] == [[], [], []]
    assert LocalMesh.attach(tmp_path).topology.services["model"].replicas == []


def test_weights_and_endpoints_changed_from_two_processes_keep_each_other(tmp_path: Path) -> None:
    scaler = LocalMesh(dynamic_topology([("127.0.0.1:7001", "v1")]), [ISTIO], tmp_path)
    scaler.render()
    cli = LocalMesh.attach(tmp_path)  # attached before the scaler's change: its topology is the old one
    scaler.set_endpoints("model", [MeshEndpoint(address="127.0.0.1:7009")], wait=False)
    cli.set_weights("model", {"v1": 70, "v2": 30}, wait=False)
    scaler.set_endpoints("model", [MeshEndpoint(address="127.0.0.1:7010")], wait=False)  # its weights are old
    state = LocalMesh.attach(tmp_path)
    assert state.weights("model") == {"v1": 70, "v2": 30}
    assert [r.address for r in state.topology.services["model"].replicas] == ["127.0.0.1:7010"]
    assert json.loads((tmp_path / "state.json").read_text())["istio_paths"] == [str(ISTIO)]


@pytest.mark.parametrize(
    ("service", "replicas", "fragment"),
    [
        ("nope", [], "unknown service 'nope'"),
        ("feature", [], "service 'feature' is not dynamic"),
        ("model", ["127.0.0.1:7001", "127.0.0.1:7001"], "appears twice"),
    ],
)
def test_set_endpoints_errors(tmp_path: Path, service: str, replicas: list[str], fragment: str) -> None:
    mesh = LocalMesh(dynamic_topology(), [ISTIO], tmp_path)
    mesh.render()
    before = (tmp_path / "state.json").read_text()
    with pytest.raises(MeshConfigError, match=fragment):
        mesh.set_endpoints(service, [MeshEndpoint(address=a) for a in replicas], wait=False)
    assert (tmp_path / "state.json").read_text() == before


class FakeClusters(BaseHTTPRequestHandler):
    """Envoy's /clusters as `FakeClusters.body` says."""

    body = ""

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/clusters" else 404)
        self.end_headers()
        self.wfile.write(FakeClusters.body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def admin_address() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeClusters)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def clusters_text(hosts: dict[str, dict[str, str]]) -> str:
    """/clusters lines: per cluster, per host, its health flags."""
    lines = [f"{c}::default_priority::max_connections::100" for c in (ALL, V1, V2)]
    lines += [f"{c}::{h}::health_flags::{flags}" for c, per in hosts.items() for h, flags in per.items()]
    return "\n".join(lines) + "\n"


def test_set_endpoints_waits_for_envoy_to_list_exactly_the_hosts(tmp_path: Path, admin_address: str) -> None:
    mesh = LocalMesh(dynamic_topology([], admin=admin_address), [ISTIO], tmp_path)
    mesh.render()
    new = [MeshEndpoint(address="127.0.0.1:7001")]
    FakeClusters.body = clusters_text({ALL: {"127.0.0.1:7001": "healthy"}})  # the v1 subset does not list it yet
    with pytest.raises(TimeoutError, match=r"cluster 'outbound\|grpc\|v1\|model'.*it lists \{\}"):
        mesh.set_endpoints("model", new, timeout=0.2)
    pending = "/failed_active_hc/pending_active_hc"
    FakeClusters.body = clusters_text({ALL: {"127.0.0.1:7001": pending}, V1: {"127.0.0.1:7001": pending}})
    mesh.set_endpoints("model", new, timeout=0.2)  # listed is enough by default
    with pytest.raises(TimeoutError, match=r"healthy hosts \['127.0.0.1:7001'\] in cluster 'outbound\|grpc\|\|model'"):
        mesh.set_endpoints("model", new, timeout=0.2, healthy=True)
    FakeClusters.body = clusters_text({ALL: {"127.0.0.1:7001": "healthy"}, V1: {"127.0.0.1:7001": "healthy"}})
    mesh.set_endpoints("model", new, timeout=0.2, healthy=True)
    FakeClusters.body = clusters_text({})
    mesh.set_endpoints("model", [], timeout=0.2, healthy=True)  # no hosts anywhere
