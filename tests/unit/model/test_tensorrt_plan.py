"""The TensorRT backend's GPU-free logic (services/model/backends/tensorrt_plan.py, tensorrt_context.py) on CPU: build
settings and profile from the config, the plan cache and its key, shipped plans' provenance, buffer sizing, output
slicing and the context discipline; and that without a GPU the backend refuses before touching TensorRT."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from services.model.backends import get_backend
from services.model.backends.gpu import Gpu, NoGpu, why_no_gpu
from services.model.backends.tensorrt_context import InstancePool, current
from services.model.backends.tensorrt_plan import (
    DEFAULT_WORKSPACE_BYTES,
    Binding,
    BuildSettings,
    PlanCache,
    PlanMismatch,
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
from tests.helpers.models import Mlp, multi_io_config
from tests.unit.model.onnx_models import onnx_config, write_onnx_model


def trt_config(**extra: Any) -> ModelConfig:
    return ModelConfig.model_validate(onnx_config("m", backend="tensorrt", **extra))


def accelerator(**parameters: Any) -> dict[str, Any]:
    entry = {"name": "tensorrt", "parameters": parameters}
    return {"optimization": {"execution_accelerators": {"gpu_execution_accelerator": [entry]}}}


# ---------------------------------------------------------------------------------------------- build settings


def test_precision_comes_from_the_onnx_and_the_accelerator() -> None:
    assert build_settings(trt_config(), 1, "none") == BuildSettings("FP32", DEFAULT_WORKSPACE_BYTES)
    assert build_settings(trt_config(), 1, "static").precision == "INT8"  # a Q/DQ file is INT8 whatever is said
    fp16 = trt_config(**accelerator(precision_mode="fp16", max_workspace_size_bytes=1 << 28))
    assert build_settings(fp16, 1, "none") == BuildSettings("FP16", 1 << 28)
    int8 = trt_config(version_overrides={2: {"optimization": {"quantization": "int8"}}})
    assert build_settings(int8, 2, "static").precision == "INT8"
    with pytest.raises(ValueError, match="precision_mode INT8 needs a Q/DQ ONNX: TensorRT 11 has no calibrator"):
        build_settings(trt_config(**accelerator(precision_mode="INT8")), 1, "none")
    with pytest.raises(ValueError, match="precision_mode FP16 with an INT8"):
        build_settings(fp16, 1, "static")


def test_the_profile_spans_one_row_to_max_batch_size_optimised_for_the_largest_preferred_size() -> None:
    batching = {"max_queue_delay_us": 100, "preferred_batch_sizes": [4, 8]}
    assert profile_for(trt_config(dynamic_batching=batching)).shapes == {"x": ((1, 8), (8, 8), (16, 8))}
    assert profile_for(trt_config()).shapes == {"x": ((1, 8), (16, 8), (16, 8))}
    fixed = ModelConfig.model_validate({**multi_io_config("multi"), "backend": "tensorrt"})
    assert profile_for(fixed).shapes == {"a": ((2, 3),) * 3, "b": ((2,),) * 3}
    variable = trt_config(inputs=[{"name": "x", "datatype": "FP32", "dims": [-1]}])
    with pytest.raises(ValueError, match=r"needs fixed dims; input\(s\) \['x'\] have -1"):
        profile_for(variable)


# ---------------------------------------------------------------------------------------------- the plan cache


def key_for(**changes: Any) -> Any:
    args: dict[str, Any] = {
        "tensorrt_version": "11.4.0.106",
        "gpu_name": "NVIDIA L4",
        "compute_capability": (8, 9),
        "onnx_bytes": b"onnx",
        "profile": profile_for(trt_config()),
        "settings": BuildSettings("FP32", DEFAULT_WORKSPACE_BYTES),
    }
    args.update(changes)
    return plan_key(**args)


def test_every_field_a_plan_depends_on_changes_its_key() -> None:
    base = key_for()
    changed = [
        key_for(tensorrt_version="11.5.0"),
        key_for(gpu_name="NVIDIA A10G"),
        key_for(compute_capability=(8, 6)),
        key_for(onnx_bytes=b"onnx2"),
        key_for(profile=Profile({"x": ((1, 8), (8, 8), (16, 8))})),
        key_for(settings=BuildSettings("FP16", DEFAULT_WORKSPACE_BYTES)),
        key_for(settings=BuildSettings("FP32", 1 << 20)),
    ]
    assert key_for().digest == base.digest
    assert len({base.digest, *(k.digest for k in changed)}) == len(changed) + 1


def test_the_cache_returns_a_plan_only_for_its_own_key(tmp_path: Path) -> None:
    cache = PlanCache(tmp_path / "plans")
    key = key_for()
    assert cache.load(key) is None
    path = cache.store(key, b"plan bytes")
    assert path.read_bytes() == b"plan bytes" and cache.load(key) == b"plan bytes"
    assert cache.load(key_for(gpu_name="NVIDIA T4")) is None  # another GPU: rebuilt, never reused
    assert not list((tmp_path / "plans").glob("*.tmp"))
    _, meta = cache.paths(key)
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "tensorrt_version": "10.0"}))
    assert cache.load(key) is None  # a plan whose recorded key differs is never loaded
    meta.write_text("{not json")
    assert cache.load(key) is None


def test_a_shipped_plan_needs_its_provenance_and_must_match_this_tensorrt_and_gpu(tmp_path: Path) -> None:
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"plan")
    with pytest.raises(PlanMismatch, match=r"model.plan has no model.plan.json saying which TensorRT version"):
        given_plan_meta(plan)
    cache = PlanCache(tmp_path)
    _, meta = cache.paths(key_for())
    cache.store(key_for(), b"plan")
    (tmp_path / "model.plan.json").write_text(meta.read_text())
    recorded = given_plan_meta(plan)
    check_given_plan(recorded, "11.4.0.106", "NVIDIA L4", (8, 9))
    with pytest.raises(PlanMismatch, match=r"built with TensorRT 11.4.0.106 for NVIDIA L4 .*this is TensorRT 11.5"):
        check_given_plan(recorded, "11.5.0", "NVIDIA L4", (8, 9))
    with pytest.raises(PlanMismatch, match=r"compute capability 8.9\); this is TensorRT 11.4.0.106 on NVIDIA H100"):
        check_given_plan(recorded, "11.4.0.106", "NVIDIA H100", (9, 0))


# ---------------------------------------------------------------------------------------------- buffers and shapes


BINDINGS = [Binding("x", True, np.dtype(np.float32), (-1, 8)), Binding("y", False, np.dtype(np.float32), (-1, 1))]


def test_bindings_must_be_the_configs() -> None:
    check_bindings(BINDINGS, trt_config())
    with pytest.raises(ValueError, match=r"the engine's outputs are \['z'\]"):
        check_bindings([BINDINGS[0], Binding("z", False, np.dtype(np.float32), (-1, 1))], trt_config())
    with pytest.raises(ValueError, match="engine input 'x' is float16, the config says FP32"):
        check_bindings([Binding("x", True, np.dtype(np.float16), (-1, 8)), BINDINGS[1]], trt_config())


def test_buffers_hold_the_largest_batch_once() -> None:
    config = trt_config()
    assert buffer_shapes(BINDINGS, profile_for(config), config) == {"x": (16, 8), "y": (16, 1)}


def test_inputs_set_their_real_shape_and_outputs_come_back_sliced_and_copied() -> None:
    profile = profile_for(trt_config())
    assert input_shapes({"x": np.zeros((3, 8), np.float32)}, profile) == {"x": (3, 8)}
    with pytest.raises(ValueError, match=r"input 'x' of shape \[17, 8\] is past the engine's profile \[16, 8\]"):
        input_shapes({"x": np.zeros((17, 8), np.float32)}, profile)
    host = np.full(16 * 8, -1.0, np.float32)
    x = np.arange(24, dtype=np.float64).reshape(3, 8)
    staged = stage_input(host, x)
    assert staged.base is host and staged.dtype == np.float32 and staged.tolist() == list(range(24))
    out_host = np.arange(16, dtype=np.float32)
    rows = take_output(out_host, (3, 1))
    assert rows.tolist() == [[0.0], [1.0], [2.0]]
    out_host[:] = 99  # the next call overwrites the buffer; the answer already returned is a copy
    assert rows.tolist() == [[0.0], [1.0], [2.0]]


def test_fp16_builds_from_a_mixed_precision_copy_with_fp32_inputs_and_outputs(tmp_path: Path) -> None:
    folder = write_onnx_model(tmp_path, "m", onnx_config("m"), {1: Mlp(1)})
    source = (folder / "1" / "model.onnx").read_bytes()
    assert engine_source(source, BuildSettings("FP32", 1)) == source
    converted = onnx.load_from_string(engine_source(source, BuildSettings("FP16", 1)))
    assert {i.data_type for i in converted.graph.initializer} == {onnx.TensorProto.FLOAT16}
    elem = [v.type.tensor_type.elem_type for v in (*converted.graph.input, *converted.graph.output)]
    assert elem == [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT]


# ---------------------------------------------------------------------------------------------- the context discipline


class FakeContext:
    """Records pushes and pops per thread, as a CUDA context stack would hold them."""

    def __init__(self) -> None:
        self.depth: dict[int, int] = {}
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def push(self) -> None:
        with self.lock:
            self.depth[threading.get_ident()] = self.depth.get(threading.get_ident(), 0) + 1
            self.calls.append("push")

    def pop(self) -> None:
        with self.lock:
            self.depth[threading.get_ident()] -= 1
            self.calls.append("pop")


def test_the_context_is_popped_also_when_the_call_fails() -> None:
    context = FakeContext()
    with current(context):
        assert context.depth[threading.get_ident()] == 1
    with pytest.raises(RuntimeError), current(context):
        raise RuntimeError("execute failed")
    assert context.calls == ["push", "pop", "push", "pop"] and set(context.depth.values()) == {0}


def test_each_worker_thread_pushes_around_its_own_call_on_an_instance_of_its_own() -> None:
    context = FakeContext()
    pool = InstancePool([{"stream": i, "busy": False} for i in range(3)])
    seen: list[int] = []
    errors: list[str] = []

    def call() -> None:
        for _ in range(50):
            with pool.acquire() as instance, current(context):
                if instance["busy"] or context.depth[threading.get_ident()] != 1:
                    errors.append("shared")
                instance["busy"] = True
                seen.append(instance["stream"])
                time.sleep(0)  # let another thread try to take the same instance
                instance["busy"] = False

    threads = [threading.Thread(target=call) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and set(seen) <= {0, 1, 2} and len(seen) == 150
    assert set(context.depth.values()) == {0}  # every thread popped what it pushed
    with pytest.raises(ValueError, match="at least one instance"):
        InstancePool([])


# ---------------------------------------------------------------------------------------------- without a GPU


def test_without_a_gpu_the_backend_refuses_before_touching_tensorrt(tmp_path: Path) -> None:
    reason = why_no_gpu()
    if reason is None:
        pytest.skip("this machine has a GPU: tests/gpu exercise the backend there")
    folder = write_onnx_model(tmp_path, "m", onnx_config("m", backend="tensorrt"), {1: Mlp(1)})
    with pytest.raises(NoGpu, match="the tensorrt backend needs an NVIDIA GPU"):
        get_backend("tensorrt").load(folder / "1", trt_config(), 1)
    assert "tensorrt" not in sys.modules and "pycuda" not in sys.modules


def test_with_a_gpu_but_no_tensorrt_the_message_says_how_a_gpu_image_gets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import services.model.backends.tensorrt as backend

    monkeypatch.setattr(backend, "require_gpu", lambda what: Gpu(0, "NVIDIA L4", (8, 9), 24 << 30))
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import tensorrt raises ImportError
    with pytest.raises(RuntimeError, match=r"TensorRT is not installed .*a GPU image installs TensorRT and pycuda"):
        get_backend("tensorrt").load(tmp_path, trt_config(), 1)
