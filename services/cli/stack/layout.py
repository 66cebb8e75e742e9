"""Where the local stack runs: every port and path of its processes, laid out from a port base and a topology."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from services.cli.stack.ports import METRICS_OFFSET, PortAllocator
from services.cli.stack.topology import ModelGroup, StackTopology

ROOT = Path(__file__).resolve().parents[3]
MESH_DIR = "mesh"  # under the log dir: Envoy's rendered config and its admin socket
SOCKETS_DIR = "sockets"  # under the log dir, mode 0700: the services' gRPC sockets and the mesh's listeners
MESH_SERVICES = ("gateway", "model", "feature", "cache")
NO_TRACES: tuple[None, None, None] = (None, None, None)


class ModelReplica(BaseModel):
    """One model-service replica slot of the stack: its mesh subset, the model versions it is pinned to, its ports;
    `initial` when it runs from the start (the others are started and retired by the autoscaler)."""

    name: str
    subset: str
    pinned_versions: dict[str, list[int]]
    port: int
    metrics_port: int
    slot: int = Field(0, description="Its place in its group (0 first): the autoscaler fills slots in order.")
    initial: bool = Field(True, description="Started with the stack (the group's first `replicas` slots).")


class GatewayReplica(BaseModel):
    """One gateway process of the stack: its name and ports (every replica is an endpoint of the mesh's gateway)."""

    name: str
    port: int
    metrics_port: int


UNIX_PATH_MAX = 100  # sun_path holds 108 bytes; services.mesh takes at most 100 for Envoy's admin


class StackLayout(BaseModel):
    """Every port and path of the local stack; services.cli.stack.specs turns it into process specs.

    `local(base)` places the ports: gateway base (its further replicas base+10, base+20, ...), stable model replicas
    base+1, base+11, ..., feature base+2, cache base+3, Valkey base+4 (the feature store) and base+6 (the cache's),
    the scaler base+5 (only when a group autoscales), the canary's replicas from base+21 (after at least two stable
    slots); each /metrics port is its gRPC port + 1000 (with base 8000: the documented 8000-8003 / 9000-9003, the
    scaler 8005 / 9005). Each group has a slot (name and ports) for each of its max_replicas, ten ports apart,
    whether it runs or not: the stable group's at base+1+10*i, the canary's from base+1+10*max(stable max_replicas,
    2); `replicas` lists every slot, `initial` marking those that start with the stack. With the mesh: Envoy's
    ingress base+80, admin base+1901 (8080, 9901; with `admin_socket`, the Unix socket `<log_dir>/mesh/admin.sock`
    instead), and the outbound listener of gateway, model, feature, cache at base+100..103. With traces: the OTLP
    receiver on 4317 for base 8000, else base+90; its UI base+91, and in retroactive mode Envoy's access log records
    base+92. A layout whose slots reach these (a stable group of 8 and a canary of 3 reach base+101) is refused:
    `clashing_ports`.

    With `socket_dir` (the default of a layout with a log dir) the gRPC servers of the gateways, model replicas,
    feature, cache and scaler listen on Unix sockets `<socket_dir>/<name>.sock`, and the mesh's listener of each
    service on `<socket_dir>/mesh-<service>.sock` (each 0600, in a 0700 folder: no other local user can call them);
    their gRPC ports are then unused and the mesh gets no listener ports. The ingress, /metrics, the trace store and
    Valkey stay TCP.
    """

    host: str = "127.0.0.1"
    gateways: list[GatewayReplica] = Field(
        default_factory=lambda: [GatewayReplica(name="gateway", port=8000, metrics_port=9000)],
        description="The gateway's replicas (the first is `gateway_port`).",
    )
    feature_port: int = 8002
    feature_metrics_port: int = 9002
    cache_port: int = 8003
    cache_metrics_port: int = 9003
    replicas: list[ModelReplica] = Field(description="Every model replica slot: the initial ones, those to scale to.")
    groups: list[ModelGroup] = Field(
        default_factory=list, description="The topology's model groups (their subsets, bounds and scaling policy)."
    )
    scaler_port: int | None = Field(None, description="The scaler service's port; None: no group autoscales.")
    scaler_metrics_port: int | None = None
    valkey_port: int | None = Field(
        None, description="The supervised Valkey of the feature store's port; None: an external Redis."
    )
    valkey_cache_port: int | None = Field(
        None, description="The supervised Valkey of the response cache's port; None: the cache uses the other Redis."
    )
    mesh: bool = Field(False, description="Run Envoy (rendered from istio/) between the services.")
    insecure: bool = Field(False, description="A plaintext ingress that asks for no token (quick trials).")
    ingress_port: int = 8080
    admin_port: int = 9901
    admin_socket: Path | None = Field(
        None, description="Envoy's admin on this Unix socket (mode 0600) instead of admin_port."
    )
    socket_dir: Path | None = Field(
        None,
        description="The folder (0700) of the services' Unix sockets and the mesh's service listeners; None: they "
        "listen on loopback TCP ports, open to every local user (tests and benchmarks that need ports).",
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
        sockets: bool | None = None,
    ) -> StackLayout:
        """The layout of `topology` (default: the demo stack) from `port_base` (0: every port a free one), its ports
        placed as the class docstring says. `sockets` (default: when there is a `log_dir`): the services and the
        mesh's service listeners on Unix sockets in `<log_dir>/sockets`; False: on TCP ports. Long because it names
        every field of the layout once."""
        ports = PortAllocator(port_base, host)
        topology = topology or StackTopology.demo()
        replicas = model_replicas(topology, ports)
        gateways = gateway_replicas(topology.gateway.replicas, ports, gateway_port)
        feature_port, feature_metrics_port = ports.pair(2)
        cache_port, cache_metrics_port = ports.pair(3)
        valkey_port = ports.one(4) if valkey else None
        valkey_cache_port = ports.one(6) if valkey else None
        scaler_ports = dict(zip(("scaler_port", "scaler_metrics_port"), ports.pair(5), strict=True))
        socket_dir = sockets_path(log_dir) if (log_dir is not None if sockets is None else sockets) else None
        listen = mesh_ports(ports, admin_socket, socket_dir is None) if mesh else {}
        traces_port, traces_ui_port, traces_recording_port = trace_ports(ports, tracing_mode) if traces else NO_TRACES
        layout = cls(
            traces_port=traces_port,
            traces_ui_port=traces_ui_port,
            traces_recording_port=traces_recording_port,
            traces_db=traces_db.resolve() if traces_db else None,
            tracing_mode=tracing_mode,
            mesh=mesh,
            insecure=insecure,
            ingress_port=listen.pop("ingress", 8080),
            admin_port=listen.pop("admin", 9901),
            admin_socket=admin_socket_path(log_dir) if mesh and admin_socket else None,
            socket_dir=socket_dir,
            listen_ports=listen,
            host=host,
            gateways=gateways,
            feature_port=feature_port,
            feature_metrics_port=feature_metrics_port,
            cache_port=cache_port,
            cache_metrics_port=cache_metrics_port,
            valkey_port=valkey_port,
            valkey_cache_port=valkey_cache_port,
            **(scaler_ports if topology.autoscaled else {}),
            replicas=replicas,
            groups=topology.groups,
            models_dir=(models_dir or default_models_dir()).resolve(),
            pipelines_dir=pipelines_dir.resolve() if pipelines_dir else None,
            log_dir=log_dir.resolve() if log_dir else None,
        )
        if clashes := layout.clashing_ports():
            raise ValueError(f"the layout from port base {port_base} gives one port to several: {'; '.join(clashes)}")
        layout.check_socket_paths()
        return layout

    @property
    def gateway_port(self) -> int:
        """The first gateway replica's port (the stack's gateway, reached without the mesh)."""
        return self.gateways[0].port

    @property
    def gateway_metrics_port(self) -> int:
        return self.gateways[0].metrics_port

    @property
    def initial_replicas(self) -> list[ModelReplica]:
        """The model replicas that start with the stack."""
        return [r for r in self.replicas if r.initial]

    @property
    def autoscaled(self) -> list[ModelGroup]:
        """The model groups whose replica count follows the demand."""
        return [g for g in self.groups if g.autoscaled]

    def slots(self, subset: str) -> list[ModelReplica]:
        """Every replica slot of a group, in order."""
        return [r for r in self.replicas if r.subset == subset]

    @property
    def admin(self) -> str:
        """Envoy's admin address as services.mesh takes it: `unix:/abs/admin.sock` or host:port."""
        return f"unix:{self.admin_socket}" if self.admin_socket is not None else self.address(self.admin_port)

    @property
    def valkey_config(self) -> Path:
        """The feature store's Valkey's config file (0600, in a 0700 folder: it holds the password); the folder is
        its data folder too (the append-only file)."""
        if self.log_dir is None:
            raise ValueError("the supervised Valkey's config lives in the log dir: the layout has none")
        return self.log_dir / "valkey" / "valkey.conf"

    @property
    def valkey_cache_config(self) -> Path:
        """The response cache's Valkey's config file (as `valkey_config`, in its own folder)."""
        return self.valkey_config.parent.parent / "valkey-cache" / "valkey.conf"

    def address(self, port: int) -> str:
        return f"{self.host}:{port}"

    def socket(self, name: str) -> Path | None:
        """The Unix socket of process `name`'s gRPC server (or `mesh-<service>`: a mesh listener); None on TCP."""
        return self.socket_dir / f"{name}.sock" if self.socket_dir is not None else None

    def service_address(self, name: str, port: int) -> str:
        """Where process `name` (gRPC port `port` in a TCP layout) serves gRPC: `unix:/path` or host:port."""
        socket = self.socket(name)
        return f"unix:{socket}" if socket is not None else self.address(port)

    def replica_address(self, replica: ModelReplica) -> str:
        return self.service_address(replica.name, replica.port)

    def mesh_address(self, service: str) -> str:
        """Where callers reach `service` through the mesh: its Envoy listener (a socket, or a port in listen_ports)."""
        socket = self.socket(f"mesh-{service}")
        return f"unix:{socket}" if socket is not None else self.address(self.listen_ports[service])

    def socket_paths(self) -> list[Path]:
        """Every Unix socket of the services and the mesh's service listeners (none in a TCP layout)."""
        names = [g.name for g in self.gateways] + [r.name for r in self.replicas] + ["feature", "cache"]
        names += ["scaler"] if self.scaler_port is not None else []
        names += [f"mesh-{service}" for service in MESH_SERVICES] if self.mesh else []
        return [p for p in map(self.socket, names) if p is not None]

    def check_socket_paths(self) -> None:
        """ValueError when a socket's path is longer than a Unix socket address holds."""
        for path in self.socket_paths():
            if len(os.fsencode(path)) > UNIX_PATH_MAX:
                raise ValueError(
                    f"the socket {path} is longer than a Unix socket path may be ({UNIX_PATH_MAX} bytes); "
                    "choose a shorter --log-dir"
                )

    def ports(self) -> list[tuple[str, int]]:
        """(owner, port) of every port the stack binds (gRPC ports only in a TCP layout)."""
        tcp = self.socket_dir is None
        out: list[tuple[str, int]] = []
        for g in self.gateways:
            out += [(g.name, g.port)] * tcp + [(f"{g.name} metrics", g.metrics_port)]
        out += [("feature", self.feature_port)] * tcp + [("feature metrics", self.feature_metrics_port)]
        out += [("cache", self.cache_port)] * tcp + [("cache metrics", self.cache_metrics_port)]
        for r in self.replicas:
            out += [(r.name, r.port)] * tcp + [(f"{r.name} metrics", r.metrics_port)]
        if self.valkey_port is not None:
            out.append(("valkey", self.valkey_port))
        if self.valkey_cache_port is not None:
            out.append(("valkey-cache", self.valkey_cache_port))
        if self.scaler_port is not None and tcp:
            out.append(("scaler", self.scaler_port))
        if self.scaler_metrics_port is not None:
            out.append(("scaler metrics", self.scaler_metrics_port))
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


def model_replicas(topology: StackTopology, ports: PortAllocator) -> list[ModelReplica]:
    """The model service's replica slots: the stable group's from offset 1 (lettered: model-v1-a, model-v1-b, ...),
    then the canary's after at least two stable slots (lettered when it may run several)."""
    replicas = replica_group(topology.stable, ports, 1, lettered=True)
    if topology.canary is not None:
        first = 10 * max(topology.stable.max_replicas, 2) + 1
        replicas += replica_group(topology.canary, ports, first, lettered=topology.canary.max_replicas > 1)
    return replicas


def replica_group(group: ModelGroup, ports: PortAllocator, first_offset: int, lettered: bool) -> list[ModelReplica]:
    """One group's slots up to its max_replicas, ten ports apart from `first_offset`; its first `replicas` initial."""
    out = []
    for i in range(group.max_replicas):
        port, metrics_port = ports.pair(first_offset + 10 * i)
        name = f"model-{group.subset}-{chr(ord('a') + i)}" if lettered else f"model-{group.subset}"
        out.append(
            ModelReplica(
                name=name,
                subset=group.subset,
                pinned_versions=group.pinned_versions,
                port=port,
                metrics_port=metrics_port,
                slot=i,
                initial=i < group.replicas,
            )
        )
    return out


def gateway_replicas(count: int, ports: PortAllocator, gateway_port: int | None = None) -> list[GatewayReplica]:
    """The gateway's replicas, ten ports apart (named gateway-a, gateway-b, ... when there are several); the first on
    `gateway_port` when given, and with fixed ports the others after it."""
    out = []
    for i in range(count):
        if gateway_port is None or (i > 0 and ports.free):
            port, metrics_port = ports.pair(10 * i)
        elif ports.free:
            port, metrics_port = gateway_port, ports.fresh()
        else:
            port, metrics_port = gateway_port + 10 * i, gateway_port + 10 * i + METRICS_OFFSET
        name = "gateway" if count == 1 else f"gateway-{chr(ord('a') + i)}"
        out.append(GatewayReplica(name=name, port=port, metrics_port=metrics_port))
    return out


def mesh_ports(ports: PortAllocator, admin_socket: bool, listeners: bool = True) -> dict[str, int]:
    """Envoy's ports: the outbound listener of each service (unless they are sockets), the ingress, and its admin
    unless on a socket."""
    out = {name: ports.one(100 + i) for i, name in enumerate(MESH_SERVICES)} if listeners else {}
    out["ingress"] = ports.one(80)
    if not admin_socket:
        out["admin"] = ports.one(1901)
    return out


def admin_socket_path(log_dir: Path | None) -> Path:
    """`<log_dir>/mesh/admin.sock`, refused when it is longer than a Unix socket path may be."""
    if log_dir is None:
        raise ValueError("Envoy's admin socket lives in the log dir: give log_dir")
    path = log_dir.resolve() / MESH_DIR / "admin.sock"
    if len(os.fsencode(path)) > UNIX_PATH_MAX:
        raise ValueError(
            f"Envoy's admin socket {path} is longer than a Unix socket path may be "
            f"({UNIX_PATH_MAX} bytes); choose a shorter --log-dir"
        )
    return path


def sockets_path(log_dir: Path | None) -> Path:
    """`<log_dir>/sockets`, where the stack's Unix sockets live."""
    if log_dir is None:
        raise ValueError("the stack's Unix sockets live in the log dir: give log_dir (or sockets=False)")
    return log_dir.resolve() / SOCKETS_DIR


def ensure_socket_dir(path: Path) -> None:
    """Make the sockets' folder, or take over a leftover one: mode 0700 and owned by this user (PermissionError
    otherwise), so that no other local user may connect to a socket in it whatever the socket's own mode."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if path.is_symlink() or not path.is_dir() or info.st_uid != os.getuid():
        raise PermissionError(f"{path}: not a folder of this user's; the stack's sockets cannot live there")
    path.chmod(0o700)


def socket_in_use(path: Path) -> bool:
    """Whether something answers a connect on the Unix socket `path` (a leftover socket file refuses it)."""
    if not path.is_socket():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def trace_ports(ports: PortAllocator, tracing_mode: str) -> tuple[int, int, int | None]:
    """The trace store's ports: its OTLP receiver (4317 with the default base), its UI, and in retroactive mode where
    it serves Envoy's access log records."""
    otlp = 4317 if ports.base == 8000 else ports.one(90)
    return otlp, ports.one(91), ports.one(92) if tracing_mode == "retroactive" else None
