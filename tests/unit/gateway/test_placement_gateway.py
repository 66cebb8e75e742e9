"""Two gateways in this process, an edge and a cloud tier, the edge's cloud client on a real loopback gRPC channel to
the cloud's servicer: sensitive requests are answered at the edge and the cloud hears nothing of them, general ones
are answered by the cloud (the features, or the general inputs, crossing), a cloud that fails or is late leaves the
edge answering `edge_only`, an edge model that fails gives a sensitive request the policy's answer, and the cloud
refuses anything marked sensitive."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common.errors import MeshserveError, Unavailable
from services.common.server import Lifecycle
from services.common.tensor_codec import serialize_bytes
from services.gateway import metrics
from services.gateway.cloud import CloudClient, CloudConfigError, read_token, sent_bytes
from services.gateway.domain import PipelineRequest
from services.gateway.handler import GatewayHandler
from services.gateway.servicer import SERVICE_NAME, GatewayServicer
from services.gateway.settings import GatewaySettings
from services.gateway.upstream import Upstreams
from services.model.api import InferResult, RawTensor
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.inprocess import serving_in_process
from tests.unit.gateway.fake_services import fake_services
from tests.unit.gateway.fakes import FakeCache, FakeFeatures, FakeModel, pipeline_document, scores
from tests.unit.gateway.test_handler import sample

CANARY = "canary-5d1e"
TOKEN = "edge-token-for-tests"
EDGE_SCORE, CLOUD_SCORE = 0.9, 0.7


class Headers:
    """The metadata of every call an upstream fake got."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []


class RecordingModel(FakeModel):
    """FakeModel that keeps each call's metadata, and answers pass-through ModelInfer (what the cloud forwards)."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.headers = Headers()

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[RawTensor],
        *,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> InferResult:
        self.headers.seen.append(dict(metadata))
        return await super().infer(model, version, inputs, timeout_s=timeout_s, metadata=metadata)

    async def model_infer(
        self, request: pb.ModelInferRequest, *, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()
    ) -> pb.ModelInferResponse:
        inputs = [
            RawTensor(t.name, t.datatype, list(t.shape), raw)
            for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)
        ]
        result = await self.infer(request.model_name, request.model_version, inputs, metadata=metadata)
        response = pb.ModelInferResponse(model_name=result.model_name, model_version=result.model_version)
        for tensor in result.outputs:
            response.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
            response.raw_output_contents.append(tensor.raw)
        return response


class RecordingFeatures(FakeFeatures):
    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.headers = Headers()

    async def compute(self, feature_set: str, rows: Any, budget_ms: float = 0.0, **kwargs: Any) -> Any:
        self.headers.seen.append(dict(kwargs.get("metadata", ())))
        return await super().compute(feature_set, rows, budget_ms, **kwargs)


class RecordingCache(FakeCache):
    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.headers = Headers()

    async def lookup(self, keys: Sequence[bytes], *args: Any, **kwargs: Any) -> Any:
        self.headers.seen.append(dict(kwargs.get("metadata", ())))
        return await super().lookup(keys, *args, **kwargs)


@dataclass
class Tier:
    handler: GatewayHandler
    log: list[str]
    model: RecordingModel
    features: RecordingFeatures
    cache: RecordingCache


def upstreams(log: list[str], score: float) -> tuple[Upstreams, RecordingModel, RecordingFeatures, RecordingCache]:
    model, features, cache = RecordingModel(log), RecordingFeatures(log), RecordingCache(log)
    model.values[("m", "")] = ("1", score)
    return Upstreams(cache=cache, feature=features, model=model), model, features, cache  # type: ignore[arg-type]


def tiered_document(name: str, **placement: Any) -> dict[str, Any]:
    document = pipeline_document(name=name)
    document["inputs"][0]["data_class"] = "sensitive"
    document["placement"] = {"cloud_timeout_ms": 500, **placement}
    return document


@pytest.fixture()
def pipelines(tmp_path: Path) -> Path:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    for document in (
        tiered_document("p"),
        tiered_document("q", leave_edge="request"),
        tiered_document("d", on_edge_model_down="default"),
    ):
        (folder / f"{document['name']}.yaml").write_text(yaml.safe_dump(document))
    return folder


def settings(pipelines: Path, **fields: Any) -> GatewaySettings:
    return GatewaySettings(
        host="127.0.0.1", port=0, metrics_port=0, pipelines_dir=pipelines, near_cache_watched_ttl_s=0.0, **fields
    )


async def ready(handler: GatewayHandler, log: list[str]) -> GatewayHandler:
    handler.lifecycle.ready = True
    await handler.refresher.refresh()
    log.clear()
    return handler


@asynccontextmanager
async def cloud_tier(pipelines: Path) -> AsyncIterator[tuple[Tier, int]]:
    log: list[str] = []
    up, model, features, cache = upstreams(log, CLOUD_SCORE)
    handler = GatewayHandler(settings(pipelines, tier="cloud", public_models=["m"]), Lifecycle(), up)
    await ready(handler, log)

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(GatewayServicer(handler), server)

    async with serving_in_process("gateway", handler.settings, SERVICE_NAME, register, handler) as service:
        assert service.port is not None
        yield Tier(handler, log, model, features, cache), service.port
    await handler.close()


@asynccontextmanager
async def edge_tier(pipelines: Path, cloud_url: str, tmp_path: Path, tier: str = "edge") -> AsyncIterator[Tier]:
    token = tmp_path / "cloud-token"
    token.write_text(f"{TOKEN}\n")
    log: list[str] = []
    up, model, features, cache = upstreams(log, EDGE_SCORE)
    handler = GatewayHandler(
        settings(pipelines, tier=tier, cloud_url=cloud_url, cloud_token_file=token), Lifecycle(), up
    )
    await ready(handler, log)
    try:
        yield Tier(handler, log, model, features, cache)
    finally:
        await handler.close()


@pytest.fixture()
async def tiers(pipelines: Path, tmp_path: Path) -> AsyncIterator[tuple[Tier, Tier]]:
    async with cloud_tier(pipelines) as (cloud, port), edge_tier(pipelines, f"127.0.0.1:{port}", tmp_path) as edge:
        yield edge, cloud


def request(pipeline: str, users: Sequence[str], amount: float = 12.5) -> PipelineRequest:
    rows = len(users)
    return PipelineRequest(
        pipeline=pipeline,
        inputs={
            "user_id": np.array([[u.encode()] for u in users], dtype=object),
            "amount": np.full((rows, 1), amount, np.float32),
        },
    )


def everything_the_cloud_got(cloud: Tier) -> str:
    """Every request, header and feature row the cloud's upstreams saw, as text."""
    seen = [cloud.model.inputs, cloud.model.headers.seen, cloud.features.rows, cloud.features.headers.seen]
    seen.append(cloud.cache.headers.seen)
    return repr(seen)


