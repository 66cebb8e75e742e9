"""The chaos run's report: its tables printed, written to bench/results/chaos-<date>.md and .json, and its figures
merged into bench/results/latest.json."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.limits import LimitSample
from bench.chaos.phases import Figures, Phase, PhaseResult
from bench.lib import results

PREFIX = "chaos"


@dataclass
class RampStep:
    rate: float
    figures: Figures
    holds: bool


@dataclass
class Run:
    """Everything one chaos run measured, as the report shows it."""

    command: str
    date: str
    quick: bool
    capacity_rps: float | None
    capacity_note: str
    p99_bound_s: float | None
    ramp: list[RampStep]
    phases: list[PhaseResult]
    faults: dict[str, str] = field(default_factory=dict)  # phase key -> what was done, e.g. "SIGKILL cache (pid 7)"
    generator_cpu: dict[str, float] = field(default_factory=dict)  # phase key -> the generator's CPU share of a core
    generator: dict[str, Any] = field(default_factory=dict)  # its CPU per request, lag, ...
    stack: dict[str, Any] = field(default_factory=dict)  # how the stack ran: gateway replicas, flags, what it lacked
    took_s: float = 0.0
    limits: dict[str, list[LimitSample]] = field(default_factory=dict)  # overload phase key -> both limits over time


def key(result: PhaseResult) -> str:
    """`50%/kill cache`: a phase's level and name."""
    return f"{result.phase.level:.0%}/{result.phase.name}"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def reasons(counts: dict[str, int]) -> str:
    """`features_degraded 12, model_timeout:fallback_model 3` (largest first); `-` for none."""
    return ", ".join(f"{r or '?'} {n}" for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "-"


def cell(value: Any) -> str:
    """A table cell as bench.results prints them: `-` for none, thousands separators, three significant digits."""
    return results.format_table([""], [[value]]).splitlines()[-1].strip()


def verdict(result: PhaseResult) -> str:
    failed = [c.label for c in result.checks if not c.ok]
    return "met" if not failed else "MISSED: " + "; ".join(failed)


PHASE_HEADERS = [
    "level",
    "phase",
    "sent",
    "whole",
    "degraded",
    "refused",
    "failed",
    "lost",
    "p50 ms",
    "p99 ms",
    "recovery s",
    "gen CPU",
    "gen lag p99 ms",
    "targets",
]


def phase_rows(run: Run) -> list[list[Any]]:
    rows = []
    for r in run.phases:
        f = r.figures
        cpu = run.generator_cpu.get(key(r))
        rows.append(
            [
                f"{r.phase.level:.0%} ({r.phase.rate:.0f}/s)",
                r.phase.name,
                f.sent,
                f.whole,
                sum(f.degraded.values()),
                sum(f.refused.values()),
                sum(f.failed.values()),
                f.lost,
                ms(f.p50_s),
                ms(f.p99_s),
                "-"
                if r.phase.kind in ("quiet", "wipe")  # a wipe's marks last on purpose
                else ("never" if r.recovery_s is None else round(r.recovery_s, 1)),
                "-" if cpu is None else f"{cpu:.0%}",
                ms(f.late_p99_s),
                verdict(r),
            ]
        )
    return rows


CAUSE_HEADERS = ["level", "phase", "fault", "degraded by cause", "refused by code", "failed by code", "versions"]


def cause_rows(run: Run) -> list[list[Any]]:
    rows = []
    for r in run.phases:
        f = r.figures
        rows.append(
            [
                f"{r.phase.level:.0%}",
                r.phase.name,
                run.faults.get(key(r), "-"),
                reasons(f.degraded),
                reasons(f.refused),
                reasons(f.failed),
                reasons(f.versions),
            ]
        )
    return rows


RAMP_HEADERS = ["rate /s", "sent", "whole %", "lost", "p50 ms", "p99 ms", "holds"]


def ramp_rows(run: Run) -> list[list[Any]]:
    return [
        [
            s.rate,
            s.figures.sent,
            None if s.figures.whole_ratio is None else 100.0 * s.figures.whole_ratio,
            s.figures.lost,
            ms(s.figures.p50_s),
            ms(s.figures.p99_s),
            "yes" if s.holds else "no",
        ]
        for s in run.ramp
    ]


LIMIT_HEADERS = ["t s", "load", "ingress limit", "minRTT ms", "sample RTT ms", "ingress refused", "gateway limits"]


def gateway_cell(gateways: dict[str, dict[str, float]]) -> str:
    """`gateway 42, gateway-2 40` (one pipeline), `gateway fraud 42 digits 64` (several); `-` where none answered."""
    parts = []
    for name, limits in sorted(gateways.items()):
        if len(limits) == 1:
            parts.append(f"{name} {next(iter(limits.values())):.0f}")
        elif limits:
            parts.append(f"{name} " + " ".join(f"{p} {v:.0f}" for p, v in sorted(limits.items())))
    return ", ".join(parts) or "-"


def limit_rows(phase: Phase, samples: Sequence[LimitSample], every_s: float = 1.0) -> list[list[Any]]:
    """A row per `every_s` of the phase (its first sample in it): seconds from the phase's start, base or overload,
    the ingress's limit, its minRTT and sample RTT, the calls it refused since the row before, each gateway's limit."""
    rows: list[list[Any]] = []
    last_blocked: int | None = None
    next_t = phase.start_s
    start, end = phase.fault_start_s, phase.fault_end_s
    for s in samples:
        if s.t_s + 1e-9 < next_t:
            continue
        next_t = s.t_s + every_s
        load = "overload" if start is not None and end is not None and start <= s.t_s < end else "base"
        refused = None if s.ingress_blocked is None or last_blocked is None else s.ingress_blocked - last_blocked
        last_blocked = s.ingress_blocked if s.ingress_blocked is not None else last_blocked
        rows.append(
            [
                round(s.t_s - phase.start_s, 1),
                load,
                s.ingress_limit,
                s.ingress_min_rtt_ms,
                s.ingress_sample_rtt_ms,
                refused,
                gateway_cell(s.gateways),
            ]
        )
    return rows


def limit_tables(run: Run) -> list[tuple[str, list[list[Any]]]]:
    """(phase key, its limit rows) of every phase whose limits were sampled."""
    return [(key(r), limit_rows(r.phase, run.limits[key(r)])) for r in run.phases if key(r) in run.limits]


def check_rows(run: Run) -> list[list[Any]]:
    return [[key(r), c.label, c.measured, "PASS" if c.ok else "FAIL"] for r in run.phases for c in r.checks if not c.ok]


def summary(run: Run) -> str:
    checks = [c for r in run.phases for c in r.checks]
    met = sum(c.ok for c in checks)
    capacity = "-" if run.capacity_rps is None else f"{run.capacity_rps:.0f} req/s"
    return f"capacity {capacity}{run.capacity_note}; targets met {met}/{len(checks)}; took {run.took_s:.0f} s"


def print_report(run: Run) -> None:
    results.print_table(RAMP_HEADERS, ramp_rows(run), title="capacity ramp (open loop, each step its own window)")
    results.print_table(PHASE_HEADERS, phase_rows(run), title="chaos phases (answers by the time they were sent)")
    results.print_table(CAUSE_HEADERS, cause_rows(run), title="by cause and code")
    for name, rows in limit_tables(run):
        results.print_table(LIMIT_HEADERS, rows, title=f"concurrency limits over time, {name}")
    missed = check_rows(run)
    if missed:
        results.print_table(["phase", "target", "measured", "result"], missed, title="targets missed")
    print(f"\n{summary(run)}", flush=True)


def markdown(run: Run) -> str:
    """The run as a Markdown page: what ran, the ramp, the phase table, causes, targets missed."""

    def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
        cells = [[cell(v).replace("|", "\\|") for v in row] for row in rows]
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in cells])

    stack = ", ".join(f"{k}: {v}" for k, v in run.stack.items())
    gen = ", ".join(f"{k}: {v}" for k, v in run.generator.items())
    parts = [
        f"# Chaos run, {run.date}{' (quick smoke run)' if run.quick else ''}",
        f"Command: `{run.command}`",
        f"Stack: {stack}",
        f"Load generator: {gen}",
        summary(run),
        "## Capacity ramp",
        table(RAMP_HEADERS, ramp_rows(run)),
        "## Phases",
        table(PHASE_HEADERS, phase_rows(run)),
        "## By cause and code",
        table(CAUSE_HEADERS, cause_rows(run)),
    ]
    for name, rows in limit_tables(run):
        parts += [f"## Concurrency limits over time, {name}", table(LIMIT_HEADERS, rows)]
    missed = check_rows(run)
    parts += ["## Targets missed", table(["phase", "target", "measured", "result"], missed) if missed else "none"]
    return "\n\n".join(parts) + "\n"


