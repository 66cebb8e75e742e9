"""GatewayHandler with fake upstreams, in domain types: checks, admission, counting, pipeline metadata; and the
servicer in front of it over a real in-process gRPC server (status codes, trailers, response parameters)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from prometheus_client import Counter

from services.common.errors import (
    InvalidArgument,
    MeshserveError,
    NotFound,
    ResourceExhausted,
    Unavailable,
    error_with_code,
)
from services.common.server import Lifecycle
from services.common.tensor_codec import serialize_bytes
from services.gateway import metrics
from services.gateway.admission import Priority
from services.gateway.domain import PipelineRequest
from services.gateway.handler import GatewayHandler
from services.gateway.servicer import SERVICE_NAME, GatewayServicer
from services.gateway.settings import GatewaySettings
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.inprocess import serving_in_process
from tests.unit.gateway.fakes import FakeFeatures, FakeModel, fake_upstreams, inputs, pipeline_document, scores


def sample(metric: Counter, **labels: str) -> float:
    """A counter's value for these labels (0 before its first increment)."""
    for family in metric.collect():
        for found in family.samples:
            if found.name.endswith("_total") and found.labels == labels:
                return found.value
    return 0.0


@pytest.fixture()
def settings(tmp_path: Path) -> GatewaySettings:
    document = pipeline_document(admission={"max_inflight": 1, "adaptive": False})
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(document))
    return GatewaySettings(
        host="127.0.0.1", port=0, metrics_port=0, pipelines_dir=tmp_path, near_cache_watched_ttl_s=0.0
    )


@pytest.fixture()
def log() -> list[str]:
    return []


@pytest.fixture()
async def handler(settings: GatewaySettings, log: list[str]) -> AsyncIterator[GatewayHandler]:
    lifecycle = Lifecycle()
    lifecycle.ready = True
    handler = GatewayHandler(settings, lifecycle, fake_upstreams(log))
    await handler.refresher.refresh()
    log.clear()
    yield handler
    await handler.close()


def request(rows: int = 1, **fields: object) -> PipelineRequest:
    return PipelineRequest(pipeline="p", inputs=inputs(rows), **fields)  # type: ignore[arg-type]


async def test_a_request_is_answered_and_counted(handler: GatewayHandler, log: list[str]) -> None:
    ok_before = sample(metrics.REQUESTS, pipeline="p", code="OK", cache="miss")
    response = await handler.infer(request(rows=2, id="r1"), None, ())
    assert (response.pipeline, response.id, response.model_version, response.cache) == ("p", "r1", "1", "miss")
    assert response.degraded is None and response.stages_ms == {}  # stage times only with debug
    assert scores(response.outputs[0]) == [pytest.approx(0.9)] * 2
    await handler.runners["p"].drain_stores()
    assert log == ["cache.lookup", "features.compute fs_v1", "model.infer m:", "cache.store m:1"]
    stats = handler.statistics("p")["p"]
    assert (stats.success_count, stats.inferences, stats.model_count, stats.fail_count) == (1, 2, 1, 0)
    assert sample(metrics.REQUESTS, pipeline="p", code="OK", cache="miss") == ok_before + 1


async def test_admission_refusal_is_resource_exhausted_and_counted(handler: GatewayHandler, log: list[str]) -> None:
    shed_before = sample(metrics.SHED, pipeline="p", priority="normal")
    refused_before = sample(metrics.REQUESTS, pipeline="p", code="RESOURCE_EXHAUSTED", cache="none")
    held = handler.admission.acquire("p")  # the pipeline's only slot
    with pytest.raises(ResourceExhausted) as info:
        await handler.infer(request(), None, ())
    assert info.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(info.value.trailers) == {"grpc-retry-pushback-ms": "50"}
    assert log == []  # refused before any upstream call
    assert sample(metrics.SHED, pipeline="p", priority="normal") == shed_before + 1
    refused = sample(metrics.REQUESTS, pipeline="p", code="RESOURCE_EXHAUSTED", cache="none")
    assert refused == refused_before + 1
    held.release()
    assert (await handler.infer(request(), None, ())).cache == "miss"


