"""A chaos phase's figures from the answers sent in it: counts by kind and reason, p50/p99, the time to get back to
the quiet phase's p99 and whole ratio after its fault ends, and whether the chaos run's targets hold."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.chaos.outcomes import DEGRADED, FAILED, LOST, OK_KINDS, REFUSED, WHOLE

QUIET, FAULT, OVERLOAD = "quiet", "fault", "overload"
# A fault whose marks are meant to last: a store wiped on purpose marks every answer that reads it until its longest
# window has passed (features_store_reset), so such a phase has no recovery to wait for.
WIPE = "wipe"

# The chaos run's targets.
STRICT_LEVEL = 0.5  # at this share of capacity or less: nothing failed, lost or refused, degraded only by the fault
RECOVERY_MOST_S = 10.0  # back to the quiet figures within 10 s of the fault's end
REFUSAL_MOST_S = 0.005  # under overload the excess is refused within 5 ms
OVERLOAD_P99_MOST = 2.0  # and what is admitted keeps its p99 within 2 x the quiet p99

# Recovery: windows of answers (by send time) compared with the quiet phase, sliding by STEP_S; recovered at the
# first window from which HOLD_S of windows in a row all meet it. A 2 s window at 25 req/s holds 50 answers, enough
# for a p99 that is not just the slowest one; the margins absorb the noise of a shared 2-core machine.
WINDOW_S = 2.0
STEP_S = 0.5
HOLD_S = 4.0
P99_MARGIN = 1.5  # a window's p99 within 1.5 x the quiet p99
WHOLE_MARGIN = 0.01  # a window's whole ratio at most 1 point under the quiet one

# Capacity: the highest rate of the ramp at which 99% of answers are whole, none is lost and the p99 stays bounded:
# within P99_BOUND_FACTOR x the median of the ramp's first, light step (its median, not its p99: a light step holds
# too few answers for a steady p99), and never under P99_FLOOR_S. Queueing may add to the tail, up to a point. The
# floor is an eighth of the default 2 s deadline: under a lower one, a single scheduling hiccup of a shared machine
# in a step (whose p99 is then its second slowest answer) put the capacity far under what the stack serves
# (bench/README.md, "Chaos run").
CAPACITY_WHOLE_LEAST = 0.99
P99_BOUND_FACTOR = 10.0
P99_FLOOR_S = 0.25


@dataclass(frozen=True, slots=True)
class Sample:
    """One request of the run: when it was sent (s since the run's start), how long its answer took (to the
    deadline for a lost one), its kind and reason (bench.chaos.outcomes), the model version that answered, and how
    far behind its schedule the generator sent it."""

    sent_s: float
    latency_s: float
    kind: str
    reason: str = ""
    version: str = ""
    late_s: float = 0.0


@dataclass(frozen=True)
class Phase:
    """A span of the run (by send time) at one base rate, with the fault it injects, if any.

    `causes` are the `degraded` causes this fault may bring (prefixes of the parameter, e.g. `features_`): the
    degradation it is allowed at the strict level. A fault that is one event (a SIGKILL, a copied version, a
    weight change) starts and ends at the same time.
    """

    name: str
    level: float
    rate: float
    start_s: float
    end_s: float
    kind: str = QUIET
    fault_start_s: float | None = None
    fault_end_s: float | None = None
    causes: tuple[str, ...] = ()


@dataclass
class Figures:
    """What a set of answers adds up to."""

    sent: int = 0
    whole: int = 0
    degraded: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    p50_s: float | None = None
    p99_s: float | None = None
    refused_p99_s: float | None = None
    versions: dict[str, int] = field(default_factory=dict)
    late_p99_s: float | None = None  # the generator's own lag behind its schedule

    @property
    def whole_ratio(self) -> float | None:
        return self.whole / self.sent if self.sent else None


@dataclass(frozen=True)
class Baseline:
    """The quiet phase of a level: what recovery returns to."""

    p99_s: float
    whole_ratio: float


@dataclass(frozen=True)
class Check:
    """One target on one phase: its label, whether it holds, what was measured."""

    label: str
    ok: bool
    measured: str


@dataclass
class PhaseResult:
    phase: Phase
    figures: Figures
    during: Figures  # the answers sent while the fault lasted (the whole phase when it has none)
    recovery_s: float | None
    checks: list[Check]
    timeline: list[tuple[float, int, int, float | None]] = field(default_factory=list)  # see timeline()

    @property
    def met(self) -> bool:
        return all(c.ok for c in self.checks)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def count(samples: Sequence[Sample]) -> Figures:
    """Counts by kind and reason; p50/p99 of the OK answers (whole or degraded); p99 of the refusals."""
    kinds: Counter[str] = Counter()
    by: dict[str, Counter[str]] = {DEGRADED: Counter(), REFUSED: Counter(), FAILED: Counter()}
    versions: Counter[str] = Counter()
    ok_latency: list[float] = []
    refused_latency: list[float] = []
    for s in samples:
        kinds[s.kind] += 1
        if s.kind in by:
            by[s.kind][s.reason] += 1
        if s.kind in OK_KINDS:
            ok_latency.append(s.latency_s)
            if s.version:
                versions[s.version] += 1
        elif s.kind == REFUSED:
            refused_latency.append(s.latency_s)
    return Figures(
        sent=len(samples),
        whole=kinds[WHOLE],
        degraded=dict(by[DEGRADED]),
        refused=dict(by[REFUSED]),
        failed=dict(by[FAILED]),
        lost=kinds[LOST],
        p50_s=percentile(ok_latency, 50),
        p99_s=percentile(ok_latency, 99),
        refused_p99_s=percentile(refused_latency, 99),
        versions=dict(versions),
        late_p99_s=percentile([s.late_s for s in samples], 99),
    )


def between(samples: Sequence[Sample], start_s: float, end_s: float) -> list[Sample]:
    """The samples sent in [start_s, end_s), from samples sorted by send time."""
    sent = [s.sent_s for s in samples]
    return list(samples[bisect.bisect_left(sent, start_s) : bisect.bisect_left(sent, end_s)])


def baseline(figures: Figures) -> Baseline | None:
    """The quiet phase's p99 and whole ratio; None when it answered nothing."""
    if figures.p99_s is None or figures.whole_ratio is None:
        return None
    return Baseline(figures.p99_s, figures.whole_ratio)


