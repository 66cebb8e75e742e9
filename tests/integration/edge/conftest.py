"""`meshserve up --topology edge_cloud` as a subprocess on free ports for the tests of this folder, and what they
read from it: each tier's stack.json and secrets, its processes' /metrics, its Valkey, its files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from services.cli.connect import Endpoint, stack_endpoint

ROOT = Path(__file__).resolve().parents[3]
MESHSERVE = Path(sys.executable).parent / "meshserve"


@dataclass
class Tiers:
    """The running two tiers: the top-level state dir (its stack.json points at the edge) and `meshserve up`."""

    process: subprocess.Popen[str]
    log_dir: Path
    output: Path

    def state(self, tier: str | None = None) -> dict[str, Any]:
        folder = self.log_dir if tier is None else self.log_dir / tier
        return dict(json.loads((folder / "stack.json").read_text()))

    def endpoint(self, tier: str = "edge", subject: str = "tests") -> Endpoint:
        """The tier's ingress: TLS with its CA and a token minted from its own key."""
        return stack_endpoint(self.state(tier), subject=subject)

    def pids(self, tier: str) -> dict[str, int]:
        return {s["name"]: int(s["pid"]) for s in self.state(tier)["services"] if s.get("pid")}

    def internal_token(self, tier: str) -> str:
        path = self.log_dir / tier / "secrets" / "internal-token"
        return path.read_text().strip() if path.is_file() else ""

    def metrics(self, tier: str, service: str) -> str:
        """The Prometheus text of one of the tier's processes (the internal token sent when the stack has one)."""
        port = next(s["metrics_port"] for s in self.state(tier)["services"] if s["name"] == service)
        token = self.internal_token(tier)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
        with urllib.request.urlopen(request, timeout=5) as response:
            return str(response.read().decode())

    def all_metrics(self, tier: str) -> dict[str, str]:
        """Every /metrics of the tier's processes, and Envoy's stats."""
        from services.mesh.admin import EnvoyAdmin

        out = {s["name"]: self.metrics(tier, s["name"]) for s in self.state(tier)["services"] if s.get("metrics_port")}
        admin = EnvoyAdmin(self.state(tier)["admin"])
        out["envoy"] = admin.get("/stats/prometheus")
        return out

    def printed(self) -> str:
        return self.output.read_text(errors="replace")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This folder's trace tests (test_traces*.py) before its other tests, in place: those kill tiers and the last
    stops both (`meshserve down`)."""
    here = Path(__file__).parent
    mine = [i for i, item in enumerate(items) if item.path.parent == here]
    ordered = sorted((items[i] for i in mine), key=lambda item: not item.path.name.startswith("test_traces"))
    for i, item in zip(mine, ordered, strict=True):
        items[i] = item


def sample(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`, in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.fixture(scope="package")
def tiers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiers]:
    """Both tiers, up once for the folder; SIGTERM (then SIGKILL) after its last test."""
    if not any((ROOT / "models/fraud_mlp").glob("2/")):
        pytest.skip("demo models not built (`make models`)")
    log_dir = tmp_path_factory.mktemp("t") / "s"  # short: Envoy's admin socket lives under it
    output = log_dir.parent / "up.out"
    env = {**os.environ, "COLUMNS": "200"}
    args = ["up", "--topology", "edge_cloud", "--port-base", "0", "--log-dir", str(log_dir)]
    with output.open("w") as out:
        process = subprocess.Popen(
            [str(MESHSERVE), *args, "--start-timeout", "80", "--stop-timeout", "10"],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
    t = Tiers(process, log_dir, output)
    try:
        deadline = time.monotonic() + 150  # two stacks on a loaded 2-core machine
        while not (log_dir / "stack.json").exists():
            assert process.poll() is None, f"meshserve up exited with {process.returncode}:\n{t.printed()}"
            assert time.monotonic() < deadline, f"tiers not up after 150s:\n{t.printed()}"
            time.sleep(0.2)
        yield t
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)  # a test may have paused it
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