def figures_json(f: Figures) -> dict[str, Any]:
    """One set of answers' figures as the JSON file holds them (latencies in ms)."""
    return {
        "sent": f.sent,
        "whole": f.whole,
        "degraded": f.degraded,
        "refused": f.refused,
        "failed": f.failed,
        "lost": f.lost,
        "p50_ms": ms(f.p50_s),
        "p99_ms": ms(f.p99_s),
        "refused_p99_ms": ms(f.refused_p99_s),
        "versions": f.versions,
        "generator_lag_p99_ms": ms(f.late_p99_s),
    }


def phase_json(run: Run, r: PhaseResult) -> dict[str, Any]:
    """One phase as the JSON file holds it: what it was, its figures (and its fault window's), checks, per second."""
    return {
        "level": r.phase.level,
        "rate": r.phase.rate,
        "name": r.phase.name,
        "kind": r.phase.kind,
        "fault": run.faults.get(key(r)),
        "start_s": r.phase.start_s,
        "end_s": r.phase.end_s,
        "fault_start_s": r.phase.fault_start_s,
        "fault_end_s": r.phase.fault_end_s,
        "allowed_causes": list(r.phase.causes),
        **figures_json(r.figures),
        "during_fault": figures_json(r.during),
        "recovery_s": r.recovery_s,
        "generator_cpu": run.generator_cpu.get(key(r)),
        "checks": [{"label": c.label, "ok": c.ok, "measured": c.measured} for c in r.checks],
        "per_second": [{"t_s": t, "sent": n, "whole": whole, "p99_ms": ms(p99)} for t, n, whole, p99 in r.timeline],
        "met": r.met,
    }


