"""Configurations of the model service side by side: each variant in its own server, alternated in one run.

A variant changes the model's config.yaml (`config`, e.g. {"backend": "torchscript"}; `dynamic_batching.<knob>`
for a batching knob), the service's environment (`env`), or runs another checkout (`tree`, which needs the same
models and .venv); `floor` is the bare gRPC server. Each variant's server holds the one model asked for (fraud_mlp
or the heavy model of bench.model_service), and perf_analyzer measures it at each concurrency, `--rounds` times in
turn:

    python -m bench.experiments.model_variants '{"floor": {}, "inline": {"config": {"execution": "inline"}},
        "thread": {"config": {"execution": "thread"}}}' --model fraud_mlp --concurrency 1,32 --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.lib.model_repo import FRAUD, HEAVY, heavy_file, write_variant
from bench.lib.perf_analyzer import PerfAnalyzerError, ensure_perf_analyzer, run_perf_analyzer
from bench.lib.serving import ServerProcess, floor_argv, free_port, model_service_argv, model_service_env, running


@contextlib.contextmanager
def serve(name: str, spec: dict[str, Any], repo: Path, model: str) -> Iterator[ServerProcess]:
    port = free_port()
    if name == "floor":
        with running(name, floor_argv(port), port, health=False, models=[model]) as server:
            yield server
        return
    env = {**model_service_env(repo, port), **spec.get("env", {})}
    tree = spec.get("tree")
    if tree is None:
        with running(name, model_service_argv(), port, env, health=True, models=[model]) as server:
            yield server
        return
    argv = [model_service_argv()[0], "-m", "services.model"]
    server = ServerProcess(name, argv, port, {**env, "PYTHONPATH": tree}, cwd=Path(tree))
    try:
        server.wait_ready(health=True, models=[model])
        yield server
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.model_variants", description=__doc__)
    parser.add_argument("variants", help="JSON object: name -> {config, env, tree}")
    parser.add_argument("--model", default=FRAUD, choices=(FRAUD, HEAVY))
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated perf_analyzer concurrencies")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--measurement-ms", type=int, default=3000)
    args = parser.parse_args(argv)
    variants: dict[str, dict[str, Any]] = json.loads(args.variants)
    levels = [int(c) for c in args.concurrency.split(",")]
    ensure_perf_analyzer()
    results: dict[tuple[str, int], list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="meshserve-variants-") as tmp_name:
        tmp = Path(tmp_name)
        for name, spec in variants.items():
            if name != "floor":
                write_variant(tmp / name, args.model, heavy_file(), spec.get("config", {}))
        for round_no in range(args.rounds):
            for name, spec in variants.items():
                with serve(name, spec, tmp / name, args.model) as server:
                    for c in levels:
                        try:
                            r = run_perf_analyzer(args.model, server.url, c, measurement_ms=args.measurement_ms)
                        except PerfAnalyzerError as exc:
                            cell = f"FAILED ({str(exc).splitlines()[0][:80]})"
                        else:
                            cell = f"{r.throughput:,.0f}/s p50 {r.p50_ms:.2f} p99 {r.p99_ms:.2f}"
                        results.setdefault((name, c), []).append(cell)
                        print(f"round {round_no + 1} {name:<24} c={c:<3} {cell}", flush=True)
    print(f"\n{args.model}, perf_analyzer batch-1 requests, each round in turn:")
    for c in levels:
        for name in variants:
            print(f"  c={c:<3} {name:<24} " + " | ".join(results.get((name, c), [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