async def test_sensitive_rows_are_answered_at_the_edge_and_never_cross(tiers: tuple[Tier, Tier]) -> None:
    edge, cloud = tiers
    bytes_before = sample(metrics.CLOUD_BYTES, pipeline="p", leave_edge="derived_features")
    answers_before = sample(metrics.TIER_ANSWERS, pipeline="p", tier="edge", data_class="sensitive")
    response = await edge.handler.infer(request("p", ["", CANARY, ""]), None, ())  # one row carries an id
    assert scores(response.outputs[0]) == [pytest.approx(EDGE_SCORE)] * 3
    assert response.tier == "edge" and response.degraded is None
    assert cloud.log == [] and CANARY not in everything_the_cloud_got(cloud)
    assert sample(metrics.CLOUD_BYTES, pipeline="p", leave_edge="derived_features") == bytes_before
    assert sample(metrics.TIER_ANSWERS, pipeline="p", tier="edge", data_class="sensitive") == answers_before + 1
    for upstream in (edge.model, edge.features, edge.cache):
        assert upstream.headers.seen
        for headers in upstream.headers.seen:
            assert headers["x-meshserve-data-class"] == "sensitive" and headers["x-meshserve-tier"] == "edge"


async def test_general_rows_are_answered_by_the_cloud_from_the_features_alone(tiers: tuple[Tier, Tier]) -> None:
    edge, cloud = tiers
    bytes_before = sample(metrics.CLOUD_BYTES, pipeline="p", leave_edge="derived_features")
    response = await edge.handler.infer(request("p", ["", ""], amount=33.0), None, ())
    assert scores(response.outputs[0]) == [pytest.approx(CLOUD_SCORE)] * 2
    assert response.tier == "cloud" and response.degraded is None
    assert cloud.log == ["model.infer m:"] and edge.log == ["features.compute fs_v1"]  # no edge cache, no model
    (sent,) = cloud.model.inputs
    assert [(t.name, t.datatype, t.shape) for t in sent] == [("features", "FP32", [2, 3])]
    assert np.frombuffer(sent[0].raw, np.float32).reshape(2, 3)[:, 0].tolist() == [33.0, 33.0]
    (headers,) = cloud.model.headers.seen  # what the cloud gateway passed on to its model
    assert "authorization" not in headers
    assert sample(metrics.CLOUD_BYTES, pipeline="p", leave_edge="derived_features") > bytes_before + 24


