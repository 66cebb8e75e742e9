"""Forwarding of models that are not pipelines: v2 messages through unchanged to a fake model service over real
gRPC, admission per model, errors with their code, NOT_FOUND naming the pipelines, pipelines not loadable."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from services.common.errors import InvalidArgument, MeshserveError, NotFound, ResourceExhausted, Unavailable
from services.gateway.admission import Admission, Priority
from services.gateway.forwarding import FORWARD_TIMEOUT_S, Forwarder
from services.model.api import ModelClient
from services.protos import inference_pb2 as pb
from tests.unit.gateway.fake_services import FakeModelService, fake_services

DEADLINE_SLACK_S = 0.25
TOKEN = "operator-secret"
ADMIN = (("authorization", f"Bearer {TOKEN}"),)  # seen: 3.0095 s remaining on the server for a 3 s client timeout


@pytest.fixture()
async def rig() -> AsyncIterator[tuple[Forwarder, FakeModelService]]:
    async with fake_services() as (service, _, channel):
        admission = Admission(total_cap=2, min_limit=1, low_priority_share=0.5, retry_after_ms=50)
        forwarder = Forwarder(ModelClient(channel), admission, ["fraud", "digits"], public=["m"], admin_token=TOKEN)
        yield forwarder, service


async def test_infer_is_forwarded_unchanged_with_the_caller_headers(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    request = pb.ModelInferRequest(model_name="m", model_version="2", id="x")
    request.parameters["p"].string_param = "v"
    response = await forwarder.model_infer(request, Priority.NORMAL, 3.0, [("x-canary", "true")])
    assert (response.model_name, response.model_version) == ("m", "2")
    assert service.requests["ModelInfer"] == request
    assert service.metadata["ModelInfer"]["x-canary"] == "true"
    # The caller's deadline passed on (not the 30 s forward timeout); the server may read it a few ms long,
    # since the wire format and the two clocks round it.
    assert 2.0 < (service.time_remaining["ModelInfer"] or 0) <= 3.0 + DEADLINE_SLACK_S
    assert forwarder.admission.pools["model:m"].inflight == 0


async def test_a_call_without_deadline_gets_the_forward_timeout(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    await forwarder.model_config(pb.ModelConfigRequest(name="m"), None)
    assert FORWARD_TIMEOUT_S - 5 < (service.time_remaining["ModelConfig"] or 0) <= FORWARD_TIMEOUT_S + DEADLINE_SLACK_S


async def test_forwarded_infer_is_admitted_under_the_model_pool(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, _ = rig
    held = [forwarder.admission.acquire("model:m"), forwarder.admission.acquire("model:m", Priority.HIGH)]
    with pytest.raises(ResourceExhausted):
        await forwarder.model_infer(pb.ModelInferRequest(model_name="m"), Priority.NORMAL, 3.0, ())
    for permit in held:
        permit.release()


async def test_an_unknown_model_names_the_pipelines(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    forwarder.public = ["m", "nope"]
    service.fail["ModelInfer"] = grpc.StatusCode.NOT_FOUND
    service.fail["ModelMetadata"] = grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFound) as info:
        await forwarder.model_infer(pb.ModelInferRequest(model_name="nope"), Priority.NORMAL, 3.0, ())
    assert str(info.value).endswith("(pipelines here: digits, fraud)")
    assert info.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(NotFound, match=r"\(pipelines here: digits, fraud\)$"):
        await forwarder.model_metadata(pb.ModelMetadataRequest(name="nope"), 3.0)


async def test_other_errors_keep_their_code(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    service.fail["ModelStatistics"] = grpc.StatusCode.UNAVAILABLE
    with pytest.raises(Unavailable, match=r"ModelStatistics failed$"):
        await forwarder.model_statistics(pb.ModelStatisticsRequest(name="m"), 3.0)


async def test_readiness_is_false_when_the_model_service_cannot_say(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    assert await forwarder.model_ready(pb.ModelReadyRequest(name="m"), 3.0)
    service.fail["ModelReady"] = grpc.StatusCode.UNAVAILABLE
    assert not await forwarder.model_ready(pb.ModelReadyRequest(name="m"), 3.0)


async def test_the_index_lists_pipelines_then_the_public_models(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    service.index = ["m", "internal_model"]
    index = await forwarder.repository_index(pb.RepositoryIndexRequest(), 3.0)
    assert [(m.name, m.reason) for m in index.models] == [("digits", "pipeline"), ("fraud", "pipeline"), ("m", "")]
    service.fail["RepositoryIndex"] = grpc.StatusCode.UNAVAILABLE
    index = await forwarder.repository_index(pb.RepositoryIndexRequest(), 3.0)
    assert [m.name for m in index.models] == ["digits", "fraud"]


async def test_a_model_that_is_not_public_is_not_reachable_nor_revealed(
    rig: tuple[Forwarder, FakeModelService],
) -> None:
    forwarder, service = rig
    calls = [
        forwarder.model_infer(pb.ModelInferRequest(model_name="fraud_mlp"), Priority.NORMAL, 3.0, ()),
        forwarder.model_metadata(pb.ModelMetadataRequest(name="fraud_mlp"), 3.0),
        forwarder.model_config(pb.ModelConfigRequest(name="fraud_mlp"), 3.0),
        forwarder.model_statistics(pb.ModelStatisticsRequest(name="fraud_mlp"), 3.0),
    ]
    for call in calls:
        with pytest.raises(NotFound, match=r"^no pipeline 'fraud_mlp' here \(pipelines: digits, fraud\)$"):
            await call
    assert not await forwarder.model_ready(pb.ModelReadyRequest(name="fraud_mlp"), 3.0)
    assert service.requests == {}  # nothing reached the model service


async def test_a_pipeline_cannot_be_loaded_or_unloaded(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    with pytest.raises(InvalidArgument, match="'fraud' is a pipeline"):
        await forwarder.repository_model_load(pb.RepositoryModelLoadRequest(model_name="fraud"), 3.0, ADMIN)
    with pytest.raises(InvalidArgument, match="'digits' is a pipeline"):
        await forwarder.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="digits"), 3.0, ADMIN)
    assert "RepositoryModelLoad" not in service.requests


@pytest.mark.parametrize(
    "headers", [(), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),), (("x-admin", TOKEN),)]
)
async def test_loading_and_unloading_need_the_operator_token(
    rig: tuple[Forwarder, FakeModelService], headers: tuple[tuple[str, str], ...]
) -> None:
    forwarder, service = rig
    for call in (
        forwarder.repository_model_load(pb.RepositoryModelLoadRequest(model_name="m"), 3.0, headers),
        forwarder.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="fraud_mlp"), 3.0, headers),
    ):
        with pytest.raises(MeshserveError, match="only the operator") as info:
            await call
        assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert service.requests == {}


async def test_the_operator_token_loads_and_unloads_any_model(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    await forwarder.repository_model_load(pb.RepositoryModelLoadRequest(model_name="m"), 3.0, ADMIN)
    await forwarder.repository_model_unload(pb.RepositoryModelUnloadRequest(model_name="fraud_mlp"), 3.0, ADMIN)
    assert service.requests["RepositoryModelUnload"].model_name == "fraud_mlp"
    # The model service is called with its own operator credential (by default the gateway's admin token).
    assert service.metadata["RepositoryModelUnload"]["authorization"] == f"Bearer {TOKEN}"


async def test_without_an_operator_token_nobody_loads_or_unloads(rig: tuple[Forwarder, FakeModelService]) -> None:
    forwarder, service = rig
    forwarder.admin_token = ""
    with pytest.raises(MeshserveError, match="MESHSERVE_GATEWAY_ADMIN_TOKEN") as info:
        await forwarder.repository_model_unload(
            pb.RepositoryModelUnloadRequest(model_name="m"), 3.0, (("authorization", "Bearer "),)
        )
    assert info.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert service.requests == {}
