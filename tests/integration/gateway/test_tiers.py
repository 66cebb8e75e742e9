"""Two tiers as real processes, no Envoy between them: an edge (model, feature and cache services, and a gateway with
MESHSERVE_GATEWAY_TIER=edge whose cloud URL is the cloud gateway itself) and a cloud (model service, gateway with
MESHSERVE_GATEWAY_TIER=cloud serving fraud_mlp by name). The shipped fraud pipeline (derived_features) with a canary
in every sensitive field: sensitive rows are answered at the edge and the cloud hears nothing of them (its gateway's
and its model's counters, its logs); general rows are answered in the cloud; with the cloud gateway killed, every
general request is answered edge_only; with the edge model killed, sensitive requests get the policy's UNAVAILABLE."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.pipelines import fraud_repository, roomy_pipelines
from tests.helpers.servers import (
    ROOT,
    ServiceProcess,
    cache_service,
    feature_service,
    gateway_service,
    model_service,
)

pytestmark = pytest.mark.skipif(
    not any((ROOT / "models" / "fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
)
CANARY = "canary-9b27e0"
SENSITIVE = ("user_id", "merchant_id", "device_id")
TOKEN = "edge-gateway-token-for-tests"
T0 = 1_767_000_000


@dataclass
class Tiers:
    edge_model: ServiceProcess
    edge: ServiceProcess
    cloud_model: ServiceProcess
    cloud: ServiceProcess


def pipelines(folder: Path) -> Path:
    """The shipped pipelines, fraud's stage limits roomy for a busy test machine (its placement as shipped, but the
    cloud's time limit, so that only a killed cloud, not a slow one, answers edge_only)."""

    def cloud_timeout(spec: dict) -> None:
        spec["placement"]["cloud_timeout_ms"] = 5000

    roomy_pipelines(folder, cloud_timeout)
    return folder


@pytest.fixture(scope="module")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    root = tmp_path_factory.mktemp("tiers")
    repo = fraud_repository(root)
    folder = pipelines(root / "pipelines")
    token = root / "cloud-token"
    token.write_text(TOKEN + "\n")
    logs = root / "logs"
    nowhere = "127.0.0.1:9"  # the cloud gateway forwards fraud_mlp by name: no feature or cache call
    with (
        model_service(repo, logs / "cloud", MESHSERVE_MODEL_WATCH="false") as cloud_model,
        gateway_service(
            logs / "cloud",
            cloud_model.address,
            nowhere,
            nowhere,
            folder,
            MESHSERVE_GATEWAY_TIER="cloud",
            MESHSERVE_GATEWAY_PUBLIC_MODELS='["fraud_mlp"]',
            MESHSERVE_GATEWAY_NEAR_CACHE_WATCHED_TTL_S="0",
        ) as cloud,
        model_service(repo, logs / "edge", MESHSERVE_MODEL_WATCH="false") as edge_model,
        feature_service(logs / "edge") as feature,
        cache_service(logs / "edge") as cache,
        gateway_service(
            logs / "edge",
            edge_model.address,
            feature.address,
            cache.address,
            folder,
            MESHSERVE_GATEWAY_TIER="edge",
            MESHSERVE_GATEWAY_CLOUD_URL=cloud.address,
            MESHSERVE_GATEWAY_CLOUD_TOKEN_FILE=str(token),
        ) as edge,
    ):
        yield Tiers(edge_model, edge, cloud_model, cloud)


