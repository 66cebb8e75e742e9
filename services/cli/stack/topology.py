"""What the local stack runs: the model service's replica groups (mesh subsets, pinned versions, how far each may
scale) and the gateway's replica count, from a YAML file."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from services.common.validation import describe

DEMO_FILE = "demo_topology.yaml"
ELASTIC_FILE = "elastic_topology.yaml"
MAX_REPLICAS = 8
# A model replica's cold start, spawn to SERVING: about 1 s measured on a 2-core machine for the demo models
# (meshserve_model_cold_start_seconds: imports, load and warm-up), doubled for margin. A scale-down window shorter
# than this would let a group shrink before a replica it just started could take its first request.
COLD_START_S = 2.0
DEFAULT_TARGET_PER_REPLICA = 16.0
DEFAULT_SCALE_DOWN_WINDOW_S = 30.0
ON_DEMAND = "on_demand"  # validation context key: whether the stack can start replicas while it runs (the mesh)


class TopologyFileError(ValueError):
    """A stack topology file that cannot be read or does not validate; the message names the file and field."""


class ModelGroup(BaseModel):
    """Model-service replicas that serve one mesh subset, each loading only its pinned model versions; between
    `min_replicas` and `max_replicas` of them run, following the demand for `scale_on` (both default to `replicas`:
    a fixed group)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subset: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        description="The replicas' `version` label, which the DestinationRule subset of that name selects.",
    )
    replicas: int = Field(
        1, ge=0, le=MAX_REPLICAS, description="How many replicas run at start (0 only when min_replicas is 0)."
    )
    min_replicas: int = Field(
        ge=0, le=MAX_REPLICAS, description="The fewest replicas (0: the group sleeps without demand); default replicas."
    )
    max_replicas: int = Field(ge=0, le=MAX_REPLICAS, description="The most replicas (at least 1); default replicas.")
    pinned_versions: dict[str, list[int]] = Field(
        default_factory=dict, description="Per model, the only versions these replicas load (others load as usual)."
    )
    target_per_replica: float = Field(
        DEFAULT_TARGET_PER_REPLICA,
        gt=0,
        description="Demand (in-flight plus parked model calls at the gateways) one replica should carry.",
    )
    scale_down_window_s: float = Field(
        DEFAULT_SCALE_DOWN_WINDOW_S,
        description="How long the demand must have wanted fewer replicas before the group shrinks (at least the "
        "cold start).",
    )
    scale_on: str | None = Field(
        None,
        description="The model whose demand drives the group; default: the only model of pinned_versions (required "
        "when the group scales and pins several or none).",
    )

    @model_validator(mode="before")
    @classmethod
    def _fixed_by_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            count = data.get("replicas", 1)
            fixed = (count, count) if isinstance(count, int) and count >= 0 else (0, MAX_REPLICAS)  # else: its error
            data = {"min_replicas": fixed[0], "max_replicas": fixed[1], **data}
        return data

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> Self:
        if self.max_replicas == 0:
            raise ValueError(
                "max_replicas is 0: the group would never run a replica (to start at zero and wake on demand: "
                "replicas 0, min_replicas 0, max_replicas 1 or more)"
            )
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} is above max_replicas {self.max_replicas}")
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(
                f"replicas {self.replicas} is outside [min_replicas, max_replicas] = "
                f"[{self.min_replicas}, {self.max_replicas}]"
            )
        if self.scale_down_window_s < COLD_START_S:
            raise ValueError(
                f"scale_down_window_s {self.scale_down_window_s:g} is shorter than a replica's cold start "
                f"({COLD_START_S:g} s)"
            )
        if self.autoscaled and self.model is None:
            raise ValueError(
                f"scale_on is required: the group scales and pins {len(self.pinned_versions)} models "
                f"({', '.join(sorted(self.pinned_versions)) or 'none'})"
            )
        if self.autoscaled and not (info.context or {}).get(ON_DEMAND, True):
            field = "min_replicas" if self.min_replicas == 0 else "max_replicas"
            scaling = "scale to zero" if self.min_replicas == 0 else "autoscaling"
            raise ValueError(
                f"{field}: {scaling} needs the mesh, which starts replicas on demand (without it the gateway calls "
                f"one fixed replica); run with the mesh, or give the group min_replicas = max_replicas"
            )
        return self

    @property
    def autoscaled(self) -> bool:
        """Whether the replica count follows the demand (min_replicas below max_replicas)."""
        return self.min_replicas != self.max_replicas

    @property
    def model(self) -> str | None:
        """The model whose demand drives the group: `scale_on`, else the only pinned model (None: neither)."""
        if self.scale_on is not None:
            return self.scale_on
        return next(iter(self.pinned_versions)) if len(self.pinned_versions) == 1 else None


