"""TorchScript backend (the legacy format): torch.jit models on CPU or CUDA, static INT8 quantization at load."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import torch

from services.model.backends import torch_threads
from services.model.backends.base import Backend, LoadedModel
from services.model.config import ModelConfig

log = logging.getLogger(__name__)
if torch_threads():
    torch.set_num_threads(torch_threads())

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


CALIBRATION_FILE = "calibration.npz"  # an INT8 version's calibration rows: one array per input, keyed by name
CALIBRATION_BATCH = 256
QUANTIZED_LAYERS = frozenset({"Linear", "Conv1d", "Conv2d", "Conv3d"})


def load_calibration(version_dir: Path, config: ModelConfig) -> dict[str, np.ndarray]:
    """The rows an INT8 version ships for calibration (`calibration.npz`, one array per config input)."""
    path = version_dir / CALIBRATION_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: quantization int8 on the torchscript backend calibrates static scales on the rows "
            f"the version ships in {CALIBRATION_FILE} (one array per input)"
        )
    with np.load(path, allow_pickle=False) as archive:
        rows = {name: archive[name] for name in archive.files}
    missing = [spec.name for spec in config.inputs if spec.name not in rows]
    if missing:
        raise ValueError(f"{path.name} has no rows for input(s) {missing} (it holds {sorted(rows)})")
    return {spec.name: rows[spec.name] for spec in config.inputs}


def quantize_int8(
    module: torch.jit.ScriptModule, calibration: dict[str, np.ndarray], input_names: list[str]
) -> torch.jit.ScriptModule:
    """Static INT8 in graph mode (`quantize_jit`, which takes TorchScript, unlike torchao): activation scales are
    observed on the calibration rows once, then fixed, so a row's answer never depends on the rows batched with it
    (dynamic quantization computes them per batch). Weights per channel, with fbgemm kernels. The last of two or
    more Linear/Conv layers stays FP32 (it makes the outputs, where an INT8 step costs the most); no FP32 layer may
    feed a quantized one, since torch's FP32 matmul rounds differently by batch size and one rounding across an
    INT8 step moves the answer (a FP32 first layer on heavy_mlp moved scores by 1.6e-4 with the batch)."""
    from torch.ao.quantization import get_default_qconfig, quantize_jit

    qconfig = get_default_qconfig("fbgemm")
    layers = [name for name, sub in module.named_modules() if sub.original_name in QUANTIZED_LAYERS]
    qconfig_dict: dict[str, object] = {"": qconfig}
    if len(layers) > 1:
        qconfig_dict[layers[-1]] = None

    rows = len(calibration[input_names[0]])

    def calibrate(model: torch.jit.ScriptModule, _: object) -> None:
        with torch.inference_mode():
            for start in range(0, rows, CALIBRATION_BATCH):
                model(*(torch.from_numpy(calibration[n][start : start + CALIBRATION_BATCH]) for n in input_names))

    previous = torch.backends.quantized.engine
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization is deprecated in favour of torchao
        torch.backends.quantized.engine = "fbgemm"
        try:
            return quantize_jit(module, qconfig_dict, calibrate, [None])
        finally:
            torch.backends.quantized.engine = previous


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
    """Loads `default_model_filename` with torch.jit on the configured device, statically INT8-quantized if asked."""

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
                raise RuntimeError("int8 on the torchscript backend runs on CPU; set device: cpu")
            calibration = load_calibration(version_dir, config)
            module = quantize_int8(module, calibration, [spec.name for spec in config.inputs])
            rows = len(next(iter(calibration.values())))
            log.info("%s v%d: static INT8, calibrated on %d rows", config.name, version, rows)
        return TorchScriptModel(module, config, device)
