"""The backend registry: each backend name mapped to its class, Triton platform and model file, imported only when used.

A new backend is its module under `services/model/backends/` plus one entry in BACKENDS; a config's `backend`
choices are this map's keys and its `platform` choices their Triton platform strings, so a name is valid exactly
when a backend serves it. Entries name "module:Class" import paths, so that reading a config never imports torch,
ONNX Runtime or TensorRT.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from services.common.errors import InvalidArgument

if TYPE_CHECKING:
    from services.model.backends.base import Backend


@dataclass(frozen=True, slots=True)
class Registration:
    """How the repository finds one backend: its class, the platform Triton names it by, its model file."""

    target: str  # "module:Class"
    platform: str  # Triton's platform string (ModelMetadata.platform, config `platform`)
    filename: str  # the file a version folder holds for it, unless the config names another


BACKENDS: dict[str, Registration] = {
    "torchscript": Registration(
        "services.model.backends.torchscript:TorchScriptBackend", "pytorch_libtorch", "model.pt"
    ),
    "onnxruntime": Registration(
        "services.model.backends.onnxruntime:OnnxRuntimeBackend", "onnxruntime_onnx", "model.onnx"
    ),
    "tensorrt": Registration("services.model.backends.tensorrt:TensorRTBackend", "tensorrt_plan", "model.plan"),
}
PLATFORMS: dict[str, str] = {registration.platform: name for name, registration in BACKENDS.items()}
_torch_threads = 0  # the process's torch intra-op thread count (0: torch's own choice), applied on torch's import


def set_torch_threads(threads: int) -> None:
    """Give torch `threads` intra-op threads: now if torch is imported, else when a backend first imports it (a
    replica that serves no TorchScript model never imports torch: about a second of its cold start)."""
    global _torch_threads
    _torch_threads = threads
    if threads and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def torch_threads() -> int:
    """The count `set_torch_threads` asked for (0: none); the torch backend applies it when it is imported."""
    return _torch_threads


def registered() -> list[str]:
    """The backend names a model config may choose, in registry order."""
    return list(BACKENDS)


def unknown_backend_message(name: str) -> str:
    """What an unknown `backend` value is told: the registered names to choose from."""
    return f"unknown backend {name!r}; registered backends: {', '.join(registered())}"


def unknown_platform_message(platform: str) -> str:
    """What an unknown `platform` value is told: the platforms of the registered backends."""
    return f"unknown platform {platform!r}; platforms served: {', '.join(PLATFORMS)}"


def get_backend(name: str) -> Backend:
    """A new instance of the backend registered under `name`, its module imported now (torch is heavy)."""
    registration = BACKENDS.get(name)
    if registration is None:
        raise InvalidArgument(unknown_backend_message(name))
    module_name, _, class_name = registration.target.partition(":")
    backend_class: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return backend_class()
