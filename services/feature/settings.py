"""Settings of the feature service (`MESHSERVE_FEATURE_*`, plus `MESHSERVE_REDIS_URL`, its store's URL)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[2]


class FeatureSettings(ServiceSettings):
    """`python -m services.feature` reads these from the environment."""

    model_config = SettingsConfigDict(
        env_prefix="MESHSERVE_FEATURE_", extra="ignore", frozen=True, populate_by_name=True
    )

    port: int = Field(8002, ge=0, le=65535, description="gRPC port.")
    metrics_port: int = Field(9002, ge=0, le=65535, description="Prometheus /metrics port (0 disables).")
    redis_url: str | None = Field(
        None,
        validation_alias=AliasChoices("MESHSERVE_REDIS_URL"),
        description="The feature store's Redis/Valkey URL (`MESHSERVE_REDIS_URL`, no service prefix; the stack and "
        "k8s/ give feature and cache a Redis each: this one keeps an append-only file and never evicts); unset starts "
        "an embedded Valkey.",
    )
    features_dir: Path = Field(ROOT / "features", description="Folder of feature set YAML files (`<name>_v<N>`).")
    key_prefix: str = Field("meshserve:feature:", description="Prefix of every Redis key this service writes.")
    lookup_budget_ms: float = Field(
        5.0, gt=0, description="Default time budget of the online lookup per Compute; past it rows are degraded."
    )
    lookup_budget_per_row_ms: float = Field(
        0.2, ge=0, description="Added to the default budget per row (Redis reads every row's buckets)."
    )
    ingest_timeout_ms: float = Field(
        1000.0,
        gt=0,
        description="Time allowed for one batched Ingest write, its confirmation on disk included (WAITAOF).",
    )
    generation_check_s: float = Field(
        1.0,
        gt=0,
        description="How often the store's generation marker is read (one GET), besides on every new connection: "
        "a store that lost its data (FLUSHALL) is noticed within this.",
    )
    max_batch: int = Field(1024, ge=1, description="Most rows in one Compute or events in one Ingest.")
    max_field_bytes: int = Field(
        256,
        ge=1,
        description="Most UTF-8 bytes of one string field of a row or event (an id, a category); longer is "
        "refused with INVALID_ARGUMENT naming row and field. (A whole request is bounded by max_message_bytes.)",
    )
    redis_max_connections: int = Field(64, ge=1, description="Redis connection pool size.")
    fault_delay_ms: float = Field(
        0.0, ge=0, description="Fault injection for drills and tests: every online lookup takes this much longer."
    )
    admin_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token of the operator, the only caller that may write online aggregates (Ingest needs "
        "'authorization: Bearer <token>'); empty: any caller that reaches the port may (a WARNING at start says so).",
    )
