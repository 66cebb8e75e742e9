"""The model service process serving ONNX: a version broken in any way a user can break it (a corrupt file, inputs
that disagree with the config, a GPU platform without a GPU) is reported in RepositoryIndex while the rest serves.
The demo models served from ONNX through tritonclient and perf_analyzer are in tests/compat/test_model_onnx.py."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from services.common.tensor_codec import decode_tensor, encode_raw
from services.model.backends.gpu import why_no_gpu
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.models import Mlp, reference_output
from tests.helpers.servers import model_service
from tests.unit.model.onnx_models import onnx_config, write_onnx_model


def infer(stub: pb_grpc.GRPCInferenceServiceStub, model: str, name: str, x: np.ndarray) -> np.ndarray:
    request = pb.ModelInferRequest(model_name=model)
    datatype, shape, raw = encode_raw(x)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    response = stub.ModelInfer(request, timeout=10)
    out = response.outputs[0]
    return decode_tensor(out.name, out.datatype, out.shape, None, response.raw_output_contents[0])


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_onnx_model(root, "onnx_mlp", onnx_config("onnx_mlp", version_policy={"all": {}}), {1: Mlp(1), 2: Mlp(2)})
    corrupt = write_onnx_model(root, "corrupt", onnx_config("corrupt"), {1: Mlp(3)})
    (corrupt / "1" / "model.onnx").write_bytes(b"not an onnx model" * 10)
    write_onnx_model(root, "mismatch", onnx_config("mismatch"), {1: Mlp(4)})
    mismatch = onnx_config("mismatch", inputs=[{"name": "x", "datatype": "FP32", "dims": [9]}])
    (root / "mismatch" / "config.yaml").write_text(yaml.safe_dump(mismatch))
    write_onnx_model(root, "gpu_only", onnx_config("gpu_only", platform="tensorrt_plan", backend=None), {1: Mlp(5)})
    return root


def test_broken_onnx_versions_are_reported_and_the_rest_serves(repo: Path, tmp_path: Path) -> None:
    with model_service(repo, tmp_path / "logs", MESHSERVE_MODEL_WATCH="false") as service:
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            index = {
                (m.name, m.version): m for m in stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5).models
            }
            assert index[("onnx_mlp", "1")].state == index[("onnx_mlp", "2")].state == "READY"
            reasons = {name: index[(name, "1")] for name in ("corrupt", "mismatch", "gpu_only")}
            assert all(entry.state == "UNAVAILABLE" for entry in reasons.values())
            assert "model.onnx is not a valid ONNX model" in reasons["corrupt"].reason
            assert "mismatch/1/model.onnx: input 'x' has shape ['?', 8] in the file" in reasons["mismatch"].reason
            if why_no_gpu() is not None:
                assert "the tensorrt backend needs an NVIDIA GPU" in reasons["gpu_only"].reason
            assert str(repo) not in "".join(e.reason for e in reasons.values())  # no server paths for clients
            metadata = stub.ModelMetadata(pb.ModelMetadataRequest(name="onnx_mlp"), timeout=5)
            assert metadata.platform == "onnxruntime_onnx"
            x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
            for version, seed in (("", 2), ("1", 1)):
                request_model = "onnx_mlp"
                request = pb.ModelInferRequest(model_name=request_model, model_version=version)
                datatype, shape, raw = encode_raw(x)
                request.inputs.add(name="x", datatype=datatype, shape=shape)
                request.raw_input_contents.append(raw)
                response = stub.ModelInfer(request, timeout=10)
                out = response.outputs[0]
                y = decode_tensor(out.name, out.datatype, out.shape, None, response.raw_output_contents[0])
                np.testing.assert_allclose(y, reference_output(Mlp(seed), x), atol=1e-5)
            with pytest.raises(grpc.RpcError) as err:
                infer(stub, "corrupt", "x", x)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert service.terminate() == 0
