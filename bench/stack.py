"""`python -m bench.stack`: the whole local stack (`meshserve up`: Envoy ingress and sidecar listeners, every service)
under perf_analyzer with distinct fraud transactions, beside a bare gRPC server in the same run, with its
two targets (c=1 p50 and c=8 throughput, each relative to the bare server), then the CPU each process of the stack
spends per request on all-miss and Zipf traffic and what a million requests cost at a price per vCPU-hour, with the
cost targets (all-miss c=32 CPU per request in all and in the gateway, and the c=1 p50 in ms)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from bench.lib import cpu, results
from bench.lib.fraud_load import gateway_metric_samples, transaction_values
from bench.lib.local_stack import RunningStack, local_stack
from bench.lib.perf_analyzer import PerfAnalyzerError, PerfResult, ensure_perf_analyzer, run_perf_analyzer
from bench.lib.results import ratio
from bench.lib.serving import ROOT, ServerStartError, floor_argv, free_port, running
from bench.pipeline import zipf_ranks
from services.cli.stack.credentials import state_internal_token
from services.cli.stack.state import read_state
from services.mesh.admin import EnvoyAdmin

if TYPE_CHECKING:
    from services.traces.analysis import Node, Trace

COMMAND = "python -m bench.stack"
PREFIX = "stack"
PIPELINE = "fraud"
FLOOR_MODEL = "fraud_mlp"  # the floor answers any model with the same config; fraud_mlp's shape, as bench.model_service
CONCURRENCY = (1, 8)
TRANSACTIONS = 20_000
STACK, FLOOR = "stack", "floor"
INGRESS_STAGE = "envoy.ingress"
CPU_CONCURRENCY = (1, 8, 32)
ALL_MISS, ZIPF = "all-miss", "Zipf"
ZIPF_POOL = 2_000  # distinct transactions the Zipf(1.1) stream draws from, as bench.pipeline's
ZIPF_REQUESTS = 20_000  # requests in its perf_analyzer file (sent in turn, round and round)
# The CPU table's columns: the stack's processes (stack.json's services) by what they run.
# `other`: a service stack.json lists that none of the named columns is (the supervisor, `meshserve up` itself, is
# not a service of the stack and is not counted).
PROCESSES = ("gateway", "Envoy", "cache", "feature", "model", "trace store", "Valkey", "other")
INGRESS_REQUESTS = "http.ingress.downstream_rq_completed"  # Envoy's count of the ingress's finished requests

# The targets, each against the bare server measured in the same run.
C1_P50_MOST = 6.0  # stack c=1 p50 <= 6 x the floor's
# Stack c=8 req/s / floor c=8 infer/s: at least 3 x the ratio of the run that set the targets (bench/README.md).
C8_THROUGHPUT_LEAST = 3 * 80.0 / 2261.0
# The cost issue's targets (bench/README.md, "CPU per request"): all-miss c=32 with tracing as the default runs it.
COST_C = 32
TOTAL_MS_MOST = 1.6  # CPU ms per request over every process of the stack
GATEWAY_MS_MOST = 0.6  # the gateway's share of it
C1_P50_MS_MOST = 5.0  # the stack's c=1 p50, in ms (not a ratio)


def transaction_entry(i: int, t0: int) -> dict[str, list[Any]]:
    """One fraud transaction as perf_analyzer's --input-data wants it: each input's values as a flat list."""
    return {
        name: [value] if isinstance(value, str) else [x.item() for x in value.reshape(-1)]
        for name, value in transaction_values(i, t0).items()
    }


def write_input_data(path: Path, first: int, n: int, t0: int) -> Path:
    """An --input-data file of the n distinct transactions first .. first + n - 1 (perf_analyzer sends them in turn)."""
    path.write_text(json.dumps({"data": [transaction_entry(i, t0) for i in range(first, first + n)]}))
    return path


class InputFiles:
    """A fresh file of distinct transactions per perf_analyzer run, so that no run meets another's in the cache."""

    def __init__(self, folder: Path, n: int, t0: int) -> None:
        self.folder = folder
        self.n = n
        self.t0 = t0
        self.made = 0

    def next(self) -> Path:
        index = self.made
        self.made += 1
        return write_input_data(self.folder / f"transactions-{index}.json", index * self.n, self.n, self.t0)

    def zipf(self, pool: int = ZIPF_POOL, n: int = ZIPF_REQUESTS) -> SameFile:
        """A file of n transactions in Zipf(1.1) order over `pool` transactions no other file holds."""
        index = self.made
        self.made += 1
        first = index * self.n
        ranks = zipf_ranks(min(pool, self.n), n, seed=99)
        rows = {rank: transaction_entry(first + rank, self.t0) for rank in set(ranks)}
        entries = [rows[rank] for rank in ranks]
        path = self.folder / f"zipf-{index}.json"
        path.write_text(json.dumps({"data": entries}))
        return SameFile(path)


