"""Two tiers on one machine: an edge and a cloud stack, each a whole local stack (own Envoy, ports, state dir and
secrets), the edge's gateway reaching the cloud's ingress through the edge Envoy's egress listener."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from services.cli.stack.layout import ROOT, StackLayout
from services.cli.stack.ports import PortAllocator
from services.cli.stack.specs import ProcessSpec
from services.cli.stack.topology import GatewayGroup, ModelGroup, StackTopology, TopologyFileError, shipped_file
from services.common.validation import describe

EDGE_CLOUD = "edge_cloud"  # the name `--topology` takes for the shipped file
EDGE_CLOUD_FILE = "edge_cloud_topology.yaml"
TIERS = ("cloud", "edge")  # started in this order (the edge calls the cloud), stopped in the other
TierName = Literal["cloud", "edge"]
TIER_PORT_OFFSET = 200  # the cloud's port base is the edge's plus this (the edge keeps the documented 8080)
EGRESS_OFFSET = 104  # the edge Envoy's egress listener, after the outbound listeners at base+100..103
CLOUD_TOKEN_FILE = "cloud-token"  # in the edge's secrets: the edge gateway's bearer token for the cloud ingress
CLOUD_TOKEN_SUBJECT = "edge-gateway"
CLOUD_TOKEN_TTL_S = 30 * 24 * 3600.0
ISTIO = ROOT / "istio"
GENERAL_ROUTE = "general-to-the-cloud"  # istio/edge's route out, whose fault delay plays the WAN


class TierTopology(BaseModel):
    """One tier's stack: its model group (fixed), gateway replicas, the models its replicas serve, the models its
    gateway lets clients call by name, and its pipelines folder."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stable: ModelGroup = Field(description="The tier's model replicas (a fixed group: tiers do not autoscale).")
    gateway: GatewayGroup = Field(default_factory=GatewayGroup, description="The tier's gateway replicas.")
    serve_models: list[str] = Field(
        default_factory=list, description="The only models its replicas load (MESHSERVE_MODEL_SERVE_MODELS)."
    )
    public_models: list[str] = Field(
        default_factory=list, description="Models its gateway serves by name (MESHSERVE_GATEWAY_PUBLIC_MODELS)."
    )
    pipelines: Path | None = Field(
        None, description="Its gateway's pipelines folder, relative to the checkout (default: the gateway's)."
    )

    @model_validator(mode="after")
    def _fixed(self) -> Self:
        if self.stable.autoscaled:
            raise ValueError("stable: a tier's model group is fixed (min_replicas = max_replicas)")
        return self

    def stack(self) -> StackTopology:
        """The single-tier topology of this tier's stack (no canary)."""
        return StackTopology(stable=self.stable, gateway=self.gateway)

    def pipelines_dir(self) -> Path | None:
        if self.pipelines is None:
            return None
        return self.pipelines if self.pipelines.is_absolute() else ROOT / self.pipelines


class EdgeCloudTopology(BaseModel):
    """`meshserve up --topology edge_cloud`: the cloud and the edge tier, and the WAN delay between them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cloud: TierTopology
    edge: TierTopology

    def tier(self, name: str) -> TierTopology:
        return self.cloud if name == "cloud" else self.edge

    @classmethod
    def load(cls, path: Path | Traversable) -> EdgeCloudTopology:
        """Read and validate a two-tier topology file; TopologyFileError naming the file and the field."""
        try:
            return cls.model_validate(yaml.safe_load(path.read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise TopologyFileError(f"{path}: {exc}") from None
        except ValidationError as exc:
            raise TopologyFileError(f"{path}: {describe(exc)}") from None

    @classmethod
    def shipped(cls) -> EdgeCloudTopology:
        return cls.load(shipped_file(EDGE_CLOUD_FILE))


def tier_topology_file(topology: Path | None) -> Path | Traversable | None:
    """The two-tier file `--topology` names: `edge_cloud` (the shipped one), or a YAML file whose top level has
    `cloud` and `edge`; None for a single-tier topology (or none)."""
    if topology is None:
        return None
    if str(topology) == EDGE_CLOUD:
        return shipped_file(EDGE_CLOUD_FILE)
    try:
        data = yaml.safe_load(topology.read_text())
    except (OSError, yaml.YAMLError):
        return None  # StackTopology.load says what is wrong with it
    return topology if isinstance(data, dict) and {"cloud", "edge"} <= set(data) else None


@dataclass(frozen=True)
class TierLayouts:
    """Both tiers' layouts, each in its own state dir under the top-level log dir, and the edge's egress listener."""

    topology: EdgeCloudTopology
    log_dir: Path
    cloud: StackLayout
    edge: StackLayout
    egress_port: int

    def layout(self, tier: str) -> StackLayout:
        return self.cloud if tier == "cloud" else self.edge

    def tier_dir(self, tier: str) -> Path:
        return self.log_dir / tier

    @property
    def egress(self) -> str:
        return self.edge.address(self.egress_port)


def tier_layouts(
    topology: EdgeCloudTopology, log_dir: Path, port_base: int = 8000, models_dir: Path | None = None, **options: Any
) -> TierLayouts:
    """The layouts of both tiers: the edge from `port_base`, the cloud from `port_base` + 200 (0: free ports for
    both), each with its state dir `<log_dir>/<tier>`, its trace store there, its own Valkey, Envoy's admin on a
    socket; `options` are StackLayout.local's (host, traces, tracing_mode, insecure). ValueError on clashing ports."""
    log_dir = log_dir.resolve()
    layouts = {}
    for name in TIERS:
        tier = topology.tier(name)
        base = 0 if port_base == 0 else port_base + (TIER_PORT_OFFSET if name == "cloud" else 0)
        tier_dir = log_dir / name
        layouts[name] = StackLayout.local(
            base,
            topology=tier.stack(),
            models_dir=models_dir,
            pipelines_dir=tier.pipelines_dir(),
            traces_db=tier_dir / "traces.sqlite",
            valkey=True,
            log_dir=tier_dir,
            mesh=True,
            admin_socket=True,
            **options,
        )
    for name, layout in layouts.items():  # istio/ and the tier's own part of the split (istio/edge, istio/cloud)
        layouts[name] = layout.model_copy(update={"istio_paths": [*layout.istio_paths, ISTIO / name]})
    egress_port = PortAllocator(port_base, layouts["edge"].host).one(EGRESS_OFFSET)
    return TierLayouts(topology, log_dir, layouts["cloud"], layouts["edge"], egress_port)


