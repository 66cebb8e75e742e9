"""The backend registry: each config `backend` name mapped to the class that loads it, imported only when used.

A new backend (onnxruntime, tensorrt) is its module under `services/model/backends/` plus one line in BACKENDS;
the config's `backend` choices come from this map, so a name is valid exactly when a backend serves it.
Entries are "module:Class" import paths, so that reading a config never imports torch or TensorRT.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from services.common.errors import InvalidArgument

if TYPE_CHECKING:
    from services.model.backends.base import Backend

BACKENDS: dict[str, str] = {
    "torchscript": "services.model.backends.torchscript:TorchScriptBackend",
}


def registered() -> list[str]:
    """The backend names a model config may choose, in registry order."""
    return list(BACKENDS)


def unknown_backend_message(name: str) -> str:
    """What an unknown `backend` value is told: the registered names to choose from."""
    return f"unknown backend {name!r}; registered backends: {', '.join(registered())}"


def get_backend(name: str) -> Backend:
    """A new instance of the backend registered under `name`, its module imported now (torch is heavy)."""
    path = BACKENDS.get(name)
    if path is None:
        raise InvalidArgument(unknown_backend_message(name))
    module_name, _, class_name = path.partition(":")
    backend_class: type[Backend] = getattr(importlib.import_module(module_name), class_name)
    return backend_class()
