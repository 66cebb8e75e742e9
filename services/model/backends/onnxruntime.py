"""ONNX Runtime backend: a version's `model.onnx` on the CPU, or on a GPU through the execution providers its config
chooses the way Triton's ONNX Runtime backend does (its accelerators in order, then CUDA, then the CPU)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from services.model.backends.base import Backend, LoadedModel
from services.model.backends.gpu import why_no_gpu
from services.model.backends.onnx_io import check_io, check_quantization, read_onnx
from services.model.config import Accelerator, ModelConfig, flag

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
# Triton's numbering of `optimization.graph.level` (0, unset, is every optimisation).
GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    0: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}
_ARENA_STRATEGIES = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}
_CONV_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
# Triton's keys of the tensorrt accelerator that ONNX Runtime's TensorRT EP takes under another name.
_TENSORRT_RENAMED = {"max_workspace_size_bytes": "trt_max_workspace_size"}


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a version's session runs: the device and the execution providers with their options, in order."""

    device: str  # "cpu" or "cuda:0"
    providers: list[tuple[str, dict[str, str]]]


def _tensorrt_options(accelerator: Accelerator) -> dict[str, str]:
    options: dict[str, str] = {"device_id": "0"}
    for key, value in accelerator.parameters.items():
        if key == "precision_mode":
            precision = value.upper()
            options["trt_fp16_enable"] = str(precision == "FP16")
            options["trt_int8_enable"] = str(precision == "INT8")
        else:
            options[_TENSORRT_RENAMED.get(key, key)] = value
    return options


def _cuda_options(accelerator: Accelerator | None) -> dict[str, str]:
    options: dict[str, str] = {"device_id": "0"}
    for key, value in (accelerator.parameters if accelerator else {}).items():
        if key == "arena_extend_strategy":
            options[key] = _ARENA_STRATEGIES[value]
        elif key == "cudnn_conv_algo_search":
            options[key] = _CONV_SEARCH[value]
        else:
            options[key] = value
    return options


def gpu_missing(config: ModelConfig, available: list[str]) -> str | None:
    """Why this version cannot run on a GPU (None: it can); NVML is asked only when a GPU could be used."""
    if config.device == "cpu":
        return "the config says device cpu"
    if CUDA not in available:
        return f"this onnxruntime has no {CUDA} (a GPU image installs onnxruntime-gpu)"
    return why_no_gpu()


def placement(config: ModelConfig, version: int, available: list[str], missing: str | None) -> Placement:
    """The device and providers for one version: `device: cpu` (or `auto` without a usable GPU: `missing` says why)
    runs on the CPU provider alone; on a GPU the config's accelerators come first (tensorrt needs ONNX Runtime's
    TensorRT EP), then CUDA (with the cuda accelerator's options), then the CPU for what neither takes.
    RuntimeError when the config asks for what this machine lacks."""
    optimization = config.optimization_for(version)
    if config.device == "cuda" and missing is not None:
        raise RuntimeError(f"config asks for device cuda, but {missing}")
    if missing is not None:
        if optimization.execution_accelerators and optimization.execution_accelerators.gpu_execution_accelerator:
            log.info("%s v%d runs on the CPU: its GPU execution accelerators are not used", config.name, version)
        return Placement("cpu", [(CPU, {})])
    providers: list[tuple[str, dict[str, str]]] = []
    accelerators = optimization.execution_accelerators
    for accelerator in accelerators.gpu_execution_accelerator if accelerators else []:
        if accelerator.name == "tensorrt":
            if TENSORRT not in available:
                raise RuntimeError(
                    f"the config asks for the tensorrt execution accelerator, but this onnxruntime has no {TENSORRT} "
                    "(it needs onnxruntime-gpu built with TensorRT and the TensorRT libraries)"
                )
            providers.append((TENSORRT, _tensorrt_options(accelerator)))
    providers.append((CUDA, _cuda_options(optimization.accelerator("cuda"))))
    providers.append((CPU, {}))
    return Placement("cuda:0", providers)