async def test_request_mode_sends_only_the_general_inputs(tiers: tuple[Tier, Tier]) -> None:
    edge, cloud = tiers
    response = await edge.handler.infer(request("q", ["", ""], amount=7.0), None, ())
    assert response.tier == "cloud" and scores(response.outputs[0]) == [pytest.approx(CLOUD_SCORE)] * 2
    assert edge.log == []  # nothing computed here
    (rows,) = cloud.features.rows  # the cloud's own features, on the general inputs and an empty id
    assert rows == [{"user_id": "", "amount": 7.0}] * 2


async def test_the_clients_header_makes_a_general_request_sensitive(tiers: tuple[Tier, Tier]) -> None:
    edge, cloud = tiers
    claimed = edge.handler.claimed([("x-meshserve-data-class", "sensitive")])
    response = await edge.handler.infer(request("p", ["", ""]), None, (), claimed)
    assert response.tier == "edge" and cloud.log == []
    assert edge.handler.claimed([("x-meshserve-data-class", "general")]) == "general"


async def test_a_cloud_that_is_down_leaves_general_requests_to_the_edge(pipelines: Path, tmp_path: Path) -> None:
    async with cloud_tier(pipelines) as (_, port):
        dead = f"127.0.0.1:{port}"  # the cloud's port, closed once the block ends
    async with edge_tier(pipelines, dead, tmp_path) as edge:
        before = sample(metrics.EDGE_ONLY, pipeline="p", reason="UNAVAILABLE")
        for _ in range(3):
            response = await edge.handler.infer(request("p", ["", ""]), None, ())
            assert scores(response.outputs[0]) == [pytest.approx(EDGE_SCORE)] * 2
            assert (response.tier, response.degraded) == ("edge", "edge_only")
        assert sample(metrics.EDGE_ONLY, pipeline="p", reason="UNAVAILABLE") == before + 3


async def test_a_late_cloud_leaves_general_requests_to_the_edge(tiers: tuple[Tier, Tier]) -> None:
    edge, cloud = tiers
    cloud.model.gate = asyncio.Event()  # the cloud's model never answers
    before = sample(metrics.EDGE_ONLY, pipeline="p", reason="DEADLINE_EXCEEDED")
    response = await edge.handler.infer(request("p", [""]), None, ())
    assert (response.tier, response.degraded) == ("edge", "edge_only")
    assert "DEADLINE_EXCEEDED" in (response.degraded_detail or "")
    assert sample(metrics.EDGE_ONLY, pipeline="p", reason="DEADLINE_EXCEEDED") == before + 1
    cloud.model.gate.set()


async def test_an_edge_model_down_gives_sensitive_requests_the_policy(tiers: tuple[Tier, Tier]) -> None:
    edge, cloud = tiers
    edge.model.errors[("m", "")] = Unavailable("model service: connection refused")
    with pytest.raises(MeshserveError) as info:
        await edge.handler.infer(request("p", [CANARY]), None, ())
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert "placement.on_edge_model_down is unavailable" in str(info.value)
    assert "model.infer m:2" not in edge.log  # the pipeline's fallback is not the policy's
    response = await edge.handler.infer(request("d", [CANARY]), None, ())
    assert response.degraded == "model_unavailable:default" and response.default_decision == "review"
    assert scores(response.outputs[0]) == [pytest.approx(0.5)]
    assert cloud.log == [] and CANARY not in everything_the_cloud_got(cloud)


def infer_message(users: Sequence[bytes], model: str = "p") -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model)
    message.inputs.add(name="user_id", datatype="BYTES", shape=[len(users), 1])
    message.raw_input_contents.append(serialize_bytes(np.array(list(users), dtype=object)))
    message.inputs.add(name="amount", datatype="FP32", shape=[len(users), 1])
    message.raw_input_contents.append(np.full(len(users), 1.0, np.float32).tobytes())
    return message


