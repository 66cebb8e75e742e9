"""An open-loop run's phases and what each adds up to: requests sent, answered, failed by gRPC code, lost, p50/p99 of
the answers, and for a phase that starts with no replica serving, the time from its first request to its first
answer. Answers are bench.chaos's samples (one per request, classified as it came back) and belong to the phase
they were sent in."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.chaos.outcomes import FAILED, OK_KINDS, REFUSED
from bench.chaos.phases import Sample, between, count, percentile


@dataclass(frozen=True)
class Phase:
    """A span of the run (by send time): its load (`rate` req/s, or `burst` requests at once at its start).

    `from_zero`: it starts with the model at zero replicas (its first answer waits for a cold start). `compared`:
    it is part of the schedule both stacks run (the elastic stack's extra rounds from zero are not).
    """

    name: str
    start_s: float
    end_s: float
    rate: float = 0.0
    burst: int = 0
    from_zero: bool = False
    compared: bool = True

    @property
    def loaded(self) -> bool:
        return self.rate > 0 or self.burst > 0

    @property
    def steady(self) -> bool:
        """Loaded and entered with replicas already serving: where the two stacks' latency is compared."""
        return self.loaded and not self.from_zero

    @property
    def load(self) -> str:
        if self.burst:
            return f"{self.burst} at once"
        return f"{self.rate:g}/s" if self.rate else "none"


@dataclass
class PhaseFigures:
    """What one phase's requests came to."""

    sent: int = 0
    answered: int = 0
    degraded: int = 0  # of the answered: with a `degraded` parameter (a fallback, not the model's score)
    failed: dict[str, int] = field(default_factory=dict)  # by gRPC code, refusals included
    failed_after_s: dict[str, float] = field(default_factory=dict)  # by code: the median time to the failure
    lost: int = 0  # no answer by the deadline
    p50_s: float | None = None
    p99_s: float | None = None
    first_answer_s: float | None = None  # from the first request sent to the first answer back

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())


def first_answer_s(samples: Sequence[Sample]) -> float | None:
    """Seconds from the first request sent to the first answer that came back (any request's); None without one."""
    if not samples:
        return None
    answers = [s.sent_s + s.latency_s for s in samples if s.kind in OK_KINDS]
    return min(answers) - min(s.sent_s for s in samples) if answers else None


def account(phase: Phase, samples: Sequence[Sample]) -> PhaseFigures:
    """The phase's figures from the run's samples sorted by send time."""
    mine = between(samples, phase.start_s, phase.end_s)
    f = count(mine)
    failed: dict[str, int] = {}
    for by in (f.refused, f.failed):
        for code, n in by.items():
            failed[code] = failed.get(code, 0) + n
    after: dict[str, list[float]] = {}
    for s in mine:
        if s.kind in (REFUSED, FAILED):
            after.setdefault(s.reason, []).append(s.latency_s)
    return PhaseFigures(
        sent=f.sent,
        answered=f.whole + sum(f.degraded.values()),
        degraded=sum(f.degraded.values()),
        failed=failed,
        failed_after_s={code: statistics.median(times) for code, times in after.items()},
        lost=f.lost,
        p50_s=f.p50_s,
        p99_s=f.p99_s,
        first_answer_s=first_answer_s(mine),
    )


def account_all(phases: Sequence[Phase], samples: Sequence[Sample]) -> list[PhaseFigures]:
    """Every phase's figures, in order."""
    ordered = sorted(samples, key=lambda s: s.sent_s)
    return [account(p, ordered) for p in phases]


def p99_of(phases: Sequence[Phase], samples: Sequence[Sample]) -> float | None:
    """The p99 of the answers to the requests sent in all of `phases` together."""
    ordered = sorted(samples, key=lambda s: s.sent_s)
    latencies = [s.latency_s for p in phases for s in between(ordered, p.start_s, p.end_s) if s.kind in OK_KINDS]
    return percentile(latencies, 99)


def up_steps(phases: Sequence[Phase]) -> list[tuple[Phase, float]]:
    """The phases whose load is a step up: from zero replicas, or above the load of the phase before (a burst counts
    as its size), each with the end of the span its reaction is looked for in: the phase's own end."""
    out = []
    previous = 0.0
    for p in phases:
        level = float(p.burst) if p.burst else p.rate
        if p.loaded and (p.from_zero or level > previous):
            out.append((p, p.end_s))
        previous = level
    return out


def failed_text(failed: dict[str, int], after_s: dict[str, float] | None = None) -> str:
    """`UNAVAILABLE 3, INTERNAL 1` (largest first), each with its median time to fail when `after_s` has it
    (`UNAVAILABLE 3 after 0.02 s`); `-` for none."""
    after_s = after_s or {}
    parts = []
    for code, n in sorted(failed.items(), key=lambda kv: (-kv[1], kv[0])):
        parts.append(f"{code} {n}" + (f" after {after_s[code]:.2f} s" if code in after_s else ""))
    return ", ".join(parts) or "-"
