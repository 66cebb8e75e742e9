"""Start real meshserve service processes on free loopback ports and wait until they are healthy."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.cli.stack.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def health_status(address: str, service: str = "", timeout: float = 1.0) -> int | None:
    """The grpc.health.v1 status (SERVING=1, NOT_SERVING=2), or None when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout).status
        except grpc.RpcError:
            return None


@dataclass
class ServiceProcess:
    process: subprocess.Popen[bytes]
    address: str
    metrics_port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_serving(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"service exited with {self.process.returncode}:\n{self.log()}")
            if health_status(self.address) == health_pb2.HealthCheckResponse.SERVING:
                return
            time.sleep(0.1)
        raise TimeoutError(f"service at {self.address} not SERVING after {timeout}s:\n{self.log()}")

    def terminate(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


@contextmanager
def service_process(name: str, log_dir: Path, env: dict[str, str], port: int | None = None) -> Iterator[ServiceProcess]:
    """`python -m services.<name>` on free loopback ports (or `port`), SERVING before the body runs, SIGTERM after.

    `env` adds to (or, with an empty value, removes from) this process's environment.
    """
    prefix = f"MESHSERVE_{name.upper()}_"
    port, metrics_port = port or free_port(), free_port()
    environ = {
        **os.environ,
        f"{prefix}HOST": "127.0.0.1",
        f"{prefix}PORT": str(port),
        f"{prefix}METRICS_PORT": str(metrics_port),
        "OTEL_SDK_DISABLED": "true",
        "PYTHONUNBUFFERED": "1",
        **env,
    }
    environ = {k: v for k, v in environ.items() if v != ""}
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"], cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT
        )
    service = ServiceProcess(process, f"127.0.0.1:{port}", metrics_port, log_path)
    try:
        service.wait_serving()
        yield service
    finally:
        service.terminate()


def model_service(
    repo: Path, log_dir: Path, port: int | None = None, **env: str
) -> AbstractContextManager[ServiceProcess]:
    """The model service on `repo` (see service_process)."""
    return service_process(
        "model",
        log_dir,
        {
            "MESHSERVE_MODEL_REPOSITORY": str(repo),
            "MESHSERVE_MODEL_WATCH_DEBOUNCE_MS": "200",
            "MESHSERVE_MODEL_GRACE_PERIOD_S": "20",
            **env,
        },
        port,
    )


def cache_service(log_dir: Path, **env: str) -> AbstractContextManager[ServiceProcess]:
    """The cache service; an embedded Valkey unless MESHSERVE_REDIS_URL is passed (see service_process)."""
    return service_process("cache", log_dir, {"MESHSERVE_REDIS_URL": "", "MESHSERVE_CACHE_GRACE_PERIOD_S": "5", **env})


def feature_service(log_dir: Path, **env: str) -> AbstractContextManager[ServiceProcess]:
    """The feature service; an embedded Valkey unless MESHSERVE_REDIS_URL is passed (see service_process)."""
    return service_process(
        "feature", log_dir, {"MESHSERVE_REDIS_URL": "", "MESHSERVE_FEATURE_GRACE_PERIOD_S": "5", **env}
    )


def gateway_service(
    log_dir: Path, model: str, feature: str, cache: str, pipelines: Path | None = None, **env: str
) -> AbstractContextManager[ServiceProcess]:
    """The gateway pointed at the given model, feature and cache addresses (see service_process)."""
    return service_process(
        "gateway",
        log_dir,
        {
            "MESHSERVE_GATEWAY_MODEL_ADDRESS": model,
            "MESHSERVE_GATEWAY_FEATURE_ADDRESS": feature,
            "MESHSERVE_GATEWAY_CACHE_ADDRESS": cache,
            "MESHSERVE_GATEWAY_GRACE_PERIOD_S": "5",
            **({"MESHSERVE_GATEWAY_PIPELINES_DIR": str(pipelines)} if pipelines is not None else {}),
            **env,
        },
    )
