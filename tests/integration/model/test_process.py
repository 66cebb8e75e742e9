"""`python -m services.model` as its own process, driven with the project's stubs: health, readiness, a config
naming an unregistered backend, SIGTERM; and that reading configs never imports a backend's heavy library."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2

from services.common.tensor_codec import decode_tensor, encode_raw
from services.model.servicer import SERVICE_NAME
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.models import Mlp, mlp_config, reference_output, write_model
from tests.helpers.servers import ROOT, health_status, model_service


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    write_model(root, "mlp", mlp_config("mlp"), {1: Mlp(1), 2: Mlp(2)})
    write_model(root, "broken", mlp_config("broken", backend="tensorflow"), {1: Mlp(3)})
    return root


def test_the_process_serves_reports_a_broken_backend_and_drains_on_sigterm(repo: Path, tmp_path: Path) -> None:
    with model_service(repo, tmp_path / "logs", MESHSERVE_MODEL_WATCH="false") as service:
        assert health_status(service.address, SERVICE_NAME) == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            assert stub.ServerLive(pb.ServerLiveRequest(), timeout=5).live
            assert stub.ServerReady(pb.ServerReadyRequest(), timeout=5).ready
            index = {
                (m.name, m.version): m for m in stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5).models
            }
            assert index[("mlp", "2")].state == "READY"
            broken = index[("broken", "")]
            assert broken.state == "UNAVAILABLE"
            assert "unknown backend 'tensorflow'; registered backends: torchscript, onnxruntime" in broken.reason
            x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
            request = pb.ModelInferRequest(model_name="mlp")
            datatype, shape, raw = encode_raw(x)
            request.inputs.add(name="x", datatype=datatype, shape=shape)
            request.raw_input_contents.append(raw)
            response = stub.ModelInfer(request, timeout=10)
            out = response.outputs[0]
            y = decode_tensor(out.name, out.datatype, out.shape, None, response.raw_output_contents[0])
            np.testing.assert_allclose(y, reference_output(Mlp(2), x), rtol=1e-5, atol=1e-6)
            with pytest.raises(grpc.RpcError) as err:
                stub.ModelInfer(pb.ModelInferRequest(model_name="broken"), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert service.terminate() == 0
        assert health_status(service.address) is None
        assert "model mlp version 2 unloaded" in service.log()


def test_reading_configs_and_serving_rpcs_imports_no_backend_library(repo: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path

        from services.model.backends import get_backend
        from services.model.repository import ModelRepository
        from services.model.servicer import ModelServicer  # the whole request path down to the manager

        assert ModelRepository(Path({str(repo)!r})).read_config("mlp").backend == "torchscript"
        assert "torch" not in sys.modules, "reading a config imported torch"
        assert "onnxruntime" not in sys.modules and "onnx" not in sys.modules, "reading a config imported ONNX"
        get_backend("tensorrt")  # its module loads; TensorRT and pycuda wait for a GPU and a model that uses them
        assert "tensorrt" not in sys.modules and "pycuda" not in sys.modules, "the tensorrt backend imported TensorRT"
        get_backend("torchscript")
        assert "torch" in sys.modules, "the torchscript backend should import torch when it is asked for"
        print("lazy")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "lazy"