def write_cloud_token(edge_secrets_dir: Path, token: str) -> Path:
    """The edge gateway's token for the cloud ingress, as a file only its owner reads (the gateway reads it at
    start)."""
    path = edge_secrets_dir / CLOUD_TOKEN_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)
    tmp.replace(path)
    return path


def is_service(spec: ProcessSpec, service: str) -> bool:
    """Whether the spec runs `python -m services.<service>`."""
    return spec.argv[-2:] == ["-m", f"services.{service}"]


def settings_env(settings: Any, **fields: Any) -> dict[str, str]:
    """The environment for `fields` through the service's settings class; the contract's plain names for fields
    the class does not have yet (`MESHSERVE_<SERVICE>_<FIELD>`)."""
    known = {k: v for k, v in fields.items() if k in settings.model_fields}
    env = settings.env_for(**known)
    prefix = settings.model_config.get("env_prefix", "")
    for k, v in fields.items():
        if k not in known and v is not None:
            env[f"{prefix}{k}".upper()] = json.dumps(v) if isinstance(v, list | dict) else str(v)
    return env


def tier_env(specs: list[ProcessSpec], tier: TierTopology, gateway: dict[str, Any]) -> None:
    """Give a tier's processes what is theirs in a tier: the model replicas only `serve_models`, the gateways
    their tier settings (`gateway`) and `public_models`."""
    from services.gateway.settings import GatewaySettings
    from services.model.settings import ModelSettings

    for spec in specs:
        if is_service(spec, "model") and tier.serve_models:
            spec.env.update(ModelSettings.env_for(serve_models=tier.serve_models))
        elif is_service(spec, "gateway"):
            public = {"public_models": tier.public_models} if tier.public_models else {}
            spec.env.update(settings_env(GatewaySettings, **gateway, **public))


def state_summary(layouts: TierLayouts, states: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The top-level stack.json: the edge's (where clients call: its ingress, CA and secrets), with `tiers` naming
    each tier's state dir and `pid` the process that runs them (`meshserve down` signals it)."""
    return {
        **states["edge"],
        "pid": os.getpid(),
        "tiers": {name: str(layouts.tier_dir(name)) for name in TIERS},
        "cloud_ingress": states["cloud"].get("ingress"),
        "egress": layouts.egress,
        "wan_delay_ms": wan_delay_ms(),
    }


def wan_delay_ms(istio: Path = ISTIO) -> float | None:
    """The emulated WAN: the fixed delay of istio/edge's route that takes general requests to the cloud (None when
    it has none)."""
    from services.mesh.durations import parse_duration

    try:
        docs = list(yaml.safe_load_all((istio / "edge" / "virtualservice.yaml").read_text()))
    except (OSError, yaml.YAMLError):
        return None
    for doc in docs:
        for route in ((doc or {}).get("spec") or {}).get("http") or []:
            delay = ((route.get("fault") or {}).get("delay") or {}).get("fixedDelay")
            if route.get("name") == GENERAL_ROUTE and delay:
                return round(parse_duration(str(delay)) * 1000.0, 3)
    return None
