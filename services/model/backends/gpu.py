"""Which NVIDIA GPUs this machine has, asked of NVML, so that no CUDA library is touched where none is present.

A TensorRT plan or a CUDA session opened without a GPU fails in native code (at worst it takes the process with
it); NVML answers "no driver" or "no device" as an ordinary error, so every GPU path asks here first.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Gpu:
    """One GPU as NVML describes it."""

    index: int
    name: str
    compute_capability: tuple[int, int]
    memory_total: int  # bytes


class NoGpu(RuntimeError):
    """No NVIDIA GPU can be used here: the message says why (no NVML library, no driver, no device)."""


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise NoGpu(f"NVML is not installed (nvidia-ml-py): {exc}") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no usable driver
        raise NoGpu(f"no NVIDIA driver (NVML: {exc})") from exc
    return pynvml


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def gpus() -> list[Gpu]:
    """Every GPU NVML sees, in index order; NoGpu when NVML itself is unusable."""
    nvml = _nvml()
    found: list[Gpu] = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        found.append(Gpu(index, _text(nvml.nvmlDeviceGetName(handle)), (int(major), int(minor)), int(memory.total)))
    return found


def require_gpu(what: str, index: int = 0) -> Gpu:
    """GPU `index`, or NoGpu saying that `what` needs one and why there is none."""
    try:
        found = gpus()
    except NoGpu as exc:
        raise NoGpu(f"{what} needs an NVIDIA GPU: {exc}") from exc
    if index >= len(found):
        raise NoGpu(f"{what} needs an NVIDIA GPU: NVML sees {len(found)} GPU(s), none with index {index}")
    return found[index]


def why_no_gpu() -> str | None:
    """None when a GPU is present, else the one-line reason (what tests print when they skip)."""
    try:
        found = gpus()
    except NoGpu as exc:
        return str(exc)
    return None if found else "NVML sees no GPU"


def memory_used(index: int = 0) -> int:
    """Bytes of GPU `index`'s memory in use, as NVML reports it (every process's)."""
    nvml = _nvml()
    return int(nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index)).used)
