"""The GPU check's served half: one model service process holding every (model, path, batching) entry, driven over
gRPC by the benchmarks' closed-loop client one cell at a time, with its own /metrics read during each cell (GPU
utilisation from NVML, rows per executed batch)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.gpu.variants import Variant, variant_config

SAMPLE_EVERY_S = 0.25
POOL = 256  # distinct requests per entry, serialized once and cycled
READY_MOST_S = 240.0  # loading every entry (heavy_mlp's 65 MiB files on each path) before health says SERVING


@dataclass(frozen=True)
class Entry:
    """One served model: a model of the work repository through one path, with dynamic batching on or off."""

    model: str  # heavy_mlp, fraud_mlp
    variant: Variant
    batching: bool

    @property
    def name(self) -> str:
        path = self.variant.name.lower().replace(" ", "_")
        return f"{self.model}__{path}__{'batched' if self.batching else 'unbatched'}"


@dataclass
class Cell:
    """One closed-loop run against one entry at one concurrency, with what /metrics said meanwhile."""

    entry: Entry
    concurrency: int
    throughput: float
    p50_ms: float
    p99_ms: float
    answered: int
    errors: dict[str, int]
    rows_per_batch: float | None
    gpu_utilization: float | None  # mean of the samples, 0..1; None where /metrics exports no GPU gauge
    gpu_samples: list[float] = field(default_factory=list)


def ready_models(address: str, names: Sequence[str]) -> set[str]:
    """Which of `names` the model service at `address` says are ready."""
    import grpc

    from services.protos import inference_pb2 as pb
    from services.protos import inference_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        return {n for n in names if stub.ModelReady(pb.ModelReadyRequest(name=n), timeout=5).ready}


def ready_reason(address: str, name: str) -> str:
    """The model service's own word on why `name` is not ready (its repository index)."""
    import grpc

    from services.protos import inference_pb2 as pb
    from services.protos import inference_pb2_grpc as pb_grpc

    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=5)
    found = [f"v{m.version} {m.state}: {m.reason}" for m in index.models if m.name == name]
    return "; ".join(found) or "not in its repository index (model-service.log)"


