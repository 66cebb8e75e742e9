"""Where the local stack runs: every port and path of its processes, laid out from a port base and a topology."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

from services.cli.stack.topology import ModelGroup, StackTopology

if TYPE_CHECKING:
    from services.cli.stack.credentials import StackSecrets
    from services.mesh import MeshTopology

ROOT = Path(__file__).resolve().parents[3]
METRICS_OFFSET = 1000  # metrics port = gRPC port + 1000 (8000 -> 9000), as the default ports are laid out
MESH_SERVICES = ("gateway", "model", "feature", "cache")


class ModelReplica(BaseModel):
    """One model-service process of the stack: its mesh subset, the model versions it is pinned to, its ports."""

    name: str
    subset: str
    pinned_versions: dict[str, list[int]]
    port: int
    metrics_port: int


class GatewayReplica(BaseModel):
    """One gateway process of the stack: its name and ports (every replica is an endpoint of the mesh's gateway)."""

    name: str
    port: int
    metrics_port: int


UNIX_PATH_MAX = 100  # sun_path holds 108 bytes; services.mesh takes at most 100 for Envoy's admin


class StackLayout(BaseModel):
    """Every port and path of the local stack; services.cli.stack.specs turns it into process specs."""

    host: str = "127.0.0.1"
    gateways: list[GatewayReplica] = Field(
        default_factory=lambda: [GatewayReplica(name="gateway", port=8000, metrics_port=9000)],
        description="The gateway's replicas (the first is `gateway_port`).",
    )
    feature_port: int = 8002
    feature_metrics_port: int = 9002
    cache_port: int = 8003
    cache_metrics_port: int = 9003
    replicas: list[ModelReplica]
    valkey_port: int | None = Field(None, description="The supervised Valkey's port; None: an external Redis.")
    mesh: bool = Field(False, description="Run Envoy (rendered from istio/) between the services.")
    insecure: bool = Field(False, description="A plaintext ingress that asks for no token (quick trials).")
    ingress_port: int = 8080
    admin_port: int = 9901
    admin_socket: Path | None = Field(
        None, description="Envoy's admin on this Unix socket (mode 0600) instead of admin_port."
    )
    listen_ports: dict[str, int] = Field(
        default_factory=dict, description="Per service, the Envoy outbound listener its callers use (mesh only)."
    )
    istio_paths: list[Path] = Field(default_factory=lambda: [ROOT / "istio"])
    models_dir: Path
    pipelines_dir: Path | None = None
    log_dir: Path | None = Field(None, description="Logs, stack.json, secrets/, mesh/ and valkey/ of the stack.")
    grace_period_s: float = Field(5.0, ge=0, description="Each service's drain time on SIGTERM.")
    traces_port: int | None = Field(
        None, description="The local OTLP receiver and trace store (services.traces); None: no tracing."
    )
    traces_db: Path | None = Field(None, description="Its SQLite file (default: the store's own default).")
    traces_ui_port: int | None = Field(None, description="The trace UI's HTTP port; None: no UI.")
    traces_recording_port: int | None = Field(
        None, description="Where the trace store serves Envoy's access log records to collectors (retroactive mode)."
    )
    tracing_mode: Literal["retroactive", "head"] = Field(
        "retroactive",
        description="With traces: `retroactive` records every request and keeps the slow, failed, degraded and "
        "caller-sampled ones plus a baseline (MESHSERVE_TRACING_*); `head` exports what is sampled (Envoy's "
        "randomSamplingPercentage for new traces) and nothing else.",
    )

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
        tracing_mode: Literal["retroactive", "head"] = "retroactive",
        valkey: bool = False,
        log_dir: Path | None = None,
        insecure: bool = False,
        admin_socket: bool = False,
    ) -> StackLayout:
        """The layout of `topology` (default: the demo stack) from `port_base` (0: every port a free one).

        gateway base (its further replicas base+10, base+20, ...), stable model replicas base+1, base+11, ...,
        feature base+2, cache base+3, Valkey base+4, the canary's replicas from base+21 (after at least two stable
        slots); each /metrics port is its gRPC port + 1000 (with base 8000: the documented 8000-8003 / 9000-9003).
        With the mesh: Envoy's ingress base+80, admin base+1901 (8080, 9901; with `admin_socket`, the Unix socket
        `<log_dir>/mesh/admin.sock` instead), and the outbound listener of gateway, model, feature, cache at
        base+100..103. With traces: the OTLP receiver on 4317 for base 8000, else base+90.
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
        gateways = []
        count = topology.gateway.replicas
        for i in range(count):
            g, gm = port(10 * i)
            if gateway_port is not None and i == 0:
                g, gm = gateway_port, fresh() if port_base == 0 else gateway_port + METRICS_OFFSET
            elif gateway_port is not None and port_base != 0:
                g, gm = gateway_port + 10 * i, gateway_port + 10 * i + METRICS_OFFSET
            name = "gateway" if count == 1 else f"gateway-{chr(ord('a') + i)}"
            gateways.append(GatewayReplica(name=name, port=g, metrics_port=gm))
        f, fm = port(2)
        c, cm = port(3)
        valkey_port = port(4)[0] if valkey else None
        mesh_ports = {}
        if mesh:
            mesh_ports = {name: port(100 + i)[0] for i, name in enumerate(MESH_SERVICES)}
            mesh_ports["ingress"] = port(80)[0]
            if not admin_socket:
                mesh_ports["admin"] = port(1901)[0]
        socket_path = None
        if mesh and admin_socket:
            if log_dir is None:
                raise ValueError("Envoy's admin socket lives in the log dir: give log_dir")
            socket_path = log_dir.resolve() / "mesh" / "admin.sock"
            if len(os.fsencode(socket_path)) > UNIX_PATH_MAX:
                raise ValueError(
                    f"Envoy's admin socket {socket_path} is longer than a Unix socket path may be "
                    f"({UNIX_PATH_MAX} bytes); choose a shorter --log-dir"
                )
        traces_port = traces_ui_port = traces_recording_port = None
        if traces:
            traces_port = 4317 if port_base == 8000 else port(90)[0]
            traces_ui_port = port(91)[0]
            if tracing_mode == "retroactive":
                traces_recording_port = port(92)[0]
        layout = cls(
            traces_port=traces_port,
            traces_ui_port=traces_ui_port,
            traces_recording_port=traces_recording_port,
            traces_db=traces_db.resolve() if traces_db else None,
            tracing_mode=tracing_mode,
            mesh=mesh,
            insecure=insecure,
            ingress_port=mesh_ports.pop("ingress", 8080),
            admin_port=mesh_ports.pop("admin", 9901),
            admin_socket=socket_path,
            listen_ports=mesh_ports,
            host=host,
            gateways=gateways,
            feature_port=f,
            feature_metrics_port=fm,
            cache_port=c,
            cache_metrics_port=cm,
            valkey_port=valkey_port,
            replicas=replicas,
            models_dir=(models_dir or default_models_dir()).resolve(),
            pipelines_dir=pipelines_dir.resolve() if pipelines_dir else None,
            log_dir=log_dir.resolve() if log_dir else None,
        )
        clashes = layout.clashing_ports()
        if clashes:
            raise ValueError(f"the layout from port base {port_base} gives one port to several: {'; '.join(clashes)}")
        return layout

    @property
    def gateway_port(self) -> int:
        """The first gateway replica's port (the stack's gateway, reached without the mesh)."""
        return self.gateways[0].port

    @property
    def gateway_metrics_port(self) -> int:
        return self.gateways[0].metrics_port

    @property
    def admin(self) -> str:
        """Envoy's admin address as services.mesh takes it: `unix:/abs/admin.sock` or host:port."""
        return f"unix:{self.admin_socket}" if self.admin_socket is not None else self.address(self.admin_port)

    @property
    def valkey_config(self) -> Path:
        """The supervised Valkey's config file (0600, in a 0700 folder: it holds the password)."""
        if self.log_dir is None:
            raise ValueError("the supervised Valkey's config lives in the log dir: the layout has none")
        return self.log_dir / "valkey" / "valkey.conf"

    def address(self, port: int) -> str:
        return f"{self.host}:{port}"

    def ports(self) -> list[tuple[str, int]]:
        """(owner, port) of every port the stack binds."""
        out: list[tuple[str, int]] = []
        for g in self.gateways:
            out += [(g.name, g.port), (f"{g.name} metrics", g.metrics_port)]
        out += [
            ("feature", self.feature_port),
            ("feature metrics", self.feature_metrics_port),
            ("cache", self.cache_port),
            ("cache metrics", self.cache_metrics_port),
        ]
        for r in self.replicas:
            out += [(r.name, r.port), (f"{r.name} metrics", r.metrics_port)]
        if self.valkey_port is not None:
            out.append(("valkey", self.valkey_port))
        if self.mesh:
            out += [(f"envoy {k}", v) for k, v in self.listen_ports.items()]
            out.append(("envoy ingress", self.ingress_port))
            if self.admin_socket is None:
                out.append(("envoy admin", self.admin_port))
        if self.traces_port is not None:
            out.append(("traces", self.traces_port))
        if self.traces_ui_port is not None:
            out.append(("traces ui", self.traces_ui_port))
        if self.traces_recording_port is not None:
            out.append(("traces recording", self.traces_recording_port))
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


