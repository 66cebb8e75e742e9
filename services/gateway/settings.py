"""Settings of the gateway (`MESHSERVE_GATEWAY_*`): where the other services are, pipelines, cold starts, admission,
and its tier (single, or the edge or cloud of a two-tier deployment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings

ROOT = Path(__file__).resolve().parents[2]


class GatewaySettings(ServiceSettings):
    """`python -m services.gateway` reads these from the environment."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_GATEWAY_", extra="ignore", frozen=True)

    port: int = Field(8000, ge=0, le=65535, description="gRPC port (the ingress API).")
    metrics_port: int = Field(9000, ge=0, le=65535, description="Prometheus /metrics port (0 disables).")
    pipelines_dir: Path = Field(ROOT / "pipelines", description="Folder of pipeline YAML files.")
    model_address: str = Field(
        "127.0.0.1:8001",
        description="Model service (or its mesh listener): host:port, or unix:/abs/path for a Unix socket (the local "
        "stack's mesh listeners).",
    )
    feature_address: str = Field("127.0.0.1:8002", description="Feature service (or its mesh listener), as above.")
    cache_address: str = Field("127.0.0.1:8003", description="Cache service (or its mesh listener), as above.")
    scaler_address: str = Field(
        "",
        description="Scaler service (services/scaler), host:port or unix:/abs/path: the gateway streams its demand "
        "there (model calls in flight and requests parked, per model and subset) on a change and every second; "
        "empty: no reporting.",
    )
    demand_interval_s: float = Field(
        0.1,
        gt=0,
        description="Shortest time between two demand reports to the scaler: changes in between go in the next one "
        "(each carries the most calls in flight since the previous); under load a report goes every interval. The "
        "local autoscaler reads the demand every 0.5 s.",
    )
    public_models: list[str] = Field(
        default_factory=list,
        description="Models besides the pipelines that clients may call by name through the gateway (JSON list); "
        "any other name is unknown here, so internal models are reachable only through their pipelines.",
    )
    admin_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token of the operator, the only caller that may load or unload models through the "
        "gateway ('authorization: Bearer <token>'); empty: only an operator JWT may (see jwks), or nobody.",
    )
    jwks: str = Field(
        "",
        description="JSON Web Key Set (the JSON itself, or the path of a file holding it) that verifies callers' "
        "JWTs (services/common/tokens.py: ES256, issuer https://meshserve.local, audience meshserve); loading "
        "and unloading also pass for 'authorization: Bearer <JWT>' whose subject is the operator's. Empty: only "
        "admin_token. Read once at start.",
    )
    model_admin_token: SecretStr | None = Field(
        None,
        description="Bearer token the gateway sends on the loads and unloads it forwards to the model service "
        "(its MESHSERVE_MODEL_ADMIN_TOKEN); unset: admin_token; empty: none sent.",
    )
    cold_start_wait_s: float = Field(
        20.0,
        ge=0,
        description="The longest a request waits, parked, for a model with no serving replica (scaled to zero: "
        "Envoy's 'no healthy upstream'), from when it first parks; past it UNAVAILABLE (or a pipeline's remedy, "
        "marked cold_start). Each request still leaves at its own deadline. 0: never wait (a remedy or UNAVAILABLE "
        "at once).",
    )
    park_limit: int = Field(
        1000, ge=1, description="The most requests parked per model; beyond, UNAVAILABLE at once (queue full)."
    )
    probe_interval_s: float = Field(
        0.05,
        gt=0,
        description="How often the gateway asks a cold model's readiness (ModelReady, routed like the parked "
        "requests) while requests are parked for it; the first ready answer releases them all.",
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

    tier: Literal["single", "edge", "cloud"] = Field(
        "single",
        description="single: one tier, pipelines' placement ignored. edge: requests are classified by their inputs' "
        "data classes; sensitive ones are answered here only, general ones go to the cloud tier as the pipeline's "
        "placement says, every outgoing call carries x-meshserve-data-class and x-meshserve-tier. cloud: requests "
        "marked sensitive (header or a value in a sensitive input) are refused with PERMISSION_DENIED.",
    )
    cloud_url: str = Field(
        "",
        description="With tier edge: host:port of the cloud tier (the edge's egress listener, or the cloud ingress "
        "directly); required when a pipeline sends general requests to the cloud.",
    )
    cloud_token_file: Path | None = Field(
        None,
        description="With tier edge: a file holding the bearer token the cloud ingress accepts (as `meshserve "
        "token` prints it), sent as 'authorization: Bearer <token>' on every cloud call; read once at start.",
    )
    cloud_tls_ca_file: Path | None = Field(
        None,
        description="With tier edge: the CA certificate (PEM) of the cloud ingress; set: TLS to cloud_url, unset: "
        "plaintext (a local egress listener that does TLS itself).",
    )

    @field_validator("jwks")
    @classmethod
    def _jwks_json(cls, value: str) -> str:
        """The key set's JSON, read from the file when `value` is a path; a key set with no keys is an error."""
        text = value.strip()
        if not text:
            return ""
        if not text.startswith("{"):
            try:
                text = Path(text).read_text().strip()
            except OSError as exc:
                raise ValueError(f"not a JWKS document nor a readable file ({exc.strerror})") from None
        try:
            keys = json.loads(text).get("keys")
        except (ValueError, AttributeError):
            raise ValueError("not a JWKS document (a JSON object with a 'keys' list)") from None
        if not isinstance(keys, list) or not keys:
            raise ValueError("the JWKS has no keys (a JSON object with a non-empty 'keys' list)")
        return text

    def model_operator_token(self) -> str:
        """The bearer token forwarded loads and unloads carry to the model service ('' for none)."""
        token = self.admin_token if self.model_admin_token is None else self.model_admin_token
        return token.get_secret_value()
