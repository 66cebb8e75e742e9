"""The local stack's shape (services, replicas, ports) and the process specs built from it."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]
METRICS_OFFSET = 1000  # metrics port = gRPC port + 1000 (8000 -> 9000), as the default ports are laid out


class ProcessSpec(BaseModel):
    """One supervised process: how to start it, where it answers health checks, what it waits for."""

    name: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict, description="Added to the supervisor's environment.")
    host: str = "127.0.0.1"
    port: int | None = Field(None, description="gRPC port checked with grpc.health.v1 (None: ready once started).")
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
    models_dir: Path
    pipelines_dir: Path | None = None
    grace_period_s: float = Field(5.0, ge=0, description="Each service's drain time on SIGTERM.")

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
    ) -> Topology:
        """The default layout from `port_base` (0: every port a free one).

        gateway base, model v1 base+1, base+11, ..., feature base+2, cache base+3, model v2 canary base+21;
        each /metrics port is its gRPC port + 1000 (with base 8000: the documented 8000-8003 / 9000-9003).
        """

        def port(offset: int) -> tuple[int, int]:
            if port_base == 0:
                return free_port(host), free_port(host)
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
            gm = free_port(host) if port_base == 0 else gateway_port + METRICS_OFFSET
        f, fm = port(2)
        c, cm = port(3)
        return cls(
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


def model_target(topology: Topology) -> str:
    """Where the gateway sends model requests.

    Without the local Envoy, the first v1 replica (the canary and the other replicas are reachable directly,
    not through the gateway). With the mesh this becomes the Envoy listener that splits v1/v2.
    """
    return topology.address(topology.replicas[0].port)


def build_specs(topology: Topology, redis_url: str) -> list[ProcessSpec]:
    """Process specs of the stack, dependencies first: model replicas, feature, cache, then the gateway."""
    t = topology
    specs: list[ProcessSpec] = []
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
            },
        )
        spec.role = f"model {r.subset} " + ", ".join(f"{m}:{v}" for m, v in r.pinned_versions.items())
        specs.append(spec)
    feature = service_spec("feature", "feature", t.host, t.feature_port, t.feature_metrics_port, t.grace_period_s,
                           {"MESHSERVE_REDIS_URL": redis_url})  # fmt: skip
    feature.role = "online features"
    cache = service_spec("cache", "cache", t.host, t.cache_port, t.cache_metrics_port, t.grace_period_s,
                         {"MESHSERVE_REDIS_URL": redis_url})  # fmt: skip
    cache.role = "response cache"
    specs += [feature, cache]
    gateway_env = {
        "MESHSERVE_GATEWAY_MODEL_ADDRESS": model_target(t),
        "MESHSERVE_GATEWAY_FEATURE_ADDRESS": t.address(t.feature_port),
        "MESHSERVE_GATEWAY_CACHE_ADDRESS": t.address(t.cache_port),
    }
    if t.pipelines_dir is not None:
        gateway_env["MESHSERVE_GATEWAY_PIPELINES_DIR"] = str(t.pipelines_dir)
    gateway = service_spec("gateway", "gateway", t.host, t.gateway_port, t.gateway_metrics_port, t.grace_period_s,
                           gateway_env)  # fmt: skip
    gateway.role = "ingress (v2 protocol, pipelines)"
    gateway.depends_on = [s.name for s in specs]
    specs.append(gateway)
    return specs


def busy_ports(specs: list[ProcessSpec]) -> list[str]:
    """'name: port N' for every port of the specs that something already holds."""
    busy = []
    for spec in specs:
        for port in (spec.port, spec.metrics_port):
            if port and port_in_use(spec.host, port):
                busy.append(f"{spec.name}: port {port}")
    return busy
