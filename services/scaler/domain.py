"""The scaler's domain types: demand per model and subset, a gateway's snapshot of it, and what KEDA asks about
(no protobuf here)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

DemandKey = tuple[str, str]
"""(model, subset); subset "" when the mesh picks the subset (the calls pin none)."""

# The keys of a ScaledObject trigger's `metadata` this scaler reads (KEDA passes the whole block, `scalerAddress`
# among them; other keys are ignored).
MODEL_KEY = "model"
SUBSET_KEY = "subset"
TARGET_KEY = "targetPerReplica"
METRIC_PREFIX = "meshserve"
_NOT_IN_NAME = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class Demand:
    """Requests for one model and subset: calls in flight, and requests parked while it has no serving replica."""

    in_flight: int = 0
    parked: int = 0

    @property
    def total(self) -> int:
        return self.in_flight + self.parked

    def __add__(self, other: Demand) -> Demand:
        return Demand(self.in_flight + other.in_flight, self.parked + other.parked)


@dataclass(frozen=True, slots=True)
class DemandSnapshot:
    """One gateway's whole current demand (a key it leaves out has none)."""

    gateway: str
    demand: Mapping[DemandKey, Demand] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReportAck:
    """What a report stream gave the scaler: the snapshots it took."""

    reports: int


@dataclass(frozen=True, slots=True)
class ScaledTarget:
    """What one ScaledObject scales on: a model's demand, one subset's (`subset`) or every subset's (None), and the
    demand one replica should carry."""

    model: str
    subset: str | None
    target_per_replica: float

    @property
    def metric_name(self) -> str:
        return metric_name(self.model, self.subset)

    def covers(self, key: DemandKey) -> bool:
        return key[0] == self.model and (self.subset is None or key[1] == self.subset)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """GetMetricSpec's answer: the metric's name and its target value per replica."""

    name: str
    target: float


@dataclass(frozen=True, slots=True)
class MetricValue:
    """GetMetrics' answer: the metric's current value."""

    name: str
    value: float


def metric_name(model: str, subset: str | None) -> str:
    """`meshserve-<model>[-<subset>]` in what an HPA's external metric name accepts everywhere: lower-case letters,
    digits and dashes (`fraud_mlp`, `v2` -> `meshserve-fraud-mlp-v2`). Two names may meet (`a_b`, `a-b`): harmless,
    since GetMetrics reads the demand from the ScaledObject's metadata, never from the name."""
    parts = [METRIC_PREFIX, model, *([subset] if subset else [])]
    return "-".join(p for p in (_NOT_IN_NAME.sub("-", part.lower()).strip("-") for part in parts) if p)
