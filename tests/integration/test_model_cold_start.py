"""The model service's cold start as a scale-from-zero sees it, on real processes: health says SERVING only once
every model the replica serves is loaded and warmed up; a replica serving ONNX models never maps torch, and the
models it does not serve stay listed and answer NOT_FOUND; the cold start counts from the spawn, not the import."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.tensor_codec import decode_tensor, encode_raw
from services.model.cold_start import COLD_START_SECONDS
from services.model.manager import SERVE_MODELS_SETTING
from services.model.servicer import SERVICE_NAME
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc
from tests.helpers.models import Mlp, Slow, mlp_config, reference_output, write_model
from tests.helpers.servers import ROOT, free_port, model_service
from tests.unit.model.onnx_models import onnx_config, write_onnx_model

SERVING = health_pb2.HealthCheckResponse.SERVING
SLOW_ROUNDS = 400  # matmuls per forward: a few hundred ms each, and warm-up runs six (batch 1 and 16, three each)
START_DELAY_S = 1.0  # the interpreter sleeps this long before importing services.model
TICK_S = 0.01  # /proc/<pid>/stat counts the spawn in clock ticks


@dataclass(frozen=True, slots=True)
class Spawned:
    process: subprocess.Popen[bytes]
    address: str
    metrics_port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def spawned(repo: Path, log_dir: Path, argv: list[str], **env: str) -> Iterator[Spawned]:
    """The model service started with `argv` on `repo`, yielded at once (not waiting for SERVING), SIGTERM after."""
    port, metrics_port = free_port(), free_port()
    environ = {
        **os.environ,
        "MESHSERVE_MODEL_HOST": "127.0.0.1",
        "MESHSERVE_MODEL_PORT": str(port),
        "MESHSERVE_MODEL_METRICS_PORT": str(metrics_port),
        "MESHSERVE_MODEL_REPOSITORY": str(repo),
        "MESHSERVE_MODEL_WATCH": "false",
        "OTEL_SDK_DISABLED": "true",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"model-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Spawned(process, f"127.0.0.1:{port}", metrics_port, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@dataclass(frozen=True, slots=True)
class Sample:
    """One look at a starting replica: health first, then each model's readiness (read after it)."""

    health: int | None  # overall grpc.health.v1 status, None while nothing answers
    service_health: int | None  # the inference service's
    server_ready: bool | None
    models_ready: dict[str, bool]


def look(channel: grpc.Channel, models: list[str]) -> Sample | None:
    """One Sample, or None when the server does not answer yet (or any call failed)."""
    health = health_pb2_grpc.HealthStub(channel)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    try:
        overall = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1).status
        service = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=1).status
        server_ready = stub.ServerReady(pb.ServerReadyRequest(), timeout=1).ready
        ready = {name: stub.ModelReady(pb.ModelReadyRequest(name=name), timeout=1).ready for name in models}
    except grpc.RpcError:
        return None
    return Sample(overall, service, server_ready, ready)


def watch_start(service: Spawned, models: list[str], timeout_s: float = 180.0) -> list[Sample]:
    """Samples from the spawn until health says SERVING (the last sample), as fast as the calls go."""
    samples: list[Sample] = []
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(service.address) as channel:
        while time.monotonic() < deadline:
            if service.process.poll() is not None:
                raise RuntimeError(f"the model service exited with {service.process.returncode}:\n{service.log()}")
            sample = look(channel, models)
            if sample is not None:
                samples.append(sample)
                if sample.health == SERVING:
                    return samples
            time.sleep(0.02)
    raise TimeoutError(f"not SERVING after {timeout_s} s:\n{service.log()}")