class SameFile:
    """One --input-data file for every run (the Zipf stream: its repeats are the point)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def next(self) -> Path:
        return self.path


# ----------------------------------------------------------------------------- figures (pure)


@dataclass(frozen=True)
class Target:
    """One target: a measured ratio against a threshold."""

    name: str
    label: str
    value: float | None
    threshold: float
    at_most: bool  # True: value <= threshold passes; False: value >= threshold passes

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "n/a"
        ok = self.value <= self.threshold if self.at_most else self.value >= self.threshold
        return "PASS" if ok else "FAIL"

    @property
    def bound(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.threshold:.3g}"


def targets(stack: dict[int, PerfResult], floor: dict[int, PerfResult]) -> list[Target]:
    """The c=1 p50 ratio (stack / floor, at most 6) and the c=8 throughput ratio (at least 3 x 80 / 2,261)."""
    s1, f1, s8, f8 = stack.get(1), floor.get(1), stack.get(8), floor.get(8)
    return [
        Target(
            "target.c1_p50_vs_floor",
            "c=1 p50, stack / bare server",
            ratio(s1.p50_us if s1 else None, f1.p50_us if f1 else None),
            C1_P50_MOST,
            at_most=True,
        ),
        Target(
            "target.c8_throughput_vs_floor",
            "c=8 req/s, stack / bare server",
            ratio(s8.throughput if s8 else None, f8.throughput if f8 else None),
            C8_THROUGHPUT_LEAST,
            at_most=False,
        ),
    ]


def cost_targets(stack: dict[int, PerfResult], cells: Sequence[CpuCell]) -> list[Target]:
    """The cost issue's targets: all-miss c=32 CPU ms per request in all and in the gateway, and the c=1 p50 in ms
    (n/a without the cell or the run that measures each)."""
    cell = next((c for c in cells if c.traffic == ALL_MISS and c.concurrency == COST_C), None)
    ms = cell.per_request_ms if cell is not None else None
    s1 = stack.get(1)
    return [
        Target(
            f"target.all_miss_c{COST_C}_total_cpu_ms",
            f"all-miss c={COST_C}: CPU ms per request, whole stack",
            ms.get(cpu.TOTAL) if ms else None,
            TOTAL_MS_MOST,
            at_most=True,
        ),
        Target(
            f"target.all_miss_c{COST_C}_gateway_cpu_ms",
            f"all-miss c={COST_C}: CPU ms per request, gateway",
            ms.get("gateway") if ms else None,
            GATEWAY_MS_MOST,
            at_most=True,
        ),
        Target("target.c1_p50_ms", "c=1 p50 ms, whole stack", s1.p50_ms if s1 else None, C1_P50_MS_MOST, at_most=True),
    ]


def median_result(runs: Sequence[PerfResult]) -> PerfResult:
    """The run with the median p50 (over rounds: one real measurement, not a blend of several)."""
    ordered = sorted(runs, key=lambda r: r.p50_us)
    return ordered[(len(ordered) - 1) // 2]


def figures(stack: dict[int, PerfResult], floor: dict[int, PerfResult], command: str = COMMAND) -> list[dict[str, Any]]:
    """Every figure of a run for bench/results/latest.json, the targets last."""
    out: list[dict[str, Any]] = []
    for c in sorted(set(stack) | set(floor)):
        for who, measured in ((STACK, stack), (FLOOR, floor)):
            r = measured.get(c)
            if r is None:
                continue
            versus = "" if who == FLOOR else f"the bare grpc.aio server (bench.lib.floor_server) at c={c}, same run"
            shown = f"{command} -> {r.command}"
            out += [
                results.figure(f"{PREFIX}.{who}.c{c}.throughput", round(r.throughput, 1), "req/s", versus, shown),
                results.figure(f"{PREFIX}.{who}.c{c}.p50", round(r.p50_ms, 3), "ms", versus, shown),
                results.figure(f"{PREFIX}.{who}.c{c}.p99", round(r.p99_ms, 3), "ms", versus, shown),
            ]
    for t in targets(stack, floor):
        value = None if t.value is None else round(t.value, 4)
        out.append(results.figure(f"{PREFIX}.{t.name}", value, "ratio", f"the bare server; target {t.bound}", command))
    return out


def table_rows(stack: dict[int, PerfResult], floor: dict[int, PerfResult]) -> list[list[Any]]:
    """One row per concurrency: stack and floor req/s, p50, p99, and the stack / floor ratios."""
    rows = []
    for c in sorted(set(stack) | set(floor)):
        s, f = stack.get(c), floor.get(c)
        rows.append(
            [
                c,
                s.throughput if s else None,
                s.p50_ms if s else None,
                s.p99_ms if s else None,
                f.throughput if f else None,
                f.p50_ms if f else None,
                f.p99_ms if f else None,
                ratio(s.throughput if s else None, f.throughput if f else None),
                ratio(s.p50_us if s else None, f.p50_us if f else None),
            ]
        )
    return rows


@dataclass
class CpuCell:
    """One perf_analyzer run of the CPU table: its traffic and concurrency, the run (None: perf_analyzer gave no
    stable measurement, or failed), the requests the gateways answered OK and the CPU seconds each column's processes
    spent over the run, how long it took, and the cache hit ratio."""

    traffic: str
    concurrency: int
    perf: PerfResult | None
    answers: int
    seconds: dict[str, float]
    elapsed_s: float = 0.0
    hits: float | None = None

    @property
    def per_request_ms(self) -> dict[str, float] | None:
        """CPU ms per request per column and in all: whenever the gateways answered, since CPU and answers
        are read over the same time whether or not perf_analyzer's latency windows agreed."""
        return cpu.per_request_ms(self.seconds, self.answers)

    @property
    def rate(self) -> float | str | None:
        """perf_analyzer's req/s; without its measurement (it did not stabilise, or stopped at an error), `~N`: the
        gateways' answers over the run's wall time."""
        if self.perf is not None:
            return self.perf.throughput
        return f"~{self.answers / self.elapsed_s:,.0f}" if self.answers and self.elapsed_s else None


