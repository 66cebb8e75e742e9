"""`make gpu-check`: every GPU path of the model service this machine can run, measured; a one-line skip elsewhere.

On a machine with an NVIDIA GPU it says which paths are present and which are missing (and why), runs the GPU
tests (tests/gpu), measures the heavy model in process (rows/s at batch 1 and 32) and served under perf_analyzer
(c=1 and c=32) on each path beside ONNX Runtime on the CPU, reads GPU memory across 20 reloads, and turns the
served throughput into a cost per million inferences at the list prices below. Figures go to
bench/results/latest.json under `gpu_check.`.

    python -m tests.gpu.check [--measurement-ms 3000] [--price T4=0.526 ...]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from services.model.backends.gpu import gpus, memory_used, why_no_gpu
from tests.gpu.variants import HEAVY, ROOT, VARIANTS, Variant, missing, variant_config

RELOADS = 20
BATCHES = (1, 32)
CONCURRENCY = (1, 32)
# On-demand list prices, USD per hour, AWS EC2 Linux in us-east-1, one GPU per instance. g5.xlarge as a rate card of
# 2026-06-17 gives it; g4dn.xlarge and g6.xlarge as AWS listed them when this was written (2026-12-03), not re-read
# since: pass --price to use today's.
PRICES = {"T4": ("g4dn.xlarge", 0.526), "L4": ("g6.xlarge", 0.8048), "A10G": ("g5.xlarge", 1.006)}
PRICES_DATED = "2026-12-03"
CPU = Variant("onnxruntime CPU", "onnxruntime", "FP32", {"backend": "onnxruntime", "device": "cpu"})


def cost_per_million(price_per_hour: float, inferences_per_second: float) -> float:
    """USD per million inferences on an instance at `price_per_hour` serving `inferences_per_second` flat out."""
    return price_per_hour / (inferences_per_second * 3600.0) * 1e6


def run_gpu_tests() -> int:
    """pytest on tests/gpu (its own process: TensorRT and CUDA state stay out of this one); its exit status."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/gpu"]
    print(f"\n$ {' '.join(command[1:])}", flush=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def in_process(variant: Variant) -> dict[int, float]:
    """Rows/s of the heavy model's forward at each batch size through `variant`'s backend."""
    from bench.lib.rates import rows_per_second
    from services.model.backends import get_backend
    from services.model.config import ModelConfig

    config = ModelConfig.model_validate(variant_config(HEAVY, variant, 1))
    model = get_backend(config.backend).load(HEAVY / "1", config, 1)
    try:
        rates = {}
        for batch in BATCHES:
            x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
            rates[batch] = rows_per_second(lambda x=x: model.forward({"features": x}), batch)
        return rates
    finally:
        model.unload()


def served(variant: Variant, tmp: Path, measurement_ms: int) -> dict[int, Any]:
    """perf_analyzer against the model service serving the heavy model through `variant`, at each concurrency."""
    from bench.lib.perf_analyzer import PerfAnalyzerError, run_perf_analyzer
    from bench.lib.serving import free_port, model_service_argv, model_service_env, running

    repo = tmp / variant.name.replace(" ", "_")
    shutil.copytree(HEAVY / "1", repo / "heavy_mlp" / "1")
    (repo / "heavy_mlp" / "config.yaml").write_text(yaml.safe_dump(variant_config(HEAVY, variant, 1)))
    port = free_port()
    found: dict[int, Any] = {}
    with running(variant.name, model_service_argv(), port, model_service_env(repo, port), models=["heavy_mlp"]) as srv:
        for c in CONCURRENCY:
            try:
                found[c] = run_perf_analyzer("heavy_mlp", srv.url, c, measurement_ms=measurement_ms)
            except PerfAnalyzerError as exc:
                print(f"  {variant.name} c={c}: perf_analyzer failed: {str(exc).splitlines()[0]}", flush=True)
    return found


async def reload_memory(variant: Variant, tmp: Path, cycles: int = RELOADS) -> tuple[int, int]:
    """GPU memory in use (bytes) after one load and unload of the heavy model, and after `cycles` more."""
    from services.model.manager import ModelManager
    from services.model.repository import ModelRepository

    repo = tmp / f"reload-{variant.name.replace(' ', '_')}"
    shutil.copytree(HEAVY / "1", repo / "heavy_mlp" / "1")
    (repo / "heavy_mlp" / "config.yaml").write_text(yaml.safe_dump(variant_config(HEAVY, variant, 1)))
    manager = ModelManager(ModelRepository(repo), drain_timeout_s=5.0)
    await manager.load("heavy_mlp")
    await manager.unload("heavy_mlp")
    await asyncio.sleep(0.5)
    baseline = memory_used()
    for _ in range(cycles):
        await manager.load("heavy_mlp")
        await manager.unload("heavy_mlp")
    await asyncio.sleep(0.5)
    return baseline, memory_used()


def parse_prices(values: list[str]) -> dict[str, tuple[str, float]]:
    prices = dict(PRICES)
    for value in values:
        gpu, _, price = value.partition("=")
        if gpu not in prices or not price:
            raise SystemExit(f"--price {value!r}: expected one of {', '.join(prices)}=<USD per hour>")
        prices[gpu] = (prices[gpu][0], float(price))
    return prices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu.check", description=__doc__.split("\n")[0])
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--price", action="append", default=[], help="GPU=USD/hour, e.g. L4=0.80 (T4, L4, A10G)")
    parser.add_argument("--skip-tests", action="store_true", help="measure only")
    args = parser.parse_args(argv)
    reason = why_no_gpu()
    if reason is not None:
        print(f"gpu-check: skipped, no NVIDIA GPU here ({reason}); no GPU figure measured")
        return 0
    if not (HEAVY / "1" / "model.onnx").is_file():
        print(f"gpu-check: {HEAVY.relative_to(ROOT)} is not built: run `make models` first", file=sys.stderr)
        return 1
    prices = parse_prices(args.price)
    from bench.lib import results

    gpu = gpus()[0]
    print(
        f"GPU 0: {gpu.name}, compute capability {gpu.compute_capability[0]}.{gpu.compute_capability[1]}, "
        f"{gpu.memory_total / 2**30:.0f} GiB"
    )
    present = []
    for variant in VARIANTS:
        why = missing(variant)
        print(f"  {variant.name:<30} {'present' if why is None else 'missing: ' + why}")
        if why is None:
            present.append(variant)
    failed = 0 if args.skip_tests else run_gpu_tests()
    command = "python -m tests.gpu.check" + (
        f" --measurement-ms {args.measurement_ms}" if args.measurement_ms != 3000 else ""
    )
    figures: list[dict[str, Any]] = []

    def fig(name: str, value: float | None, unit: str, versus: str = "") -> None:
        figures.append(results.figure(f"gpu_check.{name}", value, unit, f"{gpu.name}; {versus}".rstrip("; "), command))

    rows = []
    with tempfile.TemporaryDirectory(prefix="meshserve-gpu-check-") as tmp_name:
        tmp = Path(tmp_name)
        for variant in [CPU, *present]:
            key = variant.name.replace(" ", "_")
            started = time.monotonic()
            rates = in_process(variant)
            perf = served(variant, tmp, args.measurement_ms)
            memory = asyncio.run(reload_memory(variant, tmp)) if variant is not CPU else None
            for batch, rate in rates.items():
                fig(f"heavy_mlp.{key}.in_process.b{batch}", rate, "rows/s", "onnxruntime CPU in process")
            for c, r in perf.items():
                fig(
                    f"heavy_mlp.{key}.served.c{c}.throughput",
                    r.throughput,
                    "infer/s",
                    "perf_analyzer, batch-1 requests",
                )
                fig(f"heavy_mlp.{key}.served.c{c}.p99", r.p99_ms, "ms")
            if memory is not None:
                fig(
                    f"heavy_mlp.{key}.reload_memory_growth",
                    (memory[1] - memory[0]) / 2**20,
                    "MiB",
                    f"{RELOADS} reloads",
                )
            best = max((r.throughput for r in perf.values()), default=None)
            costs = {g: cost_per_million(p, best) if best else None for g, (_, p) in prices.items()}
            for g, cost in costs.items():
                fig(
                    f"heavy_mlp.{key}.usd_per_million.{g}",
                    cost,
                    "USD",
                    f"{prices[g][0]} at ${prices[g][1]}/h ({PRICES_DATED})",
                )
            rows.append(
                [
                    variant.name,
                    rates.get(1),
                    rates.get(32),
                    *(perf[c].throughput if c in perf else None for c in CONCURRENCY),
                    None if memory is None else (memory[1] - memory[0]) / 2**20,
                    *costs.values(),
                ]
            )
            print(f"  measured {variant.name} in {time.monotonic() - started:.0f} s", flush=True)
    results.print_table(
        [
            "heavy_mlp path",
            "b1 rows/s",
            "b32 rows/s",
            "c=1 infer/s",
            "c=32 infer/s",
            f"{RELOADS} reloads MiB",
            *(f"$/1M {g}" for g in prices),
        ],
        rows,
        title=f"heavy_mlp on {gpu.name} (cost: best served throughput at {PRICES_DATED} list prices)",
    )
    print("cost per million = USD per hour / (inferences per second x 3600) x 1e6, with the throughput measured here")
    results.record(figures)
    print(f"recorded {len(figures)} figures in {results.LATEST.relative_to(ROOT)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
