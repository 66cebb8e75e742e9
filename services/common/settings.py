"""Typed settings shared by every service, read from `MESHSERVE_<SERVICE>_*` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    """Settings every gRPC service has; each service subclasses this with its own env prefix and ports."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_", extra="ignore", frozen=True)

    host: str = Field("0.0.0.0", description="Address the gRPC server binds.")
    port: int = Field(8000, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(9000, ge=0, le=65535, description="Prometheus /metrics port (0 disables).")
    grace_period_s: float = Field(
        20.0, ge=0, description="On SIGTERM: how long in-flight requests may run before they are cancelled."
    )
    shutdown_delay_s: float = Field(
        0.0,
        ge=0,
        description="On SIGTERM: keep accepting while health says NOT_SERVING, so load balancers notice "
        "(a preStop sleep); then stop accepting and drain.",
    )
    max_message_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest gRPC message received or sent; larger is refused."
    )
    keepalive_time_s: float = Field(30.0, gt=0, description="HTTP/2 keepalive ping interval.")
    keepalive_timeout_s: float = Field(10.0, gt=0, description="Keepalive ping ack timeout.")
    max_concurrent_rpcs: int | None = Field(
        None, ge=1, description="Hard cap on concurrent RPCs (grpc refuses more with RESOURCE_EXHAUSTED)."
    )
    reuse_port: bool = Field(False, description="Set SO_REUSEPORT so several processes can share the port.")
    log_level: str = Field("INFO", description="Python logging level.")
