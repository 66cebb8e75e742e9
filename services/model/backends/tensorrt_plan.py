"""What a TensorRT engine needs decided before any GPU is touched: build settings and the optimisation profile from the
model config, the plan cache (its key and store), buffer shapes, and the outputs sliced to a batch's real rows.

Everything here is plain Python and numpy, unit-tested on CPU; `tensorrt.py` is the thin layer that hands these
decisions to TensorRT and pycuda on a GPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.model.config import ModelConfig

log = logging.getLogger(__name__)

DEFAULT_WORKSPACE_BYTES = 1 << 30  # Triton's default for max_workspace_size_bytes
PRECISIONS = ("FP32", "FP16", "INT8")
Shape = tuple[int, ...]


class PlanMismatch(RuntimeError):
    """A plan built for another TensorRT version, GPU or model: loading it would fail, or worse, so it never is."""


@dataclass(frozen=True, slots=True)
class BuildSettings:
    """How the engine is built: the precision its ONNX carries and the builder's workspace limit."""

    precision: str  # FP32; FP16 (the ONNX converted to mixed precision first); INT8 (a Q/DQ ONNX)
    workspace_bytes: int


def build_settings(config: ModelConfig, version: int, onnx_quantization: str) -> BuildSettings:
    """The precision and workspace of one version, from its `tensorrt` execution accelerator (Triton's
    precision_mode and max_workspace_size_bytes) and its quantization. TensorRT 11 takes precision from the network
    itself: INT8 only from Q/DQ nodes (`onnx_quantization` "static"), FP16 from a mixed-precision ONNX."""
    optimization = config.optimization_for(version)
    accelerator = optimization.accelerator("tensorrt")
    mode = accelerator.get("precision_mode") if accelerator else None
    int8 = optimization.quantization == "int8" or onnx_quantization == "static"
    precision = mode.upper() if mode else ("INT8" if int8 else "FP32")
    if precision == "INT8" and onnx_quantization != "static":
        raise ValueError(
            "precision_mode INT8 needs a Q/DQ ONNX: TensorRT 11 has no calibrator "
            "(python -m services.model.export --int8-calibration makes one)"
        )
    if int8 and precision != "INT8":
        raise ValueError(f"precision_mode {precision} with an INT8 (Q/DQ) ONNX: the Q/DQ nodes fix the precision")
    workspace = accelerator.get("max_workspace_size_bytes") if accelerator else None
    return BuildSettings(precision, int(workspace) if workspace else DEFAULT_WORKSPACE_BYTES)


@dataclass(frozen=True, slots=True)
class Profile:
    """The optimisation profile: per input, its (min, opt, max) shapes."""

    shapes: dict[str, tuple[Shape, Shape, Shape]]

    def max_shape(self, name: str) -> Shape:
        return self.shapes[name][2]

    def as_key(self) -> list[list[Any]]:
        return [[name, [list(s) for s in shapes]] for name, shapes in sorted(self.shapes.items())]


def profile_for(config: ModelConfig) -> Profile:
    """Batch 1 to max_batch_size, optimised for the largest preferred batch size (else the largest batch); a model
    without a batch dimension gets its fixed shapes. The other dims must be fixed: the profile has one size for them."""
    variable = [spec.name for spec in config.inputs if -1 in spec.dims]
    if variable:
        raise ValueError(f"the tensorrt backend needs fixed dims; input(s) {variable} have -1")
    shapes: dict[str, tuple[Shape, Shape, Shape]] = {}
    batching = config.dynamic_batching
    opt_rows = max(batching.preferred_batch_sizes) if batching and batching.preferred_batch_sizes else None
    for spec in config.inputs:
        dims = tuple(spec.dims)
        if config.max_batch_size > 0:
            top = config.max_batch_size
            shapes[spec.name] = ((1, *dims), (opt_rows or top, *dims), (top, *dims))
        else:
            shapes[spec.name] = (dims, dims, dims)
    return Profile(shapes)


@dataclass(frozen=True, slots=True)
class PlanKey:
    """Everything a plan depends on: a plan is reused only where every field is equal."""

    tensorrt_version: str
    gpu_name: str
    compute_capability: str  # "9.0"
    onnx_sha256: str
    profile: str  # the profile as canonical JSON
    precision: str
    workspace_bytes: int

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


def plan_key(
    tensorrt_version: str,
    gpu_name: str,
    compute_capability: tuple[int, int],
    onnx_bytes: bytes,
    profile: Profile,
    settings: BuildSettings,
) -> PlanKey:
    return PlanKey(
        tensorrt_version,
        gpu_name,
        f"{compute_capability[0]}.{compute_capability[1]}",
        hashlib.sha256(onnx_bytes).hexdigest(),
        json.dumps(profile.as_key(), separators=(",", ":")),
        settings.precision,
        settings.workspace_bytes,
    )


