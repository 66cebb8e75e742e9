"""The demo models served from ONNX by ONNX Runtime answer as TorchScript does through an unmodified tritonclient,
and run under perf_analyzer (where it can run)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml

from bench.lib.perf_analyzer import has_libb64, installed_cudart_lib, run_perf_analyzer
from tests.helpers.servers import ROOT, model_service

DEMO = {"fraud_mlp": "features", "digits_cnn": "image"}


def demo_repo(root: Path, backend: str) -> Path:
    """The demo models (version 1) for one backend."""
    for model in DEMO:
        shutil.copytree(ROOT / "models" / model / "1", root / model / "1")
        config = yaml.safe_load((ROOT / "models" / model / "config.yaml").read_text())
        config.pop("default_model_filename", None)
        config.pop("version_overrides", None)
        config.update(backend=backend, version_policy={"specific": {"versions": [1]}})
        (root / model / "config.yaml").write_text(yaml.safe_dump(config))
    return root


def compare(onnx_url: str, torch_url: str) -> dict[str, dict]:
    """Each demo model's platforms on the two services and the largest difference between their answers."""
    worst = {}
    for model, name in DEMO.items():
        clients = [triton.InferenceServerClient(url) for url in (onnx_url, torch_url)]
        metadata = clients[0].get_model_metadata(model)
        dims = [int(d) for d in metadata.inputs[0].shape[1:]]
        x = np.random.default_rng(3).random((24, *dims), dtype=np.float32)
        answers = []
        for client in clients:
            inp = triton.InferInput(name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            result = client.infer(model, [inp], model_version="1")
            answers.append({o.name: result.as_numpy(o.name) for o in metadata.outputs})
        worst[model] = {
            "platforms": [c.get_model_metadata(model).platform for c in clients],
            "diff": max(
                float(np.abs(answers[0][o].astype(float) - answers[1][o].astype(float)).max()) for o in answers[0]
            ),
        }
        for client in clients:
            client.close()
    return worst


@pytest.mark.skipif(
    not (ROOT / "models" / "fraud_mlp" / "1" / "model.onnx").is_file(), reason="demo models not built (`make models`)"
)
def test_demo_models_from_onnx_answer_as_torchscript_through_tritonclient_and_perf_analyzer(tmp_path: Path) -> None:
    onnx_repo = demo_repo(tmp_path / "onnx", "onnxruntime")
    torch_repo = demo_repo(tmp_path / "torch", "torchscript")
    with (
        model_service(onnx_repo, tmp_path / "logs-onnx", MESHSERVE_MODEL_WATCH="false") as onnx_service,
        model_service(torch_repo, tmp_path / "logs-torch", MESHSERVE_MODEL_WATCH="false") as torch_service,
    ):
        for model, found in compare(onnx_service.address, torch_service.address).items():
            assert found["platforms"] == ["onnxruntime_onnx", "pytorch_libtorch"], model
            assert found["diff"] <= 1e-5, f"{model}: ONNX Runtime and TorchScript differ by {found['diff']}"
        if has_libb64() and installed_cudart_lib() is not None:
            for model in DEMO:
                result = run_perf_analyzer(model, onnx_service.address, concurrency=2, measurement_ms=800)
                assert result.throughput > 0 and result.has_server_stats, model
