"""The whole stack's CPU per request on all-miss traffic, in short windows, with how many requests each batched
downstream call of the gateway served (`python -m bench.experiments.cpu_window`, about a minute; not in
`make bench`).

For comparing two trees quickly: run it in each, alternated, e.g.
`for t in /tmp/old /tmp/new; do (cd $t && .venv/bin/python -m bench.experiments.cpu_window); done`.
It starts the stack as `bench.stack` does (`meshserve up --insecure`), warms it for 2 s, then runs `--windows`
perf_analyzer windows of all-miss traffic at `--concurrency` (each window fresh transactions), each with
`bench.stack`'s per-process CPU table and the mean requests per call of each stage
(`meshserve_gateway_batch_requests`, read before and after).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from bench import stack as bench_stack
from bench.lib.fraud_load import gateway_metric_samples
from bench.lib.local_stack import local_stack
from bench.lib.perf_analyzer import ensure_perf_analyzer
from services.cli.stack.credentials import state_internal_token
from services.cli.stack.state import read_state

BATCH_REQUESTS = "meshserve_gateway_batch_requests"


def batch_sums(state: Mapping[str, object]) -> dict[tuple[str, str], float]:
    """(stage, "sum" or "count") -> the fraud pipeline's batch-requests histogram over every gateway now."""
    out: dict[tuple[str, str], float] = {}
    services = state.get("services", [])
    assert isinstance(services, list)
    for service in services:
        if bench_stack.process_column(str(service.get("name", ""))) != "gateway" or not service.get("metrics_port"):
            continue
        for sample in gateway_metric_samples(int(service["metrics_port"]), state_internal_token(dict(state))):
            kind = sample.name.removeprefix(f"{BATCH_REQUESTS}_")
            if kind in ("sum", "count") and sample.labels.get("pipeline") == bench_stack.PIPELINE:
                key = (sample.labels.get("stage", ""), kind)
                out[key] = out.get(key, 0.0) + sample.value
    return out


def requests_per_call(before: Mapping[tuple[str, str], float], after: Mapping[tuple[str, str], float]) -> dict:
    """stage -> mean requests per downstream call between two `batch_sums` readings (stages with no call left out)."""
    out = {}
    for stage in sorted({stage for stage, _ in after}):
        calls = after.get((stage, "count"), 0.0) - before.get((stage, "count"), 0.0)
        if calls > 0:
            out[stage] = round((after.get((stage, "sum"), 0.0) - before.get((stage, "sum"), 0.0)) / calls, 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.experiments.cpu_window", description=__doc__)
    parser.add_argument("--windows", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--measurement-ms", type=int, default=4000)
    args = parser.parse_args(argv)
    ensure_perf_analyzer()
    with tempfile.TemporaryDirectory(prefix="meshserve-cpu-window-") as tmp:
        data = bench_stack.InputFiles(Path(tmp), bench_stack.TRANSACTIONS, int(time.time()) - 7200)
        with local_stack(Path(tmp) / "logs", ["--insecure"]) as running:
            state = read_state(running.log_dir) or running.state
            bench_stack.measure("warm", running.ingress, bench_stack.PIPELINE, args.concurrency, 2000, data)
            cells = []
            for _ in range(args.windows):
                before = batch_sums(state)
                cells.append(
                    bench_stack.measure_cpu(running, bench_stack.ALL_MISS, args.concurrency, args.measurement_ms, data)
                )
                print(f"    requests per call: {requests_per_call(before, batch_sums(state))}", flush=True)
    bench_stack.print_cpu(cells, bench_stack.cpu.USD_PER_VCPU_HOUR)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