class GatewayGroup(BaseModel):
    """The gateway's replicas: each its own process and ports, all endpoints of the mesh's `gateway` service, which
    the ingress balances across (and stops sending to when one dies). It never scales: it is the activator that
    holds requests while a model group wakes up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="How many gateway processes run.")


class StackTopology(BaseModel):
    """The replicas of `meshserve up`: a stable model group, an optional canary, the gateway's count (feature, cache,
    Valkey, the trace store and Envoy always run once).

    Validated with the context {"on_demand": False} (a stack without the mesh), a group that scales is refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    stable: ModelGroup = Field(description="The subset that takes the bulk of the split (v1).")
    canary: ModelGroup | None = Field(None, description="The subset under trial (v2); none: no canary replicas.")
    gateway: GatewayGroup = Field(default_factory=GatewayGroup, description="The gateway's replicas.")

    @model_validator(mode="after")
    def _distinct_subsets(self) -> Self:
        if self.canary is not None and self.canary.subset == self.stable.subset:
            raise ValueError(f"the canary's subset must differ from the stable one ({self.stable.subset!r})")
        return self

    @property
    def groups(self) -> list[ModelGroup]:
        """The model groups: stable, then the canary if any."""
        return [self.stable] if self.canary is None else [self.stable, self.canary]

    @property
    def autoscaled(self) -> list[ModelGroup]:
        """The groups whose replica count follows the demand."""
        return [g for g in self.groups if g.autoscaled]

    @classmethod
    def load(cls, path: Path | Traversable, *, on_demand: bool = True) -> StackTopology:
        """Read and validate a topology file (`on_demand`: whether the stack can start replicas while it runs);
        TopologyFileError naming the file and the field at fault."""
        try:
            return cls.model_validate(yaml.safe_load(path.read_text()), context={ON_DEMAND: on_demand})
        except (OSError, yaml.YAMLError) as exc:
            raise TopologyFileError(f"{path}: {exc}") from None
        except ValidationError as exc:
            raise TopologyFileError(f"{path}: {describe(exc)}") from None

    @classmethod
    def demo(cls) -> StackTopology:
        """The default stack: the `demo_topology.yaml` shipped with the CLI."""
        return cls.load(demo_file())

    @classmethod
    def elastic(cls) -> StackTopology:
        """The benchmark's stack: `elastic_topology.yaml`, one subset scaling 0..3 and no canary."""
        return cls.load(shipped_file(ELASTIC_FILE))

    def with_counts(
        self,
        stable_replicas: int | None = None,
        canary: bool | None = None,
        gateway_replicas: int | None = None,
        *,
        on_demand: bool = True,
    ) -> StackTopology:
        """The command line's overrides: the stable group's replica count (its start count when it scales), whether
        the canary runs, the gateway's replica count; validated again for a stack that can (`on_demand`) or cannot
        start replicas while it runs. TopologyFileError naming the field at fault."""
        if canary and self.canary is None:
            raise TopologyFileError("the topology has no canary group to run")
        stable = self.stable.model_dump()
        if stable_replicas is not None:
            stable["replicas"] = stable_replicas
            if not self.stable.autoscaled:  # a fixed group stays fixed, at the new count
                stable.update(min_replicas=stable_replicas, max_replicas=stable_replicas)
        data = {
            "stable": stable,
            "canary": self.canary.model_dump() if self.canary is not None and canary is not False else None,
            "gateway": self.gateway.model_dump() if gateway_replicas is None else {"replicas": gateway_replicas},
        }
        try:
            return StackTopology.model_validate(data, context={ON_DEMAND: on_demand})
        except ValidationError as exc:
            raise TopologyFileError(describe(exc)) from None


def shipped_file(name: str) -> Traversable:
    """A topology shipped with the CLI, as a package resource (wherever it is installed)."""
    return resources.files("services.cli.stack") / name


def demo_file() -> Traversable:
    """The demo topology, as a package resource (it ships with the CLI, wherever it is installed)."""
    return shipped_file(DEMO_FILE)
