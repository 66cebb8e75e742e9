"""The model service over real gRPC sockets, driven by unmodified tritonclient."""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.helpers.models import Mlp, MultiIO, reference_output
from tests.helpers.servers import ServiceProcess


def infer(client: triton.InferenceServerClient, model: str, x: np.ndarray, version: str = "") -> triton.InferResult:
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], model_version=version)


def status_of(exc: InferenceServerException) -> str:
    return str(exc.status()).replace("StatusCode.", "")


def rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def test_server_live_ready_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta.name == "meshserve"
    assert "model_repository" in meta.extensions


def test_model_metadata_follows_triton_conventions(client: triton.InferenceServerClient) -> None:
    meta = client.get_model_metadata("mlp")
    assert meta.name == "mlp"
    assert sorted(meta.versions) == ["2", "3"]
    assert meta.platform == "pytorch_libtorch"
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.inputs] == [("x", "FP32", [-1, 8])]
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [("y", "FP32", [-1, 1])]


def test_model_config_is_tritons_message(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config("batched").config
    assert config.name == "batched"
    assert config.max_batch_size == 16
    assert config.input[0].name == "x" and list(config.input[0].dims) == [8]
    assert config.input[0].data_type == triton.model_config_pb2.TYPE_FP32
    assert config.HasField("dynamic_batching")
    unbatched = client.get_model_config("mlp").config
    assert not unbatched.HasField("dynamic_batching")
    assert unbatched.version_policy.latest.num_versions == 2


def test_infer_raw_contents_matches_torch(client: triton.InferenceServerClient) -> None:
    x = rows(5)
    result = infer(client, "mlp", x)
    assert result.get_response().model_version == "3"  # newest ready version without a version asked
    np.testing.assert_allclose(result.as_numpy("y"), reference_output(Mlp(3), x), rtol=1e-5, atol=1e-6)


def test_infer_typed_contents(server: ServiceProcess) -> None:
    """Typed InferTensorContents (no raw) through tritonclient's own protobuf stubs."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([10, 20], dtype=np.int64)
    request = service_pb2.ModelInferRequest(model_name="multi")
    ta = request.inputs.add(name="a", datatype="FP32", shape=[2, 3])
    ta.contents.fp32_contents.extend(a.reshape(-1).tolist())
    tb = request.inputs.add(name="b", datatype="INT64", shape=[2])
    tb.contents.int64_contents.extend(b.tolist())
    with grpc.insecure_channel(server.address) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    outputs = {o.name: (o, raw) for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)}
    a2 = np.frombuffer(outputs["a2"][1], dtype=np.float32).reshape(list(outputs["a2"][0].shape))
    b1 = np.frombuffer(outputs["b1"][1], dtype=np.int64)
    expected_a, expected_b = MultiIO()(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_array_equal(a2, expected_a.numpy())
    np.testing.assert_array_equal(b1, expected_b.numpy())
    assert outputs["b1"][0].datatype == "INT64"


def test_requested_outputs_subset(client: triton.InferenceServerClient) -> None:
    a = triton.InferInput("a", [2, 3], "FP32")
    a.set_data_from_numpy(np.ones((2, 3), np.float32))
    b = triton.InferInput("b", [2], "INT64")
    b.set_data_from_numpy(np.array([1, 2], np.int64))
    result = client.infer("multi", [a, b], outputs=[triton.InferRequestedOutput("b1")])
    assert [o.name for o in result.get_response().outputs] == ["b1"]
    np.testing.assert_array_equal(result.as_numpy("b1"), [2, 3])


def test_version_selection_and_policy(client: triton.InferenceServerClient) -> None:
    x = rows(2, seed=1)
    for version in ("2", "3"):
        result = infer(client, "mlp", x, version)
        assert result.get_response().model_version == version
        np.testing.assert_allclose(result.as_numpy("y"), reference_output(Mlp(int(version)), x), rtol=1e-5, atol=1e-6)
    assert client.is_model_ready("mlp", "3") and not client.is_model_ready("mlp", "1")
    assert client.is_model_ready("pinned", "1") and client.is_model_ready("pinned", "3")
    assert not client.is_model_ready("pinned", "2")
    assert infer(client, "pinned", x).get_response().model_version == "3"
    with pytest.raises(InferenceServerException) as err:
        infer(client, "mlp", x, "1")  # on disk, outside the policy
    assert status_of(err.value) == "NOT_FOUND" and "version 1" in err.value.message()


@pytest.mark.parametrize(
    ("build", "code", "fragment"),
    [
        (lambda: ("nope", [("x", [1, 8], "FP32", rows(1))]), "NOT_FOUND", "unknown model 'nope'"),
        (lambda: ("mlp", [("x", [1, 8], "FP64", rows(1).astype(np.float64))]), "INVALID_ARGUMENT", "datatype FP64"),
        (lambda: ("mlp", [("x", [1, 7], "FP32", rows(1)[:, :7].copy())]), "INVALID_ARGUMENT", "shape [1, 7]"),
        (lambda: ("mlp", [("z", [1, 8], "FP32", rows(1))]), "INVALID_ARGUMENT", "missing input(s) ['x']"),
        (lambda: ("mlp", [("x", [17, 8], "FP32", rows(17))]), "INVALID_ARGUMENT", "over max_batch_size 16"),
        (lambda: ("mlp", [("x", [8], "FP32", rows(1)[0])]), "INVALID_ARGUMENT", "expected ['batch', 8]"),
    ],
    ids=["unknown-model", "dtype", "shape", "name", "batch-over-max", "no-batch-dim"],
)
def test_bad_requests_get_clear_errors(client: triton.InferenceServerClient, build, code: str, fragment: str) -> None:
    model, tensors = build()
    inputs = []
    for name, shape, datatype, data in tensors:
        t = triton.InferInput(name, shape, datatype)
        t.set_data_from_numpy(data)
        inputs.append(t)
    with pytest.raises(InferenceServerException) as err:
        client.infer(model, inputs)
    assert status_of(err.value) == code
    assert fragment in err.value.message()
    assert client.is_server_ready()  # the service keeps serving


def test_nan_is_refused_unless_allowed(client: triton.InferenceServerClient) -> None:
    x = rows(3)
    x[1, 4] = np.nan
    x[2, 0] = np.inf
    with pytest.raises(InferenceServerException) as err:
        infer(client, "mlp", x)
    assert status_of(err.value) == "INVALID_ARGUMENT"
    assert "'x' holds 2 NaN/Inf" in err.value.message()
    assert np.isnan(infer(client, "nan_ok", x).as_numpy("y")[1, 0])


def _raw_request(model: str, shape: list[int], raw: bytes, datatype: str = "FP32") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    return request


@pytest.mark.parametrize(
    ("request_factory", "fragment"),
    [
        (lambda: _raw_request("mlp", [1, 8], b"\0" * 31), "raw contents hold 31 bytes"),
        (lambda: _raw_request("mlp", [-1, 8], b""), "negative dimension"),
        (lambda: _raw_request("mlp", [1, 8], b"\0" * 32, "FP99"), "unknown datatype"),
    ],
    ids=["raw-length", "negative-dim", "bad-datatype"],
)
def test_malformed_tensors(server: ServiceProcess, request_factory, fragment: str) -> None:
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request_factory(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in err.value.details()


def test_typed_element_count_mismatch(server: ServiceProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 8]).contents.fp32_contents.extend([1.0] * 5)
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "fp32_contents holds 5 elements" in err.value.details()


def test_unknown_version_string(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as err:
        infer(client, "mlp", rows(1), "latest")
    assert status_of(err.value) == "NOT_FOUND"


def test_oversized_message_refused(client: triton.InferenceServerClient, server: ServiceProcess) -> None:
    request = service_pb2.ModelInferRequest(model_name="mlp")
    request.inputs.add(name="x", datatype="FP32", shape=[16, 8])
    request.raw_input_contents.append(b"\0" * (2 * 1024 * 1024))  # over the 1 MiB limit set for this server
    with grpc.insecure_channel(server.address) as channel, pytest.raises(grpc.RpcError) as err:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert client.is_server_ready()


def test_batched_results_equal_unbatched(client: triton.InferenceServerClient, server: ServiceProcess) -> None:
    """Concurrent requests of 1..3 rows are gathered into batches (padded to 4/16) and scattered back."""
    before = client.get_inference_statistics("batched").model_stats[0]
    inputs = [rows(1 + i % 3, seed=i) for i in range(96)]
    with ThreadPoolExecutor(24) as pool:
        outputs = list(pool.map(lambda x: infer(client, "batched", x).as_numpy("y"), inputs))
    for x, y in zip(inputs, outputs, strict=True):
        assert y.shape == (x.shape[0], 1)
        np.testing.assert_allclose(y, reference_output(Mlp(7), x), rtol=1e-5, atol=1e-6)
    after = client.get_inference_statistics("batched").model_stats[0]
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences == sum(x.shape[0] for x in inputs)
    assert executions < len(inputs), "concurrent requests should share forward passes"
    assert after.inference_stats.queue.count - before.inference_stats.queue.count == len(inputs)
    assert all(b.batch_size <= 16 for b in after.batch_stats)


def test_statistics_and_metrics(client: triton.InferenceServerClient, server: ServiceProcess) -> None:
    infer(client, "mlp", rows(2), "2")
    stats = client.get_inference_statistics("mlp", "2").model_stats
    assert [s.version for s in stats] == ["2"]
    assert stats[0].inference_stats.success.count >= 1 and stats[0].inference_stats.compute_infer.ns > 0
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    assert 'meshserve_model_inferences_total{model="mlp",version="2"}' in text
    assert 'meshserve_model_state{model="mlp",state="READY",version="3"} 1.0' in text
    assert "meshserve_model_queue_duration_seconds_bucket" in text
    assert 'meshserve_grpc_server_handled_total{code="INVALID_ARGUMENT"' in text


def test_repository_index_load_unload(client: triton.InferenceServerClient) -> None:
    index = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
    assert index[("mlp", "3")] == "READY" and index[("pinned", "1")] == "READY"
    client.unload_model("pinned")
    assert not client.is_model_ready("pinned")
    with pytest.raises(InferenceServerException) as err:
        infer(client, "pinned", rows(1))
    assert status_of(err.value) == "UNAVAILABLE"
    client.load_model("pinned")
    assert client.is_model_ready("pinned", "3")
    assert infer(client, "pinned", rows(1)).get_response().model_version == "3"
    with pytest.raises(InferenceServerException) as err:
        client.load_model("does_not_exist")
    assert status_of(err.value) == "NOT_FOUND"
    with pytest.raises(InferenceServerException) as err:  # a failed load leaves no trace of the name
        infer(client, "does_not_exist", rows(1))
    assert status_of(err.value) == "NOT_FOUND"
    assert "does_not_exist" not in {m.name for m in client.get_model_repository_index().models}
