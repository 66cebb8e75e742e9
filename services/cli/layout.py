"""Where the local stack runs: every port and path of its processes, laid out from a port base and a topology."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from services.cli.stack_topology import ModelGroup, StackTopology

if TYPE_CHECKING:
    from services.mesh import MeshTopology

ROOT = Path(__file__).resolve().parents[2]
METRICS_OFFSET = 1000  # metrics port = gRPC port + 1000 (8000 -> 9000), as the default ports are laid out
MESH_SERVICES = ("gateway", "model", "feature", "cache")


class ModelReplica(BaseModel):
    """One model-service process of the stack: its mesh subset, the model versions it is pinned to, its ports."""

    name: str
    subset: str
    pinned_versions: dict[str, list[int]]
    port: int
    metrics_port: int


class StackLayout(BaseModel):
    """Every port and path of the local stack; services.cli.specs turns it into process specs."""

    host: str = "127.0.0.1"
    gateway_port: int = 8000
    gateway_metrics_port: int = 9000
    feature_port: int = 8002
    feature_metrics_port: int = 9002
    cache_port: int = 8003
    cache_metrics_port: int = 9003
    replicas: list[ModelReplica]
    mesh: bool = Field(False, description="Run Envoy (rendered from istio/) between the services.")
    ingress_port: int = 8080
    admin_port: int = 9901
    listen_ports: dict[str, int] = Field(
        default_factory=dict, description="Per service, the Envoy outbound listener its callers use (mesh only)."
    )
    istio_paths: list[Path] = Field(default_factory=lambda: [ROOT / "istio"])
    models_dir: Path
    pipelines_dir: Path | None = None
    grace_period_s: float = Field(5.0, ge=0, description="Each service's drain time on SIGTERM.")
    traces_port: int | None = Field(
        None, description="The local OTLP receiver and trace store (services.traces); None: no tracing."
    )
    traces_db: Path | None = Field(None, description="Its SQLite file (default: the store's own default).")

    @classmethod
    def local(
        cls,
        port_base: int = 8000,
        gateway_port: int | None = None,
        *,
        topology: StackTopology | None = None,
        models_dir: Path | None = None,
        pipelines_dir: Path | None = None,
        host: str = "127.0.0.1",
        mesh: bool = False,
        traces: bool = False,
        traces_db: Path | None = None,
    ) -> StackLayout:
        """The layout of `topology` (default: the demo stack) from `port_base` (0: every port a free one).

        gateway base, stable model replicas base+1, base+11, ..., feature base+2, cache base+3, the canary's
        replicas from base+21 (after at least two stable slots); each /metrics port is its gRPC port + 1000 (with
        base 8000: the documented 8000-8003 / 9000-9003). With the mesh: Envoy's ingress base+80, admin base+1901
        (8080, 9901), and the outbound listener of gateway, model, feature, cache at base+100..103. With traces:
        the OTLP receiver on 4317 for base 8000, else base+90.
        """
        topology = topology or StackTopology.demo()
        taken: set[int] = set()

        def fresh() -> int:
            """A free port not handed out before (the OS may offer a just-released port again)."""
            while (p := free_port(host)) in taken:
                pass
            taken.add(p)
            return p

        def port(offset: int) -> tuple[int, int]:
            if port_base == 0:
                return fresh(), fresh()
            return port_base + offset, port_base + offset + METRICS_OFFSET

        def group(g: ModelGroup, first_offset: int, lettered: bool) -> list[ModelReplica]:
            out = []
            for i in range(g.replicas):
                p, m = port(first_offset + 10 * i)
                name = f"model-{g.subset}-{chr(ord('a') + i)}" if lettered else f"model-{g.subset}"
                out.append(
                    ModelReplica(name=name, subset=g.subset, pinned_versions=g.pinned_versions, port=p, metrics_port=m)
                )
            return out

        replicas = group(topology.stable, 1, lettered=True)
        if topology.canary is not None:
            replicas += group(topology.canary, 10 * max(topology.stable.replicas, 2) + 1, topology.canary.replicas > 1)
        g, gm = port(0)
        if gateway_port is not None:
            g = gateway_port
            gm = fresh() if port_base == 0 else gateway_port + METRICS_OFFSET
        f, fm = port(2)
        c, cm = port(3)
        mesh_ports = {}
        if mesh:
            mesh_ports = {name: port(100 + i)[0] for i, name in enumerate(MESH_SERVICES)}
            mesh_ports["ingress"] = port(80)[0]
            mesh_ports["admin"] = port(1901)[0]
        traces_port = None
        if traces:
            traces_port = 4317 if port_base == 8000 else port(90)[0]
        layout = cls(
            traces_port=traces_port,
            traces_db=traces_db.resolve() if traces_db else None,
            mesh=mesh,
            ingress_port=mesh_ports.pop("ingress", 8080),
            admin_port=mesh_ports.pop("admin", 9901),
            listen_ports=mesh_ports,
            host=host,
            gateway_port=g,
            gateway_metrics_port=gm,
            feature_port=f,
            feature_metrics_port=fm,
            cache_port=c,
            cache_metrics_port=cm,
            replicas=replicas,
            models_dir=(models_dir or default_models_dir()).resolve(),
            pipelines_dir=pipelines_dir.resolve() if pipelines_dir else None,
        )
        clashes = layout.clashing_ports()
        if clashes:
            raise ValueError(f"the layout from port base {port_base} gives one port to several: {'; '.join(clashes)}")
        return layout

    def address(self, port: int) -> str:
        return f"{self.host}:{port}"

    def ports(self) -> list[tuple[str, int]]:
        """(owner, port) of every port the stack binds."""
        out = [
            ("gateway", self.gateway_port),
            ("gateway metrics", self.gateway_metrics_port),
            ("feature", self.feature_port),
            ("feature metrics", self.feature_metrics_port),
            ("cache", self.cache_port),
            ("cache metrics", self.cache_metrics_port),
        ]
        for r in self.replicas:
            out += [(r.name, r.port), (f"{r.name} metrics", r.metrics_port)]
        if self.mesh:
            out += [(f"envoy {k}", v) for k, v in self.listen_ports.items()]
            out += [("envoy ingress", self.ingress_port), ("envoy admin", self.admin_port)]
        if self.traces_port is not None:
            out.append(("traces", self.traces_port))
        return out

    def clashing_ports(self) -> list[str]:
        """'port N: a, b' for every port handed to more than one owner."""
        owners: dict[int, list[str]] = {}
        for owner, port in self.ports():
            owners.setdefault(port, []).append(owner)
        return [f"port {p}: {', '.join(names)}" for p, names in owners.items() if len(names) > 1]


def default_models_dir() -> Path:
    """`./models` when it is a model repository, else the repository checkout's `models/`."""
    here = Path("models")
    return here if here.is_dir() else ROOT / "models"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def mesh_topology(layout: StackLayout) -> MeshTopology:
    """The mesh's view of the stack: each service's endpoints with their subset labels, listeners, ingress, admin."""
    from services.mesh import MeshEndpoint, MeshService, MeshTopology

    t = layout
    endpoints = {
        "gateway": [(t.gateway_port, "v1")],
        "model": [(r.port, r.subset) for r in t.replicas],
        "feature": [(t.feature_port, "v1")],
        "cache": [(t.cache_port, "v1")],
    }
    return MeshTopology(
        services={
            name: MeshService(
                listen=t.address(t.listen_ports[name]),
                replicas=[MeshEndpoint(address=t.address(p), labels={"version": v}) for p, v in ports],
            )
            for name, ports in endpoints.items()
        },
        ingress=t.address(t.ingress_port),
        admin=t.address(t.admin_port),
        otlp=t.address(t.traces_port) if t.traces_port else None,
    )
