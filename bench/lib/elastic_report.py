"""The scaling benchmark's report: each stack's run as tables (phases, replicas over time, cold starts, reactions,
what the model replicas used and cost, the probes, the targets) and its figures for bench/results/latest.json."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.phases import Sample, percentile
from bench.lib import cpu, results
from bench.lib.elastic_targets import Measured, Probe, Target, rows, targets
from bench.lib.load_phases import Phase, PhaseFigures, account_all, failed_text, p99_of, up_steps
from bench.lib.replica_usage import (
    Snapshot,
    cpu_seconds,
    interval_cpu_s,
    memory_gib_seconds,
    most_alive,
    process_seconds,
)
from bench.lib.scaling import ColdStart, Decision, per_second, reaction_s, replica_seconds, timeline_text

PREFIX = "elastic"
ELASTIC, FIXED = "elastic", "fixed"
# The price of one replica-hour: one model replica per instance, an m7i.large (2 vCPUs, 8 GiB) at AWS EC2 On-Demand,
# Linux, us-east-1, $0.1008 an hour (https://aws.amazon.com/ec2/pricing/on-demand/), which is two of bench.lib.cpu's
# vCPU-hours (its sources are cited there). Pass --price-per-hour for another instance, region or date.
VCPUS_PER_INSTANCE = 2
USD_PER_INSTANCE_HOUR = VCPUS_PER_INSTANCE * cpu.USD_PER_VCPU_HOUR
PRICE_SOURCE = (
    f"AWS EC2 on-demand m7i.large, Linux, us-east-1: ${USD_PER_INSTANCE_HOUR:.4f}/h, one replica per instance"
)


@dataclass
class StackResult:
    """One stack's run: its phases, every answer, the probes, /proc samples, decisions and cold starts."""

    kind: str
    initial_replicas: int
    log_dir: Path
    origin: float  # time.perf_counter() at the run's start: every time of the run is seconds since it
    origin_wall: float  # time.time() at the same moment (for autoscale.json and the logs)
    subset: str | None = None  # the scaled group's (decisions of other subsets are not its)
    phases: list[Phase] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    at_zero: list[tuple[float, float]] = field(default_factory=list)  # spans with the group asleep at zero
    snapshots: list[Snapshot] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    cold_starts: list[ColdStart] = field(default_factory=list)
    unfinished: int = 0  # sent and never back (each request has a deadline, so 0 unless the run broke off)
    parked: tuple[float, float] | None = None  # the gateways' parked requests: count, seconds parked in all

    @property
    def compared(self) -> list[Phase]:
        return [p for p in self.phases if p.compared]

    @property
    def span(self) -> tuple[float, float]:
        """The compared schedule's start and end (0, 0 when it has none)."""
        c = self.compared
        return (c[0].start_s, c[-1].end_s) if c else (0.0, 0.0)

    def figures(self) -> list[PhaseFigures]:
        return account_all(self.phases, self.samples)


@dataclass
class Usage:
    """What a stack's model replicas used over its compared schedule."""

    replica_s: float
    process_s: float
    cpu_s: float
    memory_gib_s: float
    answered: int
    usd: float

    @property
    def usd_per_million(self) -> float | None:
        return self.usd / self.answered * 1e6 if self.answered else None


@dataclass
class Run:
    """Both stacks' runs and how they are priced."""

    command: str
    deadline_s: float
    elastic: StackResult
    fixed: StackResult | None
    fixed_replicas: int
    usd_per_hour: float
    machine: str = ""

    @property
    def by_decisions(self) -> bool:
        """Replica-seconds from the autoscaler's decisions (else from the model processes /proc saw)."""
        return bool(self.elastic.decisions)


def usage(stack: StackResult, by_decisions: bool, usd_per_hour: float) -> Usage:
    start, end = stack.span
    snaps = stack.snapshots
    process_s = process_seconds(snaps, start, end)
    replica_s = replica_seconds(stack.decisions, stack.initial_replicas, start, end) if by_decisions else process_s
    answered = sum(f.answered for p, f in zip(stack.phases, stack.figures(), strict=True) if p.compared)
    return Usage(
        replica_s=replica_s,
        process_s=process_s,
        cpu_s=cpu_seconds(snaps, start, end),
        memory_gib_s=memory_gib_seconds(snaps, start, end),
        answered=answered,
        usd=replica_s / 3600.0 * usd_per_hour,
    )


