"""Start, wait for and stop the server processes the benchmarks measure (free ports, readiness, logs)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.cli.stack.ports import free_port as stack_free_port
from services.protos import inference_pb2 as pb
from services.protos import inference_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]


class ServerStartError(RuntimeError):
    """A benchmarked server exited or never became ready; the message carries its log's tail."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now, below the kernel's ephemeral range (see the stack's ports)."""
    return stack_free_port()


def venv_python() -> str:
    """The project's virtualenv interpreter (the running one where there is no `.venv`)."""
    candidate = ROOT / ".venv" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def model_service_argv() -> list[str]:
    """`python -m services.model` with the project's interpreter."""
    return [venv_python(), "-m", "services.model"]


def model_service_env(repo: Path, port: int) -> dict[str, str]:
    """The model service's environment: the repository at `repo` on `port`, a free metrics port, tracing off."""
    return {
        "MESHSERVE_MODEL_REPOSITORY": str(repo),
        "MESHSERVE_MODEL_PORT": str(port),
        "MESHSERVE_MODEL_METRICS_PORT": str(free_port()),
        "OTEL_SDK_DISABLED": "true",
    }


def floor_argv(port: int) -> list[str]:
    """The floor server (bench.lib.floor_server) on `port`."""
    return [venv_python(), "-m", "bench.lib.floor_server", "--port", str(port)]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _health_serving(channel: grpc.Channel) -> bool:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=1.0)
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def _v2_ready(channel: grpc.Channel, models: Sequence[str]) -> bool:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    if not stub.ServerReady(pb.ServerReadyRequest(), timeout=1.0).ready:
        return False
    return all(stub.ModelReady(pb.ModelReadyRequest(name=m), timeout=1.0).ready for m in models)


class ServerProcess:
    """A server subprocess with its log file; `wait_ready` polls gRPC health or v2 readiness."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        port: int,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        cwd: Path = ROOT,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.port = port
        self.url = f"127.0.0.1:{port}"
        log_dir = log_dir or (ROOT / ".logs")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"bench-{name.replace(' ', '_')}.log"
        self._log = self.log_path.open("w")
        self.ready_s: float | None = None
        self.proc = subprocess.Popen(
            self.argv,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def log_tail(self, lines: int = 40) -> str:
        self._log.flush()
        return _tail(self.log_path, lines)

    def wait_ready(self, health: bool = True, models: Sequence[str] = (), timeout_s: float = 180.0) -> float:
        """Block until the server answers SERVING (grpc.health.v1) or v2 ready; returns seconds waited."""
        started = time.monotonic()
        deadline = started + timeout_s
        with grpc.insecure_channel(self.url) as channel:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(
                        f"{self.name} exited with {self.proc.returncode} before it was ready "
                        f"(log {self.log_path}):\n{self.log_tail()}"
                    )
                try:
                    ok = _health_serving(channel) if health else True
                    if ok and models:
                        ok = _v2_ready(channel, models)
                    if ok:
                        self.ready_s = time.monotonic() - started
                        return self.ready_s
                except grpc.RpcError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"{self.name} not ready after {timeout_s:.0f}s (log {self.log_path}):\n{self.log_tail()}"
                    )
                time.sleep(0.25)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, wait; SIGKILL the process group if it does not exit in time."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self._log.close()
        return self.proc.returncode


@contextlib.contextmanager
def running(
    name: str,
    argv: Sequence[str],
    port: int,
    env: Mapping[str, str] | None = None,
    health: bool = True,
    models: Sequence[str] = (),
    timeout_s: float = 180.0,
) -> Iterator[ServerProcess]:
    """Start a server, wait until it is ready, yield it, and always stop it."""
    server = ServerProcess(name, argv, port, env)
    try:
        server.wait_ready(health=health, models=models, timeout_s=timeout_s)
        yield server
    finally:
        server.stop()