def process_column(name: str) -> str:
    """The CPU table's column of a stack.json service (`model-stable-a` -> model, `gateway-b` -> gateway)."""
    named = {"envoy": "Envoy", "traces": "trace store", "valkey": "Valkey", "feature": "feature", "cache": "cache"}
    if name in named:
        return named[name]
    for prefix in ("gateway", "model"):
        if name == prefix or name.startswith(prefix + "-"):
            return prefix
    return "other"


def stack_processes(state: dict[str, Any]) -> dict[int, str]:
    """pid -> CPU table column of every process stack.json lists (replicas of a service share its column)."""
    out = {}
    for service in state.get("services", []):
        if service.get("pid"):
            out[int(service["pid"])] = process_column(str(service.get("name", "")))
    return out


CPU_HEADERS = ["traffic", "c", "req/s", "p50 ms", "hits", *PROCESSES, "total", "$ per 1M"]


def cpu_rows(cells: Sequence[CpuCell], usd_per_vcpu_hour: float) -> list[list[Any]]:
    """One row per cell: req/s, p50, hit ratio, CPU ms per request per column and in all, and the CPU's cost of a
    million requests (empty cells where the run failed or a column has no process)."""
    rows: list[list[Any]] = []
    for cell in cells:
        ms = cell.per_request_ms
        if ms is None:
            rows.append([cell.traffic, cell.concurrency, *([None] * (len(CPU_HEADERS) - 2))])
            continue
        hits = "-" if cell.hits is None else f"{cell.hits:.0%}"
        p50 = cell.perf.p50_ms if cell.perf is not None else None
        cost = f"{cpu.cost_per_million(ms[cpu.TOTAL], usd_per_vcpu_hour):.3f}"
        processes = [ms.get(p) for p in PROCESSES]
        rows.append([cell.traffic, cell.concurrency, cell.rate, p50, hits, *processes, ms[cpu.TOTAL], cost])
    return rows