def steady_p99(stack: StackResult) -> float | None:
    return p99_of([p for p in stack.compared if p.steady], stack.samples)


def loaded_p99(stack: StackResult) -> float | None:
    return p99_of([p for p in stack.compared if p.loaded], stack.samples)


def reactions(stack: StackResult) -> list[tuple[Phase, float | None]]:
    """Each load step up and the seconds until a replica it added served (None: none added)."""
    return [(p, reaction_s(p.start_s, until, stack.cold_starts)) for p, until in up_steps(stack.phases)]


def idle_cpu(stack: StackResult, spans: Sequence[tuple[float, float]]) -> float | None:
    """Model CPU seconds between the samples inside each span (None without spans). A span's edges fall between
    two samples, in an interval it shares with a replica still exiting or one already starting for the next load:
    prorating that interval would charge their CPU to the sleep."""
    if not spans:
        return None
    total = 0.0
    for start, end in spans:
        inside = [s for s in stack.snapshots if start <= s.t_s <= end]
        total += sum(interval_cpu_s(a, b) for a, b in itertools.pairwise(inside))
    return total


def measured(run: Run) -> Measured:
    e, f = run.elastic, run.fixed
    figs = e.figures()
    return Measured(
        failed=sum(x.failed_total for x in figs),
        lost=sum(x.lost for x in figs) + e.unfinished,
        deadline_s=run.deadline_s,
        cold_starts_s=[c.serving_s for c in e.cold_starts],
        first_answers_s=[
            x.first_answer_s
            for p, x in zip(e.phases, figs, strict=True)
            if p.from_zero and x.first_answer_s is not None
        ],
        reactions_s=[r for _, r in reactions(e) if r is not None],
        idle_zero_cpu_s=idle_cpu(e, e.at_zero),
        replica_seconds=usage(e, run.by_decisions, run.usd_per_hour).replica_s,
        fixed_replica_seconds=None if f is None else usage(f, run.by_decisions, run.usd_per_hour).replica_s,
        steady_p99_s=steady_p99(e),
        fixed_steady_p99_s=None if f is None else steady_p99(f),
        probes=e.probes,
    )


# ----------------------------------------------------------------------------- tables


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def counts_per_second(stack: StackResult, phase: Phase) -> list[int]:
    """The replica count each second of a phase: the autoscaler's, or (without decisions) the model processes /proc
    saw."""
    if stack.decisions or stack.kind == FIXED:
        return per_second(stack.decisions, stack.initial_replicas, phase.start_s, phase.end_s)
    out, t = [], phase.start_s
    while t < phase.end_s - 1e-9:
        out.append(most_alive(stack.snapshots, t, min(t + 1.0, phase.end_s)))
        t += 1.0
    return out


PHASE_HEADERS = [
    "stack",
    "phase",
    "load",
    "s",
    "sent",
    "answered",
    "degraded",
    "failed",
    "lost",
    "p50 ms",
    "p99 ms",
    "first answer s",
    "replicas",
]


def phase_rows(stack: StackResult) -> list[list[Any]]:
    out = []
    for p, f in zip(stack.phases, stack.figures(), strict=True):
        counts = counts_per_second(stack, p)
        replicas = "-" if not counts else f"{min(counts)}-{max(counts)}" if min(counts) != max(counts) else counts[0]
        first = f.first_answer_s if p.from_zero else None
        out.append(
            [
                stack.kind,
                p.name + (" (from 0)" if p.from_zero else ""),
                p.load,
                p.end_s - p.start_s,
                f.sent,
                f.answered,
                f.degraded,
                failed_text(f.failed, f.failed_after_s),
                f.lost,
                ms(f.p50_s),
                ms(f.p99_s),
                first,
                replicas,
            ]
        )
    return out


def timeline_lines(stack: StackResult) -> list[str]:
    """One line per phase: its name and a digit per second (the replica count)."""
    width = max((len(p.name) for p in stack.phases), default=0)
    return [f"  {p.name:<{width}}  {timeline_text(counts_per_second(stack, p))}" for p in stack.phases]


