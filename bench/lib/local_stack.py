"""The whole local stack for a benchmark: `meshserve up` on free ports in a subprocess, until its ingress answers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lib.serving import ROOT, ServerStartError, venv_python


@dataclass
class RunningStack:
    """A `meshserve up` subprocess and what its stack.json says."""

    process: subprocess.Popen[bytes]
    log_dir: Path
    ingress: str
    state: dict[str, Any]


def up_command(log_dir: Path, up_args: Sequence[str] = ()) -> list[str]:
    """`meshserve up` on free ports, headless (no demo traffic), logging into `log_dir`."""
    return [venv_python(), "-m", "services.cli.main", "up", "--port-base", "0", "--log-dir", str(log_dir), *up_args]


@contextlib.contextmanager
def local_stack(
    log_dir: Path,
    up_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    timeout_s: float = 180.0,
) -> Iterator[RunningStack]:
    """Start the stack as `meshserve up` does, yield once its ingress answers, then stop it with SIGTERM (as
    Ctrl-C would) and wait for its orderly shutdown."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path = log_dir / "up.out"
    state_path = log_dir / "stack.json"
    with out_path.open("wb") as out:
        process = subprocess.Popen(
            up_command(log_dir, up_args),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + timeout_s
        while not state_path.exists():  # written once the ingress reaches the gateway through Envoy
            if process.poll() is not None or time.monotonic() > deadline:
                raise ServerStartError(f"meshserve up did not come up ({out_path}):\n{out_path.read_text()[-3000:]}")
            time.sleep(0.2)
        state = json.loads(state_path.read_text())
        yield RunningStack(process, log_dir, state["ingress"] or state["gateway"], state)
    finally:
        stop_stack(process)


def stop_stack(process: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """SIGTERM to the supervisor (it stops its children in reverse order); SIGKILL to the group if it hangs."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
