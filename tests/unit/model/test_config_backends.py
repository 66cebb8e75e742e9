"""A config names its backend by registry name or Triton platform; the model file, session parameters and execution
accelerators follow the backend, and what a backend would not read is an error, never silently dropped."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.common.validation import describe
from services.model.backends import BACKENDS, PLATFORMS
from services.model.config import ModelConfig
from tests.helpers.models import mlp_config


def parse(**extra: Any) -> ModelConfig:
    return ModelConfig.model_validate(mlp_config("m", **extra))


def refused(**extra: Any) -> str:
    with pytest.raises(ValidationError) as err:
        parse(**extra)
    return describe(err.value)


@pytest.mark.parametrize(
    ("platform", "backend", "filename"),
    [
        ("pytorch_libtorch", "torchscript", "model.pt"),
        ("onnxruntime_onnx", "onnxruntime", "model.onnx"),
        ("tensorrt_plan", "tensorrt", "model.plan"),
    ],
)
def test_a_triton_platform_names_the_backend_and_its_model_file(platform: str, backend: str, filename: str) -> None:
    assert PLATFORMS[platform] == backend and BACKENDS[backend].filename == filename
    by_platform, by_name = parse(platform=platform), parse(backend=backend)
    assert (by_platform.backend, by_platform.default_model_filename) == (backend, filename)
    assert (by_name.backend, by_name.default_model_filename, by_name.platform) == (backend, filename, None)
    assert parse(platform=platform, backend=backend, default_model_filename="weights.bin").default_model_filename == (
        "weights.bin"
    )


def test_the_default_stays_torchscript() -> None:
    config = parse()
    assert (config.backend, config.default_model_filename) == ("torchscript", "model.pt")


def test_an_unknown_or_contradicting_platform_is_refused() -> None:
    assert "unknown platform 'tensorflow_savedmodel'; platforms served: pytorch_libtorch" in refused(
        platform="tensorflow_savedmodel"
    )
    assert "platform onnxruntime_onnx is served by backend onnxruntime, not tensorrt" in refused(
        platform="onnxruntime_onnx", backend="tensorrt"
    )


def test_session_parameters_are_tritons_strings_for_onnxruntime_only() -> None:
    config = parse(backend="onnxruntime", parameters={"intra_op_thread_count": 2, "enable_mem_arena": False})
    assert config.parameters == {"intra_op_thread_count": "2", "enable_mem_arena": "0"}
    assert "parameters apply to the onnxruntime backend, not torchscript" in refused(
        parameters={"intra_op_thread_count": "1"}
    )
    assert "unknown key 'threads'" in refused(backend="onnxruntime", parameters={"threads": "1"})
    assert "execution_mode must be one of 0, 1" in refused(backend="onnxruntime", parameters={"execution_mode": 2})
    assert "must be a non-negative integer" in refused(backend="onnxruntime", parameters={"intra_op_thread_count": -1})


def accelerators(*entries: dict[str, Any]) -> dict[str, Any]:
    return {"execution_accelerators": {"gpu_execution_accelerator": list(entries)}}


def test_execution_accelerators_as_tritons_onnxruntime_backend_reads_them() -> None:
    trt = {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "trt_engine_cache_enable": True}}
    config = parse(backend="onnxruntime", optimization=accelerators(trt, {"name": "cuda"}))
    entry = config.optimization.accelerator("tensorrt")
    assert entry is not None and entry.parameters == {"precision_mode": "FP16", "trt_engine_cache_enable": "1"}
    assert config.optimization.accelerator("cuda") is not None
    assert "tensorrt: unknown parameter 'precision'" in refused(
        backend="onnxruntime", optimization=accelerators({"name": "tensorrt", "parameters": {"precision": "FP16"}})
    )
    assert "precision_mode must be one of fp32, fp16, int8" in refused(
        backend="onnxruntime", optimization=accelerators({"name": "tensorrt", "parameters": {"precision_mode": "TF32"}})
    )
    assert "gpu_execution_accelerator.0.name" in refused(
        backend="onnxruntime", optimization=accelerators({"name": "x"})
    )
    cpu = {"execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino"}]}}
    assert "no CPU execution accelerator is served here" in refused(backend="onnxruntime", optimization=cpu)


def test_each_backend_refuses_what_it_would_not_read() -> None:
    assert "do not apply to the torchscript backend" in refused(optimization=accelerators({"name": "cuda"}))
    assert "optimization.graph applies to the onnxruntime backend, not tensorrt" in refused(
        backend="tensorrt", optimization={"graph": {"level": 1}}
    )
    native = {"name": "tensorrt", "parameters": {"precision_mode": "FP16", "max_workspace_size_bytes": "1024"}}
    assert parse(backend="tensorrt", optimization=accelerators(native)).backend == "tensorrt"
    for entry in ({"name": "cuda"}, {"name": "tensorrt", "parameters": {"trt_engine_cache_enable": "1"}}):
        message = refused(backend="tensorrt", version_overrides={2: {"optimization": accelerators(entry)}})
        assert "version_overrides.2.optimization.execution_accelerators: the tensorrt backend reads only" in message
