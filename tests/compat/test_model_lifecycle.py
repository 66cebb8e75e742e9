"""Hot reload under load, broken versions, queue limits, deadlines and SIGTERM drain, over real sockets."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton
import yaml
from grpc_health.v1 import health_pb2
from tritonclient.utils import InferenceServerException

from tests.helpers.models import Mlp, Slow, mlp_config, reference_output, save_scripted, write_model
from tests.helpers.servers import health_status, model_service

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def x_rows(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def infer(client: triton.InferenceServerClient, model: str, x: np.ndarray, timeout: float | None = None):
    inp = triton.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp], client_timeout=timeout)


def wait_until(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def metric(port: int, name: str, labels: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def publish_version(model_dir: Path, version: int, module) -> None:
    """Deploy a version the way a CI job would: write it aside, then rename it into place."""
    staging = model_dir.parent / f".staging-{model_dir.name}-{version}"
    save_scripted(module, staging / "model.pt")
    os.rename(staging, model_dir / str(version))


class Load:
    """Closed-loop client threads sending requests until stopped, recording answers and failures."""

    def __init__(self, address: str, model: str, threads: int = 4) -> None:
        self.address, self.model = address, model
        self.stop = threading.Event()
        self.answers: list[tuple[str, np.ndarray, np.ndarray]] = []
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def _run(self, seed: int) -> None:
        client = triton.InferenceServerClient(self.address)
        i = 0
        while not self.stop.is_set():
            x = x_rows(1 + i % 4, seed=seed * 1000 + i)
            i += 1
            try:
                result = infer(client, self.model, x, timeout=20)
                self.answers.append((result.get_response().model_version, x, result.as_numpy("y")))
            except InferenceServerException as exc:
                self.failures.append(f"{exc.status()}: {exc.message()}")
        client.close()

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()


def test_hot_reload_under_load_without_failures(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model_dir = write_model(repo, "m", mlp_config("m", dynamic_batching={"max_queue_delay_us": 100}), {1: Mlp(1)})
    with model_service(repo, tmp_path / "logs") as server:
        client = triton.InferenceServerClient(server.address)
        with Load(server.address, "m") as load:
            wait_until(lambda: len(load.answers) > 50, what="traffic on v1")
            publish_version(model_dir, 2, Mlp(2))
            wait_until(lambda: client.is_model_ready("m", "2"), what="v2 ready")
            wait_until(lambda: not client.is_model_ready("m", "1"), what="v1 retired")
            seen = len(load.answers)
            wait_until(lambda: len(load.answers) > seen + 50, what="traffic on v2")

            # A broken version never replaces the working one.
            (model_dir / "3").mkdir()
            (model_dir / "3" / "model.pt").write_bytes(b"not a torchscript archive")
            wait_until(
                lambda: any(
                    m.version == "3" and m.state == "UNAVAILABLE" for m in client.get_model_repository_index().models
                ),
                what="v3 reported broken",
            )
            seen = len(load.answers)
            wait_until(lambda: len(load.answers) > seen + 20, what="traffic after broken v3")
        assert load.failures == []
        index = {(m.name, m.version): m for m in client.get_model_repository_index().models}
        assert "failed to load" in index[("m", "3")].reason
        assert not client.is_model_ready("m", "3") and client.is_model_ready("m", "2")

        versions = [v for v, _, _ in load.answers]
        switch = versions.index("2")
        assert set(versions[:switch]) == {"1"}
        assert versions[-1] == "2"
        assert versions.count("1") < len(versions)
        for version, x, y in load.answers[-20:]:
            np.testing.assert_allclose(y, reference_output(Mlp(int(version)), x), rtol=1e-5, atol=1e-6)
        assert "m" in server.log() and "failed to load" in server.log()
        client.close()


def test_broken_config_keeps_serving_and_load_rpc_reports_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model_dir = write_model(repo, "m", mlp_config("m"), {1: Mlp(1)})
    with model_service(repo, tmp_path / "logs", MESHSERVE_MODEL_WATCH="false") as server:
        client = triton.InferenceServerClient(server.address)
        good = (model_dir / "config.yaml").read_text()
        (model_dir / "config.yaml").write_text(yaml.safe_dump({**mlp_config("m"), "max_batch_size": -3}))
        with pytest.raises(InferenceServerException) as err:
            client.load_model("m")
        assert "max_batch_size" in err.value.message() and "config.yaml" in err.value.message()
        assert infer(client, "m", x_rows(1)).get_response().model_version == "1"
        (model_dir / "config.yaml").write_text(good)
        shutil.copytree(model_dir / "1", model_dir / "2")
        client.load_model("m")
        assert infer(client, "m", x_rows(1)).get_response().model_version == "2"
        client.close()


def test_queue_limit_and_deadlines(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    config = mlp_config("slow", max_batch_size=1, dynamic_batching={"max_queue_size": 2, "max_queue_delay_us": 0})
    write_model(repo, "slow", config, {1: Slow(rounds=400)})  # a few hundred ms per forward
    with model_service(repo, tmp_path / "logs") as server:
        client = triton.InferenceServerClient(server.address)
        x = x_rows(1)
        # Queue full: excess is refused at once with RESOURCE_EXHAUSTED, the rest completes.
        with ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(infer, client, "slow", x, 60) for _ in range(8)]
            outcomes = []
            for f in futures:
                try:
                    f.result()
                    outcomes.append("OK")
                except InferenceServerException as exc:
                    outcomes.append(str(exc.status()).replace("StatusCode.", ""))
        assert outcomes.count("RESOURCE_EXHAUSTED") >= 1
        assert outcomes.count("OK") >= 3
        assert set(outcomes) <= {"OK", "RESOURCE_EXHAUSTED"}

        # Deadlines: requests that expire in the queue never reach compute.
        before = client.get_inference_statistics("slow").model_stats[0].execution_count
        with ThreadPoolExecutor(3) as pool:
            slow = pool.submit(infer, client, "slow", x, 60)
            wait_until(
                lambda: (
                    metric(server.metrics_port, "meshserve_model_pending_requests", 'model="slow",version="1"') >= 1
                ),
                what="the slow request in flight",
            )
            hurried = [pool.submit(infer, client, "slow", x, 0.01) for _ in range(2)]
            codes = []
            for f in hurried:
                with pytest.raises(InferenceServerException) as err:
                    f.result()
                codes.append(str(err.value.status()))
            slow.result()
        assert all("DEADLINE_EXCEEDED" in c for c in codes)
        time.sleep(0.5)  # let the server pass the expired requests in its queue
        after = client.get_inference_statistics("slow").model_stats[0].execution_count
        assert after - before == 1
        client.close()


def test_sigterm_drains_admitted_requests(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    # One batch takes a few hundred ms: the first request runs alone, the other 15 all queue behind it.
    config = mlp_config("slow", max_batch_size=16, dynamic_batching={"max_queue_delay_us": 0})
    write_model(repo, "slow", config, {1: Slow(rounds=400)})
    with model_service(repo, tmp_path / "logs") as server:
        client = triton.InferenceServerClient(server.address)
        x = x_rows(1)
        infer(client, "slow", x, 60)  # channel up before the burst
        with ThreadPoolExecutor(16) as pool:
            futures = [pool.submit(infer, client, "slow", x, 60) for _ in range(16)]
            wait_until(
                lambda: (
                    metric(server.metrics_port, "meshserve_model_pending_requests", 'model="slow",version="1"') >= 16
                ),
                what="all 16 requests admitted",
            )
            server.process.send_signal(15)
            wait_until(lambda: health_status(server.address) in (NOT_SERVING, None), timeout=5, what="NOT_SERVING")
            drained_early = sum(f.done() for f in futures)
            results = [f.result() for f in futures]
        assert drained_early < len(futures), "readiness must drop before the in-flight work is done"
        for r in results:
            np.testing.assert_allclose(r.as_numpy("y"), x * 2.0)
        assert server.process.wait(30) == 0
        client.close()
