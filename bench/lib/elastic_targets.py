"""The scaling benchmark's targets: what an elastic stack must do against the same load on a fixed-size one, each as
its measured value, its bound and whether it was met."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.chaos.phases import percentile

FIRST_ANSWER_P50_MOST_S = 1.0  # first request -> first answer, in a phase that starts from zero replicas
FIRST_ANSWER_P99_MOST_S = 2.0
REACTION_MOST_S = 3.0  # a load step -> the replica it added serving
IDLE_CPU_MOST_S = 0.0  # model CPU while the group sleeps at zero
REPLICA_SECONDS_MOST = 0.6  # elastic / fixed
STEADY_P99_MOST = 1.2  # elastic / fixed, loaded phases entered with replicas serving
DEADLINE_SLACK_S = 0.05  # a request shorter than the cold start ends DEADLINE_EXCEEDED this close to its deadline
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"


@dataclass(frozen=True, slots=True)
class Probe:
    """A request sent at zero replicas with a deadline shorter than the cold start: its status code and when it
    ended."""

    code: str
    elapsed_s: float
    deadline_s: float

    @property
    def off_s(self) -> float:
        """How far from its deadline it ended (negative: before)."""
        return self.elapsed_s - self.deadline_s


@dataclass
class Measured:
    """What the targets are judged on (None or empty where the run could not measure it)."""

    failed: int
    lost: int
    deadline_s: float
    cold_starts_s: Sequence[float] = ()
    first_answers_s: Sequence[float] = ()
    reactions_s: Sequence[float] = ()
    idle_zero_cpu_s: float | None = None
    replica_seconds: float | None = None
    fixed_replica_seconds: float | None = None
    steady_p99_s: float | None = None
    fixed_steady_p99_s: float | None = None
    probes: Sequence[Probe] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Target:
    """One line of the target table: `met` None when nothing was measured."""

    name: str
    label: str
    value: float | None
    measured: str
    bound: str
    met: bool | None

    @property
    def verdict(self) -> str:
        return "n/a" if self.met is None else ("met" if self.met else "MISSED")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _at_most(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def reliability(m: Measured) -> Target:
    """0 failed and 0 lost, with each request's deadline above the slowest cold start."""
    slowest = max(m.cold_starts_s, default=None)
    premise = slowest is None or m.deadline_s > slowest
    bound = f"0 and 0 (deadline {m.deadline_s:g} s > cold start max {_s(slowest)})"
    measured = f"{m.failed} failed, {m.lost} lost" + ("" if premise else "; deadline under a cold start")
    return Target(
        "no_failed_or_lost", "failed + lost", m.failed + m.lost, measured, bound, m.failed + m.lost == 0 and premise
    )


def first_answer(m: Measured) -> list[Target]:
    """The first answer of a phase that starts from zero: p50 and p99 over those phases."""
    p50 = percentile(list(m.first_answers_s), 50)
    p99 = percentile(list(m.first_answers_s), 99)
    n = len(m.first_answers_s)
    return [
        Target(
            "first_answer_p50",
            "first answer from zero, p50",
            p50,
            f"{_s(p50)} (n={n})",
            f"<= {FIRST_ANSWER_P50_MOST_S:g} s",
            _at_most(p50, FIRST_ANSWER_P50_MOST_S),
        ),
        Target(
            "first_answer_p99",
            "first answer from zero, p99",
            p99,
            f"{_s(p99)} (n={n})",
            f"<= {FIRST_ANSWER_P99_MOST_S:g} s",
            _at_most(p99, FIRST_ANSWER_P99_MOST_S),
        ),
    ]


def reaction(m: Measured) -> Target:
    """The slowest load step to its added replica serving."""
    worst = max(m.reactions_s, default=None)
    shown = f"worst {_s(worst)} of {len(m.reactions_s)} steps" if worst is not None else "no replica added"
    return Target(
        "reaction",
        "load step -> added replica serving",
        worst,
        shown,
        f"<= {REACTION_MOST_S:g} s",
        _at_most(worst, REACTION_MOST_S),
    )


def idle_cpu(m: Measured) -> Target:
    v = m.idle_zero_cpu_s
    return Target(
        "idle_zero_cpu",
        "model CPU while at zero replicas",
        v,
        "-" if v is None else f"{v:.2f} CPU-s",
        f"<= {IDLE_CPU_MOST_S:g} CPU-s",
        _at_most(v, IDLE_CPU_MOST_S),
    )


def against_fixed(m: Measured) -> list[Target]:
    """Replica-seconds and the steady loaded phases' p99, elastic over fixed."""
    rs = _ratio(m.replica_seconds, m.fixed_replica_seconds)
    p99 = _ratio(m.steady_p99_s, m.fixed_steady_p99_s)
    rs_shown = "-" if rs is None else f"{rs:.2f}x ({m.replica_seconds:.0f} / {m.fixed_replica_seconds:.0f} replica-s)"
    p99_shown = "-" if p99 is None else f"{p99:.2f}x ({_ms(m.steady_p99_s)} / {_ms(m.fixed_steady_p99_s)})"
    return [
        Target(
            "replica_seconds_vs_fixed",
            "replica-seconds, elastic / fixed",
            rs,
            rs_shown,
            f"<= {REPLICA_SECONDS_MOST:g}x",
            _at_most(rs, REPLICA_SECONDS_MOST),
        ),
        Target(
            "steady_p99_vs_fixed",
            "loaded-phase p99, elastic / fixed",
            p99,
            p99_shown,
            f"<= {STEADY_P99_MOST:g}x",
            _at_most(p99, STEADY_P99_MOST),
        ),
    ]


def short_deadline(m: Measured) -> Target:
    """Every request shorter than the cold start ends DEADLINE_EXCEEDED within the slack of its deadline."""
    if not m.probes:
        return Target(
            "short_deadline",
            "deadline < cold start -> DEADLINE_EXCEEDED",
            None,
            "none sent",
            f"within {DEADLINE_SLACK_S * 1000:.0f} ms",
            None,
        )
    worst = max(abs(p.off_s) for p in m.probes)
    exceeded = sum(p.code == DEADLINE_EXCEEDED for p in m.probes)
    others = sorted({p.code for p in m.probes if p.code != DEADLINE_EXCEEDED})
    shown = f"{exceeded}/{len(m.probes)} {DEADLINE_EXCEEDED}, worst {max(p.off_s for p in m.probes) * 1000:+.0f} ms"
    if others:
        shown += f" (others: {', '.join(others)})"
    met = exceeded == len(m.probes) and worst <= DEADLINE_SLACK_S
    return Target(
        "short_deadline",
        "deadline < cold start -> DEADLINE_EXCEEDED",
        worst,
        shown,
        f"all, within {DEADLINE_SLACK_S * 1000:.0f} ms",
        met,
    )


def targets(m: Measured) -> list[Target]:
    """The target table, in the order the benchmark prints it."""
    return [reliability(m), *first_answer(m), reaction(m), idle_cpu(m), *against_fixed(m), short_deadline(m)]


def rows(table: Sequence[Target]) -> list[list[str]]:
    """The table's rows: target, measured, bound, verdict."""
    return [[t.label, t.measured, t.bound, t.verdict] for t in table]
