"""The model service's v2 RPCs over a real in-process gRPC server: the servicer, the shared interceptors, and the
wiring of `python -m services.model` (its build) from start to drain."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.tensor_codec import decode_tensor, encode_raw
from services.model.__main__ import build
from services.model.handler import ModelHandler
from services.model.servicer import SERVICE_NAME, ModelServicer, deadline_of
from services.model.settings import ModelSettings
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.inprocess import serving_in_process
from tests.helpers.models import Mlp, reference_output


def model_settings(repo: Path, **overrides: Any) -> ModelSettings:
    """Loopback, a free port, no metrics port, no watcher: one in-process model service."""
    base: dict[str, Any] = {"host": "127.0.0.1", "port": 0, "metrics_port": 0, "repository": repo, "watch": False}
    return ModelSettings(**{**base, **overrides})


@pytest.fixture()
async def stub(repo: Path, handler: ModelHandler) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    register = lambda server: pb_grpc.add_GRPCInferenceServiceServicer_to_server(ModelServicer(handler), server)  # noqa: E731
    async with serving_in_process("model", model_settings(repo), SERVICE_NAME, register, handler) as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            yield pb_grpc.GRPCInferenceServiceStub(channel)


def infer_request(model: str, x: np.ndarray, version: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    datatype, shape, raw = encode_raw(x)
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    return request


def output(response: pb.ModelInferResponse, index: int = 0) -> np.ndarray:
    out = response.outputs[index]
    return decode_tensor(out.name, out.datatype, out.shape, None, response.raw_output_contents[index])


async def test_live_ready_and_metadata(stub: pb_grpc.GRPCInferenceServiceStub, handler: ModelHandler) -> None:
    assert (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert (await stub.ServerReady(pb.ServerReadyRequest())).ready
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="mlp", version="3"))).ready
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="broken"))).ready
    server = await stub.ServerMetadata(pb.ServerMetadataRequest())
    assert server.name == "meshserve" and "binary_tensor_data" in server.extensions
    meta = await stub.ModelMetadata(pb.ModelMetadataRequest(name="mlp"))
    assert list(meta.versions) == ["2", "3"] and list(meta.inputs[0].shape) == [-1, 8]
    handler.lifecycle.draining = True
    assert not (await stub.ServerLive(pb.ServerLiveRequest())).live
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="mlp"))).ready


async def test_infer_with_raw_contents(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    x = np.random.default_rng(3).standard_normal((3, 8)).astype(np.float32)
    response = await stub.ModelInfer(infer_request("mlp", x, version="2"), timeout=10)
    assert (response.model_name, response.model_version) == ("mlp", "2")
    np.testing.assert_allclose(output(response), reference_output(Mlp(2), x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("request_", "code", "fragment"),
    [
        (infer_request("nope", np.zeros((1, 8), np.float32)), grpc.StatusCode.NOT_FOUND, "unknown model"),
        (infer_request("mlp", np.zeros((1, 8), np.float32), "1"), grpc.StatusCode.NOT_FOUND, "no ready version 1"),
        (infer_request("mlp", np.zeros((1, 4), np.float32)), grpc.StatusCode.INVALID_ARGUMENT, "expected ['batch', 8]"),
        (infer_request("broken", np.zeros((1, 8), np.float32)), grpc.StatusCode.UNAVAILABLE, "registered backends"),
        (infer_request("mlp", np.zeros((0, 8), np.float32)), grpc.StatusCode.INVALID_ARGUMENT, "input 'x' has 0 rows"),
    ],
)
async def test_errors_reach_the_client_as_their_status(
    stub: pb_grpc.GRPCInferenceServiceStub, request_: pb.ModelInferRequest, code: grpc.StatusCode, fragment: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(request_, timeout=10)
    assert err.value.code() == code
    assert fragment in (err.value.details() or "")


async def call_each_rpc_naming(stub: pb_grpc.GRPCInferenceServiceStub, name: str) -> list[grpc.aio.AioRpcError]:
    """The error of every RPC that names a model, asked about `name`."""
    calls = [
        lambda: stub.ModelInfer(infer_request(name, np.zeros((1, 8), np.float32)), timeout=10),
        lambda: stub.ModelInfer(infer_request(name, np.zeros((1, 8), np.float32), version="7"), timeout=10),
        lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name=name)),
        lambda: stub.ModelConfig(pb.ModelConfigRequest(name=name)),
        lambda: stub.ModelStatistics(pb.ModelStatisticsRequest(name=name)),
        lambda: stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name)),
        lambda: stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name=name)),
    ]
    errors = []
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call()
        errors.append(err.value)
    return errors


async def test_an_oversized_model_name_is_invalid_and_never_echoed(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    """A 200 kB name echoed into grpc-message made Envoy reset the stream (a retryable UNAVAILABLE that ejected
    healthy replicas); a name longer than any model folder's can be is bad input, answered briefly."""
    for size in (256, 200_000):
        for error in await call_each_rpc_naming(stub, "n" * size):
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
            details = error.details() or ""
            assert f"model name of {size} bytes" in details and "n" * 65 not in details and len(details) < 200


