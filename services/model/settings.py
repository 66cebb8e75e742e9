"""Settings of the model service (`MESHSERVE_MODEL_*`)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from services.common.settings import ServiceSettings


class ModelSettings(ServiceSettings):
    """`python -m services.model` reads these from the environment."""

    model_config = SettingsConfigDict(env_prefix="MESHSERVE_MODEL_", extra="ignore", frozen=True)

    port: int = Field(8001, ge=0, le=65535, description="gRPC port.")
    metrics_port: int = Field(9001, ge=0, le=65535, description="Prometheus /metrics port (0 disables).")
    repository: Path = Field(Path("models"), description="Model repository root (Triton layout).")
    models: list[str] = Field(
        default_factory=list,
        description="Models to load at start (JSON list); empty loads every model this replica serves.",
    )
    serve_models: list[str] = Field(
        default_factory=list,
        description=(
            "The only models of the repository this replica serves (JSON list, e.g. '[\"fraud_mlp\"]'): the others "
            "are never read, loaded or imported (nor their backends), RepositoryIndex lists them UNAVAILABLE, and "
            "calls for them get NOT_FOUND naming this setting; `models` must be among them. Empty: every model."
        ),
    )
    watch: bool = Field(True, description="Watch the repository and hot-reload changed models.")
    watch_debounce_ms: int = Field(500, ge=50, description="Quiet time after a change before reloading.")
    watch_force_polling: bool = Field(False, description="Poll instead of inotify (network filesystems).")
    torch_threads: int = Field(
        0,
        ge=0,
        description=(
            "torch intra-op threads per process (0: 1 when every model loaded at start runs inline, else torch's "
            "default)."
        ),
    )
    inline_max_forward_us: int = Field(
        1000,
        ge=0,
        description=(
            "For models with `execution: auto`: the longest warm-up forward (at the largest batch) that still runs "
            "on the event loop; longer ones run on worker threads (0: always worker threads)."
        ),
    )
    pinned_versions: dict[str, list[int]] = Field(
        default_factory=dict,
        description=(
            "Per model, the only versions this replica loads (JSON, e.g. '{\"fraud_mlp\": [1]}'); overrides the "
            "model's version_policy so that a replica serves one mesh subset (v1 or the v2 canary)."
        ),
    )
    plan_cache: Path = Field(
        Path(tempfile.gettempdir()) / "meshserve-plans",
        description=(
            "Where the tensorrt backend keeps the plans it builds, one per TensorRT version, GPU, ONNX hash, profile "
            "and precision (writable; the repository stays read-only). A plan is rebuilt only when its key changes."
        ),
    )
    fault_delay_ms: float = Field(
        0.0,
        ge=0,
        description="Fault injection for drills and tests: every forward pass takes this much longer (0: off).",
    )
    admin_token: SecretStr = Field(
        SecretStr(""),
        description="Bearer token of the operator, the only caller that may load or unload models "
        "(RepositoryModelLoad/Unload need 'authorization: Bearer <token>'); empty: any caller that reaches the "
        "port may (a WARNING at start says so).",
    )

    @model_validator(mode="after")
    def _models_are_served(self) -> ModelSettings:
        """`models` loads at start only what this replica serves: a name outside `serve_models` is a typo or a
        contradiction, refused at start rather than logged as a failed load."""
        outside = [name for name in self.models if self.serve_models and name not in self.serve_models]
        if outside:
            raise ValueError(
                f"models {outside} are not in serve_models {self.serve_models}: a replica loads only what it serves"
            )
        return self
