"""The near cache's fast path over real processes (model, feature and cache services, a single-tier gateway, the
shipped fraud pipeline): a request that came as raw contents and that the gateway answered before, byte for byte,
is answered from its raw bytes before any decoding (meshserve_gateway_wire_hits_total counts it), and every row of
every such answer, under 16 concurrent callers, equals the full path's answer to the same request (its first answer,
a miss, and the answer to the same transaction sent as typed contents, which always takes the full path). A request
whose bytes differ in any way (another datatype, the [rows] shape) takes the full path: answered the same, or
refused INVALID_ARGUMENT as before."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.pipelines import fraud_repository, roomy_pipelines
from tests.helpers.servers import ROOT, ServiceProcess, cache_service, feature_service, gateway_service, model_service

pytestmark = pytest.mark.skipif(
    not any((ROOT / "models" / "fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
)
T0 = 1_767_000_000
TRANSACTIONS = 120
CALLERS = 16
TEXT = ("user_id", "merchant_id", "device_id", "country", "channel", "mcc")


@dataclass
class Stack:
    gateway: ServiceProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("wire")
    repo = fraud_repository(root)
    folder = roomy_pipelines(root / "pipelines")
    logs = root / "logs"
    with (
        model_service(repo, logs, MESHSERVE_MODEL_WATCH="false") as model,
        feature_service(logs) as feature,
        cache_service(logs) as cache,
        gateway_service(logs, model.address, feature.address, cache.address, folder) as gateway,
    ):
        yield Stack(gateway)


def values(i: int) -> dict[str, np.ndarray]:
    """Transaction i as 1 to 3 rows (each row its own transaction), every input [rows, 1]."""
    rows = 1 + i % 3
    ids = [f"{i}-{r}" for r in range(rows)]
    column = {
        "event_time": np.array([T0 + 60 * i + r for r in range(rows)], np.int64),
        "amount": np.array([10.0 + i + 0.25 * r for r in range(rows)], np.float32),
        "card_present": np.array([(i + r) % 2 == 0 for r in range(rows)]),
        "account_age_days": np.array([30.0 + i for _ in range(rows)], np.float32),
        "user_id": np.array([f"u{x}" for x in ids], object),
        "merchant_id": np.array([f"m{x}" for x in ids], object),
        "device_id": np.array([f"d{x}" for x in ids], object),
        "country": np.array(["DE"] * rows, object),
        "channel": np.array(["web" if i % 2 else "app"] * rows, object),
        "mcc": np.array(["5411"] * rows, object),
    }
    return {name: array.reshape(rows, 1) for name, array in column.items()}


def raw_request(arrays: dict[str, np.ndarray], flat: bool = False) -> pb.ModelInferRequest:
    """As raw_input_contents (`flat`: the [rows] shape the pipeline also takes for a [1] input)."""
    request = pb.ModelInferRequest(model_name="fraud")
    for name, array in arrays.items():
        shape = [array.shape[0]] if flat else list(array.shape)
        if array.dtype == object:
            data = b"".join(len(s.encode()).to_bytes(4, "little") + s.encode() for s in array.reshape(-1))
            request.inputs.add(name=name, datatype="BYTES", shape=shape)
        else:
            datatype = {"int64": "INT64", "float32": "FP32", "bool": "BOOL"}[array.dtype.name]
            request.inputs.add(name=name, datatype=datatype, shape=shape)
            data = array.tobytes()
        request.raw_input_contents.append(data)
    return request


def typed_request(arrays: dict[str, np.ndarray]) -> pb.ModelInferRequest:
    """The same transaction as typed contents: always the full path."""
    request = pb.ModelInferRequest(model_name="fraud")
    for name, array in arrays.items():
        tensor = request.inputs.add(name=name, shape=list(array.shape))
        flat = array.reshape(-1)
        if array.dtype == object:
            tensor.datatype = "BYTES"
            tensor.contents.bytes_contents.extend(s.encode() for s in flat)
        elif array.dtype == np.int64:
            tensor.datatype = "INT64"
            tensor.contents.int64_contents.extend(flat.tolist())
        elif array.dtype == np.float32:
            tensor.datatype = "FP32"
            tensor.contents.fp32_contents.extend(flat.tolist())
        else:
            tensor.datatype = "BOOL"
            tensor.contents.bool_contents.extend(flat.tolist())
    return request


def scores(response: pb.ModelInferResponse) -> list[float]:
    return np.frombuffer(response.raw_output_contents[0], np.float32).tolist()


def cache_of(response: pb.ModelInferResponse) -> str:
    return response.parameters["cache"].string_param


def wire_hits(gateway: ServiceProcess) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{gateway.metrics_port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "meshserve_gateway_wire_hits_total" and s.labels.get("pipeline") == "fraud"
    )


def answer_all(gateway: ServiceProcess, requests: list[pb.ModelInferRequest]) -> list[pb.ModelInferResponse]:
    """Every request answered, CALLERS at a time, in order."""
    with grpc.insecure_channel(gateway.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        with ThreadPoolExecutor(CALLERS) as pool:
            return list(pool.map(lambda r: stub.ModelInfer(r, timeout=30), requests))


def test_known_requests_are_answered_from_their_raw_bytes_with_the_full_paths_answers(stack: Stack) -> None:
    transactions = [values(i) for i in range(TRANSACTIONS)]
    first = answer_all(stack.gateway, [raw_request(t) for t in transactions])
    assert {cache_of(r) for r in first} == {"miss"}
    before = wire_hits(stack.gateway)
    # The fast path and the full path, interleaved under concurrent load.
    mixed = [r for t in transactions for r in (raw_request(t), typed_request(t), raw_request(t, flat=True))]
    answers = answer_all(stack.gateway, mixed)
    fast, typed, flat = answers[0::3], answers[1::3], answers[2::3]
    assert wire_hits(stack.gateway) - before == TRANSACTIONS  # every repeated raw request, and only those
    for i, transaction in enumerate(transactions):
        rows = transaction["amount"].shape[0]
        assert len(scores(first[i])) == rows
        for row in range(rows):  # row by row: the fast path's answer is the full path's
            assert scores(fast[i])[row] == scores(first[i])[row] == scores(typed[i])[row] == scores(flat[i])[row]
        assert cache_of(fast[i]) == cache_of(typed[i]) == cache_of(flat[i]) == "hit"
        assert fast[i].parameters["model_version"].string_param == first[i].parameters["model_version"].string_param


def test_a_known_requests_bytes_under_another_datatype_are_refused_as_before(stack: Stack) -> None:
    transaction = values(TRANSACTIONS + 1)
    answer_all(stack.gateway, [raw_request(transaction)])
    wrong = raw_request(transaction)
    wrong.inputs[1].datatype = "FP64"  # amount's 4 bytes a row, now claimed to be 8-byte floats
    before = wire_hits(stack.gateway)
    with grpc.insecure_channel(stack.gateway.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(wrong, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "amount" in (refused.value.details() or "")
    assert wire_hits(stack.gateway) == before