def cold_start_rows(stack: StackResult) -> list[list[Any]]:
    c = stack.cold_starts
    if not c:
        return [["spawn -> SERVING", 0, None, None, "no cold start line in the model replicas' logs"]]
    return [
        [
            "spawn -> SERVING",
            len(c),
            percentile([x.serving_s for x in c], 50),
            percentile([x.serving_s for x in c], 99),
            "the replicas' log line of meshserve_model_cold_start_seconds",
        ],
        [
            "  of which imports",
            len(c),
            percentile([x.import_s for x in c], 50),
            percentile([x.import_s for x in c], 99),
            "",
        ],
        [
            "  of which load+warm",
            len(c),
            percentile([x.load_warm_s for x in c], 50),
            percentile([x.load_warm_s for x in c], 99),
            "",
        ],
    ]


def usage_rows(run: Run) -> list[list[Any]]:
    rows_: list[list[Any]] = []
    uses = {s.kind: usage(s, run.by_decisions, run.usd_per_hour) for s in (run.elastic, run.fixed) if s is not None}
    for kind, u in uses.items():
        per_m = u.usd_per_million
        row = [kind, u.replica_s, u.process_s, u.cpu_s, u.memory_gib_s, u.answered, f"{u.usd:.5f}"]
        rows_.append([*row, None if per_m is None else f"{per_m:.3f}"])
    if len(uses) == 2:
        e, f = uses[ELASTIC], uses[FIXED]
        rows_.append(
            [
                "elastic / fixed",
                *(
                    results.ratio(a, b)
                    for a, b in (
                        (e.replica_s, f.replica_s),
                        (e.process_s, f.process_s),
                        (e.cpu_s, f.cpu_s),
                        (e.memory_gib_s, f.memory_gib_s),
                        (e.answered, f.answered),
                        (e.usd, f.usd),
                        (e.usd_per_million, f.usd_per_million),
                    )
                ),
            ]
        )
    return rows_


def p99_rows(run: Run) -> list[list[Any]]:
    e, f = run.elastic, run.fixed
    out = []
    for label, fn in (
        ("steady loaded phases (entered with replicas up)", steady_p99),
        ("every loaded phase", loaded_p99),
    ):
        a, b = fn(e), None if f is None else fn(f)
        out.append([label, ms(a), ms(b), results.ratio(a, b)])
    return out


def probe_rows(stack: StackResult) -> list[list[Any]]:
    return [
        [i + 1, p.code, p.deadline_s * 1000, p.elapsed_s * 1000, p.off_s * 1000] for i, p in enumerate(stack.probes)
    ]


def reaction_rows(stack: StackResult) -> list[list[Any]]:
    return [[p.name, p.load, p.start_s, "no replica added" if r is None else r] for p, r in reactions(stack)]


def print_load(run: Run) -> None:
    """The phases of both stacks, and the p99 where both carried load."""
    stacks = [s for s in (run.elastic, run.fixed) if s is not None]
    results.print_table(
        PHASE_HEADERS,
        [r for s in stacks for r in phase_rows(s)],
        title="phases (requests by the time they were sent; failed by gRPC code)",
    )
    results.print_table(
        ["p99 of", "elastic ms", "fixed ms", "elastic / fixed"], p99_rows(run), title="latency where both carried load"
    )
    for s in stacks:
        if s.parked is not None:
            count, total = s.parked
            mean = total / count if count else 0.0
            print(f"{s.kind}: the gateway parked {count:.0f} requests, {mean:.2f} s each on average")
        if s.unfinished:
            print(f"{s.kind}: {s.unfinished} requests never came back (counted lost)")


def print_scaling(run: Run) -> None:
    """The elastic stack's replicas over time, its cold starts, its reactions and the short-deadline probes."""
    e = run.elastic
    source = "the autoscaler's decisions" if e.decisions else "model processes /proc saw (no autoscale.json)"
    print(f"\nreplicas per second, elastic ({source}; one digit a second)")
    print("\n".join(timeline_lines(e)))
    results.print_table(
        ["cold start", "n", "p50 s", "p99 s", "source"], cold_start_rows(e), title="the elastic replicas' cold starts"
    )
    results.print_table(
        ["step", "load", "at s", "added replica serving after s"],
        reaction_rows(e),
        title="load steps up -> the first replica they added serving",
    )
    results.print_table(
        ["probe", "code", "deadline ms", "ended after ms", "off ms"],
        probe_rows(e),
        title="requests with a deadline shorter than the cold start, sent at zero",
    )


