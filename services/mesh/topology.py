"""MeshTopology: what a cluster knows from Kubernetes (each service's endpoints and listener, Envoy's addresses)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

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


def unix_path(address: str) -> Path | None:
    """The socket path of a `unix:/abs/path` address; None for `host:port`."""
    return Path(address[len(UNIX_PREFIX) :]) if address.startswith(UNIX_PREFIX) else None


def _admin_address(value: str) -> str:
    path = unix_path(value)
    if path is None:
        return _address(value)
    if not path.is_absolute() or len(str(path).encode()) > 100:  # sun_path holds 108 bytes
        raise ValueError(f"a unix admin address needs an absolute path of at most 100 bytes: {value!r}")
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MeshEndpoint(_Strict):
    """One running process (replica) of a service, as Envoy sees it; `labels` play the pod labels (`version` picks
    the DestinationRule subset)."""

    address: str = Field(description="host:port of the replica's gRPC server.")
    labels: dict[str, str] = Field(default_factory=lambda: {"version": "v1"}, description="Pod labels.")

    _check = field_validator("address")(classmethod(lambda cls, v: _address(v)))


class MeshService(_Strict):
    """A service as the mesh sees it: its endpoints and the local address that plays its Kubernetes Service."""

    listen: str = Field(description="host:port of the outbound listener callers use for this service.")
    replicas: list[MeshEndpoint] = Field(default_factory=list, description="Its endpoints, one per replica.")
    dynamic: bool = Field(
        False,
        description="Its clusters take their endpoints from files that `LocalMesh.set_endpoints` rewrites while Envoy "
        "runs (file-based EDS); False: the replicas are fixed in envoy.yaml.",
    )

    _check = field_validator("listen")(classmethod(lambda cls, v: _address(v)))


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
