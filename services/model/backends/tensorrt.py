"""Native TensorRT backend (`tensorrt_plan`): the thin layer that hands tensorrt_plan's decisions to TensorRT 11 and
pycuda on a GPU, building a version's engine from its ONNX (plans cached by key) or loading a plan it ships.

TensorRT and pycuda are imported only after NVML has shown a GPU: without one, a plan or a CUDA context can take
the process down in native code, so a version asking for this backend there is reported broken instead.
"""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from services.model.backends.base import Backend, LoadedModel
from services.model.backends.gpu import Gpu, require_gpu
from services.model.backends.onnx_io import check_io, check_quantization, quantization_of, read_onnx
from services.model.backends.tensorrt_context import InstancePool, current
from services.model.backends.tensorrt_plan import (
    Binding,
    BuildSettings,
    PlanCache,
    Profile,
    buffer_shapes,
    build_settings,
    check_bindings,
    check_given_plan,
    engine_source,
    given_plan_meta,
    input_shapes,
    plan_key,
    profile_for,
    stage_input,
    take_output,
)
from services.model.config import ModelConfig

log = logging.getLogger(__name__)

ONNX_FILE = "model.onnx"
INSTALL_HINT = (
    "a GPU image installs TensorRT and pycuda (pip install '.[gpu]' with NVIDIA's index, or a CUDA base image; "
    "see README 'GPU backends')"
)


def import_gpu_libraries() -> tuple[Any, Any]:
    """(tensorrt, pycuda.driver), or RuntimeError naming what is missing; only called once a GPU is known."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise RuntimeError(f"TensorRT is not installed ({exc}): {INSTALL_HINT}") from exc
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        raise RuntimeError(f"pycuda is not installed ({exc}): {INSTALL_HINT}") from exc
    return trt, cuda


class PrimaryContext:
    """The device's primary CUDA context, retained once per loaded version, made current around every call."""

    def __init__(self, cuda: Any, index: int) -> None:
        self.cuda = cuda
        cuda.init()
        self.context = cuda.Device(index).retain_primary_context()

    def push(self) -> None:
        self.context.push()

    def pop(self) -> None:
        self.cuda.Context.pop()

    def release(self) -> None:
        self.context.detach()