def window_meets(samples: Sequence[Sample], quiet: Baseline) -> bool:
    """A window is back to quiet when its whole ratio and its p99 are within the margins of the quiet ones."""
    if not samples:
        return True
    whole = sum(s.kind == WHOLE for s in samples) / len(samples)
    p99 = percentile([s.latency_s for s in samples if s.kind in OK_KINDS], 99)
    return whole >= quiet.whole_ratio - WHOLE_MARGIN and (p99 is None or p99 <= P99_MARGIN * quiet.p99_s)


def recovery_s(
    samples: Sequence[Sample],
    fault_end_s: float,
    end_s: float,
    quiet: Baseline,
    window_s: float = WINDOW_S,
    step_s: float = STEP_S,
    hold_s: float = HOLD_S,
) -> float | None:
    """Seconds from the fault's end to the first window from which `hold_s` of windows in a row meet the quiet
    figures; None when that is not seen before `end_s` (samples sorted by send time)."""
    sent = [s.sent_s for s in samples]
    starts = []
    t = fault_end_s
    while t + window_s <= end_s + 1e-9:
        starts.append(t)
        t += step_s
    meets = [
        window_meets(samples[bisect.bisect_left(sent, t) : bisect.bisect_left(sent, t + window_s)], quiet)
        for t in starts
    ]
    run = round(hold_s / step_s) + 1  # windows in a row that cover hold_s
    for i in range(len(starts) - run + 1):
        if all(meets[i : i + run]):
            return starts[i] - fault_end_s
    return None


def checks(
    phase: Phase, figures: Figures, during: Figures, recovered_s: float | None, quiet: Baseline | None
) -> list[Check]:
    """The chaos run's targets that apply to this phase."""
    out = [
        Check("0 failed", not figures.failed, str(sum(figures.failed.values()))),
        Check("0 lost", figures.lost == 0, str(figures.lost)),
    ]
    if phase.kind != OVERLOAD and phase.level <= STRICT_LEVEL:
        out.append(Check("0 refused", not figures.refused, str(sum(figures.refused.values()))))
        unexplained = {r: n for r, n in figures.degraded.items() if not (phase.causes and r.startswith(phase.causes))}
        label = "0 degraded" if not phase.causes else f"degraded only {'/'.join(c + '*' for c in phase.causes)}"
        out.append(Check(label, not unexplained, str(sum(unexplained.values()))))
    if phase.kind == OVERLOAD:
        refused = during.refused_p99_s
        out.append(
            Check(
                "refused within 5 ms (p99)",
                refused is None or refused <= REFUSAL_MOST_S,
                "none refused" if refused is None else f"{refused * 1000:.1f} ms",
            )
        )
        admitted = during.p99_s
        bound = None if quiet is None else OVERLOAD_P99_MOST * quiet.p99_s
        out.append(
            Check(
                "admitted p99 <= 2x quiet",
                admitted is not None and bound is not None and admitted <= bound,
                "-"
                if admitted is None
                else f"{admitted * 1000:.1f} ms" + ("" if bound is None else f" / {bound * 1000:.1f}"),
            )
        )
    if phase.kind not in (QUIET, WIPE):
        out.append(
            Check(
                "recovered within 10 s",
                recovered_s is not None and recovered_s <= RECOVERY_MOST_S,
                "never" if recovered_s is None else f"{recovered_s:.1f} s",
            )
        )
    return out


