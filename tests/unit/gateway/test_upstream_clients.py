"""The clients the gateway uses (services/model/api.py, services/feature/api.py) against fake services over
real gRPC: plain types in and out, and every failure a MeshserveError with the service's status code."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from services.common.errors import (
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    MeshserveError,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from services.feature.api import FeatureClient, to_row
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import channel_options
from services.model.api import ModelClient, RawTensor
from services.protos import inference_pb2 as pb
from tests.unit.gateway.fake_services import FakeFeatureService, FakeModelService, fake_services

Fakes = tuple[FakeModelService, FakeFeatureService, grpc.aio.Channel]


@pytest.fixture()
async def fakes() -> AsyncIterator[Fakes]:
    async with fake_services() as found:
        yield found


async def test_model_infer_in_plain_types(fakes: Fakes) -> None:
    service, _, channel = fakes
    client = ModelClient(channel)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    result = await client.infer(
        "m", "2", [RawTensor("x", "FP32", [2, 4], x.tobytes())], timeout_s=5, metadata=[("x-model-version", "2")]
    )
    assert (result.model_name, result.model_version) == ("m", "2")
    (y,) = result.outputs
    assert (y.name, y.datatype, y.shape, y.raw) == ("y", "FP32", [2, 4], x.tobytes())
    sent = service.requests["ModelInfer"]
    assert (sent.model_name, sent.model_version, sent.inputs[0].name) == ("m", "2", "x")
    assert service.metadata["ModelInfer"]["x-model-version"] == "2"


async def test_model_describe(fakes: Fakes) -> None:
    _, _, channel = fakes
    info = await ModelClient(channel).describe("m", timeout_s=5)
    assert (info.name, info.versions, info.platform) == ("m", ["1", "2"], "onnxruntime_onnx")
    assert [(t.name, t.datatype, t.shape) for t in info.outputs] == [("y", "FP32", [-1, 1])]
    assert [(t.name, t.shape) for t in info.inputs] == [("x", [-1, 4])]


async def test_model_ready_in_plain_types_carries_the_routing_headers(fakes: Fakes) -> None:
    service, _, channel = fakes
    assert await ModelClient(channel).ready("m", "2", timeout_s=5, metadata=[("x-model-version", "2")])
    request = service.requests["ModelReady"]
    assert (request.name, request.version, service.metadata["ModelReady"]["x-model-version"]) == ("m", "2", "2")
    service.fail["ModelReady"] = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(Unavailable, match=r"^model 'm': "):
        await ModelClient(channel).ready("m", timeout_s=5)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (grpc.StatusCode.UNAVAILABLE, Unavailable),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, ResourceExhausted),
        (grpc.StatusCode.DEADLINE_EXCEEDED, DeadlineExceeded),
        (grpc.StatusCode.NOT_FOUND, NotFound),
        (grpc.StatusCode.INVALID_ARGUMENT, InvalidArgument),
        (grpc.StatusCode.INTERNAL, Internal),
        (grpc.StatusCode.UNKNOWN, MeshserveError),
    ],
)
async def test_model_failures_are_project_errors_with_the_status_code(
    fakes: Fakes, code: grpc.StatusCode, kind: type[MeshserveError]
) -> None:
    service, _, channel = fakes
    service.fail["ModelInfer"] = code
    with pytest.raises(MeshserveError) as info:
        await ModelClient(channel).infer("m", "", [RawTensor("x", "FP32", [1, 4], b"\0" * 16)], timeout_s=5)
    assert isinstance(info.value, kind) and info.value.code == code
    assert str(info.value) == "model 'm': ModelInfer failed"
    assert isinstance(info.value.__cause__, grpc.aio.AioRpcError)


async def test_an_unreachable_model_service_is_unavailable() -> None:
    options = channel_options(GatewaySettings())
    async with grpc.aio.insecure_channel("127.0.0.1:1", options=options) as channel:
        with pytest.raises(Unavailable, match=r"^model service: "):
            await ModelClient(channel).describe("m", timeout_s=2)


async def test_every_pass_through_rpc_reaches_the_model_service_unchanged(fakes: Fakes) -> None:
    service, _, channel = fakes
    client = ModelClient(channel)
    assert (await client.model_ready(pb.ModelReadyRequest(name="m"), timeout_s=5)).ready
    assert (await client.model_metadata(pb.ModelMetadataRequest(name="m"), timeout_s=5)).name == "m"
    assert (await client.model_config(pb.ModelConfigRequest(name="m"), timeout_s=5)).config.name == "m"
    assert (await client.model_statistics(pb.ModelStatisticsRequest(name="m"), timeout_s=5)).model_stats[0].name == "m"
    assert [m.name for m in (await client.repository_index(pb.RepositoryIndexRequest(), timeout_s=5)).models] == ["m"]
    await client.repository_model_load(pb.RepositoryModelLoadRequest(model_name="m"), timeout_s=5)
    await client.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="m"), timeout_s=5)
    request = pb.ModelInferRequest(model_name="m", id="abc")
    assert (await client.model_infer(request, timeout_s=5)).model_version == "1"
    assert service.requests["ModelInfer"] == request
    assert set(service.requests) == {
        "ModelReady",
        "ModelMetadata",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "ModelInfer",
    }
    service.fail["ModelConfig"] = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(Unavailable, match=r"^model service: ModelConfig failed$"):
        await client.model_config(pb.ModelConfigRequest(name="m"), timeout_s=5)


async def test_feature_compute_sends_typed_fields_and_counts_degraded_rows(fakes: Fakes) -> None:
    _, service, channel = fakes
    client = FeatureClient(channel)
    rows = [
        {"user_id": "u", "amount": 12.5, "n": 3, "card": True},
        {"user_id": "slow", "amount": 1.0, "n": 0, "card": False},
    ]
    matrix = await client.compute("fraud_v1", rows, 7.5, timeout_s=5, metadata=[("x-request-id", "r")])
    assert (matrix.rows, matrix.columns, matrix.feature_names, matrix.degraded_rows) == (2, 2, ["a", "b"], 1)
    assert len(matrix.features) == 2 * 2 * 4
    sent = service.requests["Compute"]
    assert (sent.feature_set, sent.budget_ms) == ("fraud_v1", 7.5)
    fields = sent.rows[0].fields
    assert fields["user_id"].string_value == "u" and fields["amount"].double_value == 12.5
    assert fields["n"].WhichOneof("kind") == "int64_value" and fields["card"].WhichOneof("kind") == "bool_value"
    assert service.metadata["Compute"]["x-request-id"] == "r"


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND]
)
async def test_feature_failures_are_project_errors_with_the_status_code(fakes: Fakes, code: grpc.StatusCode) -> None:
    _, service, channel = fakes
    service.fail["Compute"] = code
    with pytest.raises(MeshserveError) as info:
        await FeatureClient(channel).compute("fraud_v1", [{"user_id": "u"}], timeout_s=5)
    assert info.value.code == code and str(info.value) == "feature service: Compute failed"


async def test_get_feature_set(fakes: Fakes) -> None:
    _, service, channel = fakes
    info = await FeatureClient(channel).get_feature_set("fraud_v1", timeout_s=5)
    assert (info.feature_set, info.name, info.version, info.timestamp_field) == ("fraud_v1", "fraud", 1, "event_time")
    assert info.inputs == {"user_id": "string"} and info.features == ["a"]
    service.fail["GetFeatureSet"] = grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFound):
        await FeatureClient(channel).get_feature_set("nope", timeout_s=5)


def test_a_value_that_is_no_feature_field_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="field 'x': bytes is not a feature value"):
        to_row({"x": b"raw"})  # type: ignore[dict-item]
