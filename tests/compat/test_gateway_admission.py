"""Gateway admission control and cache versioning over real processes: a slow model behind a small limit,
priorities under overload, and a new model version that never gets an old version's cached answer."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tests.compat.gateway_helpers import params
from tests.helpers.models import Mlp, Slow, mlp_config, reference_output, write_model
from tests.helpers.servers import ServiceProcess, cache_service, free_port, gateway_service, model_service


def pipeline(name: str, model: str, max_inflight: int, adaptive: bool = False) -> dict:
    return {
        "name": name,
        "max_batch_size": 16,
        "inputs": [{"name": "x", "datatype": "FP32", "dims": [8]}],
        "model": {"name": model},
        "outputs": ["y"],
        "cache": {"ttl_s": 60, "stale_s": 0},
        "degradation": {"on_model_failure": [], "on_feature_failure": []},
        "admission": {"max_inflight": max_inflight, "adaptive": adaptive},
        "timeouts": {"total_ms": 5000, "model_ms": 5000},
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, ServiceProcess, ServiceProcess]]:
    root = tmp_path_factory.mktemp("gateway-admission")
    repo, pipelines, logs = root / "repo", root / "pipelines", root / "logs"
    slow_config = mlp_config("slow", outputs=[{"name": "y", "datatype": "FP32", "dims": [8]}])
    write_model(repo, "slow", slow_config, {1: Slow(rounds=12)})
    write_model(repo, "mlp", mlp_config("mlp", version_policy={"latest": {"num_versions": 1}}), {1: Mlp(1)})
    pipelines.mkdir()
    (pipelines / "slowpipe.yaml").write_text(yaml.safe_dump(pipeline("slowpipe", "slow", max_inflight=4)))
    (pipelines / "mlppipe.yaml").write_text(yaml.safe_dump(pipeline("mlppipe", "mlp", max_inflight=16)))
    with ExitStack() as stack:
        model = stack.enter_context(model_service(repo, logs))
        cache = stack.enter_context(cache_service(logs))
        gateway = stack.enter_context(
            gateway_service(
                logs,
                model.address,
                f"127.0.0.1:{free_port()}",
                cache.address,
                pipelines,
                MESHSERVE_GATEWAY_VERSIONS_REFRESH_S="0.2",
                MESHSERVE_GATEWAY_VERSIONS_TTL_S="0.6",
                MESHSERVE_GATEWAY_PUBLIC_MODELS='["mlp"]',  # read by name through the gateway below
            )
        )
        yield repo, gateway, model


def raw_request(model: str, x: np.ndarray, priority: str | None = None) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype(np.float32).tobytes())
    if priority is not None:
        request.parameters["priority"].string_param = priority
    return request


def flood(
    address: str, seconds: float, workers: dict[str, int], model: str = "slowpipe"
) -> dict[str, list[tuple[str, float]]]:
    """Closed-loop load: each worker sends back to back for `seconds`; (code, latency s) per call, by priority."""
    results: dict[str, list[tuple[str, float]]] = {p: [] for p in workers}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def work(priority: str, seed: int) -> None:
        with grpc.insecure_channel(address) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            i = 0
            while time.monotonic() < stop:
                x = np.zeros((1, 8), np.float32)  # never twice the same (each value exact in FP32): no cache hits
                x[0, :2] = seed, i
                i += 1
                start = time.perf_counter()
                try:
                    stub.ModelInfer(raw_request(model, x, priority if model == "slowpipe" else None), timeout=10)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                    if code == "RESOURCE_EXHAUSTED":
                        trailers = dict(exc.trailing_metadata() or ())
                        assert trailers.get("grpc-retry-pushback-ms") == "50"
                        time.sleep(0.005)
                with lock:
                    results[priority].append((code, time.perf_counter() - start))

    threads = [
        threading.Thread(target=work, args=(p, n * 1000 + k))
        for n, (p, count) in enumerate(workers.items())
        for k in range(count)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def queue_per_compute(address: str, work: Callable[[], object]) -> float:
    """How many forward passes the average request waited behind while `work` ran: the model service's own
    queue time over its compute time (ModelStatistics deltas), a ratio CPU contention scales on both sides."""

    def totals() -> tuple[int, int, int]:
        with triton.InferenceServerClient(address) as client:
            stats = client.get_inference_statistics("slow").model_stats[0].inference_stats
        return stats.queue.count, stats.queue.ns, stats.compute_infer.ns

    before = totals()
    work()
    after = totals()
    requests, queue_ns, compute_ns = (a - b for a, b in zip(after, before, strict=True))
    assert requests > 0
    return (queue_ns / requests) / (compute_ns / requests)


def test_overload_is_refused_at_once_and_admitted_work_waits_behind_the_bound_only(setup) -> None:
    _, gateway, model = setup
    direct = queue_per_compute(model.address, lambda: flood(model.address, 2.0, {"high": 16}, model="slow"))
    results: dict[str, list[tuple[str, float]]] = {}
    gated = queue_per_compute(model.address, lambda: results.update(flood(gateway.address, 2.0, {"high": 16})))
    ok = sorted(t for c, t in results["high"] if c == "OK")
    shed = sorted(t for c, t in results["high"] if c == "RESOURCE_EXHAUSTED")
    assert {c for c, _ in results["high"]} <= {"OK", "RESOURCE_EXHAUSTED"}
    assert ok and shed, f"expected both admitted and shed calls, got {len(ok)} ok and {len(shed)} shed"
    # A refusal costs far less than serving: it never waits behind the model.
    assert statistics.median(shed) < statistics.median(ok) / 3
    # Straight to the model service, 16 closed-loop clients queue behind about 15 forward passes each; through
    # the gateway at most 4 are in flight, so an admitted request waits behind at most 3.
    assert direct > 8, direct
    assert gated < 4, (gated, direct)


def test_low_priority_is_shed_before_high(setup) -> None:
    _, gateway, _ = setup
    results = flood(gateway.address, 3.0, {"high": 8, "low": 8})

    def served(priority: str) -> int:
        return sum(1 for c, _ in results[priority] if c == "OK")

    def shed_ratio(priority: str) -> float:
        return sum(1 for c, _ in results[priority] if c == "RESOURCE_EXHAUSTED") / len(results[priority])

    # The same offered load (8 closed-loop clients each): high priority gets most of the capacity.
    assert served("high") > 3 * served("low"), (served("high"), served("low"))
    assert shed_ratio("low") > shed_ratio("high")


def test_a_new_model_version_never_gets_an_old_answer(setup) -> None:
    repo, gateway, _ = setup
    client = triton.InferenceServerClient(gateway.address)
    x = np.arange(8, dtype=np.float32).reshape(1, 8)
    tensor = triton.InferInput("x", [1, 8], "FP32")
    tensor.set_data_from_numpy(x)
    first, second = client.infer("mlppipe", [tensor]), client.infer("mlppipe", [tensor])
    assert (params(first)["cache"], params(second)["cache"]) == ("miss", "hit")
    assert params(second)["model_version"] == "1"

    write_model(repo, "mlp", mlp_config("mlp", version_policy={"latest": {"num_versions": 1}}), {2: Mlp(2)})
    deadline = time.monotonic() + 30
    while True:  # the model service hot-reloads: version 2 in, version 1 out
        versions = client.get_model_metadata("mlp", as_json=True)["versions"]
        if versions == ["2"]:
            break
        assert time.monotonic() < deadline, f"model service still serves {versions}"
        time.sleep(0.2)
    time.sleep(1.0)  # past the gateway's versions TTL (0.6 s): version 1 is no longer serving
    after = client.infer("mlppipe", [tensor])
    assert params(after)["model_version"] == "2"
    assert params(after)["cache"] == "miss"
    np.testing.assert_allclose(after.as_numpy("y"), reference_output(Mlp(2), x), rtol=1e-5)