def as_json(run: Run) -> dict[str, Any]:
    """The whole run as chaos-<date>.json holds it."""
    return {
        "command": run.command,
        "date": run.date,
        "quick": run.quick,
        "capacity_rps": run.capacity_rps,
        "capacity_note": run.capacity_note,
        "p99_bound_ms": ms(run.p99_bound_s),
        "stack": run.stack,
        "generator": run.generator,
        "took_s": round(run.took_s, 1),
        "ramp": [{"rate": s.rate, "holds": s.holds, **figures_json(s.figures)} for s in run.ramp],
        "phases": [phase_json(run, r) for r in run.phases],
        "limits": {name: [dataclasses.asdict(s) for s in samples] for name, samples in run.limits.items()},
    }


def figures(run: Run) -> list[dict[str, Any]]:
    """The run's figures for bench/results/latest.json: capacity, then per phase its counts, p99 and recovery."""
    cmd = run.command
    out = [results.figure(f"{PREFIX}.capacity", run.capacity_rps, "req/s", "the ramp's p99 bound", cmd)]
    for r in run.phases:
        name = f"{PREFIX}.l{round(r.phase.level * 100)}.{slug(r.phase.name)}"
        f = r.figures
        versus = "the quiet phase of the same level"
        out += [
            results.figure(f"{name}.sent", f.sent, "requests", "", cmd),
            results.figure(f"{name}.whole", f.whole, "requests", "", cmd),
            results.figure(f"{name}.degraded", sum(f.degraded.values()), "requests", "", cmd),
            results.figure(f"{name}.refused", sum(f.refused.values()), "requests", "", cmd),
            results.figure(f"{name}.failed", sum(f.failed.values()), "requests", "", cmd),
            results.figure(f"{name}.lost", f.lost, "requests", "", cmd),
            results.figure(f"{name}.p99", None if f.p99_s is None else round(f.p99_s * 1000, 2), "ms", versus, cmd),
        ]
        if r.phase.kind not in ("quiet", "wipe"):
            out.append(results.figure(f"{name}.recovery", r.recovery_s, "s", versus, cmd))
    checks = [c for r in run.phases for c in r.checks]
    out.append(results.figure(f"{PREFIX}.targets_met", sum(c.ok for c in checks), f"of {len(checks)}", "", cmd))
    return out


def write(run: Run, folder: Path = results.RESULTS_DIR, record: bool = True) -> list[Path]:
    """chaos-<date>[-quick].md and .json in `folder`; with `record`, the figures merged into latest.json."""
    stem = f"chaos-{run.date}{'-quick' if run.quick else ''}"
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / f"{stem}.md", folder / f"{stem}.json"
    md.write_text(markdown(run))
    js.write_text(json.dumps(as_json(run), indent=2) + "\n")
    written = [md, js]
    if record:
        written.append(results.record(figures(run)))
    return written