def timeline(
    samples: Sequence[Sample], start_s: float, end_s: float, bin_s: float = 1.0
) -> list[tuple[float, int, int, float | None]]:
    """Per `bin_s` of the phase (by send time): its start from the phase's, requests sent, whole, p99 of OK answers."""
    out = []
    t = start_s
    while t < end_s - 1e-9:
        mine = between(samples, t, min(t + bin_s, end_s))
        p99 = percentile([s.latency_s for s in mine if s.kind in OK_KINDS], 99)
        out.append((round(t - start_s, 3), len(mine), sum(s.kind == WHOLE for s in mine), p99))
        t += bin_s
    return out


def assess(
    phase: Phase,
    samples: Sequence[Sample],
    quiet: Baseline | None,
    window_s: float = WINDOW_S,
    hold_s: float = HOLD_S,
) -> PhaseResult:
    """The phase's figures, its fault window's, its recovery and its checks (samples sorted by send time)."""
    mine = between(samples, phase.start_s, phase.end_s)
    figures = count(mine)
    during = figures
    recovered = None
    if phase.fault_start_s is not None and phase.fault_end_s is not None:
        if phase.fault_end_s > phase.fault_start_s:
            during = count(between(mine, phase.fault_start_s, phase.fault_end_s))
        if quiet is not None:
            recovered = recovery_s(mine, phase.fault_end_s, phase.end_s, quiet, window_s, hold_s=hold_s)
    return PhaseResult(
        phase,
        figures,
        during,
        recovered,
        checks(phase, figures, during, recovered, quiet),
        timeline(mine, phase.start_s, phase.end_s),
    )


def assess_all(
    phases: Sequence[Phase], samples: Sequence[Sample], window_s: float = WINDOW_S, hold_s: float = HOLD_S
) -> list[PhaseResult]:
    """Every phase, each fault against the quiet phase of its level (the first quiet phase at that level)."""
    ordered = sorted(samples, key=lambda s: s.sent_s)
    quiet: dict[float, Baseline | None] = {}
    out = []
    for phase in phases:
        if phase.kind == QUIET and phase.level not in quiet:
            quiet[phase.level] = baseline(count(between(ordered, phase.start_s, phase.end_s)))
        out.append(assess(phase, ordered, quiet.get(phase.level), window_s, hold_s))
    return out


# ----------------------------------------------------------------------------- capacity


def p99_bound_s(light_p50_s: float | None, factor: float = P99_BOUND_FACTOR) -> float:
    """The p99 the ramp's steps must stay under: `factor` x the light first step's median, at least P99_FLOOR_S."""
    return max(P99_FLOOR_S, factor * light_p50_s) if light_p50_s is not None else P99_FLOOR_S


def step_holds(figures: Figures, bound_s: float) -> bool:
    """A ramp step at capacity or under: 99% of answers whole, nothing lost, p99 within the bound."""
    ratio = figures.whole_ratio
    return (
        ratio is not None
        and ratio >= CAPACITY_WHOLE_LEAST
        and figures.lost == 0
        and figures.p99_s is not None
        and figures.p99_s <= bound_s
    )


def capacity(steps: Sequence[tuple[float, Figures]], bound_s: float) -> float | None:
    """The highest rate that held, under which every rate held (a rate holds when one of its steps did; rates in any
    order)."""
    held: dict[float, bool] = {}
    for rate, figures in steps:
        held[rate] = held.get(rate, False) or step_holds(figures, bound_s)
    best = None
    for rate in sorted(held):
        if not held[rate]:
            break
        best = rate
    return best