def cpu_figures(cells: Sequence[CpuCell], usd_per_vcpu_hour: float, command: str) -> list[dict[str, Any]]:
    """Per cell: CPU ms per request of each column and in all, and the cost of a million requests."""
    out = []
    for cell in cells:
        ms = cell.per_request_ms
        if ms is None:
            continue
        key = f"{PREFIX}.cpu.{cell.traffic.lower().replace('-', '_')}.c{cell.concurrency}"
        versus = f"{cell.answers:,} requests answered OK, /proc utime+stime over the same perf_analyzer run"
        for column in (*PROCESSES, cpu.TOTAL):
            if column in ms:
                slug = column.lower().replace(" ", "_")
                out.append(results.figure(f"{key}.{slug}_ms", round(ms[column], 3), "CPU ms/request", versus, command))
        cost = cpu.cost_per_million(ms[cpu.TOTAL], usd_per_vcpu_hour)
        price = f"${usd_per_vcpu_hour:g} per vCPU-hour"
        out.append(results.figure(f"{key}.usd_per_million", round(cost, 4), "USD", price, command))
    return out


# ----------------------------------------------------------------------------- the run


def request_traces(db: Path, since_ns: int) -> list[Trace]:
    """The complete request traces (rooted at the ingress, not housekeeping) the stack stored since `since_ns`: the
    ingress samples 10% of new traces (istio/telemetry.yaml)."""
    from services.traces.analysis import assemble, select
    from services.traces.store import TraceStore

    if not db.exists():
        return []
    with TraceStore(db) as store:
        rows = store.recent_traces(None, since_ns)
        traces = select(assemble(store.spans(r.trace_id for r in rows)), None, since_ns)
    return [t for t in traces if t.complete and t.root.stage == INGRESS_STAGE]


LEGS = ("caller to Envoy", "Envoy to callee", "callee", "callee to Envoy", "Envoy to caller")


def hop_legs(traces: Sequence[Trace]) -> dict[str, list[dict[str, float]]]:
    """Per mesh hop (`<service> <Method>`), the legs of every call through it, in milliseconds.

    A hop is an Envoy listener's server span L, its upstream span U (Envoy's call to the replica), the callee's own
    server span R under U, and C, the caller's span that L is a child of. The legs: L.start - C.start (the caller
    sends, Envoy reads), R.start - U.start (Envoy sends, the callee's server reaches its handler), R itself,
    U.end - R.end (the callee's answer reaches Envoy), C.end - L.end (Envoy's answer reaches the caller's code).
    The ingress has no caller span (the client's), so its calls lack the first and last legs.
    """
    out: dict[str, list[dict[str, float]]] = {}
    for trace in traces:
        parents: dict[int, Node] = {id(c): n for n in trace.nodes for c in n.children}
        for upstream in trace.nodes:
            if not (upstream.stage.startswith("envoy.") and upstream.stage.endswith(".upstream")):
                continue
            callee = next((c for c in upstream.children if c.stage.endswith(".rpc")), None)
            listener = parents.get(id(upstream))
            if callee is None or listener is None:
                continue
            u, r, ls = upstream.span, callee.span, listener.span
            call = {
                "Envoy to callee": (r.start_ns - u.start_ns) / 1e6,
                "callee": r.duration_ns / 1e6,
                "callee to Envoy": (u.end_ns - r.end_ns) / 1e6,
            }
            caller = parents.get(id(listener))
            if caller is not None:
                call["caller to Envoy"] = (ls.start_ns - caller.span.start_ns) / 1e6
                call["Envoy to caller"] = (caller.span.end_ns - ls.end_ns) / 1e6
            hop = f"{callee.stage.removesuffix('.rpc')} {r.name.rsplit('/', 1)[-1]}"
            out.setdefault(hop, []).append(call)
    return out


def hop_rows(legs: dict[str, list[dict[str, float]]]) -> list[list[Any]]:
    """Table rows: hop, calls, the p50 of each leg (None where no call has it), and the p50 of each call's time
    outside the callee (its legs but `callee`, summed)."""
    rows = []
    for hop, calls in legs.items():
        medians = []
        for leg in LEGS:
            values = [c[leg] for c in calls if leg in c]
            medians.append(statistics.median(values) if values else None)
        outside = statistics.median(sum(v for k, v in c.items() if k != "callee") for c in calls)
        rows.append([hop, len(calls), *medians, outside])
    return rows