async def test_a_failure_is_counted_with_its_code(handler: GatewayHandler) -> None:
    model: FakeModel = handler.up.model  # type: ignore[assignment]
    model.errors[("m", "")] = error_with_code(grpc.StatusCode.FAILED_PRECONDITION, "model 'm': not ready for it")
    before = sample(metrics.REQUESTS, pipeline="p", code="FAILED_PRECONDITION", cache="none")
    with pytest.raises(MeshserveError, match="not ready for it"):
        await handler.infer(request(), None, ())
    assert handler.statistics()["p"].fail_count == 1
    after = sample(metrics.REQUESTS, pipeline="p", code="FAILED_PRECONDITION", cache="none")
    assert after == before + 1
    assert handler.admission.pools["p"].inflight == 0  # the permit went back


async def test_requests_are_checked_against_the_pipeline(handler: GatewayHandler, log: list[str]) -> None:
    with pytest.raises(NotFound, match="has only version 1"):
        await handler.infer(request(version="2"), None, ())
    with pytest.raises(InvalidArgument, match="no output 'label'"):
        await handler.infer(request(requested_outputs=["label"]), None, ())
    with pytest.raises(InvalidArgument, match="'amount' is missing"):
        await handler.infer(PipelineRequest("p", {"user_id": inputs()["user_id"]}), None, ())
    with pytest.raises(NotFound, match="pipelines here: p"):
        await handler.infer(PipelineRequest("q", inputs()), None, ())
    assert log == []


async def test_debug_answers_every_stage_and_the_gateway_own_time(handler: GatewayHandler) -> None:
    response = await handler.infer(request(debug=True, requested_outputs=["score"]), None, ())
    assert set(response.stages_ms) == {"cache", "features", "model", "total", "gateway"}
    inner = sum(ms for stage, ms in response.stages_ms.items() if stage not in ("total", "gateway"))
    assert response.stages_ms["gateway"] == pytest.approx(max(0.0, response.stages_ms["total"] - inner))
    assert [t.name for t in response.outputs] == ["score"]


async def test_pipeline_metadata_needs_the_model_once(handler: GatewayHandler, log: list[str]) -> None:
    spec, outputs = await handler.describe("p")
    assert spec.name == "p" and outputs["score"].dims == [1]
    assert log == []  # learnt at start
    handler.refresher.outputs.clear()
    await handler.describe("p")
    assert log == ["model.describe m"]  # read again when missing
    handler.refresher.outputs.clear()
    handler.up.model.reachable = False  # type: ignore[attr-defined]
    with pytest.raises(Unavailable, match="has not answered yet"):
        await handler.describe("p")


async def test_readiness_and_pipelines(handler: GatewayHandler) -> None:
    assert handler.live() and handler.ready()
    assert handler.has_pipeline("p") and not handler.has_pipeline("m")
    assert handler.pipeline_ready("p", "") and handler.pipeline_ready("p", "1")
    assert not handler.pipeline_ready("p", "2")
    handler.lifecycle.draining = True
    assert not handler.live()
    with pytest.raises(NotFound):
        handler.statistics("nope")


# -- through the servicer ------------------------------------------------------------------------------------


@pytest.fixture()
async def stub(handler: GatewayHandler, settings: GatewaySettings) -> AsyncIterator[pb_grpc.GRPCInferenceServiceStub]:
    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(GatewayServicer(handler), server)

    async with serving_in_process("gateway", settings, SERVICE_NAME, register, handler) as service:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
            yield pb_grpc.GRPCInferenceServiceStub(channel)


def infer_request(rows: int = 1, **parameters: object) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="p", id="req-1")
    message.inputs.add(name="user_id", datatype="BYTES", shape=[rows, 1])
    message.raw_input_contents.append(serialize_bytes(np.array([b"u"] * rows, dtype=object)))
    message.inputs.add(name="amount", datatype="FP32", shape=[rows, 1])
    message.raw_input_contents.append(np.full(rows, 12.5, np.float32).tobytes())
    for name, value in parameters.items():
        if isinstance(value, bool):
            message.parameters[name].bool_param = value
        elif isinstance(value, int):
            message.parameters[name].int64_param = value
        else:
            message.parameters[name].string_param = str(value)
    return message


