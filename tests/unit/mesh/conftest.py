"""Shared helpers of the renderer unit tests: the real istio/ folder and a small topology."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.mesh.topology import MeshEndpoint, MeshService, MeshTopology

ROOT = Path(__file__).resolve().parents[3]
ISTIO = ROOT / "istio"


def topology(**extra: object) -> MeshTopology:
    def svc(port: int, versions: list[str]) -> MeshService:
        replicas = [
            MeshEndpoint(address=f"127.0.0.1:{port + 100 + i}", labels={"version": v}) for i, v in enumerate(versions)
        ]
        return MeshService(listen=f"127.0.0.1:{port}", replicas=replicas)

    services = {
        "gateway": svc(18000, ["v1"]),
        "model": svc(18001, ["v1", "v1", "v2"]),
        "feature": svc(18002, ["v1"]),
        "cache": svc(18003, ["v1"]),
    }
    return MeshTopology(services=services, **extra)  # type: ignore[arg-type]


@pytest.fixture()
def write_yaml(tmp_path: Path):
    """Writes documents to a YAML file under tmp_path and returns its path."""

    def write(name: str, *docs: dict) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
        return path

    return write


def vs(http: list[dict], name: str = "model", hosts: list[str] | None = None) -> dict:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name},
        "spec": {"hosts": hosts or ["model"], "http": http},
    }


def dr(spec: dict, name: str = "model") -> dict:
    return {"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule", "metadata": {"name": name}, "spec": spec}