async def test_the_cloud_refuses_anything_marked_sensitive(pipelines: Path) -> None:
    async with cloud_tier(pipelines) as (cloud, port), grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        marked = (("x-meshserve-data-class", "sensitive"),)
        for message, metadata in [
            (infer_message([b""]), marked),  # a pipeline, by header
            (infer_message([b"", CANARY.encode()]), ()),  # a pipeline, by a value in a sensitive input
            (pb.ModelInferRequest(model_name="m"), marked),  # a model forwarded by name
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(message, metadata=metadata, timeout=5)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert CANARY not in (info.value.details() or "")
        assert cloud.log == []
        response = await stub.ModelInfer(infer_message([b""]), timeout=5)  # a general request is answered
        assert response.parameters["meshserve_tier"].string_param == "cloud"


async def test_a_single_tier_gateway_ignores_the_placement(pipelines: Path, tmp_path: Path) -> None:
    async with edge_tier(pipelines, "", tmp_path, tier="single") as single:
        assert single.handler.cloud is None
        response = await single.handler.infer(request("p", [""]), None, ())
        assert response.tier is None and scores(response.outputs[0]) == [pytest.approx(EDGE_SCORE)]
        assert single.log == ["cache.lookup", "features.compute fs_v1", "model.infer m:"]
        for headers in single.model.headers.seen:
            assert "x-meshserve-data-class" not in headers
        assert single.handler.claimed([("x-meshserve-data-class", "nonsense")]) is None


async def test_one_trace_spans_both_tiers_and_the_wan_hop_is_its_own_span(
    tiers: tuple[Tier, Tier], monkeypatch: pytest.MonkeyPatch
) -> None:
    import services.gateway.batching as batching
    import services.gateway.runner as runner

    edge, cloud = tiers
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for module in (batching, runner):
        monkeypatch.setattr(module, "tracer", provider.get_tracer("meshserve.gateway"))
    with provider.get_tracer("test").start_as_current_span("request") as root:
        response = await edge.handler.infer(request("p", [""]), None, ())
    assert response.tier == "cloud"
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"features", "cloud", "cloud.batch"} <= set(spans) and "model" not in spans
    assert spans["cloud"].attributes is not None and spans["cloud"].attributes["cloud.model"] == "m"
    (headers,) = cloud.model.headers.seen  # the cloud gateway passed the edge's trace on to its model
    trace_id = headers["traceparent"].split("-")[1]
    assert trace_id == f"{root.get_span_context().trace_id:032x}"


async def test_the_cloud_client_sends_the_token_and_counts_what_crosses(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(f"Bearer {TOKEN}\n")
    assert read_token(token) == TOKEN and read_token(None) == ""
    with pytest.raises(CloudConfigError, match="MESHSERVE_GATEWAY_CLOUD_TOKEN_FILE: cannot read") as info:
        read_token(tmp_path / "missing")
    assert str(tmp_path) not in str(info.value)
    async with fake_services() as (model, _, channel):
        client = CloudClient(channel, TOKEN)
        upstream = client.for_pipeline("p", "derived_features")
        before = sample(metrics.CLOUD_BYTES, pipeline="p", leave_edge="derived_features")
        features = RawTensor("features", "FP32", [2, 3], np.ones((2, 3), np.float32).tobytes())
        headers = (
            ("x-meshserve-data-class", "general"),
            ("authorization", "Bearer a-client-token"),
            ("baggage", f"user.id={CANARY}"),
        )
        result = await upstream.infer("m", "", [features], timeout_s=5, metadata=headers)
        assert result.outputs[0].raw == features.raw
        seen = model.metadata["ModelInfer"]
        assert seen["authorization"] == f"Bearer {TOKEN}"  # this edge's credential, never a client's
        assert seen["x-meshserve-data-class"] == "general" and "baggage" not in seen
        assert sample(metrics.CLOUD_BYTES, pipeline="p", leave_edge="derived_features") == before + sent_bytes(
            [features]
        )
        assert sent_bytes([features]) >= 24


def test_an_edge_whose_pipelines_go_to_the_cloud_needs_its_url(pipelines: Path) -> None:
    with pytest.raises(CloudConfigError, match="MESHSERVE_GATEWAY_CLOUD_URL is not set"):
        GatewayHandler(settings(pipelines, tier="edge"), Lifecycle(), upstreams([], EDGE_SCORE)[0])
