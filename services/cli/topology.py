"""The local stack's shape (services, replicas, ports) and the process specs built from it."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from services.mesh import Topology as MeshTopology

ROOT = Path(__file__).resolve().parents[2]
METRICS_OFFSET = 1000  # metrics port = gRPC port + 1000 (8000 -> 9000), as the default ports are laid out


class ProcessSpec(BaseModel):
    """One supervised process: how to start it, where it answers health checks, what it waits for."""

    name: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict, description="Added to the supervisor's environment.")
    host: str = "127.0.0.1"
    port: int | None = Field(None, description="gRPC port checked with grpc.health.v1 (None: ready once started).")
    health_url: str | None = Field(None, description="Instead of gRPC health: ready when this URL answers 200.")
    metrics_port: int | None = None
    depends_on: list[str] = Field(default_factory=list, description="Processes that must be SERVING first.")
    role: str = ""

    @property
    def address(self) -> str | None:
        return f"{self.host}:{self.port}" if self.port is not None else None


class Replica(BaseModel):
    """One model-service replica of a mesh subset (v1, or the v2 canary), pinned to model versions."""

    name: str
    subset: str
    pinned_versions: dict[str, list[int]]
    port: int
    metrics_port: int


class Topology(BaseModel):
    """Every port and path of the local stack; `build_specs` turns it into process specs."""

    host: str = "127.0.0.1"
    gateway_port: int = 8000
    gateway_metrics_port: int = 9000
    feature_port: int = 8002
    feature_metrics_port: int = 9002
    cache_port: int = 8003
    cache_metrics_port: int = 9003
    replicas: list[Replica]
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
        v1_replicas: int = 2,
        canary: bool = True,
        models_dir: Path | None = None,
        pipelines_dir: Path | None = None,
        host: str = "127.0.0.1",
        mesh: bool = False,
        traces: bool = False,
        traces_db: Path | None = None,
    ) -> Topology:
        """The default layout from `port_base` (0: every port a free one).

        gateway base, model v1 base+1, base+11, ..., feature base+2, cache base+3, model v2 canary base+21;
        each /metrics port is its gRPC port + 1000 (with base 8000: the documented 8000-8003 / 9000-9003).
        With the mesh: Envoy's ingress base+80, admin base+1901 (8080, 9901), and the outbound listener of
        gateway, model, feature, cache at base+100..103. With traces: the OTLP receiver on 4317 for base 8000,
        else base+90.
        """

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

        replicas = []
        for i in range(v1_replicas):
            p, m = port(1 + 10 * i)
            replicas.append(Replica(name=f"model-v1-{chr(ord('a') + i)}", subset="v1",
                                    pinned_versions={"fraud_mlp": [1]}, port=p, metrics_port=m))  # fmt: skip
        if canary:
            p, m = port(10 * max(v1_replicas, 2) + 1)
            replicas.append(
                Replica(name="model-v2", subset="v2", pinned_versions={"fraud_mlp": [2]}, port=p, metrics_port=m)
            )
        g, gm = port(0)
        if gateway_port is not None:
            g = gateway_port
            gm = fresh() if port_base == 0 else gateway_port + METRICS_OFFSET
        f, fm = port(2)
        c, cm = port(3)
        mesh_ports = {}
        if mesh:
            services = ("gateway", "model", "feature", "cache")
            mesh_ports = {name: port(100 + i)[0] for i, name in enumerate(services)}
            mesh_ports["ingress"] = port(80)[0]
            mesh_ports["admin"] = port(1901)[0]
        traces_port = None
        if traces:
            traces_port = 4317 if port_base == 8000 else port(90)[0]
        return cls(
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

    def address(self, port: int) -> str:
        return f"{self.host}:{port}"


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


def service_spec(
    service: str, name: str, host: str, port: int, metrics_port: int, grace_s: float, env: dict[str, str]
) -> ProcessSpec:
    """`python -m services.<service>` with its MESHSERVE_<SERVICE>_* host, ports and grace period."""
    prefix = f"MESHSERVE_{service.upper()}_"
    base = {
        f"{prefix}HOST": host,
        f"{prefix}PORT": str(port),
        f"{prefix}METRICS_PORT": str(metrics_port),
        f"{prefix}GRACE_PERIOD_S": str(grace_s),
        "PYTHONUNBUFFERED": "1",
    }
    return ProcessSpec(
        name=name,
        argv=[sys.executable, "-m", f"services.{service}"],
        env={**base, **env},
        host=host,
        port=port,
        metrics_port=metrics_port,
    )


def upstream(topology: Topology, service: str) -> str:
    """Where the gateway reaches `service`: the Envoy listener with the mesh, else the service itself.

    Without the mesh the model "service" is the first v1 replica (the others and the canary get no
    traffic from the gateway); with it, Envoy splits v1/v2 and retries across replicas.
    """
    t = topology
    if t.mesh:
        return t.address(t.listen_ports[service])
    ports = {"model": t.replicas[0].port, "feature": t.feature_port, "cache": t.cache_port, "gateway": t.gateway_port}
    return t.address(ports[service])


def mesh_topology(topology: Topology) -> MeshTopology:
    """The services.mesh topology (replicas with their subset labels, listeners, ingress, admin) of the stack."""
    from services.mesh import Replica as MeshReplica
    from services.mesh import ServiceTopology
    from services.mesh import Topology as MeshTopology

    t = topology
    replicas = {
        "gateway": [(t.gateway_port, "v1")],
        "model": [(r.port, r.subset) for r in t.replicas],
        "feature": [(t.feature_port, "v1")],
        "cache": [(t.cache_port, "v1")],
    }
    return MeshTopology(
        services={
            name: ServiceTopology(
                listen=t.address(t.listen_ports[name]),
                replicas=[MeshReplica(address=t.address(p), labels={"version": v}) for p, v in ports],
            )
            for name, ports in replicas.items()
        },
        ingress=t.address(t.ingress_port),
        admin=t.address(t.admin_port),
        otlp=t.address(t.traces_port) if t.traces_port else None,
    )


def envoy_spec(topology: Topology, command: list[str]) -> ProcessSpec:
    """Envoy (its command from services.mesh), ready when its admin /ready answers; after the services."""
    t = topology
    return ProcessSpec(
        name="envoy",
        argv=command,
        host=t.host,
        health_url=f"http://{t.address(t.admin_port)}/ready",
        role=f"mesh: ingress :{t.ingress_port}, admin :{t.admin_port}, outbound "
        + ", ".join(f"{k} :{v}" for k, v in t.listen_ports.items()),
    )


def build_specs(topology: Topology, redis_url: str, envoy_command: list[str] | None = None) -> list[ProcessSpec]:
    """Process specs of the stack, dependencies first: model replicas, feature, cache, (Envoy,) the gateway.

    With the mesh (`topology.mesh` and Envoy's command), the gateway's upstream addresses are Envoy listeners.
    """
    t = topology
    if t.mesh and envoy_command is None:
        raise ValueError("the mesh needs Envoy's command (services.mesh.LocalMesh(...).envoy.command)")
    specs: list[ProcessSpec] = []
    tracing: dict[str, str] = {}
    if t.traces_port:
        traces = traces_spec(t)
        specs.append(traces)
        tracing = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{t.address(t.traces_port)}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "500",  # spans reach the store within a second (SDK default: 5 s)
        }
    for r in t.replicas:
        spec = service_spec(
            "model",
            r.name,
            t.host,
            r.port,
            r.metrics_port,
            t.grace_period_s,
            {
                "MESHSERVE_MODEL_REPOSITORY": str(t.models_dir),
                "MESHSERVE_MODEL_PINNED_VERSIONS": json.dumps(r.pinned_versions),
                "MESHSERVE_MODEL_TORCH_THREADS": str(max(1, min(4, (os.cpu_count() or 2) // len(t.replicas)))),
                **tracing,
                **({"OTEL_SERVICE_NAME": "model"} if tracing else {}),
            },
        )
        spec.role = f"model {r.subset} " + ", ".join(f"{m}:{v}" for m, v in r.pinned_versions.items())
        specs.append(spec)
    feature = service_spec("feature", "feature", t.host, t.feature_port, t.feature_metrics_port, t.grace_period_s,
                           {"MESHSERVE_REDIS_URL": redis_url, **tracing})  # fmt: skip
    feature.role = "online features"
    cache = service_spec("cache", "cache", t.host, t.cache_port, t.cache_metrics_port, t.grace_period_s,
                         {"MESHSERVE_REDIS_URL": redis_url, **tracing})  # fmt: skip
    cache.role = "response cache"
    specs += [feature, cache]
    if tracing:
        for spec in specs[1:]:
            spec.depends_on.append("traces")
    if t.mesh and envoy_command is not None:
        envoy = envoy_spec(t, envoy_command)
        envoy.depends_on = [s.name for s in specs]
        specs.append(envoy)
    gateway_env = {
        "MESHSERVE_GATEWAY_MODEL_ADDRESS": upstream(t, "model"),
        "MESHSERVE_GATEWAY_FEATURE_ADDRESS": upstream(t, "feature"),
        "MESHSERVE_GATEWAY_CACHE_ADDRESS": upstream(t, "cache"),
        **tracing,
    }
    if t.pipelines_dir is not None:
        gateway_env["MESHSERVE_GATEWAY_PIPELINES_DIR"] = str(t.pipelines_dir)
    gateway = service_spec("gateway", "gateway", t.host, t.gateway_port, t.gateway_metrics_port, t.grace_period_s,
                           gateway_env)  # fmt: skip
    gateway.role = "pipelines as v2 models (cache, features, model)"
    gateway.depends_on = [s.name for s in specs]
    specs.append(gateway)
    return specs


def traces_spec(topology: Topology) -> ProcessSpec:
    """The local OTLP receiver and trace store (`python -m services.traces`), started first."""
    t = topology
    assert t.traces_port is not None
    env = {"MESHSERVE_TRACES_HOST": t.host, "MESHSERVE_TRACES_PORT": str(t.traces_port), "PYTHONUNBUFFERED": "1"}
    if t.traces_db is not None:
        env["MESHSERVE_TRACES_DB"] = str(t.traces_db)
    return ProcessSpec(
        name="traces",
        argv=[sys.executable, "-m", "services.traces"],
        env=env,
        host=t.host,
        port=t.traces_port,
        role="OTLP receiver + trace store (meshserve traces)",
    )


def busy_ports(topology: Topology, specs: list[ProcessSpec]) -> list[str]:
    """'name: port N' for every port of the stack that something already holds."""
    ports = [(s.name, p) for s in specs for p in (s.port, s.metrics_port) if p]
    if topology.mesh:
        ports += [(f"envoy {k}", v) for k, v in topology.listen_ports.items()]
        ports += [("envoy ingress", topology.ingress_port), ("envoy admin", topology.admin_port)]
    return [f"{name}: port {port}" for name, port in ports if port_in_use(topology.host, port)]
