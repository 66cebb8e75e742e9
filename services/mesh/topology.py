"""MeshTopology: what a cluster knows from Kubernetes (each service's endpoints and listener, Envoy's addresses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from services.common.validation import describe
from services.mesh.durations import Duration
from services.mesh.errors import MeshConfigError


def split_address(address: str) -> tuple[str, int]:
    """`host:port` to (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r}")
    return host, int(port)


def _address(value: str) -> str:
    split_address(value)
    return value


UNIX_PREFIX = "unix:"
UNIX_PATH_MAX = 100  # sun_path holds 108 bytes
PIPE_MODE = 0o600  # a socket Envoy listens on: only the user running the mesh may connect


def unix_path(address: str) -> Path | None:
    """The socket path of a `unix:/abs/path` address; None for `host:port`."""
    return Path(address[len(UNIX_PREFIX) :]) if address.startswith(UNIX_PREFIX) else None


def _socket_or_address(value: str) -> str:
    """`host:port`, or `unix:/abs/path` whose path fits a Unix socket address."""
    path = unix_path(value)
    if path is None:
        return _address(value)
    if not path.is_absolute() or len(str(path).encode()) > UNIX_PATH_MAX:
        raise ValueError(f"a unix address needs an absolute path of at most {UNIX_PATH_MAX} bytes: {value!r}")
    return value


_admin_address = _socket_or_address


def envoy_address(address: str, mode: int | None = None) -> dict[str, Any]:
    """Envoy's Address of `host:port` (a SocketAddress) or `unix:/abs/path` (a Pipe; `mode`, for a socket Envoy
    binds, is the file mode it gets)."""
    path = unix_path(address)
    if path is not None:
        return {"pipe": {"path": str(path), **({"mode": mode} if mode is not None else {})}}
    host, port = split_address(address)
    return {"socket_address": {"address": host, "port_value": port}}


def host_key(address: str) -> str:
    """How Envoy's admin (/clusters) names the host at `address`: `host:port`, or a Unix socket's bare path."""
    path = unix_path(address)
    return str(path) if path is not None else address


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MeshEndpoint(_Strict):
    """One running process (replica) of a service, as Envoy sees it; `labels` play the pod labels (`version` picks
    the DestinationRule subset)."""

    address: str = Field(description="host:port, or unix:/abs/path, of the replica's gRPC server.")
    labels: dict[str, str] = Field(default_factory=lambda: {"version": "v1"}, description="Pod labels.")

    _check = field_validator("address")(classmethod(lambda cls, v: _socket_or_address(v)))


class MeshService(_Strict):
    """A service as the mesh sees it: its endpoints and the local address that plays its Kubernetes Service."""

    listen: str = Field(
        description="host:port of the outbound listener callers use for this service, or unix:/abs/path for a socket "
        "only the mesh's user may connect to (mode 0600)."
    )
    replicas: list[MeshEndpoint] = Field(default_factory=list, description="Its endpoints, one per replica.")
    dynamic: bool = Field(
        False,
        description="Its clusters take their endpoints from files that `LocalMesh.set_endpoints` rewrites while Envoy "
        "runs (file-based EDS); False: the replicas are fixed in envoy.yaml.",
    )

    _check = field_validator("listen")(classmethod(lambda cls, v: _socket_or_address(v)))


class HealthCheck(_Strict):
    """Active grpc.health.v1 checks of every replica (Kubernetes readiness probes play this role in a cluster)."""

    interval: Duration = "2s"
    timeout: Duration = "1s"
    unhealthy_threshold: int = Field(2, ge=1)
    healthy_threshold: int = Field(1, ge=1)
    no_traffic_interval: Duration = "2s"
    service_name: str = Field("", description="grpc.health.v1 service name asked ('' = the whole server).")
    unhealthy_interval: Duration = Field(
        "0.25s",
        description="Dynamic services only: how often a host that is not (yet) healthy is checked, so that a replica "
        "added before it serves enters the rotation within this time of serving.",
    )


class IngressTls(_Strict):
    """The certificate the ingress presents: the local stand-in for the Gateway server's `credentialName`."""

    cert_chain: Path = Field(description="PEM certificate chain (server certificate first).")
    private_key: Path = Field(description="PEM private key of the server certificate.")


