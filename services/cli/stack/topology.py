"""What the local stack runs: the model service's replica groups (mesh subsets, pinned versions) and the gateway's
replica count, from a YAML file."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from services.common.validation import describe

DEMO_FILE = "demo_topology.yaml"
MAX_REPLICAS = 8


class TopologyFileError(ValueError):
    """A stack topology file that cannot be read or does not validate; the message names the file and field."""


class ModelGroup(BaseModel):
    """Model-service replicas that serve one mesh subset, each loading only its pinned model versions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subset: str = Field(
        pattern=r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$",
        description="The replicas' `version` label, which the DestinationRule subset of that name selects.",
    )
    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="How many replicas of this subset run.")
    pinned_versions: dict[str, list[int]] = Field(
        default_factory=dict, description="Per model, the only versions these replicas load (others load as usual)."
    )


class GatewayGroup(BaseModel):
    """The gateway's replicas: each its own process and ports, all endpoints of the mesh's `gateway` service, which
    the ingress balances across (and stops sending to when one dies)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS, description="How many gateway processes run.")


class StackTopology(BaseModel):
    """The replicas of `meshserve up`: a stable model group, an optional canary, the gateway's count (feature, cache,
    Valkey, the trace store and Envoy always run once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stable: ModelGroup = Field(description="The subset that takes the bulk of the split (v1).")
    canary: ModelGroup | None = Field(None, description="The subset under trial (v2); none: no canary replicas.")
    gateway: GatewayGroup = Field(default_factory=GatewayGroup, description="The gateway's replicas.")

    @model_validator(mode="after")
    def _distinct_subsets(self) -> Self:
        if self.canary is not None and self.canary.subset == self.stable.subset:
            raise ValueError(f"the canary's subset must differ from the stable one ({self.stable.subset!r})")
        return self

    @classmethod
    def load(cls, path: Path | Traversable) -> StackTopology:
        """Read and validate a topology file; TopologyFileError naming the file and the field at fault."""
        try:
            return cls.model_validate(yaml.safe_load(path.read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise TopologyFileError(f"{path}: {exc}") from None
        except ValidationError as exc:
            raise TopologyFileError(f"{path}: {describe(exc)}") from None

    @classmethod
    def demo(cls) -> StackTopology:
        """The default stack: the `demo_topology.yaml` shipped with the CLI."""
        return cls.load(demo_file())

    def with_counts(
        self, stable_replicas: int | None = None, canary: bool | None = None, gateway_replicas: int | None = None
    ) -> StackTopology:
        """The command line's overrides: the stable group's replica count, whether the canary runs, the gateway's
        replica count."""
        stable = self.stable
        if stable_replicas is not None:
            stable = ModelGroup.model_validate({**stable.model_dump(), "replicas": stable_replicas})
        if canary and self.canary is None:
            raise TopologyFileError("the topology has no canary group to run")
        gateway = self.gateway if gateway_replicas is None else GatewayGroup(replicas=gateway_replicas)
        return StackTopology(stable=stable, canary=self.canary if canary is not False else None, gateway=gateway)


def demo_file() -> Traversable:
    """The demo topology, as a package resource (it ships with the CLI, wherever it is installed)."""
    return resources.files("services.cli.stack") / DEMO_FILE
