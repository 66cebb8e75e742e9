"""How to start each process of the local stack: argv, environment (from each service's settings class), health."""

from __future__ import annotations

import os
import sys

from pydantic import BaseModel, Field

from services.cache.settings import CacheSettings
from services.cli.layout import StackLayout, port_in_use
from services.common.settings import ServiceSettings
from services.feature.settings import FeatureSettings
from services.gateway.settings import GatewaySettings
from services.model.settings import ModelSettings
from services.traces.settings import TracesSettings


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


# grpc's EventEngine endpoints (its default) pass every message read from a socket through three threads (the
# EventEngine poller, one of its workers, then grpc.aio's completion-queue poller) before it reaches the event loop;
# grpc's iomgr endpoints, which these experiments switch back to, read it on the completion-queue poller itself. Each
# of a lone request's hops wakes those threads cold, so through the whole stack this took 6-12% off the c=1 p50 in
# four side-by-side runs (bench/README, issue 14). A GRPC_EXPERIMENTS the caller sets is left as it is.
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"


def process_env() -> dict[str, str]:
    """What every Python process of the stack gets besides its settings: unbuffered output, grpc's endpoints."""
    env = {"PYTHONUNBUFFERED": "1"}
    if "GRPC_EXPERIMENTS" not in os.environ:
        env["GRPC_EXPERIMENTS"] = GRPC_EXPERIMENTS
    return env


SETTINGS: dict[str, type[ServiceSettings]] = {
    "model": ModelSettings,
    "feature": FeatureSettings,
    "cache": CacheSettings,
    "gateway": GatewaySettings,
}
"""The settings class each `python -m services.<name>` reads: the only source of its environment variables."""


def service_spec(
    service: str,
    name: str,
    layout: StackLayout,
    port: int,
    metrics_port: int,
    env: dict[str, str],
    **fields: object,
) -> ProcessSpec:
    """`python -m services.<service>` with its settings (host, ports, grace period and `fields`) as it reads them.

    `env` adds variables no settings class owns (the standard OTEL_* ones).
    """
    own = SETTINGS[service].env_for(
        host=layout.host, port=port, metrics_port=metrics_port, grace_period_s=layout.grace_period_s, **fields
    )
    return ProcessSpec(
        name=name,
        argv=[sys.executable, "-m", f"services.{service}"],
        env={**own, **process_env(), **env},
        host=layout.host,
        port=port,
        metrics_port=metrics_port,
    )


def upstream(layout: StackLayout, service: str) -> str:
    """Where the gateway reaches `service`: the Envoy listener with the mesh, else the service itself.

    Without the mesh the model "service" is the first stable replica (the others and the canary get no
    traffic from the gateway); with it, Envoy splits the subsets and retries across replicas.
    """
    t = layout
    if t.mesh:
        return t.address(t.listen_ports[service])
    ports = {"model": t.replicas[0].port, "feature": t.feature_port, "cache": t.cache_port, "gateway": t.gateway_port}
    return t.address(ports[service])


def envoy_spec(layout: StackLayout, command: list[str]) -> ProcessSpec:
    """Envoy (its command from services.mesh), ready when its admin /ready answers; after the services."""
    t = layout
    return ProcessSpec(
        name="envoy",
        argv=command,
        host=t.host,
        health_url=f"http://{t.address(t.admin_port)}/ready",
        role=f"mesh: ingress :{t.ingress_port}, admin :{t.admin_port}, outbound "
        + ", ".join(f"{k} :{v}" for k, v in t.listen_ports.items()),
    )


def torch_threads(replicas: int) -> int:
    """torch intra-op threads per model replica: the cores shared among the replicas, 1 to 4 each."""
    return max(1, min(4, (os.cpu_count() or 2) // replicas))


def build_specs(layout: StackLayout, redis_url: str, envoy_command: list[str] | None = None) -> list[ProcessSpec]:
    """Process specs of the stack, dependencies first: model replicas, feature, cache, (Envoy,) the gateway.

    With the mesh (`layout.mesh` and Envoy's command), the gateway's upstream addresses are Envoy listeners.
    Each service's variables come from its settings class: a field renamed there fails here, before anything starts.
    """
    t = layout
    if t.mesh and envoy_command is None:
        raise ValueError("the mesh needs Envoy's command (services.mesh.LocalMesh(...).envoy.command)")
    specs: list[ProcessSpec] = []
    tracing: dict[str, str] = {}
    if t.traces_port:
        specs.append(traces_spec(t))
        tracing = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{t.address(t.traces_port)}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "500",  # spans reach the store within a second (SDK default: 5 s)
        }
    for r in t.replicas:
        spec = service_spec(
            "model",
            r.name,
            t,
            r.port,
            r.metrics_port,
            {**tracing, **({"OTEL_SERVICE_NAME": "model"} if tracing else {})},
            repository=t.models_dir,
            pinned_versions=r.pinned_versions,
            torch_threads=torch_threads(len(t.replicas)),
        )
        spec.role = f"model {r.subset} " + ", ".join(f"{m}:{v}" for m, v in r.pinned_versions.items())
        specs.append(spec)
    feature = service_spec(
        "feature", "feature", t, t.feature_port, t.feature_metrics_port, tracing, redis_url=redis_url
    )
    feature.role = "online features"
    cache = service_spec("cache", "cache", t, t.cache_port, t.cache_metrics_port, tracing, redis_url=redis_url)
    cache.role = "response cache"
    specs += [feature, cache]
    if tracing:
        for spec in specs[1:]:
            spec.depends_on.append("traces")
    if t.mesh and envoy_command is not None:
        envoy = envoy_spec(t, envoy_command)
        envoy.depends_on = [s.name for s in specs]
        specs.append(envoy)
    pipelines = {"pipelines_dir": t.pipelines_dir} if t.pipelines_dir is not None else {}
    gateway = service_spec(
        "gateway",
        "gateway",
        t,
        t.gateway_port,
        t.gateway_metrics_port,
        tracing,
        model_address=upstream(t, "model"),
        feature_address=upstream(t, "feature"),
        cache_address=upstream(t, "cache"),
        **pipelines,
    )
    gateway.role = "pipelines as v2 models (cache, features, model)"
    gateway.depends_on = [s.name for s in specs]
    specs.append(gateway)
    return specs


def traces_spec(layout: StackLayout) -> ProcessSpec:
    """The local OTLP receiver and trace store (`python -m services.traces`), started first."""
    t = layout
    assert t.traces_port is not None
    db = {"db": t.traces_db} if t.traces_db is not None else {}
    env = TracesSettings.env_for(host=t.host, port=t.traces_port, **db)
    return ProcessSpec(
        name="traces",
        argv=[sys.executable, "-m", "services.traces"],
        env={**env, **process_env()},
        host=t.host,
        port=t.traces_port,
        role="OTLP receiver + trace store (meshserve traces)",
    )


def busy_ports(layout: StackLayout, specs: list[ProcessSpec]) -> list[str]:
    """'name: port N' for every port of the stack that something already holds."""
    ports = [(s.name, p) for s in specs for p in (s.port, s.metrics_port) if p]
    if layout.mesh:
        ports += [(f"envoy {k}", v) for k, v in layout.listen_ports.items()]
        ports += [("envoy ingress", layout.ingress_port), ("envoy admin", layout.admin_port)]
    return [f"{name}: port {port}" for name, port in ports if port_in_use(layout.host, port)]