def mesh_topology(layout: StackLayout, secrets: StackSecrets | None = None) -> MeshTopology:
    """The mesh's view of the stack: each service's endpoints with their subset labels, listeners, ingress, admin;
    unless the layout is insecure, the ingress's TLS certificate and the JWKS of the stack's signing key (from
    `secrets`, which a secure layout needs)."""
    from services.mesh import MeshEndpoint, MeshService, MeshTopology

    t = layout
    endpoints = {
        "gateway": [(g.port, "v1") for g in t.gateways],
        "model": [(r.port, r.subset) for r in t.replicas],
        "feature": [(t.feature_port, "v1")],
        "cache": [(t.cache_port, "v1")],
    }
    security: dict[str, object] = {"authenticate": False, "ingress_tls": None}
    if not t.insecure:
        from services.common.tokens import LOCAL_ISSUER
        from services.mesh.topology import IngressTls

        if secrets is None:
            raise ValueError("a secure ingress needs the stack's secrets (its certificate and JWKS)")
        security = {
            "authenticate": True,
            "ingress_tls": IngressTls(cert_chain=secrets.ingress_cert, private_key=secrets.ingress_key),
            "jwks": {LOCAL_ISSUER: secrets.jwks()},
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
        admin=t.admin,
        otlp=t.address(t.traces_port) if t.traces_port else None,
        access_log=t.tracing_mode == "retroactive",
        **security,
    )