class Egress(_Strict):
    """The edge tier's way to the cloud tier: a loopback listener whose routes are the VirtualService of a
    ServiceEntry host (istio/edge), leading to the cloud tier's ingress."""

    listen: str = Field(description="host:port of the egress listener (what the edge gateway calls the cloud at).")
    cloud_ingress: str = Field(description="host:port of the cloud tier's ingress (plays the ServiceEntry host).")
    host: str | None = Field(
        None, description="The ServiceEntry host this egress leads to; None: the only ServiceEntry of istio/."
    )
    tls_ca: Path | None = Field(
        None,
        description="PEM CA certificate the cloud ingress's certificate must chain to (the DestinationRule's tls "
        "SIMPLE); None: the local cloud ingress is plaintext.",
    )
    tls_server_name: str | None = Field(
        None,
        description="With `tls_ca`: the name sent as SNI and required among the certificate's subject alternative "
        "names; None: the host of `cloud_ingress`.",
    )

    _check = field_validator("listen", "cloud_ingress")(classmethod(lambda cls, v: _address(v)))


class MeshTopology(_Strict):
    """Everything local that a cluster would know from Kubernetes: services, endpoints, ports, collector."""

    services: dict[str, MeshService]
    ingress: str | None = Field("127.0.0.1:8080", description="Ingress listener (plays the ingress gateway).")
    admin: str = Field(
        "127.0.0.1:9901",
        description="Envoy admin (/stats, /clusters, /ready): host:port, or unix:/abs/path for a socket only its "
        "owner may open (mode 0600).",
    )
    otlp: str | None = Field(None, description="host:port of an OTLP/gRPC collector; None exports no spans.")
    access_log: bool = Field(
        False,
        description="With `otlp`: send every request's access log record to its LogsService too, from which "
        "retroactive tracing rebuilds Envoy's spans of kept requests Envoy did not sample.",
    )
    otlp_token_file: Path | None = Field(
        None,
        description="With `otlp`: a file holding the bearer token Envoy sends the collector (its tracer's and access "
        "log's `authorization` header; the local stack's internal credential); None: none sent.",
    )
    health_check: HealthCheck | None = Field(default_factory=HealthCheck)
    node_id: str = "meshserve-local"
    ingress_tls: IngressTls | None = Field(
        None, description="Certificate files of the ingress's TLS server (Gateway tls SIMPLE); None: plaintext."
    )
    jwks: dict[str, str] = Field(
        default_factory=dict,
        description="Issuer -> JWKS JSON, replacing the inline `jwks` of the RequestAuthentication rule of that "
        "issuer (the local stack's own signing key; istio/ holds a placeholder the cluster overlays).",
    )
    egress: Egress | None = Field(
        None, description="The edge tier's egress listener to the cloud tier; None: no egress (one tier, or the cloud)."
    )
    authenticate: bool = Field(
        True,
        description="False: no jwt_authn at the ingress, so no caller has a principal: ALLOW rules asking only for "
        "some authenticated caller (requestPrincipals '*') admit everyone, DENY rules with notRequestPrincipals deny "
        "everyone (admin RPCs closed for all).",
    )

    @field_validator("ingress", "otlp")
    @classmethod
    def _addresses(cls, value: str | None) -> str | None:
        return None if value is None else _address(value)

    @field_validator("admin")
    @classmethod
    def _admin(cls, value: str) -> str:
        return _admin_address(value)

    @model_validator(mode="after")
    def _egress_name_free(self) -> MeshTopology:
        if self.egress is not None and "egress" in self.services:
            raise ValueError("a service named 'egress' and the egress listener would share a listener name")
        return self

    @classmethod
    def load(cls, path: Path | str) -> MeshTopology:
        """Read a YAML or JSON topology file; errors name the file and field."""
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text())
            return cls.model_validate(data)
        except (OSError, yaml.YAMLError) as exc:
            raise MeshConfigError(f"{path}: {exc}") from None
        except ValidationError as exc:
            raise MeshConfigError(f"{path}: topology: {describe(exc)}") from None

    def dump(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2)