def build_plan(trt: Any, source: bytes, profile: Profile, settings: BuildSettings) -> bytes:
    """A serialized engine for the ONNX `source` (strongly typed, as TensorRT 11 always builds)."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(source):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT's ONNX parser refused the model: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    optimization_profile = builder.create_optimization_profile()
    for name, (low, opt, high) in profile.shapes.items():
        optimization_profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(optimization_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT could not build an engine (its log says why)")
    return bytes(serialized)


@dataclass
class Instance:
    """One execution context with its own CUDA stream and buffers (pagelocked host, device), allocated once."""

    context: Any
    stream: Any
    host: dict[str, np.ndarray] = field(default_factory=dict)
    device: dict[str, Any] = field(default_factory=dict)


class TensorRTModel(LoadedModel):
    """A deserialized engine and its instances; every call pushes the primary context, sets the real input shapes,
    runs on its instance's stream and returns the outputs sliced to the real rows."""

    def __init__(self, trt: Any, cuda: Any, gpu: Gpu, plan: bytes, config: ModelConfig, profile: Profile) -> None:
        self.cuda = cuda
        self.config = config
        self.profile = profile
        self.device = f"cuda:{gpu.index}"
        self.output_names = [spec.name for spec in config.outputs]
        self.primary = PrimaryContext(cuda, gpu.index)
        with current(self.primary):
            self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            self.engine = self.runtime.deserialize_cuda_engine(plan)
            if self.engine is None:
                raise RuntimeError("TensorRT could not deserialize the plan (built for another version or GPU?)")
            self.bindings = [self._binding(trt, i) for i in range(self.engine.num_io_tensors)]
            check_bindings(self.bindings, config)
            shapes = buffer_shapes(self.bindings, profile, config)
            self.pool = InstancePool([self._instance(shapes) for _ in range(config.instance_count)])

    def _binding(self, trt: Any, index: int) -> Binding:
        name = self.engine.get_tensor_name(index)
        is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
        return Binding(name, is_input, dtype, tuple(self.engine.get_tensor_shape(name)))

    def _instance(self, shapes: dict[str, tuple[int, ...]]) -> Instance:
        instance = Instance(self.engine.create_execution_context(), self.cuda.Stream())
        for binding in self.bindings:
            size = math.prod(shapes[binding.name])
            instance.host[binding.name] = self.cuda.pagelocked_empty(size, binding.dtype)
            instance.device[binding.name] = self.cuda.mem_alloc(max(1, size * binding.dtype.itemsize))
            instance.context.set_tensor_address(binding.name, int(instance.device[binding.name]))
        return instance

    def forward(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        shapes = input_shapes(inputs, self.profile)
        with self.pool.acquire() as instance, current(self.primary):
            for name, array in inputs.items():
                staged = stage_input(instance.host[name], array)
                self.cuda.memcpy_htod_async(instance.device[name], staged, instance.stream)
                instance.context.set_input_shape(name, shapes[name])
            if not instance.context.execute_async_v3(instance.stream.handle):
                raise RuntimeError("TensorRT execution failed")
            produced = {name: tuple(instance.context.get_tensor_shape(name)) for name in self.output_names}
            for name, shape in produced.items():
                host = instance.host[name][: math.prod(shape)]
                self.cuda.memcpy_dtoh_async(host, instance.device[name], instance.stream)
            instance.stream.synchronize()
            return {name: take_output(instance.host[name], shape) for name, shape in produced.items()}

    def unload(self) -> None:
        with current(self.primary):
            for instance in self.pool.instances:
                for allocation in instance.device.values():
                    allocation.free()
                instance.device.clear()
                instance.host.clear()
                del instance.context
            self.pool.instances.clear()
            del self.engine
            del self.runtime
        self.primary.release()


class TensorRTBackend(Backend):
    """Loads a version's shipped plan (`model.plan` with its `.json` key) or builds one from `model.onnx`, cached
    under MESHSERVE_MODEL_PLAN_CACHE by TensorRT version, GPU, ONNX hash, profile and precision."""

    name = "tensorrt"
    platform = "tensorrt_plan"
    triton_backend = "tensorrt"

    def load(self, version_dir: Path, config: ModelConfig, version: int) -> LoadedModel:
        gpu = require_gpu("the tensorrt backend")  # before TensorRT or CUDA is touched
        trt, cuda = import_gpu_libraries()
        profile = profile_for(config)
        given = version_dir / config.default_model_filename
        if given.is_file():
            check_given_plan(given_plan_meta(given), trt.__version__, gpu.name, gpu.compute_capability)
            plan = given.read_bytes()
        else:
            plan = self._plan_from_onnx(trt, cuda, gpu, version_dir, config, version, profile)
        return TensorRTModel(trt, cuda, gpu, plan, config, profile)

    def _plan_from_onnx(
        self, trt: Any, cuda: Any, gpu: Gpu, version_dir: Path, config: ModelConfig, version: int, profile: Profile
    ) -> bytes:
        from services.model.settings import ModelSettings

        path = version_dir / ONNX_FILE
        shown = f"{config.name}/{version}/{ONNX_FILE}"
        model = read_onnx(path)
        check_io(model, config, shown)
        check_quantization(model, config.optimization_for(version).quantization, shown)
        settings = build_settings(config, version, quantization_of(model))
        onnx_bytes = path.read_bytes()
        key = plan_key(trt.__version__, gpu.name, gpu.compute_capability, onnx_bytes, profile, settings)
        cache = PlanCache(ModelSettings().plan_cache)
        plan = cache.load(key)
        if plan is not None:
            log.info("%s v%d: TensorRT plan from the cache (%s)", config.name, version, key.digest[:12])
            return plan
        primary = PrimaryContext(cuda, gpu.index)
        try:
            with current(primary):
                plan = build_plan(trt, engine_source(onnx_bytes, settings), profile, settings)
        finally:
            primary.release()
        stored = cache.store(key, plan)
        sha = hashlib.sha256(plan).hexdigest()[:12]
        log.info("%s v%d: TensorRT %s plan built (%s, %s)", config.name, version, settings.precision, stored, sha)
        return plan
