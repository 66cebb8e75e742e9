"""bench.lib.elastic_targets and bench.lib.elastic_report: each target's measured value, bound and verdict, and the
figures a run's samples, decisions and /proc samples come to against a fixed-size run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.chaos.outcomes import FAILED, LOST, WHOLE
from bench.chaos.phases import Sample
from bench.lib.elastic_report import ELASTIC, FIXED, Run, StackResult, figures, measured, print_report, usage
from bench.lib.elastic_targets import DEADLINE_EXCEEDED, Measured, Probe, Target, rows, targets
from bench.lib.load_phases import Phase
from bench.lib.replica_usage import ProcUsage, Snapshot
from bench.lib.scaling import ColdStart, Decision


def good() -> Measured:
    return Measured(
        failed=0,
        lost=0,
        deadline_s=10.0,
        cold_starts_s=[0.9, 1.1],
        first_answers_s=[0.8, 0.9, 1.0],
        reactions_s=[1.2, 2.0],
        idle_zero_cpu_s=0.0,
        replica_seconds=100.0,
        fixed_replica_seconds=300.0,
        steady_p99_s=0.055,
        fixed_steady_p99_s=0.050,
        probes=[Probe(DEADLINE_EXCEEDED, 0.26, 0.25), Probe(DEADLINE_EXCEEDED, 0.251, 0.25)],
    )


def by_name(table: list[Target]) -> dict[str, Target]:
    return {t.name: t for t in table}


def test_a_run_that_meets_every_target() -> None:
    table = targets(good())
    assert [t.verdict for t in table] == ["met"] * 8
    t = by_name(table)
    assert t["replica_seconds_vs_fixed"].value == pytest.approx(1 / 3)
    assert t["steady_p99_vs_fixed"].value == pytest.approx(1.1)
    assert t["short_deadline"].measured == "2/2 DEADLINE_EXCEEDED, worst +10 ms"
    assert rows(table)[0] == [
        "failed + lost",
        "0 failed, 0 lost",
        "0 and 0 (deadline 10 s > cold start max 1.10 s)",
        "met",
    ]


@pytest.mark.parametrize(
    ("change", "missed"),
    [
        ({"failed": 1}, "no_failed_or_lost"),
        ({"lost": 2}, "no_failed_or_lost"),
        ({"deadline_s": 1.0}, "no_failed_or_lost"),  # a deadline under the slowest cold start proves nothing
        ({"first_answers_s": [1.2, 1.3, 0.5]}, "first_answer_p50"),
        ({"first_answers_s": [0.5, 0.6, 2.5]}, "first_answer_p99"),
        ({"reactions_s": [1.0, 3.5]}, "reaction"),
        ({"idle_zero_cpu_s": 0.01}, "idle_zero_cpu"),
        ({"replica_seconds": 200.0}, "replica_seconds_vs_fixed"),
        ({"steady_p99_s": 0.07}, "steady_p99_vs_fixed"),
        ({"probes": [Probe(DEADLINE_EXCEEDED, 0.31, 0.25)]}, "short_deadline"),  # 60 ms late
        ({"probes": [Probe(DEADLINE_EXCEEDED, 0.15, 0.25)]}, "short_deadline"),  # 100 ms early
        ({"probes": [Probe("UNAVAILABLE", 0.25, 0.25)]}, "short_deadline"),  # another code, even at the deadline
    ],
)
def test_each_target_misses_on_its_own_figure(change: dict, missed: str) -> None:
    m = good()
    for key, value in change.items():
        setattr(m, key, value)
    verdicts = {t.name: t.verdict for t in targets(m)}
    assert verdicts[missed] == "MISSED"
    assert [n for n, v in verdicts.items() if v != "met"] == [missed]


def test_what_was_not_measured_is_not_applicable() -> None:
    m = Measured(failed=0, lost=0, deadline_s=10.0)
    verdicts = {t.name: t.verdict for t in targets(m)}
    assert verdicts.pop("no_failed_or_lost") == "met"
    assert set(verdicts.values()) == {"n/a"}


# ----------------------------------------------------------------------------- a run, end to end in figures

PHASES = [
    Phase("zero", 0.0, 5.0),
    Phase("low", 5.0, 15.0, rate=10.0, from_zero=True),
    Phase("high", 15.0, 25.0, rate=20.0),
    Phase("idle", 25.0, 40.0),
]


def answers(latency_high: float, first_wait: float = 0.0) -> list[Sample]:
    low = [Sample(5.0 + i / 10, max(0.01, first_wait - i / 10), WHOLE) for i in range(100)]
    high = [Sample(15.0 + i / 20, latency_high, WHOLE) for i in range(200)]
    return low + high


def snapshots(replicas: int, until: float) -> list[Snapshot]:
    """`replicas` processes alive from 0 to `until`, each using 0.5 CPU and 1 GiB, then none (reaped)."""
    out = []
    for t in range(41):
        alive = t <= until
        procs = tuple(ProcUsage(p, 1, 0.5 * t, 1 << 30) for p in range(replicas)) if alive else ()
        reaped = 0.0 if alive else 0.5 * until * replicas
        out.append(Snapshot(float(t), procs, reaped))
    return out


def test_a_run_comes_to_its_figures_against_the_fixed_one(capsys: pytest.CaptureFixture[str]) -> None:
    elastic = StackResult(ELASTIC, 0, Path("."), 0.0, 0.0, "v1", PHASES, answers(0.028, first_wait=1.2))
    elastic.decisions = [Decision(5.0, "v1", 0, 1), Decision(16.0, "v1", 1, 2), Decision(35.0, "v1", 2, 0)]
    elastic.cold_starts = [ColdStart("model-v1-a", "fraud_mlp", 6.1, 1.0, 0.7, 0.2)]
    elastic.cold_starts.append(ColdStart("model-v1-b", "fraud_mlp", 17.5, 1.2, 0.8, 0.2))
    elastic.at_zero = [(0.0, 5.0), (36.0, 40.0)]
    elastic.snapshots = [Snapshot(float(t), ()) for t in range(41)]
    elastic.probes = [Probe(DEADLINE_EXCEEDED, 0.255, 0.25)]
    fixed = StackResult(
        FIXED, 3, Path("."), 0.0, 0.0, "v1", [Phase(p.name, p.start_s, p.end_s, p.rate) for p in PHASES]
    )
    fixed.samples = answers(0.025)
    fixed.snapshots = snapshots(3, until=40.0)
    run = Run("python -m bench.elastic", 10.0, elastic, fixed, 3, usd_per_hour=3.6)

    assert usage(elastic, True, 3.6).replica_s == pytest.approx(11 * 1 + 19 * 2)  # 5..16 at 1, 16..35 at 2
    f = usage(fixed, True, 3.6)
    assert f.replica_s == pytest.approx(120.0) and f.answered == 300
    assert f.cpu_s == pytest.approx(3 * 0.5 * 40) and f.memory_gib_s == pytest.approx(120.0)
    assert f.usd == pytest.approx(0.12) and f.usd_per_million == pytest.approx(400.0)

    m = measured(run)
    assert list(m.first_answers_s) == pytest.approx([1.2])
    assert list(m.reactions_s) == pytest.approx([1.1, 2.5])  # low: 5 -> 6.1; high: 15 -> 17.5
    assert m.idle_zero_cpu_s == 0.0
    assert m.steady_p99_s == pytest.approx(0.028) and m.fixed_steady_p99_s == pytest.approx(0.025)
    verdicts = {t.name: t.verdict for t in targets(m)}
    assert verdicts["replica_seconds_vs_fixed"] == "met"  # 49 / 120
    assert verdicts["steady_p99_vs_fixed"] == "met"  # 1.12x
    assert verdicts["first_answer_p50"] == "MISSED"  # 1.2 s

    recorded = {f["name"]: f for f in figures(run, targets(m))}
    assert recorded["elastic.elastic.low.first_answer"]["value"] == pytest.approx(1.2)
    assert recorded["elastic.fixed.replica_seconds"]["value"] == 120.0
    assert recorded["elastic.target.first_answer_p50"]["unit"] == "MISSED"
    assert "elastic.fixed.low.first_answer" not in recorded

    assert [t.verdict for t in print_report(run)] == [t.verdict for t in targets(m)]
    out = capsys.readouterr().out
    assert "  low   1111111111\n" in out  # replicas per second: 1 from 5 s on
    assert "first answer from zero, p50" in out


def test_failures_and_losses_of_every_phase_count_against_the_elastic_stack() -> None:
    samples = [*answers(0.03), Sample(6.0, 0.01, FAILED, "UNAVAILABLE"), Sample(7.0, 10.0, LOST, "DEADLINE_EXCEEDED")]
    samples.sort(key=lambda s: s.sent_s)
    elastic = StackResult(ELASTIC, 0, Path("."), 0.0, 0.0, "v1", PHASES, samples, unfinished=1)
    m = measured(Run("c", 10.0, elastic, None, 3, 1.0))
    assert (m.failed, m.lost) == (1, 2)
    assert m.fixed_replica_seconds is None