class PlanCache:
    """Built plans on disk by key digest (`<digest>.plan` beside `<digest>.json`, the key in full), written
    atomically; a plan is returned only when its recorded key equals the one asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def paths(self, key: PlanKey) -> tuple[Path, Path]:
        return self.root / f"{key.digest}.plan", self.root / f"{key.digest}.json"

    def load(self, key: PlanKey) -> bytes | None:
        plan, meta = self.paths(key)
        if not plan.is_file() or not meta.is_file():
            return None
        try:
            recorded = json.loads(meta.read_text())
        except (OSError, ValueError) as exc:
            log.warning("plan cache %s: unreadable key (%s): rebuilding", meta, exc)
            return None
        if recorded != asdict(key):
            log.warning("plan cache %s: recorded for another key: rebuilding", meta)
            return None
        return plan.read_bytes()

    def store(self, key: PlanKey, plan_bytes: bytes) -> Path:
        plan, meta = self.paths(key)
        self.root.mkdir(parents=True, exist_ok=True)
        for path, data in ((plan, plan_bytes), (meta, json.dumps(asdict(key), indent=1).encode())):
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
        return plan


def given_plan_meta(path: Path) -> dict[str, Any]:
    """The sidecar of a plan shipped in a version folder (`model.plan.json`, as PlanCache writes it): a plan without
    one is refused, since only the key says which TensorRT and GPU it was built for."""
    meta = path.with_name(path.name + ".json")
    if not meta.is_file():
        raise PlanMismatch(
            f"{path.name} has no {meta.name} saying which TensorRT version and GPU built it; copy the .plan and .json "
            "pair from a plan cache (MESHSERVE_MODEL_PLAN_CACHE), or ship model.onnx and let the backend build"
        )
    try:
        recorded = json.loads(meta.read_text())
    except ValueError as exc:
        raise PlanMismatch(f"{meta.name} is not JSON: {exc}") from exc
    return recorded if isinstance(recorded, dict) else {}


def check_given_plan(
    meta: Mapping[str, Any], tensorrt_version: str, gpu_name: str, compute_capability: tuple[int, int]
) -> None:
    """PlanMismatch unless the plan was built by this TensorRT version for this GPU."""
    here = {
        "tensorrt_version": tensorrt_version,
        "gpu_name": gpu_name,
        "compute_capability": f"{compute_capability[0]}.{compute_capability[1]}",
    }
    built = {field: meta.get(field) for field in here}
    if built != here:
        raise PlanMismatch(
            f"the plan was built with TensorRT {built['tensorrt_version']} for {built['gpu_name']} (compute "
            f"capability {built['compute_capability']}); this is TensorRT {tensorrt_version} on {gpu_name} "
            f"({here['compute_capability']}): ship model.onnx and let the backend build"
        )


@dataclass(frozen=True, slots=True)
class Binding:
    """One engine I/O tensor: its name, direction, numpy dtype and shape (-1 where the profile decides)."""

    name: str
    is_input: bool
    dtype: np.dtype
    shape: Shape


def check_bindings(bindings: list[Binding], config: ModelConfig) -> None:
    """ValueError unless the engine's inputs and outputs are the config's, by name and datatype."""
    from services.common.tensor_codec import NUMPY_DTYPES

    for is_input, specs in ((True, config.inputs), (False, config.outputs)):
        kind = "input" if is_input else "output"
        found = {b.name: b for b in bindings if b.is_input == is_input}
        if sorted(found) != sorted(s.name for s in specs):
            raise ValueError(f"the engine's {kind}s are {sorted(found)}, the config declares {[s.name for s in specs]}")
        for spec in specs:
            if found[spec.name].dtype != np.dtype(NUMPY_DTYPES[spec.datatype]):
                raise ValueError(
                    f"engine {kind} {spec.name!r} is {found[spec.name].dtype}, the config says {spec.datatype}"
                )


def buffer_shapes(bindings: list[Binding], profile: Profile, config: ModelConfig) -> dict[str, Shape]:
    """The largest shape each buffer must hold: inputs at the profile's max, outputs at max_batch_size rows with
    their config dims (allocated once per profile, reused by every call)."""
    out_dims = {spec.name: tuple(spec.dims) for spec in config.outputs}
    shapes: dict[str, Shape] = {}
    for binding in bindings:
        if binding.is_input:
            shapes[binding.name] = profile.max_shape(binding.name)
        elif config.max_batch_size > 0:
            shapes[binding.name] = (config.max_batch_size, *out_dims[binding.name])
        else:
            shapes[binding.name] = out_dims[binding.name]
        if any(d < 1 for d in shapes[binding.name]):
            raise ValueError(f"buffer {binding.name!r} has no fixed size ({list(shapes[binding.name])})")
    return shapes


def nbytes(shape: Shape, dtype: np.dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


def input_shapes(inputs: Mapping[str, np.ndarray], profile: Profile) -> dict[str, Shape]:
    """The shape to set on every call (a batch's real rows), refused past the profile's max."""
    shapes: dict[str, Shape] = {}
    for name, array in inputs.items():
        top = profile.max_shape(name)
        if len(array.shape) != len(top) or any(d > t for d, t in zip(array.shape, top, strict=True)):
            raise ValueError(f"input {name!r} of shape {list(array.shape)} is past the engine's profile {list(top)}")
        shapes[name] = tuple(array.shape)
    return shapes


def stage_input(host: np.ndarray, array: np.ndarray) -> np.ndarray:
    """Copy `array` into the front of the reused flat host buffer; returns that view (what is sent to the GPU)."""
    view = host[: array.size]
    view[...] = np.ascontiguousarray(array, dtype=host.dtype).reshape(-1)
    return view


def output_view(host: np.ndarray, shape: Shape) -> np.ndarray:
    """The front of a flat output buffer holding `shape` (the real rows, padding left out)."""
    return host[: math.prod(shape)].reshape(shape)


def take_output(host: np.ndarray, shape: Shape) -> np.ndarray:
    """A copy of the real rows of an output buffer: the buffer is overwritten by the next call."""
    return output_view(host, shape).copy()


def engine_source(onnx_bytes: bytes, settings: BuildSettings) -> bytes:
    """The ONNX the engine is built from: the file itself, or for FP16 its mixed-precision copy (float weights and
    activations in FP16, inputs and outputs kept FP32), since TensorRT 11 takes precision from the network only."""
    if settings.precision != "FP16":
        return onnx_bytes
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load_from_string(onnx_bytes)
    return bytes(convert_float_to_float16(model, keep_io_types=True).SerializeToString())
