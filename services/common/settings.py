"""Typed settings shared by every service, read from `MESHSERVE_<SERVICE>_*` environment variables."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from services.common.validation import describe


class EnvSettings(BaseSettings):
    """Settings read from the environment that a supervisor can also write: the variable names and values of fields."""

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable this class reads `field` from: its alias, else `<env_prefix><FIELD>`."""
        info = cls.model_fields[field]
        alias = info.validation_alias or info.alias
        if isinstance(alias, AliasChoices):
            alias = next((choice for choice in alias.choices if isinstance(choice, str)), None)
        if alias is None:
            return f"{cls.model_config.get('env_prefix', '')}{field}".upper()
        if not isinstance(alias, str):
            raise ValueError(f"{cls.__name__}.{field}: an alias path cannot be set from the environment")
        return alias.upper()

    @classmethod
    def env_for(cls, **fields: Any) -> dict[str, str]:
        """The environment variables from which this class reads exactly these field values.

        Field names are checked against the class and values validated as the service would (ValueError at
        once, naming the field), so a renamed field breaks the caller, not the started process. Values are
        encoded as pydantic-settings decodes them: JSON for complex fields (dict, list), plain text otherwise.
        A None is left unset (only for fields whose default is None: the environment cannot spell None).
        """
        unknown = sorted(set(fields) - set(cls.model_fields))
        if unknown:
            raise ValueError(f"{cls.__name__} has no field {', '.join(map(repr, unknown))}")
        try:
            validated = cls.model_validate(fields, by_name=True)
        except ValidationError as exc:
            raise ValueError(f"{cls.__name__}: {describe(exc)}") from None
        dumped = validated.model_dump(mode="json", include=set(fields))
        source = EnvSettingsSource(cls)
        env: dict[str, str] = {}
        for name in fields:
            value = dumped[name]
            info = cls.model_fields[name]
            if value is None:
                if info.get_default(call_default_factory=True) is not None:
                    raise ValueError(f"{cls.__name__}.{name}: None cannot be set from the environment")
                continue
            text = value if isinstance(value, str) and not source.field_is_complex(info) else json.dumps(value)
            env[cls.env_name(name)] = text
        return env


class ServiceSettings(EnvSettings):
    """Settings every gRPC service has; each service subclasses this with its own env prefix and ports."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_", extra="ignore", frozen=True)

    host: str = Field("0.0.0.0", description="Address the gRPC server binds.")
    port: int = Field(8000, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    unix_socket: Path | None = Field(
        None,
        description="Serve gRPC on this Unix socket (made mode 0600; keep it in a folder only its owner may enter) "
        "instead of host:port, so that only the socket's owner can call it (the local stack's default).",
    )
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
