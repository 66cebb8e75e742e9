"""The per-model configuration document (`models/<name>/config.yaml`), validated by pydantic."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from services.common.errors import InvalidArgument
from services.common.validation import describe
from services.model.backends import (
    BACKENDS,
    PLATFORMS,
    registered,
    unknown_backend_message,
    unknown_platform_message,
)

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


def _registered_platform(platform: str) -> str:
    if platform not in PLATFORMS:
        raise PydanticCustomError("unknown_platform", "{message}", {"message": unknown_platform_message(platform)})
    return platform


# The choices are the registry's keys: a backend is configurable exactly when one is registered to serve it.
BackendName = Annotated[
    str, AfterValidator(_registered_backend), WithJsonSchema({"type": "string", "enum": registered()})
]
PlatformName = Annotated[
    str, AfterValidator(_registered_platform), WithJsonSchema({"type": "string", "enum": list(PLATFORMS)})
]

# Parameter values are strings, as in Triton's model config; a YAML number or boolean is taken as its string.
_INT = r"^[0-9]+$"
_FLAG = ("0", "1", "true", "false")


def _as_string(value: Any) -> Any:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return str(value)
    return value


def _check_value(key: str, value: str, kind: str | tuple[str, ...]) -> None:
    if isinstance(kind, tuple):
        if value.lower() not in kind:
            raise ValueError(f"{key} must be one of {', '.join(kind)}, got {value!r}")
    elif kind == "int" and not re.match(_INT, value):
        raise ValueError(f"{key} must be a non-negative integer, got {value!r}")


def flag(value: str | None, default: bool) -> bool:
    """A Triton boolean parameter ("1", "true", "0", "false"), or `default` when unset."""
    return default if value is None else value.lower() in ("1", "true")


# Triton's ONNX Runtime backend parameters served here: per model (`parameters`) and per execution accelerator.
SESSION_PARAMETERS: dict[str, str | tuple[str, ...]] = {
    "intra_op_thread_count": "int",
    "inter_op_thread_count": "int",
    "execution_mode": ("0", "1"),
    "enable_mem_arena": _FLAG,
    "enable_mem_pattern": _FLAG,
}
ACCELERATOR_PARAMETERS: dict[str, dict[str, str | tuple[str, ...]]] = {
    "tensorrt": {
        "precision_mode": ("fp32", "fp16", "int8"),
        "max_workspace_size_bytes": "int",
        "trt_engine_cache_enable": _FLAG,
        "trt_engine_cache_path": "str",
        "trt_timing_cache_enable": _FLAG,
        "trt_timing_cache_path": "str",
        "trt_builder_optimization_level": "int",
        "trt_min_subgraph_size": "int",
        "trt_max_partition_iterations": "int",
        "trt_cuda_graph_enable": _FLAG,
    },
    "cuda": {
        "gpu_mem_limit": "int",
        "arena_extend_strategy": ("0", "1"),
        "cudnn_conv_algo_search": ("0", "1", "2"),
        "do_copy_in_default_stream": _FLAG,
        "cudnn_conv_use_max_workspace": _FLAG,
        "use_ep_level_unified_stream": _FLAG,
    },
}
# What the native TensorRT backend reads of its `tensorrt` accelerator entry (the rest belong to ONNX Runtime's EP).
NATIVE_TENSORRT_PARAMETERS = frozenset({"precision_mode", "max_workspace_size_bytes"})


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


class GraphOptimization(_Strict):
    """ONNX Runtime's graph optimisation level, numbered as Triton's ONNX Runtime backend numbers it."""

    level: Literal[-1, 0, 1, 2] = Field(
        0, description="-1: basic; 1: basic and extended (fusions); 2: none; 0: all (ONNX Runtime's default)."
    )


class Accelerator(_Strict):
    """One execution accelerator, as in Triton's `optimization.execution_accelerators`: a name and its parameters
    (Triton's keys, string values)."""

    name: Literal["tensorrt", "cuda"]
    parameters: dict[str, str] = Field(default_factory=dict)

    @field_validator("parameters", mode="before")
    @classmethod
    def _strings(cls, value: Any) -> Any:
        return {k: _as_string(v) for k, v in value.items()} if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _known(self) -> Accelerator:
        known = ACCELERATOR_PARAMETERS[self.name]
        for key, value in self.parameters.items():
            if key not in known:
                raise ValueError(f"{self.name}: unknown parameter {key!r}; served: {', '.join(known)}")
            _check_value(key, value, known[key])
        return self

    def get(self, key: str) -> str | None:
        return self.parameters.get(key)


class ExecutionAccelerators(_Strict):
    """Triton's execution accelerators: tried in order on a GPU instance, before the CUDA EP and the CPU."""

    gpu_execution_accelerator: list[Accelerator] = Field(default_factory=list)
    cpu_execution_accelerator: list[dict[str, Any]] = Field(
        default_factory=list, description="None is served here (Triton's openvino needs ONNX Runtime with OpenVINO)."
    )

    @field_validator("cpu_execution_accelerator")
    @classmethod
    def _no_cpu_accelerator(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if value:
            raise ValueError("no CPU execution accelerator is served here (openvino needs ONNX Runtime with OpenVINO)")
        return value


class Optimization(_Strict):
    """Load-time optimisations."""

    quantization: Literal["none", "int8"] = Field(
        "none",
        description=(
            "int8: the version runs static INT8 (fixed scales, so a row's answer never depends on its batch): "
            "onnxruntime and tensorrt serve its Q/DQ ONNX (services.model.export --int8-calibration makes one), "
            "torchscript quantizes at load, calibrated on the version's calibration.npz."
        ),
    )
    graph: GraphOptimization | None = Field(None, description="onnxruntime only.")
    execution_accelerators: ExecutionAccelerators | None = Field(
        None, description="onnxruntime: GPU execution providers in order; tensorrt: precision and workspace."
    )

    def accelerator(self, name: str) -> Accelerator | None:
        """The first GPU accelerator entry named `name`, if any."""
        if self.execution_accelerators is None:
            return None
        return next((a for a in self.execution_accelerators.gpu_execution_accelerator if a.name == name), None)


class VersionOverride(_Strict):
    """Settings that differ for one version (e.g. version 2 served as INT8)."""

    optimization: Optimization | None = None


class ModelConfig(_Strict):
    """A model in the repository; see README 'Serve your own model'."""

    name: str = Field(min_length=1)
    backend: BackendName = Field(
        "torchscript",
        description="A name registered in services.model.backends (torchscript, onnxruntime, tensorrt); "
        "taken from `platform` when only that is given.",
    )
    platform: PlatformName | None = Field(
        None, description="Triton's platform string: pytorch_libtorch, onnxruntime_onnx or tensorrt_plan."
    )
    default_model_filename: str = Field(
        "model.pt",
        description="The file of a version folder the backend loads; default model.pt (torchscript), model.onnx "
        "(onnxruntime), model.plan (tensorrt, which builds one from model.onnx when the folder has none).",
    )
    parameters: dict[str, str] = Field(
        default_factory=dict,
        description="onnxruntime session parameters with Triton's keys: " + ", ".join(SESSION_PARAMETERS) + ".",
    )
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

    @model_validator(mode="before")
    @classmethod
    def _backend_from_platform(cls, data: Any) -> Any:
        """A config naming only Triton's `platform` gets its backend; the model file defaults to the backend's."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        platform = data.get("platform")
        if data.get("backend") is None and isinstance(platform, str) and platform in PLATFORMS:
            data["backend"] = PLATFORMS[platform]
        backend = data.get("backend", "torchscript")
        if data.get("default_model_filename") is None and isinstance(backend, str) and backend in BACKENDS:
            data["default_model_filename"] = BACKENDS[backend].filename
        if isinstance(data.get("parameters"), dict):
            data["parameters"] = {k: _as_string(v) for k, v in data["parameters"].items()}
        return data

    @model_validator(mode="after")
    def _check_backend_options(self) -> ModelConfig:
        if self.platform is not None and PLATFORMS[self.platform] != self.backend:
            raise ValueError(
                f"platform {self.platform} is served by backend {PLATFORMS[self.platform]}, not {self.backend}"
            )
        if self.parameters and self.backend != "onnxruntime":
            raise ValueError(f"parameters apply to the onnxruntime backend, not {self.backend}")
        for key, value in self.parameters.items():
            if key not in SESSION_PARAMETERS:
                raise ValueError(f"parameters: unknown key {key!r}; served: {', '.join(SESSION_PARAMETERS)}")
            _check_value(key, value, SESSION_PARAMETERS[key])
        overrides = [(f"version_overrides.{v}.", o.optimization) for v, o in self.version_overrides.items()]
        for where, optimization in [("", self.optimization), *overrides]:
            if optimization is not None:
                self._check_optimization(where, optimization)
        return self

    def _check_optimization(self, where: str, optimization: Optimization) -> None:
        if optimization.graph is not None and self.backend != "onnxruntime":
            raise ValueError(f"{where}optimization.graph applies to the onnxruntime backend, not {self.backend}")
        accelerators = optimization.execution_accelerators
        if accelerators is None or not accelerators.gpu_execution_accelerator:
            return
        if self.backend == "torchscript":
            raise ValueError(f"{where}optimization.execution_accelerators do not apply to the torchscript backend")
        if self.backend == "tensorrt":
            for accelerator in accelerators.gpu_execution_accelerator:
                extra = sorted(set(accelerator.parameters) - NATIVE_TENSORRT_PARAMETERS)
                if accelerator.name != "tensorrt" or extra:
                    raise ValueError(
                        f"{where}optimization.execution_accelerators: the tensorrt backend reads only a tensorrt "
                        f"entry with {' and '.join(sorted(NATIVE_TENSORRT_PARAMETERS))}"
                        + (f" (not {', '.join(extra)})" if extra else f" (not {accelerator.name})")
                    )

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