def metric_samples(metrics_port: int, name: str) -> dict[str, float]:
    """model label -> value of the `name` series on the service's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    found = re.findall(rf'^{name}\{{model="([^"]+)"\}} (\S+)$', text, re.MULTILINE)
    return {model: float(value) for model, value in found}


def infer(stub: pb_grpc.GRPCInferenceServiceStub, model: str, x: np.ndarray) -> np.ndarray:
    request = pb.ModelInferRequest(model_name=model)
    datatype, shape, raw = encode_raw(x)
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(raw)
    response = stub.ModelInfer(request, timeout=10)
    out = response.outputs[0]
    return decode_tensor(out.name, out.datatype, out.shape, None, response.raw_output_contents[0])


def test_health_says_serving_only_once_every_served_model_is_loaded_and_warmed(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "fast", mlp_config("fast"), {1: Mlp(1)})  # loads first (names in order), in milliseconds
    slow = mlp_config("slow", outputs=[{"name": "y", "datatype": "FP32", "dims": [8]}])
    write_model(repo, "slow", slow, {1: Slow(rounds=SLOW_ROUNDS)})  # its warm-up takes seconds
    models = ["fast", "slow"]
    argv = [sys.executable, "-m", "services.model"]
    with spawned(repo, tmp_path / "logs", argv) as service:
        samples = watch_start(service, models)
        log = service.log()
        sums = metric_samples(service.metrics_port, f"{COLD_START_SECONDS._name}_sum")
    for sample in samples:
        said_serving = SERVING in (sample.health, sample.service_health) or sample.server_ready
        assert not said_serving or all(sample.models_ready.values()), sample
    waiting = [s for s in samples if s.models_ready == {"fast": True, "slow": False}]
    assert waiting, f"no look saw fast ready while slow warmed up: {samples}"  # the window the rule is about
    assert all(s.health != SERVING and not s.server_ready for s in waiting)
    assert all(samples[-1].models_ready.values()) and samples[-1].service_health == SERVING
    assert log.index("model slow version 1 ready") < log.index("cold start: slow")  # warm-up, then SERVING
    assert set(sums) == {"fast", "slow"}


def test_a_replica_serving_an_onnx_model_maps_no_torch_and_refuses_the_models_it_does_not_serve(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    write_onnx_model(repo, "onnx_mlp", onnx_config("onnx_mlp"), {1: Mlp(1)})
    write_model(repo, "torch_mlp", mlp_config("torch_mlp"), {1: Mlp(2)})
    (repo / "unreadable" / "1").mkdir(parents=True)
    (repo / "unreadable" / "config.yaml").write_text("name: [unterminated\n")  # never read by this replica
    serving = model_service(
        repo,
        tmp_path / "logs",
        MESHSERVE_MODEL_SERVE_MODELS='["onnx_mlp"]',
        MESHSERVE_MODEL_WATCH="false",
        MESHSERVE_MODEL_TORCH_THREADS="1",  # as meshserve up sets it: applied only if torch is ever imported
    )
    with serving as service:
        maps = Path(f"/proc/{service.process.pid}/maps").read_text()
        assert "onnxruntime" in maps and "libtorch" not in maps  # torch's libraries never loaded
        with grpc.insecure_channel(service.address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            index = {
                (m.name, m.version): m for m in stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5).models
            }
            assert index[("onnx_mlp", "1")].state == "READY"
            for name in ("torch_mlp", "unreadable"):
                assert index[(name, "")].state == "UNAVAILABLE"
                assert SERVE_MODELS_SETTING in index[(name, "")].reason
            x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
            np.testing.assert_allclose(infer(stub, "onnx_mlp", x), reference_output(Mlp(1), x), rtol=1e-4, atol=1e-5)
            assert not stub.ModelReady(pb.ModelReadyRequest(name="torch_mlp"), timeout=5).ready
            calls = {
                "ModelInfer": lambda: infer(stub, "torch_mlp", x),
                "ModelMetadata": lambda: stub.ModelMetadata(pb.ModelMetadataRequest(name="torch_mlp"), timeout=5),
                "RepositoryModelLoad": lambda: stub.RepositoryModelLoad(
                    pb.RepositoryModelLoadRequest(model_name="torch_mlp"), timeout=30
                ),
            }
            for rpc, call in calls.items():
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.NOT_FOUND, rpc
                assert SERVE_MODELS_SETTING in (err.value.details() or ""), rpc
            maps = Path(f"/proc/{service.process.pid}/maps").read_text()
            assert "libtorch" not in maps  # the refused Load imported nothing either
        sums = metric_samples(service.metrics_port, f"{COLD_START_SECONDS._name}_count")
    assert sums == {"onnx_mlp": 1.0}


def test_the_cold_start_counts_from_the_spawn_not_from_the_import(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_model(repo, "mlp", mlp_config("mlp"), {1: Mlp(1)})
    late_import = (
        f"import runpy, time; time.sleep({START_DELAY_S}); runpy.run_module('services.model', run_name='__main__')"
    )
    with spawned(repo, tmp_path / "logs", [sys.executable, "-c", late_import]) as service:
        watch_start(service, ["mlp"])
        sums = metric_samples(service.metrics_port, f"{COLD_START_SECONDS._name}_sum")
        log = service.log()
    line = re.search(r"cold start: mlp v1 serving ([\d.]+) s after spawn \(import ([\d.]+) s", log)
    assert line is not None, log
    serving_s, import_s = float(line[1]), float(line[2])
    assert import_s >= START_DELAY_S - TICK_S  # a clock started at import would miss the sleep before it
    assert sums["mlp"] >= START_DELAY_S - TICK_S and serving_s >= import_s
    assert "counted from the import" not in log  # the kernel's start time, not the fallback
