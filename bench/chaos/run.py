"""`python -m bench.chaos` (`make chaos`): the whole local stack through Envoy under steady open-loop load at 50% and
90% of the capacity it measures first, through a scripted sequence of faults, with per-phase figures against issue
15's targets.

The sequence at each level: quiet; SIGKILL a model replica; SIGSTOP another for 10 s; SIGKILL Valkey; SIGSTOP the
feature service for 10 s; SIGKILL the cache service; SIGKILL a gateway; a new model version hot-loaded; the canary
shifted 10 -> 50 -> 100% then rolled back; 3x capacity for 30 s. Each phase keeps the base load running long
enough after its fault to see recovery. The stack is `meshserve up` on free ports with its own log dir and a
private copy of the model repository; the canary replica's pins are widened so the hot-loaded version is served.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import yaml

from bench.chaos import faults as faults
from bench.chaos import report as report
from bench.chaos.load import TEMPLATES, OpenLoop, request_templates
from bench.chaos.phases import (
    FAULT,
    OVERLOAD,
    P99_BOUND_FACTOR,
    QUIET,
    Phase,
    assess_all,
    between,
    capacity,
    count,
    p99_bound_s,
    step_holds,
)
from bench.lib.local_stack import local_stack
from bench.lib.serving import ROOT, ServerStartError

COMMAND = "python -m bench.chaos"
MODEL = "fraud_mlp"
HOT_SOURCE_VERSION = 2  # copied as the next version: the canary replica serves it
CANARY_PINS = list(range(2, 10))  # the canary replica's fraud_mlp versions: today's v2 and the ones hot-loaded
GATEWAY_REPLICAS = 2
RAMP_LEAST_REQUESTS = 300


@dataclass
class Durations:
    """Seconds of each part of the run (flags; --quick shortens them)."""

    settle: float = 3.0  # at a new level's rate before its quiet phase
    quiet: float = 20.0
    lead: float = 3.0  # base load before a fault
    tail: float = 17.0  # base load after a fault ends
    stop: float = 10.0  # how long a SIGSTOPped process stays stopped
    canary: float = 10.0  # each canary step: its whole phase
    overload: float = 30.0
    ramp_step: float = 8.0
    warmup: float = 5.0
    recovery_window: float = 2.0  # recovery compares windows this long with the quiet phase ...
    recovery_hold: float = 4.0  # ... and needs this long of them in a row back to it


QUICK = Durations(
    settle=2.0,
    quiet=6.0,
    lead=1.0,
    tail=6.0,
    stop=4.0,
    canary=5.0,
    overload=8.0,
    ramp_step=2.5,
    warmup=3.0,
    recovery_window=1.0,
    recovery_hold=2.0,
)


@dataclass
class Context:
    """What the script's faults act on."""

    log_dir: Path
    supervisor_pid: int
    models_dir: Path
    load: OpenLoop
    base_rate: float = 0.0
    overload_rate: float = 0.0
    stopped: set[int] = field(default_factory=set)  # SIGSTOPped pids, continued whatever happens


Action = Callable[[Context], Awaitable[str]]


@dataclass(frozen=True)
class Step:
    """One scripted phase: its fault (begin, and end after `hold` seconds), the degradation it may cause."""

    name: str
    begin: Action
    end: Action | None = None
    hold: str = ""  # the Durations field that holds the fault (empty: a single event)
    causes: tuple[str, ...] = ()
    kind: str = FAULT
    length: str = ""  # the Durations field for the whole phase, instead of lead + hold + tail


def kill(prefix: str, nth: int = 0) -> Action:
    async def act(ctx: Context) -> str:
        name, pid = faults.pid_of(ctx.log_dir, prefix, nth)
        faults.send(pid, signal.SIGKILL)
        return f"SIGKILL {name} (pid {pid})"

    return act


def stop(prefix: str, nth: int = 0) -> tuple[Action, Action]:
    held: list[tuple[str, int]] = []

    async def begin(ctx: Context) -> str:
        name, pid = faults.pid_of(ctx.log_dir, prefix, nth)
        faults.send(pid, signal.SIGSTOP)
        ctx.stopped.add(pid)
        held.append((name, pid))
        return f"SIGSTOP {name} (pid {pid})"

    async def end(ctx: Context) -> str:
        name, pid = held.pop()
        ctx.stopped.discard(pid)
        faults.send(pid, signal.SIGCONT)
        return f"SIGCONT {name}"

    return begin, end