async def test_model_infer_through_the_servicer(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    response = await stub.ModelInfer(infer_request(rows=2, debug=True), timeout=5)
    assert (response.model_name, response.model_version, response.id) == ("p", "1", "req-1")
    params = response.parameters
    assert params["model_version"].string_param == "1" and params["cache"].string_param == "miss"
    assert "degraded" not in params and params["stage_model_ms"].double_param >= 0
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [pytest.approx(0.9)] * 2
    # a lone request: each stage's call served it alone
    assert {k: v.int64_param for k, v in params.items() if k.startswith("batch_")} == {
        "batch_cache": 1,
        "batch_features": 1,
        "batch_model": 1,
    }


async def test_refusal_through_the_servicer_is_resource_exhausted_with_a_retry_hint(
    handler: GatewayHandler, stub: pb_grpc.GRPCInferenceServiceStub
) -> None:
    held = handler.admission.acquire("p", Priority.HIGH)
    try:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelInfer(infer_request(priority="low"), timeout=5)
    finally:
        held.release()
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("grpc-retry-pushback-ms", "50") in tuple(info.value.trailing_metadata() or ())


async def test_a_bad_priority_is_invalid_argument_even_for_a_forwarded_model(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    message = infer_request(priority="urgent")
    message.model_name = "some_model"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(message, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "high, normal or low" in info.value.details()


async def test_pipeline_metadata_config_statistics_and_readiness_through_the_servicer(
    stub: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    await stub.ModelInfer(infer_request(), timeout=5)
    metadata = await stub.ModelMetadata(pb.ModelMetadataRequest(name="p"), timeout=5)
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.outputs] == [("score", "FP32", [-1, 1])]
    config = (await stub.ModelConfig(pb.ModelConfigRequest(name="p"), timeout=5)).config
    assert config.max_batch_size == 8 and config.parameters["feature_set"].string_value == "fs_v1"
    stats = await stub.ModelStatistics(pb.ModelStatisticsRequest(name="p"), timeout=5)
    assert stats.model_stats[0].inference_stats.success.count == 1
    assert (await stub.ModelReady(pb.ModelReadyRequest(name="p"), timeout=5)).ready
    server = await stub.ServerMetadata(pb.ServerMetadataRequest(), timeout=5)
    assert server.name == "meshserve-gateway" and "pipelines" in server.extensions
    assert (await stub.ServerLive(pb.ServerLiveRequest(), timeout=5)).live


@pytest.mark.parametrize(
    ("priority", "words"),
    [(float("nan"), "priority"), (1e300, "priority"), (float("inf"), "priority"), (2.5, "priority")],
)
async def test_a_priority_that_is_no_level_is_invalid_argument(
    stub: pb_grpc.GRPCInferenceServiceStub, priority: float, words: str
) -> None:
    message = infer_request()
    message.parameters["priority"].double_param = priority
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(message, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in info.value.details()
    assert (await stub.ModelInfer(infer_request(), timeout=5)).outputs  # and the gateway serves on


async def test_inputs_with_zero_rows_are_invalid_argument(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ModelInfer(infer_request(rows=0), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "no rows" in info.value.details()


async def test_degraded_answers_are_neither_samples_nor_drops_unless_the_cause_is_overload(tmp_path: Path) -> None:
    """A dependency that is down (features unavailable) makes degraded answers, not a reason to refuse callers:
    the pipeline's adaptive limit stays where it was; an overloaded model is a drop."""
    document = pipeline_document(admission={"max_inflight": 32, "adaptive": True})
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(document))
    settings = GatewaySettings(
        host="127.0.0.1", port=0, metrics_port=0, pipelines_dir=tmp_path, near_cache_watched_ttl_s=0.0
    )
    lifecycle = Lifecycle()
    lifecycle.ready = True
    handler = GatewayHandler(settings, lifecycle, fake_upstreams([]))
    await handler.refresher.refresh()
    try:
        features: FakeFeatures = handler.up.feature  # type: ignore[assignment]
        model: FakeModel = handler.up.model  # type: ignore[assignment]
        limit = handler.admission.pool("p").limit
        assert limit is not None
        before = limit.value
        features.error = Unavailable("feature service: down")
        for i in range(40):
            answer = await handler.infer(PipelineRequest(pipeline="p", inputs=inputs(1, f"u{i}")), None, ())
            assert answer.degraded == "features_unavailable:default"
        assert limit.value == before
        features.error = None
        model.errors[("m", "")] = ResourceExhausted("model 'm': queue full")
        model.errors[("m", "2")] = ResourceExhausted("model 'm': queue full")
        answer = await handler.infer(PipelineRequest(pipeline="p", inputs=inputs(1, "busy")), None, ())
        assert answer.degraded == "model_overloaded:default"
        assert limit.value < before
    finally:
        await handler.close()