async def test_an_unknown_name_is_quoted_short(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    for error in await call_each_rpc_naming(stub, "q" * 200):
        assert error.code() == grpc.StatusCode.NOT_FOUND, error
        details = error.details() or ""
        assert "'" + "q" * 64 + "...' (200 bytes)" in details and "q" * 65 not in details
    with pytest.raises(grpc.aio.AioRpcError) as err:  # a version is request input too
        await stub.ModelInfer(infer_request("mlp", np.zeros((1, 8), np.float32), version="v" * 5000), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'" + "v" * 64 + "...' (5000 bytes)" in (err.value.details() or "")
    for name in ("../repo/mlp", "a\0b", ".hidden", "x/y"):
        for error in await call_each_rpc_naming(stub, name):
            assert error.code() == grpc.StatusCode.NOT_FOUND, (name, error)


async def test_no_error_a_client_sees_names_the_servers_paths(
    stub: pb_grpc.GRPCInferenceServiceStub, repo: Path
) -> None:
    (repo / "badyaml").mkdir()
    (repo / "badyaml" / "config.yaml").write_text("name: [unclosed")
    (repo / "noweights" / "1").mkdir(parents=True)
    (repo / "noweights" / "config.yaml").write_text(
        (repo / "mlp" / "config.yaml").read_text().replace("mlp", "noweights")
    )
    seen: list[str] = []
    for name in ("absent", "badyaml", "noweights"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name=name))
        seen.append(err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ModelInfer(infer_request("noweights", np.zeros((1, 8), np.float32)), timeout=10)
    seen.append(err.value.details() or "")
    index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
    seen.extend(m.reason for m in index.models)
    assert "'absent' is not in the repository" in seen[0]
    assert seen[1].startswith("badyaml/config.yaml: cannot read model config")
    assert "noweights/1/model.pt not found" in seen[2] and "noweights/1/model.pt not found" in seen[3]
    for text in seen:
        assert str(repo) not in text and str(repo.parent) not in text, text


async def test_config_statistics_and_repository_rpcs(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    config = (await stub.ModelConfig(pb.ModelConfigRequest(name="batched"))).config
    assert (config.name, config.backend, config.max_batch_size) == ("batched", "pytorch", 16)
    await stub.ModelInfer(infer_request("batched", np.ones((5, 8), np.float32)), timeout=10)
    (stats,) = (await stub.ModelStatistics(pb.ModelStatisticsRequest(name="batched"))).model_stats
    assert (stats.name, stats.version, stats.inference_count) == ("batched", "1", 5)
    assert [b.batch_size for b in stats.batch_stats] == [5]  # rows before padding to 16
    index = await stub.RepositoryIndex(pb.RepositoryIndexRequest())
    states = {(m.name, m.version): m.state for m in index.models}
    assert states[("broken", "")] == "UNAVAILABLE" and states[("mlp", "3")] == "READY"
    ready = await stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    assert {m.state for m in ready.models} == {"READY"}
    await stub.RepositoryModelUnload(pb.RepositoryModelUnloadRequest(model_name="multi"))
    assert not (await stub.ModelReady(pb.ModelReadyRequest(name="multi"))).ready
    await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="multi"))
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="multi"))).ready
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(model_name="broken"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class _Context:
    """The one ServicerContext call deadline_of makes."""

    def __init__(self, remaining: float | None) -> None:
        self.remaining = remaining

    def time_remaining(self) -> float | None:
        return self.remaining


def test_deadline_of_turns_time_remaining_into_a_monotonic_instant() -> None:
    assert deadline_of(_Context(None)) is None
    before = time.monotonic()
    deadline = deadline_of(_Context(2.0))
    assert deadline is not None and before + 2.0 <= deadline <= time.monotonic() + 2.0


async def test_model_service_serves_after_loading_and_unloads_after_drain(repo: Path) -> None:
    server, handler = build(model_settings(repo, grace_period_s=1.0))
    running = asyncio.create_task(server.run(handler.start, handler.close))
    try:
        for _ in range(600):
            if server.lifecycle.ready or running.done():
                break
            await asyncio.sleep(0.05)
        assert server.lifecycle.ready, "the model service did not become ready"
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=5
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            x = np.ones((2, 8), np.float32)
            response = await pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(infer_request("mlp", x), timeout=10)
            np.testing.assert_allclose(output(response), reference_output(Mlp(3), x), rtol=1e-5, atol=1e-6)
        server.request_stop()
        assert not server.lifecycle.ready and not server.lifecycle.live
        await asyncio.wait_for(running, 30)
    finally:
        if not running.done():
            server.request_stop()
            await asyncio.wait_for(running, 30)
    assert all(not entry.ready for entry in handler.manager.models.values())