def write_repository(models: Path, folders: dict[str, Path], entries: Sequence[Entry], repo: Path) -> None:
    """A repository at `repo` with one folder per entry: version 1's files linked from `models`, the config made to
    serve it through the entry's path, without dynamic_batching where the entry has batching off."""
    for entry in entries:
        source = models / folders[entry.model]
        target = repo / entry.name / "1"
        target.mkdir(parents=True)
        for item in (source / "1").iterdir():
            os.symlink(item.resolve(), target / item.name)
        config = variant_config(source, entry.variant, 1)
        config["name"] = entry.name
        if not entry.batching:
            config.pop("dynamic_batching", None)
        (repo / entry.name / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def request_pool(name: str, n: int = POOL, seed: int = 11) -> Callable[[], bytes]:
    """A callable cycling through `n` serialized one-row requests for model `name` (64 FP32 features each)."""
    from services.protos import inference_pb2 as pb

    rows = np.random.default_rng(seed).standard_normal((n, 64)).astype(np.float32)
    pool = []
    for row in rows:
        request = pb.ModelInferRequest(model_name=name)
        request.inputs.add(name="features", datatype="FP32", shape=[1, 64])
        request.raw_input_contents.append(row.tobytes())
        pool.append(request.SerializeToString())
    position = iter(range(1 << 62))
    return lambda: pool[next(position) % n]


def scrape(url: str) -> dict[str, dict[str, float]]:
    """The /metrics samples the check reads: GPU utilisation per GPU, rows inferred and executions per model."""
    text = urllib.request.urlopen(url, timeout=2).read().decode()
    found: dict[str, dict[str, float]] = {"gpu": {}, "inferences": {}, "executions": {}}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "meshserve_gpu_utilization_ratio":
                found["gpu"][sample.labels.get("gpu", "0")] = sample.value
            elif sample.name == "meshserve_model_inferences_total":
                found["inferences"][sample.labels["model"]] = sample.value
            elif sample.name == "meshserve_model_executions_total":
                found["executions"][sample.labels["model"]] = sample.value
    return found


async def run_cell(
    address: str, metrics_url: str, entry: Entry, concurrency: int, seconds: float, warm_s: float
) -> Cell:
    """Closed-loop load on `entry` at `concurrency` for `seconds` (after `warm_s` not counted), sampling /metrics."""
    from bench.lib.fraud_load import load

    loop = asyncio.get_running_loop()
    samples: list[float] = []
    stop = asyncio.Event()

    async def sampler() -> None:
        await asyncio.sleep(warm_s)
        while not stop.is_set():
            found = await loop.run_in_executor(None, scrape, metrics_url)
            if found["gpu"]:
                samples.append(sum(found["gpu"].values()) / len(found["gpu"]))
            await asyncio.sleep(SAMPLE_EVERY_S)

    before = await loop.run_in_executor(None, scrape, metrics_url)
    task = asyncio.create_task(sampler())
    try:
        run = await load(address, concurrency, seconds, request_pool(entry.name), warm_s=warm_s)
    finally:
        stop.set()
        await task
    after = await loop.run_in_executor(None, scrape, metrics_url)
    rows = after["inferences"].get(entry.name, 0.0) - before["inferences"].get(entry.name, 0.0)
    executions = after["executions"].get(entry.name, 0.0) - before["executions"].get(entry.name, 0.0)
    return Cell(
        entry,
        concurrency,
        run.throughput,
        run.pct(0.50),
        run.pct(0.99),
        len(run.latencies),
        dict(run.errors),
        rows / executions if executions else None,
        sum(samples) / len(samples) if samples else None,
        samples,
    )


def serve_and_drive(
    models: Path,
    folders: dict[str, Path],
    entries: Sequence[Entry],
    concurrency: Sequence[int],
    seconds: float,
    warm_s: float,
    work: Path,
    log_dir: Path,
    deadline: float,
    on_cell: Callable[[Cell], None],
    say: Callable[[str], None],
    skip: Callable[[str, str], None],
) -> list[Cell]:
    """Serve every entry from one model service (this interpreter, so the GPU machine's python and its carried
    packages) and measure each entry at each concurrency, stopping at `deadline` (time.monotonic)."""
    from bench.lib.serving import ServerProcess, free_port, model_service_env

    repo = work / "served"
    write_repository(models, folders, entries, repo)
    port = free_port()
    env = {**model_service_env(repo, port), "MESHSERVE_MODEL_WATCH": "false"}
    metrics_url = f"http://127.0.0.1:{env['MESHSERVE_MODEL_METRICS_PORT']}/metrics"
    argv = [sys.executable, "-m", "services.model"]
    server = ServerProcess("gpu-check-model-service", argv, port, env, log_dir=work / "logs")
    cells: list[Cell] = []
    try:
        waited = server.wait_ready(timeout_s=min(READY_MOST_S, max(30.0, deadline - time.monotonic())))
        ready = ready_models(server.url, [e.name for e in entries])
        say(f"model service ({sys.executable}) serving {len(ready)} of {len(entries)} entries after {waited:.1f} s")
        for entry in entries:
            if entry.name not in ready:
                skip(f"served {entry.name}", f"not ready in the model service: {ready_reason(server.url, entry.name)}")
                continue
            for c in concurrency:
                if time.monotonic() + seconds + warm_s > deadline:
                    skip(f"served {entry.name} c={c}", "time budget spent")
                    continue
                cell = asyncio.run(run_cell(server.url, metrics_url, entry, c, seconds, warm_s))
                cells.append(cell)
                on_cell(cell)
    finally:
        server.stop()
        log_dir.mkdir(parents=True, exist_ok=True)
        (log_dir / "model-service.log").write_text(server.log_path.read_text(errors="replace")[-200_000:])
    return cells
