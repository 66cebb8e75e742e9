"""TorchScript backend: torch.jit models on CPU or CUDA, with optional dynamic INT8 quantization at load."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

from services.model.backends.base import Backend, LoadedModel
from services.model.config import ModelConfig

log = logging.getLogger(__name__)

_TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "FP32": torch.float32,
    "FP64": torch.float64,
    "BF16": torch.bfloat16,
    "UINT16": torch.uint16,
    "UINT32": torch.uint32,
    "UINT64": torch.uint64,
}


def _to_torch(array: np.ndarray, device: torch.device) -> torch.Tensor:
    if array.dtype == ml_dtypes.bfloat16:
        tensor = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(torch.bfloat16)
    else:
        if not array.flags.writeable:
            array = array.copy()  # torch.from_numpy warns on read-only buffers (np.frombuffer)
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.to(device, non_blocking=True) if device.type != "cpu" else tensor


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def quantize_int8(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """Dynamic INT8 quantization of Linear layers in graph mode (works on TorchScript, unlike torchao)."""
    from torch.ao.quantization import default_dynamic_qconfig, quantize_dynamic_jit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        return quantize_dynamic_jit(module, {"": default_dynamic_qconfig})


class TorchScriptModel(LoadedModel):
    """A torch.jit module called with the config's inputs in order; its outputs keyed by the config's names."""

    def __init__(self, module: torch.jit.ScriptModule, config: ModelConfig, device: torch.device) -> None:
        self.module = module
        self.config = config
        self.torch_device = device
        self.device = str(device)
        self.input_names = [spec.name for spec in config.inputs]
        self.outputs = [(spec.name, _TORCH_DTYPES.get(spec.datatype)) for spec in config.outputs]

    def forward(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        args = [_to_torch(inputs[name], self.torch_device) for name in self.input_names]
        with torch.inference_mode():
            result = self.module(*args)
        if isinstance(result, torch.Tensor):
            produced: list[torch.Tensor] = [result]
        elif isinstance(result, dict):
            produced = [result[name] for name, _ in self.outputs]
        else:
            produced = list(result)
        if len(produced) != len(self.outputs):
            raise RuntimeError(f"model returned {len(produced)} outputs, config declares {len(self.outputs)}")
        out: dict[str, np.ndarray] = {}
        for (name, dtype), tensor in zip(self.outputs, produced, strict=True):
            if dtype is not None and tensor.dtype != dtype:
                tensor = tensor.to(dtype)
            out[name] = _to_numpy(tensor)
        return out

    def unload(self) -> None:
        del self.module
        if self.torch_device.type == "cuda":
            torch.cuda.empty_cache()


class TorchScriptBackend(Backend):
    """Loads `default_model_filename` with torch.jit on the configured device, INT8-quantized if asked."""

    name = "torchscript"
    platform = "pytorch_libtorch"
    triton_backend = "pytorch"

    def load(self, version_dir: Path, config: ModelConfig, version: int) -> LoadedModel:
        path = version_dir / config.default_model_filename
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found")
        want_cuda = config.device == "cuda" or (config.device == "auto" and torch.cuda.is_available())
        if config.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("config asks for device cuda, but no CUDA device is available")
        device = torch.device("cuda" if want_cuda else "cpu")
        module = torch.jit.load(str(path), map_location=device)
        module.eval()
        if config.optimization_for(version).quantization == "int8":
            if device.type != "cpu":
                raise RuntimeError("int8 dynamic quantization runs on CPU; set device: cpu")
            module = quantize_int8(module)
            log.info("%s v%d: dynamic INT8 quantization applied", config.name, version)
        return TorchScriptModel(module, config, device)