def stage_rows(traces: Sequence[Trace], least_share: float = 0.02) -> list[list[Any]]:
    """Table rows: end to end, then every stage with at least `least_share` of it (self time p50, share)."""
    from services.traces.analysis import breakdown

    if not traces:
        return []
    result = breakdown(traces, slowest=0)
    rows: list[list[Any]] = [["end to end", len(traces), result.e2e_p50_ns / 1e6, "100%"]]
    for s in sorted(result.stages, key=lambda s: -s.share):
        if s.share >= least_share:
            rows.append([s.stage, s.traces, s.self_p50_ns / 1e6, f"{s.share:.0%}"])
    return rows


class Inputs(Protocol):
    """Where each perf_analyzer run's --input-data file comes from (InputFiles: a fresh one per run)."""

    def next(self) -> Path: ...


def measure(name: str, url: str, model: str, c: int, measurement_ms: int, data: Inputs | None) -> PerfResult | None:
    """One perf_analyzer run (one retry with a doubled window, on fresh transactions, if it cannot stabilise)."""
    print(f"  {name:<6} c={c:<2} ...", end="", flush=True)
    for window in (measurement_ms, 2 * measurement_ms):
        extra = ["--input-data", str(data.next())] if data is not None else []
        try:
            r = run_perf_analyzer(model, url, c, measurement_ms=window, extra=extra, retries=0)
        except PerfAnalyzerError as exc:
            if "Failed to obtain stable measurement" in str(exc) and window == measurement_ms:
                continue
            print(f" FAILED\n{exc}", flush=True)
            return None
        print(f" {r.throughput:8,.1f} req/s  p50 {r.p50_ms:7.2f} ms  p99 {r.p99_ms:7.2f} ms", flush=True)
        return r
    return None