def print_usage(run: Run) -> None:
    """What each stack's model replicas used and cost, and their CPU while the elastic group slept."""
    e, f = run.elastic, run.fixed
    basis = "the autoscaler's decisions" if run.by_decisions else "model processes alive (/proc)"
    price = PRICE_SOURCE if run.usd_per_hour == USD_PER_INSTANCE_HOUR else f"${run.usd_per_hour:g}/h, given"
    results.print_table(
        ["stack", "replica-s", "process-s", "CPU-s", "GiB-s", "answered", "USD", "USD / M req"],
        usage_rows(run),
        title=f"model replicas over the compared schedule (replica-s from {basis}; {price})",
    )
    asleep = sum(b - a for a, b in e.at_zero)
    mine = idle_cpu(e, e.at_zero)
    theirs = None if f is None else idle_cpu(f, e.at_zero)
    shown = ["-" if v is None else f"{v:.2f} CPU-s" for v in (mine, theirs)]
    print(
        f"\nmodel CPU while the elastic group slept at zero ({asleep:.1f} s): {shown[0]}; fixed, same spans: {shown[1]}"
    )


def print_report(run: Run) -> list[Target]:
    """Every table of the run; returns the targets."""
    print(f"\nmachine: {run.machine} (shared with other work: absolute figures move with it)")
    print_load(run)
    print_scaling(run)
    print_usage(run)
    table = targets(measured(run))
    results.print_table(["target", "measured", "target", "result"], rows(table), title="targets")
    return table


# ----------------------------------------------------------------------------- figures


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def phase_figures(stack: StackResult, command: str) -> list[dict[str, Any]]:
    """Per phase of one stack: sent, answered, failed, lost, p99 (and the first answer of a start from zero)."""
    out = []
    for p, f in zip(stack.phases, stack.figures(), strict=True):
        if not p.loaded:
            continue
        name = f"{PREFIX}.{stack.kind}.{slug(p.name)}"
        out += [
            results.figure(f"{name}.sent", f.sent, "requests", p.load, command),
            results.figure(f"{name}.answered", f.answered, "requests", p.load, command),
            results.figure(f"{name}.failed", f.failed_total, "requests", p.load, command),
            results.figure(f"{name}.lost", f.lost, "requests", p.load, command),
            results.figure(f"{name}.p99", rounded(ms(f.p99_s)), "ms", p.load, command),
        ]
        if p.from_zero:
            out.append(results.figure(f"{name}.first_answer", rounded(f.first_answer_s), "s", "from zero", command))
    return out


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def figures(run: Run, table: Sequence[Target]) -> list[dict[str, Any]]:
    """Every figure of the run for bench/results/latest.json, the targets last."""
    cmd = run.command
    e, f = run.elastic, run.fixed
    out = phase_figures(e, cmd) + ([] if f is None else phase_figures(f, cmd))
    serving = [c.serving_s for c in e.cold_starts]
    out += [
        results.figure(f"{PREFIX}.cold_start.p50", rounded(percentile(serving, 50)), "s", "spawn -> SERVING", cmd),
        results.figure(f"{PREFIX}.cold_start.p99", rounded(percentile(serving, 99)), "s", "spawn -> SERVING", cmd),
    ]
    versus = "" if f is None else f"the same schedule on {run.fixed_replicas} fixed replicas"
    for s in (e, f):
        if s is None:
            continue
        u = usage(s, run.by_decisions, run.usd_per_hour)
        out += [
            results.figure(f"{PREFIX}.{s.kind}.replica_seconds", rounded(u.replica_s, 1), "replica-s", versus, cmd),
            results.figure(f"{PREFIX}.{s.kind}.cpu_seconds", rounded(u.cpu_s, 2), "CPU-s", versus, cmd),
            results.figure(f"{PREFIX}.{s.kind}.memory", rounded(u.memory_gib_s, 1), "GiB-s", versus, cmd),
            results.figure(
                f"{PREFIX}.{s.kind}.usd_per_million", rounded(u.usd_per_million, 4), "USD", PRICE_SOURCE, cmd
            ),
        ]
    for t in table:
        value = None if t.value is None else round(t.value, 4)
        out.append(results.figure(f"{PREFIX}.target.{t.name}", value, t.verdict, f"target {t.bound}", cmd))
    return out


def record(run: Run, table: Sequence[Target]) -> Path:
    return results.record(figures(run, table))
