"""Settings of the local trace store (`MESHSERVE_TRACES_*`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings
from services.traces.store import DEFAULT_DB


class TracesSettings(ServiceSettings):
    """`python -m services.traces` reads these from the environment."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_TRACES_", extra="ignore", frozen=True)

    port: int = Field(4317, ge=0, le=65535, description="OTLP/gRPC port (the standard 4317).")
    metrics_port: int = Field(0, ge=0, le=65535, description="Prometheus /metrics port (0, the default, disables).")
    grace_period_s: float = Field(2.0, ge=0, description="On SIGTERM: how long in-flight Exports may run.")
    db: Path = Field(DEFAULT_DB, description="SQLite file holding the recent traces (WAL mode).")
    max_spans: int = Field(200_000, ge=1, description="Most spans kept; past it the oldest traces go, whole.")
    max_age_s: float = Field(
        3600.0, ge=0, description="Traces nothing arrived for in this long are evicted, whole (0: no age bound)."
    )
    batch_max_spans: int = Field(5000, ge=1, description="Most spans written in one SQLite transaction.")
    ui_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="HTTP port of the trace UI and its JSON API (0 picks a free one; unset, the default: no UI).",
    )
    ui_host: str = Field(
        "127.0.0.1",
        description="Address the UI binds: loopback by default (it shows every kept request's attributes); on a "
        "loopback address it answers only requests naming a loopback host.",
    )
    ui_token: SecretStr = Field(
        SecretStr(""),
        description="The token the UI asks for (as `?token=` in the address it prints at start, which sets a "
        "cookie, or as a bearer token); empty: a fresh random one at every start.",
    )
    queue_max_spans: int = Field(
        100_000, ge=1, description="Spans waiting to be written; Exports past it are rejected (partial_success)."
    )
    recording_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Retroactive tracing: keep Envoy's access log records (OTLP logs on the gRPC port) in memory "
        "and serve them to collectors on this HTTP port (`POST /recording/collect`); unset: logs are refused.",
    )
    recording_max_records: int = Field(
        50_000, ge=1, description="Access log records kept for collection; past it the oldest traces go, whole."
    )
