"""The scaler service's public surface: what another service may import from it (the gateway does, to report its
demand; an autoscaler of our own would, to read the scaling signal as KEDA does).

`DemandReporter` streams a gateway's demand per (model, subset) to the scaler; `ExternalScalerClient` makes KEDA's
external-scaler calls in domain types; the metadata keys are those of a ScaledObject's trigger.
"""

from __future__ import annotations

from services.scaler.client import DemandReporter, ExternalScalerClient
from services.scaler.domain import (
    MODEL_KEY,
    SUBSET_KEY,
    TARGET_KEY,
    Demand,
    DemandKey,
    MetricSpec,
    MetricValue,
    metric_name,
)

__all__ = [
    "MODEL_KEY",
    "SUBSET_KEY",
    "TARGET_KEY",
    "Demand",
    "DemandKey",
    "DemandReporter",
    "ExternalScalerClient",
    "MetricSpec",
    "MetricValue",
    "metric_name",
]