def gateway_outcomes(state: dict[str, Any]) -> dict[tuple[str, str], float]:
    """The stack's fraud requests so far by (gRPC code, cache outcome), summed over its gateways' /metrics."""
    counts: dict[tuple[str, str], float] = {}
    for service in state.get("services", []):
        if process_column(str(service.get("name", ""))) != "gateway" or not service.get("metrics_port"):
            continue
        for sample in gateway_metric_samples(int(service["metrics_port"]), state_internal_token(state)):
            if sample.name == "meshserve_gateway_requests_total" and sample.labels.get("pipeline") == PIPELINE:
                key = (sample.labels.get("code", ""), sample.labels.get("cache", ""))
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def answers_between(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> tuple[int, float | None]:
    """The requests the gateways answered OK between two gateway_outcomes readings, and the share of those the
    cache gave (None without answers)."""
    ok = {cache: v - before.get((code, cache), 0.0) for (code, cache), v in after.items() if code == "OK"}
    answers = sum(ok.values())
    return int(answers), (ok.get("hit", 0.0) / answers if answers > 0 else None)


def ingress_requests(state: dict[str, Any]) -> int | None:
    """The requests Envoy's ingress has finished so far, answered or not (None without the mesh)."""
    return EnvoyAdmin(str(state["admin"])).stat(INGRESS_REQUESTS) if state.get("admin") else None


def measure_cpu(stack: RunningStack, traffic: str, c: int, measurement_ms: int, inputs: Inputs) -> CpuCell:
    """One perf_analyzer run, every process's CPU read from /proc before and after it, and the answers the gateways
    gave over the same time (the counters are read outside the CPU window: reading them costs CPU too).

    The answers are the gateways' OK ones: Envoy's ingress count holds requests it refused or that failed too (its
    in-flight bound, or its adaptive limit where it is on, answers some itself); with none, the two agree."""
    state = read_state(stack.log_dir) or stack.state  # the supervisor rewrites it when it restarts a process
    outcomes, at_ingress = gateway_outcomes(state), ingress_requests(state)
    before, began = cpu.snapshot(), time.monotonic()
    r = measure(traffic, stack.ingress, PIPELINE, c, measurement_ms, inputs)
    after, elapsed = cpu.snapshot(), time.monotonic() - began
    answers, hits = answers_between(outcomes, gateway_outcomes(state))
    ingress = None if at_ingress is None else (ingress_requests(state) or 0) - at_ingress
    print(f"    {answers:,} answered OK by the gateways, {'-' if ingress is None else f'{ingress:,}'} at the ingress")
    seconds = cpu.group_seconds(cpu.spent(before, after), stack_processes(state))
    return CpuCell(traffic, c, r, answers, seconds, elapsed, hits)


def cpu_runs(stack: RunningStack, concurrency: Sequence[int], measurement_ms: int, data: InputFiles) -> list[CpuCell]:
    """The CPU table's runs: all-miss (fresh transactions each run), then Zipf(1.1) over a pool of transactions no
    other run sends (one file for the three runs, so the cache holds more of it at each)."""
    print("[cpu] per-process CPU (/proc) over each run, against the requests the gateways answered OK", flush=True)
    zipf = data.zipf()
    cells = []
    for traffic, inputs in ((ALL_MISS, data), (ZIPF, zipf)):
        for c in concurrency:
            cells.append(measure_cpu(stack, traffic, c, measurement_ms, inputs))
    return cells


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__)
    parser.add_argument("--measurement-ms", type=int, default=3000, help="perf_analyzer window (ms)")
    parser.add_argument("--rounds", type=int, default=1, help="alternated rounds (each figure: the median p50 run)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCY))
    parser.add_argument("--transactions", type=int, default=TRANSACTIONS, help="distinct transactions per run")
    parser.add_argument("--up-arg", action="append", default=[], help="an extra `meshserve up` argument (repeatable)")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the stack's processes (repeatable)")
    parser.add_argument("--log-dir", type=Path, help="keep the stack's logs and traces here (default: a temp dir)")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/results/latest.json")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU table's runs")
    parser.add_argument(
        "--cpu-concurrency", type=int, nargs="+", default=list(CPU_CONCURRENCY), help="the CPU table's concurrencies"
    )
    parser.add_argument(
        "--usd-per-vcpu-hour",
        type=float,
        default=cpu.USD_PER_VCPU_HOUR,
        help=f"the price of the CPU table's cost per million requests (default {cpu.USD_PER_VCPU_HOUR}: "
        f"{cpu.PRICE_SOURCE}, https://aws.amazon.com/ec2/pricing/on-demand/)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    env = dict(item.split("=", 1) for item in args.env)
    started = time.monotonic()
    ensure_perf_analyzer()
    stack_runs: dict[int, list[PerfResult]] = {c: [] for c in args.concurrency}
    floor_runs: dict[int, list[PerfResult]] = {c: [] for c in args.concurrency}
    traced: list[Trace] = []
    cpu_cells: list[CpuCell] = []
    with tempfile.TemporaryDirectory(prefix="meshserve-bench-stack-") as tmp:
        log_dir = args.log_dir.resolve() if args.log_dir else Path(tmp) / "logs"
        data = InputFiles(Path(tmp), args.transactions, int(time.time()) - 7200)
        port = free_port()
        print(
            f"[floor] python -m bench.lib.floor_server --port {port}; [stack] meshserve up (logs {log_dir})", flush=True
        )
        try:
            with (
                running(FLOOR, floor_argv(port), port, health=False) as floor,
                # plaintext without tokens, as the floor is and as the targets were set (TLS and the JWT check's
                # own cost: bench/README.md)
                local_stack(log_dir, ["--insecure", *args.up_arg], env) as stack,
            ):
                print(f"  stack ingress {stack.ingress}, floor {floor.url}", flush=True)
                for r in range(args.rounds):
                    if args.rounds > 1:
                        print(f" round {r + 1}/{args.rounds}", flush=True)
                    for c in args.concurrency:
                        f = measure(FLOOR, floor.url, FLOOR_MODEL, c, args.measurement_ms, None)
                        since = time.time_ns()
                        s = measure(STACK, stack.ingress, PIPELINE, c, args.measurement_ms, data)
                        if c == 1:
                            traced += request_traces(log_dir / "traces.sqlite", since)
                        if f is not None:
                            floor_runs[c].append(f)
                        if s is not None:
                            stack_runs[c].append(s)
                if not args.no_cpu:
                    cpu_cells = cpu_runs(stack, args.cpu_concurrency, args.measurement_ms, data)
        except ServerStartError as exc:
            print(f"could not start: {exc}", file=sys.stderr)
            return 1
    stack_r = {c: median_result(v) for c, v in stack_runs.items() if v}
    floor_r = {c: median_result(v) for c, v in floor_runs.items() if v}
    return report(stack_r, floor_r, traced, command, args.no_record, started, cpu_cells, args.usd_per_vcpu_hour)


def report(
    stack: dict[int, PerfResult],
    floor: dict[int, PerfResult],
    traced: Sequence[Trace],
    command: str,
    no_record: bool,
    started: float,
    cpu_cells: Sequence[CpuCell] = (),
    usd_per_vcpu_hour: float = cpu.USD_PER_VCPU_HOUR,
) -> int:
    results.print_table(
        ["conc", "stack req/s", "p50 ms", "p99 ms", "floor req/s", "p50 ms", "p99 ms", "req/s ratio", "p50 ratio"],
        table_rows(stack, floor),
        title="fraud through the whole stack (perf_analyzer, distinct transactions) vs the bare server, same run",
    )
    if traced:
        results.print_table(
            ["stage", "traces", "self p50 ms", "share"],
            stage_rows(traced),
            title=f"where a lone request's time goes: self time per stage ({len(traced)} sampled traces at c=1)",
        )
        results.print_table(
            ["hop", "calls", *(f"{leg} ms" for leg in LEGS), "outside callee ms"],
            hop_rows(hop_legs(traced)),
            title="each mesh hop of those traces, leg by leg (p50)",
        )
    checks = targets(stack, floor) + (cost_targets(stack, cpu_cells) if cpu_cells else [])  # --no-cpu: as before
    results.print_table(
        ["target", "measured", "target", "result"],
        [[t.label, "-" if t.value is None else f"{t.value:.3f}", t.bound, t.verdict] for t in checks],
        title="targets",
    )
    if cpu_cells:
        print_cpu(cpu_cells, usd_per_vcpu_hour)
    if not no_record:
        cost = [
            results.figure(
                f"{PREFIX}.{t.name}", None if t.value is None else round(t.value, 4), "ms", f"target {t.bound}", command
            )
            for t in (cost_targets(stack, cpu_cells) if cpu_cells else [])
        ]
        path = results.record(
            figures(stack, floor, command) + cpu_figures(cpu_cells, usd_per_vcpu_hour, command) + cost
        )
        print(f"\nrecorded in {path.relative_to(ROOT)}")
    print(f"took {time.monotonic() - started:.0f} s")
    return 0 if stack and set(stack) == set(floor) else 1


PEERS = "pipeline_peers"  # bench.peers.pipeline's figures


def peer_rows(recorded: dict[str, dict[str, Any]], usd_per_vcpu_hour: float) -> list[list[Any]]:
    """Per concurrency bench.peers.pipeline recorded: meshserve's and Ray Serve's CPU ms per request there, each with
    the cost of a million requests at this run's price, and when it was recorded."""
    rows = []
    for c in sorted({int(n.split(".")[2][1:]) for n in recorded if n.startswith(PEERS) and n.endswith(".cpu_ms")}):
        row: list[Any] = [c]
        when = ""
        for side in ("meshserve", "ray"):
            f = recorded.get(f"{PEERS}.{side}.c{c}.cpu_ms")
            ms = f["value"] if f is not None else None
            cost = None if ms is None else f"{cpu.cost_per_million(ms, usd_per_vcpu_hour):.3f}"
            row += [ms, cost]
            when = when or (f.get("time", "") if f is not None else "")
        rows.append([*row, when])
    return rows


def print_cpu(cells: Sequence[CpuCell], usd_per_vcpu_hour: float) -> None:
    """The CPU table, then the Ray Serve peer's CPU per request and cost as bench.peers.pipeline last recorded it."""
    price = f"${usd_per_vcpu_hour:g} per vCPU-hour"
    results.print_table(
        CPU_HEADERS,
        cpu_rows(cells, usd_per_vcpu_hour),
        title="CPU ms per request, per process of the stack (/proc utime+stime over each perf_analyzer run, over the "
        f"requests the gateways answered OK in it); $ per 1M requests at {price}",
    )
    peers = peer_rows(results.load(), usd_per_vcpu_hour)
    if not peers:
        print("\nno Ray Serve peer CPU figures recorded yet (`python -m bench.peers.pipeline`)")
        return
    results.print_table(
        ["c", "meshserve CPU ms", "$ per 1M", "ray serve CPU ms", "$ per 1M", "recorded"],
        peers,
        title="the Ray Serve peer as python -m bench.peers.pipeline last recorded it (its own run: meshserve's four "
        f"services without Envoy or the trace store beside Ray Serve 2.60, all-miss, Python client), at {price}",
    )


if __name__ == "__main__":
    sys.exit(main())
