"""Settings of the cache service (`MESHSERVE_CACHE_*`, plus the shared `MESHSERVE_REDIS_URL`)."""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings


class CacheSettings(ServiceSettings):
    """`python -m services.cache` reads these from the environment."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_CACHE_", extra="ignore", frozen=True, populate_by_name=True)

    port: int = Field(8003, ge=0, le=65535, description="gRPC port.")
    metrics_port: int = Field(9003, ge=0, le=65535, description="Prometheus /metrics port (0 disables).")
    redis_url: str | None = Field(
        None,
        validation_alias=AliasChoices("MESHSERVE_REDIS_URL"),
        description="The response cache's Redis/Valkey URL (`MESHSERVE_REDIS_URL`, no service prefix; the stack and "
        "k8s/ give cache and feature a Redis each: this one may evict); unset starts an embedded Valkey.",
    )
    key_prefix: str = Field("meshserve:cache:", description="Prefix of every Redis key this service writes.")
    l1_max_bytes: int = Field(64 * 1024 * 1024, ge=0, description="In-process L1 byte budget (0 disables L1).")
    l1_max_ttl_s: float = Field(
        30.0, gt=0, description="Longest an entry lives in L1 (bounds how long another replica's invalidation lags)."
    )
    lookup_budget_ms: float = Field(2.0, gt=0, description="Default time budget of the Redis tier per lookup.")
    watch_heartbeat_s: float = Field(
        5.0, gt=0, description="A Watch stream carries an empty event after this long without one (proxies keep it)."
    )
    store_timeout_ms: float = Field(50.0, gt=0, description="Time allowed for one batched Redis write.")
    max_value_bytes: int = Field(1024 * 1024, ge=1, description="Largest value accepted by Store.")
    max_key_bytes: int = Field(64, ge=1, le=255, description="Longest key accepted (keys are digests).")
    max_batch: int = Field(1024, ge=1, description="Most keys or entries in one Lookup or Store.")
    max_ttl_s: float = Field(86400.0, gt=0, description="Longest fresh TTL accepted by Store.")
    max_stale_ttl_s: float = Field(86400.0, ge=0, description="Longest stale window accepted by Store.")
    circuit_failures: int = Field(5, ge=1, description="Consecutive Redis failures that open the circuit.")
    circuit_probe_interval_s: float = Field(1.0, gt=0, description="While open: how often Redis is probed (PING).")
    redis_max_connections: int = Field(64, ge=1, description="Redis connection pool size.")
    admin_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token of the operator, the only caller that may drop cached answers (Invalidate needs "
        "'authorization: Bearer <token>'); empty: any caller that reaches the port may (a WARNING at start says so).",
    )
