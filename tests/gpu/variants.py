"""The model service's GPU backends as variants of one model's config, and which of them this machine can run.

Asking is safe anywhere: torch answers from its own driver check, ONNX Runtime lists its providers, and TensorRT and
pycuda are only looked up (find_spec), never imported, until a GPU is known to be present.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.model.backends.gpu import why_no_gpu

ROOT = Path(__file__).resolve().parents[2]
# The model repository the GPU tests read: `make models`'s, or the one `python -m tests.gpu.check` prepared from a
# device bundle (it names it here for the pytest process it starts).
MODELS_ENV = "MESHSERVE_GPU_MODELS"
MODELS = Path(os.environ.get(MODELS_ENV) or ROOT / "models")
HEAVY = MODELS / "bench" / "heavy_mlp"
FRAUD = MODELS / "fraud_mlp"
FP16_FILE = "model_fp16.pt"  # beside model.pt: the same TorchScript module computing in FP16 (tests/gpu/models.py)
TOLERANCE = {"FP32": 1e-4, "FP16": 1e-2}  # against ONNX Runtime on the CPU, the reference


def _accelerator(precision: str | None = None) -> dict[str, Any]:
    parameters = {"precision_mode": precision} if precision else {}
    return {"execution_accelerators": {"gpu_execution_accelerator": [{"name": "tensorrt", "parameters": parameters}]}}


@dataclass(frozen=True)
class Variant:
    """One GPU path: its backend, the precision it computes in, and the config fields that select it."""

    name: str
    library: str  # what must be installed: "torch", "onnxruntime-cuda", "onnxruntime-tensorrt", "tensorrt"
    precision: str
    changes: dict[str, Any] = field(default_factory=dict)


VARIANTS = [
    Variant("torch CUDA", "torch", "FP32", {"backend": "torchscript", "device": "cuda"}),
    Variant("onnxruntime CUDA EP", "onnxruntime-cuda", "FP32", {"backend": "onnxruntime", "device": "cuda"}),
    Variant(
        "onnxruntime TensorRT EP",
        "onnxruntime-tensorrt",
        "FP32",
        {"backend": "onnxruntime", "device": "cuda", "optimization": _accelerator()},
    ),
    Variant(
        "onnxruntime TensorRT EP FP16",
        "onnxruntime-tensorrt",
        "FP16",
        {"backend": "onnxruntime", "device": "cuda", "optimization": _accelerator("FP16")},
    ),
    Variant("tensorrt", "tensorrt", "FP32", {"backend": "tensorrt", "device": "cuda"}),
    Variant(
        "tensorrt FP16",
        "tensorrt",
        "FP16",
        {"backend": "tensorrt", "device": "cuda", "optimization": _accelerator("FP16")},
    ),
]
# torch on CUDA in FP16: the torchscript backend has no precision setting, so the version ships an FP16 file.
TORCH_FP16 = Variant(
    "torch CUDA FP16",
    "torch",
    "FP16",
    {"backend": "torchscript", "device": "cuda", "default_model_filename": FP16_FILE},
)
# The INT8 (Q/DQ) version on each GPU path that serves it: precision comes from the file.
INT8_VARIANTS = [
    Variant("onnxruntime CUDA EP INT8", "onnxruntime-cuda", "INT8", {"backend": "onnxruntime", "device": "cuda"}),
    Variant(
        "onnxruntime TensorRT EP INT8",
        "onnxruntime-tensorrt",
        "INT8",
        {"backend": "onnxruntime", "device": "cuda", "optimization": _accelerator("INT8")},
    ),
    Variant("tensorrt INT8", "tensorrt", "INT8", {"backend": "tensorrt", "device": "cuda"}),
]


def library_missing(library: str) -> str | None:
    """Why `library` cannot run here (None: it can); only asked once a GPU is present."""
    if library == "torch":
        import torch

        return None if torch.cuda.is_available() else f"torch {torch.__version__} has no CUDA (a CPU build?)"
    if library.startswith("onnxruntime"):
        import onnxruntime as ort

        provider = "TensorrtExecutionProvider" if library.endswith("tensorrt") else "CUDAExecutionProvider"
        have = ort.get_available_providers()
        return None if provider in have else f"onnxruntime {ort.__version__} has no {provider} (it has {have})"
    absent = [name for name in ("tensorrt", "pycuda") if importlib.util.find_spec(name) is None]
    return f"not installed: {', '.join(absent)}" if absent else None


def missing(variant: Variant) -> str | None:
    """Why `variant` cannot run on this machine: no GPU, or its library; None when it can."""
    return why_no_gpu() or library_missing(variant.library)


def variant_config(model_dir: Path, variant: Variant, version: int) -> dict[str, Any]:
    """The model's committed config, made to serve `version` alone through `variant`."""
    document = yaml.safe_load((model_dir / "config.yaml").read_text())
    document.pop("default_model_filename", None)
    overrides = document.pop("version_overrides", {}) or {}
    document["version_policy"] = {"specific": {"versions": [version]}}
    optimization = dict((overrides.get(version) or {}).get("optimization") or {})
    changes = dict(variant.changes)
    optimization.update(changes.pop("optimization", {}))
    if optimization:
        document["version_overrides"] = {version: {"optimization": optimization}}
    document.update(changes)
    return document
