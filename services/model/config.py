"""The per-model configuration document (`models/<name>/config.yaml`), validated by pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, model_validator
from pydantic_core import PydanticCustomError

from services.common.errors import InvalidArgument
from services.common.validation import describe
from services.model.backends import BACKENDS, registered, unknown_backend_message

Datatype = Literal[
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
    "BF16",
    "BYTES",
]
FLOAT_DATATYPES = frozenset({"FP16", "FP32", "FP64", "BF16"})


def _registered_backend(name: str) -> str:
    if name not in BACKENDS:
        raise PydanticCustomError("unknown_backend", "{message}", {"message": unknown_backend_message(name)})
    return name


# The choices are the registry's keys: a backend is configurable exactly when one is registered to serve it.
BackendName = Annotated[
    str, AfterValidator(_registered_backend), WithJsonSchema({"type": "string", "enum": registered()})
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    """One input or output tensor."""

    name: str = Field(min_length=1)
    datatype: Datatype
    dims: list[int] = Field(min_length=0, description="Shape without the batch dimension; -1 = any size.")
    allow_nan: bool = Field(
        False,
        description="Accept NaN/Inf, and values whose square overflows (FP32/BF16 past 1.8e19, FP64 past 1.3e154), "
        "in this (float) input; refused by default.",
    )

    @model_validator(mode="after")
    def _check_dims(self) -> TensorSpec:
        if any(d == 0 or d < -1 for d in self.dims):
            raise ValueError(f"dims must be positive or -1, got {self.dims}")
        return self


class DynamicBatching(_Strict):
    """Dynamic batching knobs, as in Triton's dynamic batcher."""

    max_queue_delay_us: int = Field(
        100,
        ge=0,
        description=(
            "Longest a request waits for company, only when company is due: inline, while the event loop is "
            "still busy with arriving requests; on worker threads, while another batch computes or fewer rows "
            "are queued than the model held a moment ago. A lone request on an idle model never waits."
        ),
    )
    preferred_batch_sizes: list[int] = Field(default_factory=list)
    allowed_batch_sizes: list[int] = Field(
        default_factory=list,
        description="Batches are padded up to one of these sizes, then the padding stripped.",
    )
    max_queue_size: int = Field(1024, ge=1, description="Queued requests beyond this are refused at once.")


class LatestPolicy(_Strict):
    num_versions: int = Field(1, ge=1)


class SpecificPolicy(_Strict):
    versions: list[int] = Field(min_length=1)


class VersionPolicy(_Strict):
    """Which versions to serve: exactly one of `latest`, `all`, `specific`."""

    latest: LatestPolicy | None = None
    all: dict | None = None
    specific: SpecificPolicy | None = None

    @model_validator(mode="after")
    def _one_choice(self) -> VersionPolicy:
        chosen = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(chosen) > 1:
            raise ValueError(f"choose one of latest/all/specific, got {chosen}")
        return self

    def select(self, available: list[int]) -> list[int]:
        """The versions this policy serves out of those present on disk (ascending)."""
        ordered = sorted(available)
        if self.all is not None:
            return ordered
        if self.specific is not None:
            return [v for v in ordered if v in set(self.specific.versions)]
        n = self.latest.num_versions if self.latest is not None else 1
        return ordered[-n:]


class Optimization(_Strict):
    """Load-time optimisations."""

    quantization: Literal["none", "int8"] = Field(
        "none", description="int8: dynamic INT8 quantization of Linear layers at load (CPU)."
    )


class VersionOverride(_Strict):
    """Settings that differ for one version (e.g. version 2 served as INT8)."""

    optimization: Optimization | None = None


class ModelConfig(_Strict):
    """A model in the repository; see README 'Serve your own TorchScript model'."""

    name: str = Field(min_length=1)
    backend: BackendName = Field("torchscript", description="A name registered in services.model.backends.")
    default_model_filename: str = "model.pt"
    max_batch_size: int = Field(0, ge=0, description="0: the model has no batch dimension in dims.")
    inputs: list[TensorSpec] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    dynamic_batching: DynamicBatching | None = None
    version_policy: VersionPolicy = Field(default_factory=VersionPolicy)
    optimization: Optimization = Field(default_factory=Optimization)
    version_overrides: dict[int, VersionOverride] = Field(default_factory=dict)
    instance_count: int = Field(1, ge=1, le=16, description="Concurrent executions (worker threads).")
    execution: Literal["auto", "inline", "thread"] = Field(
        "auto",
        description=(
            "Where forward passes run. inline: on the event loop (for forwards shorter than a thread handoff); "
            "thread: on the version's worker threads; auto: inline when the warm-up forward at the largest batch "
            "took at most the service's inline_max_forward_us (and back to threads if forwards grow slower)."
        ),
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    warmup: bool = True

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            names = [s.name for s in specs]
            if len(set(names)) != len(names):
                raise ValueError(f"duplicate {kind} names: {names}")
        if self.dynamic_batching is not None:
            if self.max_batch_size < 1:
                raise ValueError("dynamic_batching needs max_batch_size >= 1")
            for field in ("preferred_batch_sizes", "allowed_batch_sizes"):
                sizes = getattr(self.dynamic_batching, field)
                bad = [s for s in sizes if not 1 <= s <= self.max_batch_size]
                if bad:
                    raise ValueError(f"dynamic_batching.{field} {bad} outside 1..max_batch_size")
        return self

    def optimization_for(self, version: int) -> Optimization:
        override = self.version_overrides.get(version)
        if override is not None and override.optimization is not None:
            return override.optimization
        return self.optimization


def load_model_config(path: Path, expected_name: str | None = None, shown: str | None = None) -> ModelConfig:
    """Read and validate a config.yaml; errors name the file (as `shown`, default the path) and the offending
    field."""
    where = shown or str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise InvalidArgument(f"{where}: cannot read model config: {exc.strerror or type(exc).__name__}") from exc
    except yaml.YAMLError as exc:
        raise InvalidArgument(f"{where}: cannot read model config: {exc}") from exc
    if not isinstance(raw, dict):
        raise InvalidArgument(f"{where}: model config must be a mapping")
    if expected_name is not None:
        raw.setdefault("name", expected_name)
    try:
        config = ModelConfig.model_validate(raw)
    except ValidationError as exc:
        raise InvalidArgument(f"{where}: invalid model config: {describe(exc)}") from exc
    if expected_name is not None and config.name != expected_name:
        raise InvalidArgument(f"{where}: name {config.name!r} differs from its folder {expected_name!r}")
    return config
