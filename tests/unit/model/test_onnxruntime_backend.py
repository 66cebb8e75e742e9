"""The ONNX Runtime backend on real exported models: answers equal to torch, providers chosen as Triton's ONNX Runtime
backend chooses them, session options from the config, and broken files reported, never loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from services.model.backends import get_backend
from services.model.backends.onnx_io import OnnxMismatch
from services.model.backends.onnxruntime import (
    CPU,
    CUDA,
    TENSORRT,
    OnnxRuntimeBackend,
    OnnxRuntimeModel,
    gpu_missing,
    placement,
    session_options,
)
from services.model.config import ModelConfig
from services.model.export import quantize_int8, sample_rows
from tests.helpers.models import Mlp, MultiIO, multi_io_config, reference_output
from tests.unit.model.onnx_models import onnx_config, write_onnx_model


def load(folder: Path, config: dict, version: int = 1) -> OnnxRuntimeModel:
    model = get_backend("onnxruntime").load(folder / str(version), ModelConfig.model_validate(config), version)
    assert isinstance(model, OnnxRuntimeModel)
    return model


def test_forward_equals_torch_at_every_batch_size(tmp_path: Path) -> None:
    folder = write_onnx_model(tmp_path, "m", onnx_config("m"), {1: Mlp(1)})
    model = load(folder, onnx_config("m"))
    assert model.device == "cpu" and isinstance(get_backend("onnxruntime"), OnnxRuntimeBackend)
    for rows in (1, 5, 16):
        x = np.random.default_rng(rows).standard_normal((rows, 8)).astype(np.float32)
        np.testing.assert_allclose(model.forward({"x": x})["y"], reference_output(Mlp(1), x), atol=1e-5)


def test_two_inputs_and_outputs_of_several_dtypes_without_a_batch_dimension(tmp_path: Path) -> None:
    config = {**multi_io_config("multi"), "backend": "onnxruntime"}
    folder = write_onnx_model(tmp_path, "multi", config, {1: MultiIO()})
    out = load(folder, config).forward({"a": np.ones((2, 3), np.float32), "b": np.array([1, 2], np.int64)})
    assert list(out) == ["a2", "b1"]
    np.testing.assert_array_equal(out["a2"], np.full((2, 3), 2.0, np.float32))
    assert out["b1"].dtype == np.int64 and out["b1"].tolist() == [2, 3]


def test_a_corrupt_file_is_refused_naming_it(tmp_path: Path) -> None:
    folder = write_onnx_model(tmp_path, "m", onnx_config("m"), {1: Mlp(1)})
    (folder / "1" / "model.onnx").write_bytes(b"\x08\x07garbage" * 50)
    with pytest.raises(OnnxMismatch, match=r"model\.onnx is not a valid ONNX model"):
        load(folder, onnx_config("m"))
    (folder / "1" / "model.onnx").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.onnx not found"):
        load(folder, onnx_config("m"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"inputs": [{"name": "features", "datatype": "FP32", "dims": [8]}]}, r"its inputs are \['x'\]"),
        ({"inputs": [{"name": "x", "datatype": "FP64", "dims": [8]}]}, "input 'x' is FP32 in the file, FP64"),
        ({"inputs": [{"name": "x", "datatype": "FP32", "dims": [9]}]}, r"input 'x' has shape \['\?', 8\]"),
        ({"outputs": [{"name": "y", "datatype": "FP32", "dims": [2]}]}, r"output 'y' has shape"),
        ({"max_batch_size": 0, "inputs": [{"name": "x", "datatype": "FP32", "dims": [8]}]}, "max_batch_size 0"),
    ],
)
def test_an_onnx_file_that_disagrees_with_its_config_is_refused(tmp_path: Path, change: dict, message: str) -> None:
    folder = write_onnx_model(tmp_path, "m", onnx_config("m"), {1: Mlp(1)})
    with pytest.raises(OnnxMismatch, match=message):
        load(folder, onnx_config("m", **change))


def test_int8_needs_a_static_qdq_file(tmp_path: Path) -> None:
    int8 = {"version_overrides": {1: {"optimization": {"quantization": "int8"}}}}
    folder = write_onnx_model(tmp_path, "m", onnx_config("m"), {1: Mlp(1)})
    with pytest.raises(OnnxMismatch, match="no QuantizeLinear/DequantizeLinear nodes"):
        load(folder, onnx_config("m", **int8))
    fp32 = folder / "1" / "model.onnx"
    quantize_int8(fp32, fp32, sample_rows(ModelConfig.model_validate(onnx_config("m")), 256))
    assert load(folder, onnx_config("m", **int8)).forward({"x": np.zeros((2, 8), np.float32)})["y"].shape == (2, 1)


def test_dynamic_quantization_is_refused_for_its_batch_dependent_scales(tmp_path: Path) -> None:
    folder = write_onnx_model(tmp_path, "m", onnx_config("m"), {1: Mlp(1)})
    path = folder / "1" / "model.onnx"
    model = onnx.load(str(path))  # what onnxruntime's quantize_dynamic puts in front of each MatMul
    model.graph.node.insert(0, onnx.helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zero"]))
    onnx.save(model, str(path))
    with pytest.raises(OnnxMismatch, match="computed at run time depend on the rows batched together"):
        load(folder, onnx_config("m"))


def test_a_version_on_worker_threads_gets_the_thread_pool_one_inline_keeps_one_thread(tmp_path: Path) -> None:
    folder = write_onnx_model(tmp_path, "m", onnx_config("m"), {1: Mlp(1)})
    model = load(folder, onnx_config("m"))
    assert model.intra_op_threads == 1
    assert model.executes(inline=True) is False and model.intra_op_threads == 1
    before = model.session
    assert model.executes(inline=False) is True  # reopened: the manager warms it up again
    assert model.session is not before and model.intra_op_threads == 0
    pinned = load(folder, onnx_config("m", parameters={"intra_op_thread_count": 2}))
    assert pinned.executes(inline=False) is False
    assert pinned.session.get_session_options().intra_op_num_threads == 2
    pinned.unload()
    assert pinned.session is None


def test_session_options_follow_tritons_parameters_and_graph_levels() -> None:
    config = ModelConfig.model_validate(
        onnx_config(
            "m",
            parameters={"inter_op_thread_count": 3, "execution_mode": 1, "enable_mem_arena": "0"},
            optimization={"graph": {"level": 2}},
            version_overrides={2: {"optimization": {"graph": {"level": -1}}}},
        )
    )
    options = session_options(config, 1, intra_op_threads=1)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 3)
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert options.enable_cpu_mem_arena is False and options.enable_mem_pattern is True
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert session_options(config, 2, 0).graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    default = ModelConfig.model_validate(onnx_config("m"))
    assert session_options(default, 1, 0).graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


ACCELERATED = onnx_config(
    "m",
    optimization={
        "execution_accelerators": {
            "gpu_execution_accelerator": [
                {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": 1 << 30}},
                {"name": "cuda", "parameters": {"gpu_mem_limit": 1 << 31, "arena_extend_strategy": 1}},
            ]
        }
    },
)


def test_on_a_gpu_the_accelerators_come_first_then_cuda_then_the_cpu() -> None:
    config = ModelConfig.model_validate(ACCELERATED)
    where = placement(config, 1, [TENSORRT, CUDA, CPU], None)
    assert where.device == "cuda:0"
    assert [name for name, _ in where.providers] == [TENSORRT, CUDA, CPU]
    trt_options, cuda_options = where.providers[0][1], where.providers[1][1]
    assert trt_options["trt_fp16_enable"] == "True" and trt_options["trt_int8_enable"] == "False"
    assert trt_options["trt_max_workspace_size"] == str(1 << 30)
    assert cuda_options == {
        "device_id": "0",
        "gpu_mem_limit": str(1 << 31),
        "arena_extend_strategy": "kSameAsRequested",
    }


def test_without_a_gpu_the_cpu_serves_and_asking_for_what_is_missing_fails() -> None:
    config = ModelConfig.model_validate(ACCELERATED)
    assert placement(config, 1, [CPU], "no NVIDIA driver").providers == [(CPU, {})]
    assert gpu_missing(ModelConfig.model_validate(onnx_config("m", device="cpu")), [CUDA, CPU]) is not None
    assert "onnxruntime-gpu" in (gpu_missing(config, [CPU]) or "")
    cuda = ModelConfig.model_validate({**ACCELERATED, "device": "cuda"})
    with pytest.raises(RuntimeError, match="config asks for device cuda, but no NVIDIA driver"):
        placement(cuda, 1, [CUDA, CPU], "no NVIDIA driver")
    with pytest.raises(RuntimeError, match="no TensorrtExecutionProvider"):
        placement(config, 1, [CUDA, CPU], None)


def test_here_the_cpu_package_runs_on_the_cpu(tmp_path: Path) -> None:
    """This machine's onnxruntime is the CPU build: a config with GPU accelerators still loads, on the CPU."""
    folder = write_onnx_model(tmp_path, "m", ACCELERATED, {1: Mlp(2)})
    model = load(folder, ACCELERATED)
    assert model.device == "cpu" and model.session.get_providers() == [CPU]
    x = np.ones((3, 8), np.float32)
    with torch.inference_mode():
        expected = Mlp(2).eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(model.forward({"x": x})["y"], expected, atol=1e-5)