async def kill_valkey(ctx: Context) -> str:
    pid = faults.valkey_pid(ctx.log_dir, ctx.supervisor_pid)
    faults.send(pid, signal.SIGKILL)
    return f"SIGKILL valkey (pid {pid})"


async def hot_load(ctx: Context) -> str:
    version = await asyncio.to_thread(faults.hot_load, ctx.models_dir, MODEL, HOT_SOURCE_VERSION)
    return f"copied {MODEL}/{HOT_SOURCE_VERSION} as {MODEL}/{version}"


def canary(percent: int | None) -> Action:
    async def act(ctx: Context) -> str:
        split, changed = await asyncio.to_thread(faults.set_canary, ctx.log_dir, percent)
        return ("" if changed else "already ") + ", ".join(f"{k} {v}%" for k, v in split.items())

    return act


async def overload(ctx: Context) -> str:
    ctx.load.set_rate(ctx.overload_rate)
    return f"{ctx.overload_rate:.0f} req/s"


async def back_to_base(ctx: Context) -> str:
    ctx.load.set_rate(ctx.base_rate)
    return f"back to {ctx.base_rate:.0f} req/s"


_stop_model, _cont_model = stop("model-v1", 1)
_stop_feature, _cont_feature = stop("feature")
# A stalled model replica holds its calls until the pipeline's model budget: the remedies (fallback model, stale
# cache, default) answer them, marked. Valkey and the feature service hold the features. The other faults are
# masked by retries across replicas (model, gateway), a cache that misses fast, or atomic switches.
SCRIPT = [
    Step("kill model replica", kill("model-v1", 0)),
    Step("stop model replica", _stop_model, _cont_model, hold="stop", causes=("model_",)),
    Step("kill valkey", kill_valkey, causes=("features_",)),
    Step("stop feature", _stop_feature, _cont_feature, hold="stop", causes=("features_",)),
    Step("kill cache", kill("cache")),
    Step("kill gateway", kill("gateway")),
    Step("hot-load version", hot_load),
    Step("canary 10%", canary(10), length="canary"),
    Step("canary 50%", canary(50), length="canary"),
    Step("canary 100%", canary(100), length="canary"),
    Step("canary rollback", canary(None), length="canary"),
    Step("overload 3x", overload, back_to_base, hold="overload", kind=OVERLOAD),
]


# ----------------------------------------------------------------------------- the stack


def up_options() -> set[str]:
    """The parameters `meshserve up` has in this tree (flags other helpers add land over time)."""
    from services.cli.main import up

    return set(inspect.signature(up).parameters)


def topology_file(path: Path, gateway_replicas: int, in_topology: bool) -> Path:
    """The demo topology with the canary replica pinned to CANARY_PINS of fraud_mlp (and the gateway replicas where
    the topology holds them)."""
    from services.cli.stack.topology import StackTopology

    topology = StackTopology.demo().model_dump(exclude_none=True)
    if topology.get("canary"):
        topology["canary"].setdefault("pinned_versions", {})[MODEL] = CANARY_PINS
    if in_topology:
        topology["gateway"] = {"replicas": gateway_replicas}
    path.write_text(yaml.safe_dump(topology, sort_keys=False))
    return path


def stack_arguments(
    tmp: Path, models_dir: Path, gateway_replicas: int, secure: bool = False
) -> tuple[list[str], dict[str, Any]]:
    """`meshserve up` arguments for the run and a description of the stack (what this tree could not give)."""
    from services.cli.stack.topology import StackTopology

    options = up_options()
    flag = "gateway_replicas" in options
    in_topology = not flag and "gateway" in StackTopology.model_fields
    topology = topology_file(tmp / "topology.yaml", gateway_replicas, in_topology)
    args = ["--models", str(models_dir), "--topology", str(topology)]
    described: dict[str, Any] = {"mesh": "on (Envoy ingress)"}
    if flag:
        args += ["--gateway-replicas", str(gateway_replicas)]
    if flag or in_topology:
        described["gateway replicas"] = gateway_replicas
    else:
        described["gateway replicas"] = "1 (this tree's `meshserve up` runs one)"
    if secure:
        described["ingress"] = "TLS + JWT (the stack's CA, a token minted from its key)"
    elif "insecure" in options:
        args.append("--insecure")
        described["ingress"] = "plaintext, no token (--insecure)"
    else:
        described["ingress"] = "plaintext (this tree's ingress has no TLS)"
    return args, described


