"""Fixtures for tests with the real Envoy: model-service replicas pinned to versions, and a mesh factory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton

from services.mesh import LocalMesh
from services.mesh import MeshEndpoint as Replica
from services.mesh import MeshService as ServiceTopology
from services.mesh import MeshTopology as Topology
from services.mesh.topology import HealthCheck
from tests.helpers.models import Mlp, mlp_config, write_model
from tests.helpers.servers import ServiceProcess, free_port, model_service
from tests.mesh.credentials import Issuer, Pki, make_pki

ROOT = Path(__file__).resolve().parents[2]
ISTIO = ROOT / "istio"
MODEL = "m"
X = np.ones((1, 8), dtype=np.float32)
FAST_HEALTH = HealthCheck(interval="0.5s", timeout="0.5s", no_traffic_interval="0.5s", unhealthy_threshold=1)


@pytest.fixture(scope="session")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, list[ServiceProcess]]]:
    """Model-service replicas on one repository holding versions 1 and 2: v1 twice pinned to [1], v2 pinned to [2]."""
    root = tmp_path_factory.mktemp("mesh-replicas")
    repo = root / "repo"
    write_model(repo, MODEL, mlp_config(MODEL, version_policy={"all": {}}), {1: Mlp(1), 2: Mlp(2)})
    plan = [("v1", 1), ("v1", 1), ("v2", 2)]
    managers = [
        model_service(
            repo, root / "logs", MESHSERVE_MODEL_PINNED_VERSIONS=f'{{"{MODEL}": [{v}]}}', MESHSERVE_MODEL_WATCH="false"
        )
        for _, v in plan
    ]
    try:
        with ThreadPoolExecutor(len(managers)) as pool:  # start in parallel: ~3 s instead of ~8 s
            futures = [pool.submit(cm.__enter__) for cm in managers]
        failures = [f.exception() for f in futures if f.exception() is not None]
        if failures:  # every failure, not only the first (a replica may also be stopped from outside)
            raise RuntimeError("model replicas failed to start:\n" + "\n".join(map(str, failures)))
        started = [f.result() for f in futures]
        out: dict[str, list[ServiceProcess]] = {}
        for (subset, _), process in zip(plan, started, strict=True):
            out.setdefault(subset, []).append(process)
        yield out
    finally:
        for cm in managers:
            cm.__exit__(None, None, None)


@pytest.fixture(scope="session")
def issuer() -> Issuer:
    """The local issuer's signing key for these tests (give `issuer.topology_jwks` to the mesh)."""
    return Issuer.new()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA made for these tests and the ingress certificate it signed (give `pki.ingress_tls` to the mesh)."""
    return make_pki(tmp_path_factory.mktemp("pki"))


MeshFactory = Callable[..., LocalMesh]


@pytest.fixture()
def make_mesh(tmp_path: Path) -> Iterator[MeshFactory]:
    """Starts a LocalMesh for the model service alone, on free ports, with the given replicas and istio files."""
    meshes: list[LocalMesh] = []

    def make(
        model_replicas: list[tuple[str, str]],
        istio: list[Path] | None = None,
        health_check: HealthCheck | None = FAST_HEALTH,
        otlp: str | None = None,
        gateway: str | list[str] | None = None,
        **topology: Any,
    ) -> LocalMesh:
        """`gateway`: the gateway replicas' addresses (or one); it also opens the ingress listener (bound to the
        Istio Gateway).

        `topology`: further MeshTopology fields (ingress_tls, jwks, authenticate, admin).
        """
        services = {
            "model": ServiceTopology(
                listen=f"127.0.0.1:{free_port()}",
                replicas=[Replica(address=a, labels={"version": v}) for a, v in model_replicas],
            )
        }
        if gateway is not None:
            listen = f"127.0.0.1:{free_port()}"
            addresses = [gateway] if isinstance(gateway, str) else gateway
            services["gateway"] = ServiceTopology(listen=listen, replicas=[Replica(address=a) for a in addresses])
        topology.setdefault("admin", f"127.0.0.1:{free_port()}")
        mesh_topology = Topology(
            services=services,
            ingress=f"127.0.0.1:{free_port()}" if gateway else None,
            otlp=otlp,
            health_check=health_check,
            **topology,
        )
        mesh = LocalMesh(mesh_topology, istio or [ISTIO], tmp_path / f"mesh{len(meshes)}", concurrency=1)
        meshes.append(mesh)
        mesh.start()
        return mesh

    yield make
    for mesh in meshes:
        mesh.stop()


def subset_replicas(replicas: dict[str, list[ServiceProcess]]) -> list[tuple[str, str]]:
    return [(p.address, subset) for subset, processes in replicas.items() for p in processes]


def infer(client: triton.InferenceServerClient, headers: dict[str, str] | None = None) -> str:
    """One ModelInfer through the mesh; the model_version that answered ('1' = v1 subset, '2' = v2)."""
    inp = triton.InferInput("x", list(X.shape), "FP32")
    inp.set_data_from_numpy(X)
    result = client.infer(MODEL, [inp], headers=headers, client_timeout=10)
    return str(result.get_response().model_version)


@contextmanager
def client_of(address: str) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(url=address)
    try:
        yield client
    finally:
        client.close()
