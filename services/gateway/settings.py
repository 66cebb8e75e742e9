"""Settings of the gateway (`MESHSERVE_GATEWAY_*`): where the other services are, pipelines, admission."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[2]


class GatewaySettings(ServiceSettings):
    """`python -m services.gateway` reads these from the environment."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_GATEWAY_", extra="ignore", frozen=True)

    port: int = Field(8000, ge=0, le=65535, description="gRPC port (the ingress API).")
    metrics_port: int = Field(9000, ge=0, le=65535, description="Prometheus /metrics port (0 disables).")
    pipelines_dir: Path = Field(ROOT / "pipelines", description="Folder of pipeline YAML files.")
    model_address: str = Field("127.0.0.1:8001", description="Model service (or its mesh listener), host:port.")
    feature_address: str = Field("127.0.0.1:8002", description="Feature service (or its mesh listener).")
    cache_address: str = Field("127.0.0.1:8003", description="Cache service (or its mesh listener).")
    public_models: list[str] = Field(
        default_factory=list,
        description="Models besides the pipelines that clients may call by name through the gateway (JSON list); "
        "any other name is unknown here, so internal models are reachable only through their pipelines.",
    )
    admin_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token of the operator, the only caller that may load or unload models through the "
        "gateway ('authorization: Bearer <token>'); empty: nobody may.",
    )
    max_inflight: int = Field(256, ge=1, description="Requests in flight across all pipelines; beyond: shed.")
    min_limit: int = Field(16, ge=1, description="The adaptive limit never goes below this (nor above the cap).")
    retry_after_ms: int = Field(
        50, ge=0, description="Retry hint sent with RESOURCE_EXHAUSTED (grpc-retry-pushback-ms)."
    )
    low_priority_share: float = Field(
        0.5, gt=0, le=1, description="Low-priority requests are admitted only below this share of the limit."
    )
    versions_refresh_s: float = Field(
        1.0, gt=0, description="How often the serving model versions are re-read (cache keys use them)."
    )
    versions_ttl_s: float = Field(
        3.0, gt=0, description="A version not seen serving for this long stops being looked up in the cache."
    )
    near_cache_ttl_s: float = Field(
        2.0,
        ge=0,
        description="Fresh cache hits are kept in the gateway's own memory for at most this long, so hot "
        "requests skip the cache RPC (bounded staleness after an Invalidate); 0 turns the near cache off.",
    )
    near_cache_max_bytes: int = Field(32 * 1024 * 1024, ge=0, description="Memory budget of the near cache.")
    near_cache_watched_ttl_s: float = Field(
        60.0,
        ge=0,
        description="While the cache service's invalidation stream (Watch) is live, fresh hits stay near this "
        "long (never past the pipeline's own TTL); near_cache_ttl_s applies while it is not. 0: no watch.",
    )
    watch_heartbeat_timeout_s: float = Field(
        15.0, gt=0, description="A Watch stream silent this long (the cache sends heartbeats) counts as lost."
    )
