"""Local service mesh: renders `istio/` into an Envoy bootstrap and runs it (see services.mesh.local)."""

from services.mesh.envoy import EnvoyProcess, envoy_binary
from services.mesh.errors import MeshConfigError
from services.mesh.local import LocalMesh
from services.mesh.topology import IngressTls, MeshEndpoint, MeshService, MeshTopology

__all__ = [
    "EnvoyProcess",
    "IngressTls",
    "LocalMesh",
    "MeshConfigError",
    "MeshEndpoint",
    "MeshService",
    "MeshTopology",
    "envoy_binary",
]