def ingress_channel(log_dir: Path, ingress: str, secure: bool) -> tuple[grpc.aio.Channel, tuple[tuple[str, str], ...]]:
    """A channel to the ingress and the metadata each call carries: plaintext, or with --secure TLS trusting the
    stack's CA and a bearer token minted from its signing key (as `meshserve infer` does)."""
    if not secure:
        return grpc.aio.insecure_channel(ingress), ()
    from services.cli.connect import read_state, stack_endpoint

    state = read_state(log_dir)
    if state is None:
        raise ServerStartError(f"no stack.json in {log_dir}")
    endpoint = stack_endpoint(state, ingress, subject="chaos")
    return endpoint.aio_channel(), endpoint.metadata()


def copy_models(dest: Path, source: Path = ROOT / "models") -> Path:
    """A private copy of the model repository's models, configs and versions (the copy the hot-load writes into),
    without the build scripts beside them."""
    for model in source.iterdir():
        if (model / "config.yaml").is_file():
            shutil.copytree(model, dest / model.name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


# ----------------------------------------------------------------------------- the run


class Clock:
    """Marks of wall and process CPU time, for the generator's share of a core per phase."""

    def __init__(self) -> None:
        self.wall = time.perf_counter()
        self.cpu = time.process_time()

    def share(self) -> float:
        wall = time.perf_counter() - self.wall
        return (time.process_time() - self.cpu) / wall if wall > 0 else 0.0


async def ramp(load: OpenLoop, args: argparse.Namespace, d: Durations) -> tuple[list[report.RampStep], float | None]:
    """Open-loop steps, rates growing by `ramp_factor` from `ramp_start`, until one fails twice in a row (one blip
    on a shared machine is not capacity); then the rate between the last that held and the first that failed, with
    its second chance too. Each step lasts `ramp_step` seconds and long enough for RAMP_LEAST_REQUESTS (a 99% whole
    ratio means nothing over fewer). The steps and the p99 bound."""
    steps: list[report.RampStep] = []
    bound: float | None = None

    async def step(rate: float) -> bool:
        nonlocal bound
        start = load.now_s()
        load.set_rate(rate)
        await asyncio.sleep(max(d.ramp_step, RAMP_LEAST_REQUESTS / rate))
        load.set_rate(0)
        end = load.now_s()
        await load.drain()
        figures = count(between(sorted(load.samples, key=lambda s: s.sent_s), start, end))
        if bound is None:
            bound = p99_bound_s(figures.p50_s, args.p99_bound_factor)
        holds = step_holds(figures, bound)
        steps.append(report.RampStep(round(rate, 1), figures, holds))
        p99 = "-" if figures.p99_s is None else f"{figures.p99_s * 1000:.1f} ms"
        ratio = figures.whole_ratio or 0.0
        print(
            f"  ramp {rate:6.1f} req/s: {figures.sent} sent, {ratio:.1%} whole, p99 {p99} -> "
            f"{'holds' if holds else 'does not hold'}",
            flush=True,
        )
        return holds

    async def holds(rate: float) -> bool:
        return await step(rate) or await step(rate)

    rate = args.ramp_start
    last_held = None
    while rate <= args.ramp_most:
        if not await holds(rate):
            break
        last_held = rate
        rate *= args.ramp_factor
    else:
        return steps, bound
    if last_held is not None:
        await holds(math.sqrt(last_held * rate))
    return steps, bound


async def phase(ctx: Context, level: float, step: Step | None, d: Durations, run: report.Run) -> Phase:
    """Run one phase at the context's base rate: the quiet one (no step), or a step's fault with its lead and tail."""
    load = ctx.load
    clock = Clock()
    start = load.now_s()
    name = "quiet" if step is None else step.name
    fault_start = fault_end = None
    done: list[str] = []
    if step is None:
        await asyncio.sleep(d.quiet)
    else:
        await asyncio.sleep(0 if step.length else d.lead)
        fault_start = load.now_s()
        try:
            done.append(await step.begin(ctx))
            if step.end is not None:
                await asyncio.sleep(getattr(d, step.hold) if step.hold else 0)
                done.append(await step.end(ctx))
        except faults.FaultError as e:
            done.append(f"not injected: {e}")
        fault_end = load.now_s()
        await asyncio.sleep(max(0.0, getattr(d, step.length) - (fault_end - start)) if step.length else d.tail)
    end = load.now_s()
    p = Phase(
        name,
        level,
        ctx.base_rate,
        start,
        end,
        QUIET if step is None else step.kind,
        fault_start,
        fault_end,
        () if step is None else step.causes,
    )
    k = f"{level:.0%}/{name}"
    run.generator_cpu[k] = clock.share()
    if done:
        run.faults[k] = "; ".join(done)
    mine = [s for s in load.samples if start <= s.sent_s < end]
    bad = len(mine) - sum(s.kind == "whole" for s in mine)
    print(
        f"  {k:<28} {end - start:5.1f} s  answered so far {len(mine):5}, not whole {bad:4}  {run.faults.get(k, '')}",
        flush=True,
    )
    return p


async def chaos(
    stack_log_dir: Path,
    supervisor_pid: int,
    ingress: str,
    models_dir: Path,
    args: argparse.Namespace,
    d: Durations,
    run: report.Run,
) -> None:
    """Warm-up, capacity ramp, then each level's quiet phase and SCRIPT under the open-loop load; fills `run`."""
    origin = time.perf_counter()
    templates = await asyncio.to_thread(request_templates, TEMPLATES, int(time.time()) - 7200)
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    channel, metadata = ingress_channel(stack_log_dir, ingress, args.secure)
    async with channel:
        load = OpenLoop(channel, templates, args.deadline_ms / 1000.0, origin, metadata)
        ctx = Context(stack_log_dir, supervisor_pid, models_dir, load)
        stop_load = asyncio.Event()
        runner = asyncio.create_task(load.run(stop_load))
        try:
            print(f"warm-up: {d.warmup:.0f} s at {args.ramp_start:.0f} req/s", flush=True)
            load.set_rate(args.ramp_start)
            await asyncio.sleep(d.warmup)
            load.set_rate(0)
            await load.drain()
            if args.capacity:
                cap: float | None = args.capacity
                run.capacity_note = " (given with --capacity)"
            else:
                print("capacity ramp", flush=True)
                run.ramp, run.p99_bound_s = await ramp(load, args, d)
                cap = capacity([(s.rate, s.figures) for s in run.ramp], run.p99_bound_s or 0.0)
                if cap is None:
                    cap = args.ramp_start
                    run.capacity_note = f" (not found: even {cap:.0f} req/s did not hold; the run uses it)"
                else:
                    bound = (run.p99_bound_s or 0) * 1000
                    run.capacity_note = f" (>= 99% whole, nothing lost, p99 <= {bound:.0f} ms)"
            run.capacity_rps = cap
            print(f"capacity: {cap:.1f} req/s{run.capacity_note}", flush=True)
            phases: list[Phase] = []
            for level in args.levels:
                ctx.base_rate = level * cap
                ctx.overload_rate = args.overload_factor * cap
                print(f"level {level:.0%}: {ctx.base_rate:.1f} req/s", flush=True)
                load.set_rate(ctx.base_rate)
                await asyncio.sleep(d.settle)
                phases.append(await phase(ctx, level, None, d, run))
                for step in SCRIPT:
                    phases.append(await phase(ctx, level, step, d, run))
            load.set_rate(0)
            await load.drain()
        finally:
            for pid in list(ctx.stopped):  # never leave a process of the stack stopped
                with contextlib.suppress(faults.FaultError):
                    faults.send(pid, signal.SIGCONT)
            stop_load.set()
            load.set_rate(0)
            await runner
            await load.drain()
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - cpu_start
    run.phases = assess_all(phases, load.samples, d.recovery_window, d.recovery_hold)
    overall = count(load.samples)
    run.generator = {
        "requests": load.sent,
        "CPU": f"{cpu:.1f} s over {wall:.0f} s ({cpu / wall:.0%} of a core)",
        "CPU per request": f"{1e6 * cpu / max(1, load.sent):.0f} us (all of this process, faults and parsing included)",
        "schedule lag p99": "-" if overall.late_p99_s is None else f"{1000 * overall.late_p99_s:.1f} ms",
        "deadline": f"{args.deadline_ms} ms",
    }


def durations(args: argparse.Namespace) -> Durations:
    d = QUICK if args.quick else Durations()
    overrides = {k: getattr(args, k) for k in Durations.__dataclass_fields__ if getattr(args, k, None) is not None}
    return Durations(**{**d.__dict__, **overrides})


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run of about 2 minutes: one level (50%%), "
        "short phases, results in chaos-<date>-quick.* and not in latest.json",
    )
    parser.add_argument("--levels", type=float, nargs="+", help="base loads as shares of capacity (default 0.5 0.9)")
    parser.add_argument("--capacity", type=float, help="skip the ramp: capacity in req/s")
    parser.add_argument("--overload-factor", type=float, default=3.0, help="the overload phase's rate / capacity")
    parser.add_argument("--deadline-ms", type=int, default=2000, help="each request's deadline (past it: lost)")
    parser.add_argument("--ramp-start", type=float, default=20.0, help="the ramp's first rate (req/s)")
    parser.add_argument("--ramp-factor", type=float, default=1.3, help="each ramp step's rate / the previous one's")
    parser.add_argument("--ramp-most", type=float, default=2000.0, help="the ramp stops here")
    parser.add_argument(
        "--p99-bound-factor",
        type=float,
        default=P99_BOUND_FACTOR,
        help="capacity's p99 bound: this x the first ramp step's p50 (at least 250 ms)",
    )
    parser.add_argument("--gateway-replicas", type=int, default=GATEWAY_REPLICAS, help="where `meshserve up` has them")
    parser.add_argument("--secure", action="store_true", help="through the TLS + JWT ingress (default: --insecure)")
    for name, default in Durations().__dict__.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}-s",
            dest=name,
            type=float,
            help=f"seconds (default {default:g}, --quick {getattr(QUICK, name):g})",
        )
    parser.add_argument("--up-arg", action="append", default=[], help="an extra `meshserve up` argument (repeatable)")
    parser.add_argument("--log-dir", type=Path, help="keep the stack's logs here (default: a temp dir)")
    parser.add_argument("--no-record", action="store_true", help="write no file under bench/results/")
    args = parser.parse_args(argv)
    if args.levels is None:
        args.levels = [0.5] if args.quick else [0.5, 0.9]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    d = durations(args)
    command = " ".join([COMMAND, *(argv if argv is not None else sys.argv[1:])])
    started = time.monotonic()
    run = report.Run(command, date.today().isoformat(), args.quick, None, "", None, [], [])
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="meshserve-chaos-") as tmp_name:
        tmp = Path(tmp_name)
        log_dir = args.log_dir.resolve() if args.log_dir else tmp / "logs"
        models_dir = copy_models(tmp / "models")
        up_args, run.stack = stack_arguments(tmp, models_dir, args.gateway_replicas, args.secure)
        print(f"meshserve up {' '.join(up_args + args.up_arg)} (logs {log_dir})", flush=True)
        try:
            with local_stack(log_dir, [*up_args, *args.up_arg]) as stack:
                print(f"  ingress {stack.ingress}", flush=True)
                asyncio.run(chaos(log_dir, stack.process.pid, stack.ingress, models_dir, args, d, run))
        except ServerStartError as exc:
            print(f"could not start: {exc}", file=sys.stderr)
            return 1
    run.took_s = time.monotonic() - started
    run.stack["machine"] = (
        f"{os.cpu_count()} cores, 1-min load average {load_before:.1f} before the stack, {os.getloadavg()[0]:.1f} "
        f"after; started {datetime.now(UTC) - timedelta(seconds=run.took_s):%H:%M} UTC"
    )
    report.print_report(run)
    if not args.no_record:
        for path in report.write(run, record=not args.quick):
            print(f"wrote {path.relative_to(ROOT)}")
    return 0 if run.phases and all(r.met for r in run.phases) else 1


if __name__ == "__main__":
    sys.exit(main())
