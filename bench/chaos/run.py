"""`python -m bench.chaos` (`make chaos`): the whole local stack through Envoy under steady open-loop load at 50% and
90% of the capacity it measures first, through a scripted sequence of faults, with per-phase figures against its
targets (bench.chaos.phases).

The sequence at each level (bench.chaos.script): quiet; SIGKILL a model replica; SIGSTOP another for 10 s; SIGKILL
Valkey; SIGSTOP the feature service for 10 s; SIGKILL the cache service; SIGKILL a gateway; a new model version
hot-loaded; the canary shifted 10 -> 50 -> 100% then rolled back; 3x capacity for 30 s; once, after every level, a
FLUSHALL of Valkey. Each phase keeps the base load running long enough after its fault to see recovery. The Valkey
phases check the feature store's state, not only the answers (bench.chaos.feature_state): Ingest load runs through the
SIGKILL and every acknowledged event must be in the aggregates afterwards, equal to those read before the crash; after
the FLUSHALL every row of the wiped entities must be marked features_store_reset. The ingress's adaptive concurrency
limit, shipped off, is turned on through Envoy's admin runtime for each overload phase and off after it, so the run
still measures it. The stack is `meshserve up` on free ports with its own log dir and a private copy of the model
repository; the canary replica's pins are widened so the hot-loaded version is served (bench.chaos.stack).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from bench.chaos import faults, report
from bench.chaos.limits import ADAPTIVE_FLAG, LimitProbe
from bench.chaos.load import TEMPLATES, OpenLoop, request_templates
from bench.chaos.phases import (
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
from bench.chaos.script import FINAL, QUICK, SCRIPT, Context, Durations, Step
from bench.chaos.stack import copy_models, ingress_channel, stack_arguments
from bench.lib.local_stack import local_stack
from bench.lib.serving import ROOT, ServerStartError

COMMAND = "python -m bench.chaos"
GATEWAY_REPLICAS = 2
RAMP_LEAST_REQUESTS = 300
INGRESS_LIMIT = (
    f"off as shipped; on through Envoy's admin runtime ({ADAPTIVE_FLAG}=true) for each overload phase, from before "
    "its lead (its minRTT measured at the base load), off after it"
)


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
    ctx.phase_key = f"{level:.0%}/{name}"
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
            run.capacity_rps = await find_capacity(load, args, d, run)
            print(f"capacity: {run.capacity_rps:.1f} req/s{run.capacity_note}", flush=True)
            phases = await levels(ctx, run.capacity_rps, args, d, run)
            load.set_rate(0)
            await load.drain()
        finally:
            for pid in list(ctx.stopped):  # never leave a process of the stack stopped
                with contextlib.suppress(faults.FaultError):
                    faults.send(pid, signal.SIGCONT)
            if ctx.store is not None:  # a feature-store check cut short: its writers stop
                await ctx.store.run.finish()
                await ctx.store.close()
            stop_load.set()
            load.set_rate(0)
            await runner
            await load.drain()
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - cpu_start
    run.phases = assess_all(phases, load.samples, d.recovery_window, d.recovery_hold)
    for result in run.phases:  # the feature store's state, checked by the steps that say so
        verdict = ctx.verdicts.get(f"{result.phase.level:.0%}/{result.phase.name}")
        if verdict is not None:
            result.checks.extend(verdict[0].checks(wiped=verdict[1]))
    run.generator = generator_figures(load, args, cpu, wall)


async def find_capacity(load: OpenLoop, args: argparse.Namespace, d: Durations, run: report.Run) -> float:
    """The capacity the run's levels are shares of: --capacity, else the ramp's (its first rate where none held);
    the ramp and how the capacity was found go into `run`."""
    if args.capacity:
        run.capacity_note = " (given with --capacity)"
        return float(args.capacity)
    print("capacity ramp", flush=True)
    run.ramp, run.p99_bound_s = await ramp(load, args, d)
    cap = capacity([(s.rate, s.figures) for s in run.ramp], run.p99_bound_s or 0.0)
    if cap is None:
        run.capacity_note = f" (not found: even {args.ramp_start:.0f} req/s did not hold; the run uses it)"
        return float(args.ramp_start)
    run.capacity_note = f" (>= 99% whole, nothing lost, p99 <= {(run.p99_bound_s or 0) * 1000:.0f} ms)"
    return cap


async def levels(ctx: Context, cap: float, args: argparse.Namespace, d: Durations, run: report.Run) -> list[Phase]:
    """At each level's share of `cap`: the quiet phase, then every step of SCRIPT (those of --steps, if given)."""
    phases: list[Phase] = []
    for level in args.levels:
        ctx.base_rate = level * cap
        ctx.overload_rate = args.overload_factor * cap
        print(f"level {level:.0%}: {ctx.base_rate:.1f} req/s", flush=True)
        ctx.load.set_rate(ctx.base_rate)
        await asyncio.sleep(d.settle)
        phases.append(await phase(ctx, level, None, d, run))
        for step in SCRIPT:
            if not args.steps or step.name in args.steps:
                phases.append(await sampled_phase(ctx, level, step, d, run))
    for step in FINAL:  # once, at the last level: nothing may come after a store wiped on purpose
        if not args.steps or step.name in args.steps:
            phases.append(await sampled_phase(ctx, args.levels[-1], step, d, run))
    return phases


async def sampled_phase(ctx: Context, level: float, step: Step, d: Durations, run: report.Run) -> Phase:
    """A phase; an overload phase with the ingress's adaptive concurrency limit (shipped off) turned on through
    Envoy's admin runtime before it starts (its minRTT measured at the base load) and off after it, and both
    concurrency limits, the ingress's and each gateway's, sampled throughout (run.limits; the report prints them
    over time; run.faults says how the switch went)."""
    if step.kind != OVERLOAD:
        return await phase(ctx, level, step, d, run)
    probe = LimitProbe(ctx.log_dir)
    switched = [await asyncio.to_thread(probe.switch_ingress_limit, True)]
    print(f"  {switched[0]}", flush=True)
    stop = asyncio.Event()
    sampler = asyncio.create_task(probe.sample(ctx.load.now_s, stop))
    try:
        result = await phase(ctx, level, step, d, run)
    finally:
        stop.set()
        samples = await sampler
        switched.append(await asyncio.to_thread(probe.switch_ingress_limit, False))
        print(f"  {switched[-1]}", flush=True)
    k = f"{level:.0%}/{step.name}"
    run.limits[k] = samples
    run.faults[k] = "; ".join([switched[0], *filter(None, [run.faults.get(k)]), switched[-1]])
    return result


def generator_figures(load: OpenLoop, args: argparse.Namespace, cpu: float, wall: float) -> dict[str, str | int]:
    """What the load generator itself cost and how far behind its schedule it fell, over the whole run."""
    overall = count(load.samples)
    return {
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
    parser.add_argument(
        "--steps",
        nargs="+",
        choices=[s.name for s in [*SCRIPT, *FINAL]],
        metavar="STEP",
        help="run only these steps of each level, after its quiet phase, e.g. --steps 'overload 3x' (default: all)",
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
        run.stack["ingress adaptive limit"] = INGRESS_LIMIT
        print(f"ingress adaptive concurrency limit: {INGRESS_LIMIT}", flush=True)
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