def transaction(i: int, sensitive: bool) -> pb.ModelInferRequest:
    """A one-row fraud request; the identifiers carry the canary when `sensitive`, else they are empty."""
    values: dict[str, object] = {
        "event_time": np.array([[T0 + i]], np.int64),
        "amount": np.array([[20.0 + i]], np.float32),
        "country": "DE",
        "channel": "web",
        "mcc": "5411",
        "card_present": np.array([[i % 2 == 0]]),
        "account_age_days": np.array([[400.0]], np.float32),
    }
    for name in SENSITIVE:
        values[name] = f"{CANARY}-{name}-{i}" if sensitive else ""
    request = pb.ModelInferRequest(model_name="fraud")
    for name, value in values.items():
        if isinstance(value, str):
            data = value.encode()
            request.inputs.add(name=name, datatype="BYTES", shape=[1, 1])
            request.raw_input_contents.append(len(data).to_bytes(4, "little") + data)
        else:
            assert isinstance(value, np.ndarray)
            datatype = {"i": "INT64", "f": "FP32", "b": "BOOL"}[value.dtype.kind]
            request.inputs.add(name=name, datatype=datatype, shape=[1, 1])
            request.raw_input_contents.append(value.tobytes())
    return request


def infer(service: ServiceProcess, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    with grpc.insecure_channel(service.address) as channel:
        response: pb.ModelInferResponse = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        return response


def param(response: pb.ModelInferResponse, name: str) -> str:
    return response.parameters[name].string_param if name in response.parameters else ""


def counter(service: ServiceProcess, name: str, **labels: str) -> float:
    """The sum of a counter's samples on a process's /metrics whose labels include `labels`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{service.metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def model_infers(service: ServiceProcess) -> float:
    return counter(service, "meshserve_grpc_server_handled_total", method="ModelInfer")


def test_sensitive_rows_stay_at_the_edge_general_rows_go_to_the_cloud(tiers: Tiers) -> None:
    cloud_before, model_before = model_infers(tiers.cloud), model_infers(tiers.cloud_model)
    for i in range(20):
        response = infer(tiers.edge, transaction(i, sensitive=True))
        assert param(response, "meshserve_tier") == "edge" and not param(response, "degraded")
    assert model_infers(tiers.cloud) == cloud_before  # the cloud gateway received nothing
    assert model_infers(tiers.cloud_model) == model_before
    sent = counter(tiers.edge, "meshserve_gateway_cloud_bytes_total", pipeline="fraud")
    assert sent == 0

    for i in range(10):
        response = infer(tiers.edge, transaction(100 + i, sensitive=False))
        assert param(response, "meshserve_tier") == "cloud" and not param(response, "degraded")
        assert 0.0 <= np.frombuffer(response.raw_output_contents[0], np.float32)[0] <= 1.0
    assert model_infers(tiers.cloud) == cloud_before + 10
    assert counter(tiers.edge, "meshserve_gateway_cloud_bytes_total", pipeline="fraud") >= 10 * 64 * 4
    answers = counter(tiers.edge, "meshserve_gateway_tier_answers_total", pipeline="fraud", tier="cloud")
    assert answers == 10
    for process in (tiers.cloud, tiers.cloud_model):
        assert CANARY not in process.log()


def test_the_cloud_refuses_a_request_marked_sensitive(tiers: Tiers) -> None:
    with grpc.insecure_channel(tiers.cloud.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(transaction(1, sensitive=True), timeout=30)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'user_id'" in (info.value.details() or "") and CANARY not in (info.value.details() or "")


def test_a_killed_cloud_leaves_every_general_request_answered_edge_only(tiers: Tiers) -> None:
    tiers.cloud.process.kill()
    tiers.cloud.process.wait()
    for i in range(20):
        response = infer(tiers.edge, transaction(200 + i, sensitive=False))
        assert param(response, "meshserve_tier") == "edge"
        assert param(response, "degraded") == "edge_only"
    assert counter(tiers.edge, "meshserve_gateway_edge_only_total", pipeline="fraud") >= 20


def test_a_killed_edge_model_gives_sensitive_requests_the_policys_answer(tiers: Tiers) -> None:
    tiers.edge_model.process.kill()
    tiers.edge_model.process.wait()
    for i in range(5):
        with pytest.raises(grpc.RpcError) as info:
            infer(tiers.edge, transaction(300 + i, sensitive=True))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "placement.on_edge_model_down is unavailable" in (info.value.details() or "")
    assert CANARY not in tiers.cloud.log() and CANARY not in tiers.cloud_model.log()