def session_options(config: ModelConfig, version: int, intra_op_threads: int) -> ort.SessionOptions:
    """Session options from the config's Triton parameters and graph level; `intra_op_threads` (0: ONNX Runtime's
    default, one per core) unless `intra_op_thread_count` is set."""
    params = config.parameters
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(params.get("intra_op_thread_count", intra_op_threads))
    options.inter_op_num_threads = int(params.get("inter_op_thread_count", "0"))
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if params.get("execution_mode") == "1" else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    options.enable_cpu_mem_arena = flag(params.get("enable_mem_arena"), True)
    options.enable_mem_pattern = flag(params.get("enable_mem_pattern"), True)
    graph = config.optimization_for(version).graph
    options.graph_optimization_level = GRAPH_LEVELS[graph.level if graph else 0]
    options.log_severity_level = 3  # errors only: ONNX Runtime's warnings go to stderr, not the service's log
    return options


class OnnxRuntimeModel(LoadedModel):
    """One InferenceSession; inputs fed by the config's names, outputs returned in the config's order."""

    def __init__(self, path: Path, config: ModelConfig, version: int, where: Placement, intra_op_threads: int) -> None:
        self.path = path
        self.config = config
        self.version = version
        self.placement = where
        self.device = where.device
        self.output_names = [spec.name for spec in config.outputs]
        self.explicit_threads = "intra_op_thread_count" in config.parameters
        self.intra_op_threads = intra_op_threads
        self.session: Any = self._open(intra_op_threads)

    def _open(self, intra_op_threads: int) -> Any:
        options = session_options(self.config, self.version, intra_op_threads)
        session = ort.InferenceSession(str(self.path), options, providers=self.placement.providers)
        wanted = [name for name, _ in self.placement.providers]
        if session.get_providers()[: len(wanted)] != wanted:  # ONNX Runtime falls back silently: say so instead
            raise RuntimeError(f"onnxruntime took providers {session.get_providers()}, the config asks for {wanted}")
        return session

    def forward(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.device == "cpu":
            produced = self.session.run(self.output_names, inputs)
        else:
            produced = self._run_bound(inputs)
        return dict(zip(self.output_names, produced, strict=True))

    def _run_bound(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        """On a GPU: inputs copied to the device once, outputs left there by the run and copied back once."""
        binding = self.session.io_binding()
        for name, array in inputs.items():
            binding.bind_cpu_input(name, np.ascontiguousarray(array))
        for name in self.output_names:
            binding.bind_output(name, "cuda", 0)
        self.session.run_with_iobinding(binding)
        return list(binding.copy_outputs_to_cpu())

    def executes(self, inline: bool) -> bool:
        """A version that runs on worker threads gets ONNX Runtime's thread pool (one thread per core); one inline
        on the event loop keeps a single thread, whose spinning siblings would take the core the loop needs."""
        if inline or self.explicit_threads or self.intra_op_threads == 0 or self.device != "cpu":
            return False
        self.session = self._open(0)
        self.intra_op_threads = 0
        log.info(
            "%s v%d: forwards on worker threads, onnxruntime uses one thread per core", self.config.name, self.version
        )
        return True

    def unload(self) -> None:
        self.session = None  # the session's memory (arena, weights, GPU buffers) goes with its last reference


class OnnxRuntimeBackend(Backend):
    """Checks `model.onnx` against the config (and a static Q/DQ graph for INT8), then opens a session for it."""

    name = "onnxruntime"
    platform = "onnxruntime_onnx"
    triton_backend = "onnxruntime"

    def load(self, version_dir: Path, config: ModelConfig, version: int) -> LoadedModel:
        path = version_dir / config.default_model_filename
        shown = f"{config.name}/{version}/{config.default_model_filename}"
        model = read_onnx(path)
        check_io(model, config, shown)
        check_quantization(model, config.optimization_for(version).quantization, shown)
        del model
        available = ort.get_available_providers()
        where = placement(config, version, available, gpu_missing(config, available))
        # One thread until warm-up shows where forwards run (`executes`): a forced threaded version starts with all.
        threads = 0 if config.execution == "thread" else 1
        return OnnxRuntimeModel(path, config, version, where, threads)
