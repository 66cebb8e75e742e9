"""Settings of the scaler service (`MESHSERVE_SCALER_*`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings


class ScalerSettings(ServiceSettings):
    """`python -m services.scaler` reads these from the environment."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_SCALER_", extra="ignore", frozen=True)

    port: int = Field(
        8005, ge=0, le=65535, description="gRPC port: KEDA's external-scaler API and the gateways' demand reports."
    )
    metrics_port: int = Field(9005, ge=0, le=65535, description="Prometheus /metrics port (0 disables).")
    stale_after_s: float = Field(
        3.0,
        gt=0,
        description="A gateway's demand is forgotten when its report stream sends nothing for this long (gateways "
        "report every second even when nothing changes), and the stream is ended so the gateway reconnects.",
    )
    target_per_replica: float = Field(
        8.0,
        gt=0,
        description="Demand (in-flight plus parked requests) one replica is meant to carry: the metric's target per "
        "replica in GetMetricSpec when the ScaledObject's metadata has no `targetPerReplica`.",
    )
    grace_period_s: float = Field(
        2.0,
        ge=0,
        description="On SIGTERM: how long RPCs may run before they are cancelled (the report and StreamIsActive "
        "streams end at once when draining starts: gateways and KEDA reconnect).",
    )
