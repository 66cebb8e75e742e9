"""bench.chaos.phases: a phase's counts and percentiles, the recovery time after its fault, the chaos run's targets per
phase, and capacity from the ramp's steps."""

from __future__ import annotations

import pytest

from bench.chaos.outcomes import DEGRADED, FAILED, LOST, REFUSED, WHOLE
from bench.chaos.phases import (
    FAULT,
    OVERLOAD,
    QUIET,
    Baseline,
    Figures,
    Phase,
    Sample,
    assess,
    assess_all,
    between,
    capacity,
    count,
    p99_bound_s,
    percentile,
    recovery_s,
    step_holds,
    timeline,
)


def steady(
    start: float, end: float, rate: float, latency: float = 0.010, kind: str = WHOLE, reason: str = ""
) -> list[Sample]:
    n = round((end - start) * rate)
    return [Sample(start + i / rate, latency, kind, reason, "1") for i in range(n)]


def test_percentile_interpolates_like_numpy() -> None:
    assert percentile([], 99) is None
    assert percentile([5.0], 50) == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def test_count_sorts_answers_by_kind_and_reason_and_times_only_the_ok_ones() -> None:
    samples = [
        Sample(0.0, 0.010, WHOLE, version="1"),
        Sample(0.1, 0.020, DEGRADED, "features_degraded", "2"),
        Sample(0.2, 0.030, DEGRADED, "features_degraded", "1"),
        Sample(0.3, 0.001, REFUSED, "RESOURCE_EXHAUSTED"),
        Sample(0.4, 0.500, FAILED, "UNAVAILABLE"),
        Sample(0.5, 2.000, LOST, "DEADLINE_EXCEEDED", late_s=0.004),
    ]
    f = count(samples)
    assert f.late_p99_s == pytest.approx(0.0038)
    assert (f.sent, f.whole, f.lost) == (6, 1, 1)
    assert f.degraded == {"features_degraded": 2}
    assert f.refused == {"RESOURCE_EXHAUSTED": 1} and f.failed == {"UNAVAILABLE": 1}
    assert f.p50_s == pytest.approx(0.020) and f.p99_s == pytest.approx(0.0298)  # whole and degraded only
    assert f.refused_p99_s == pytest.approx(0.001)
    assert f.versions == {"1": 2, "2": 1}
    assert f.whole_ratio == pytest.approx(1 / 6)


def test_between_takes_send_times_in_a_half_open_window() -> None:
    samples = steady(0, 10, 1)
    assert [s.sent_s for s in between(samples, 2.0, 5.0)] == [2.0, 3.0, 4.0]


QUIET_FIGURES = Baseline(p99_s=0.010, whole_ratio=1.0)


def test_recovery_is_zero_when_the_fault_leaves_no_mark() -> None:
    samples = steady(0, 20, 50)
    assert recovery_s(samples, fault_end_s=5.0, end_s=20.0, quiet=QUIET_FIGURES) == 0.0


def test_recovery_is_when_whole_answers_come_back_and_stay() -> None:
    # degraded from the fault's end (t=5) until t=8, whole after
    samples = steady(0, 5, 50) + steady(5, 8, 50, kind=DEGRADED, reason="features_degraded") + steady(8, 20, 50)
    assert recovery_s(samples, 5.0, 20.0, QUIET_FIGURES) == pytest.approx(3.0)


def test_recovery_waits_for_the_p99_as_well() -> None:
    samples = steady(0, 6, 50, latency=0.5) + steady(6, 20, 50)
    assert recovery_s(samples, 2.0, 20.0, QUIET_FIGURES) == pytest.approx(4.0)


def test_a_relapse_inside_the_hold_pushes_recovery_past_it() -> None:
    samples = (
        steady(0, 3, 50, kind=LOST)
        + steady(3, 5, 50)  # 2 s back, less than the 4 s hold
        + steady(5, 6, 50, kind=FAILED, reason="UNAVAILABLE")
        + steady(6, 20, 50)
    )
    assert recovery_s(samples, 0.0, 20.0, QUIET_FIGURES) == pytest.approx(6.0)


def test_no_recovery_when_the_phase_ends_first() -> None:
    samples = steady(0, 15, 50, kind=LOST) + steady(15, 18, 50)
    assert recovery_s(samples, 0.0, 18.0, QUIET_FIGURES) is None


def test_one_stray_slow_answer_in_a_window_stays_within_the_margin() -> None:
    samples = steady(0, 20, 50)
    samples[300] = Sample(samples[300].sent_s, 0.200, WHOLE)  # 1 of a window's 100: its p99 is 11.9 ms, under 15
    assert recovery_s(samples, 0.0, 20.0, QUIET_FIGURES) == 0.0
    samples[301] = Sample(samples[301].sent_s, 0.200, WHOLE)  # 2 of 100: the windows from 4.5 to 6 s miss the p99
    assert recovery_s(samples, 3.0, 20.0, QUIET_FIGURES) == pytest.approx(3.5)


def phase(kind: str = FAULT, level: float = 0.5, causes: tuple[str, ...] = (), **times: float) -> Phase:
    start, end = times.get("start", 0.0), times.get("end", 20.0)
    fault = None if kind == QUIET else times.get("fault", 2.0)
    return Phase(
        "p", level, 50.0, start, end, kind, fault, times.get("fault_end", fault) if fault is not None else None, causes
    )


def labels(result: object) -> dict[str, bool]:
    return {c.label: c.ok for c in result.checks}  # type: ignore[attr-defined]


def test_a_quiet_phase_at_half_capacity_allows_nothing_but_whole() -> None:
    r = assess(phase(QUIET), steady(0, 20, 50), None)
    assert labels(r) == {"0 failed": True, "0 lost": True, "0 refused": True, "0 degraded": True}
    bad = [*steady(0, 19, 50), Sample(19.5, 0.01, DEGRADED, "features_degraded")]
    assert labels(assess(phase(QUIET), bad, None))["0 degraded"] is False


def test_at_half_capacity_a_fault_may_degrade_only_by_its_own_cause() -> None:
    samples = steady(0, 2, 50) + steady(2, 4, 50, kind=DEGRADED, reason="features_unavailable:default")
    samples += steady(4, 20, 50)
    p = phase(causes=("features_",))
    r = assess(p, samples, QUIET_FIGURES)
    assert r.met, r.checks
    assert r.recovery_s == pytest.approx(2.0)
    other = steady(0, 2, 50) + steady(2, 3, 50, kind=DEGRADED, reason="model_timeout:fallback_model")
    other += steady(3, 20, 50)
    assert labels(assess(p, other, QUIET_FIGURES))["degraded only features_*"] is False


def test_at_ninety_percent_refusals_and_degradation_are_allowed_but_not_failures_or_losses() -> None:
    samples = steady(0, 2, 50) + steady(2, 3, 50, kind=REFUSED, reason="RESOURCE_EXHAUSTED") + steady(3, 20, 50)
    r = assess(phase(level=0.9), samples, QUIET_FIGURES)
    assert set(labels(r)) == {"0 failed", "0 lost", "recovered within 10 s"}
    assert r.met
    lost = [*samples, Sample(19.0, 2.0, LOST, "DEADLINE_EXCEEDED")]
    assert labels(assess(phase(level=0.9), sorted(lost, key=lambda s: s.sent_s), QUIET_FIGURES))["0 lost"] is False


def test_overload_is_judged_on_its_own_window() -> None:
    p = phase(OVERLOAD, fault=2.0, fault_end=8.0)
    during = steady(2, 8, 150, latency=0.018) + steady(
        2, 8, 100, latency=0.002, kind=REFUSED, reason="RESOURCE_EXHAUSTED"
    )
    samples = sorted(steady(0, 2, 50) + during + steady(8, 20, 50), key=lambda s: s.sent_s)
    r = assess(p, samples, QUIET_FIGURES)
    assert r.during.sent == len(during) and r.figures.sent == len(samples)
    assert labels(r) == {
        "0 failed": True,
        "0 lost": True,
        "refused within 5 ms (p99)": True,
        "admitted p99 <= 2x quiet": True,
        "recovered within 10 s": True,
    }
    slow = sorted(steady(0, 2, 50) + steady(2, 8, 150, latency=0.030) + steady(8, 20, 50), key=lambda s: s.sent_s)
    assert labels(assess(p, slow, QUIET_FIGURES))["admitted p99 <= 2x quiet"] is False
    late = steady(2, 8, 100, latency=0.009, kind=REFUSED, reason="RESOURCE_EXHAUSTED")
    assert (
        labels(assess(p, sorted(samples + late, key=lambda s: s.sent_s), QUIET_FIGURES))["refused within 5 ms (p99)"]
        is False
    )


def test_assess_all_compares_each_level_with_its_own_quiet_phase() -> None:
    half_quiet = Phase("quiet", 0.5, 50, 0, 10)
    half_fault = Phase("kill", 0.5, 50, 10, 30, FAULT, 12.0, 12.0)
    hot_quiet = Phase("quiet", 0.9, 90, 30, 40)
    hot_fault = Phase("kill", 0.9, 90, 40, 60, FAULT, 42.0, 42.0)
    samples = steady(0, 30, 50, latency=0.010) + steady(30, 60, 90, latency=0.030)
    results = assess_all([half_quiet, half_fault, hot_quiet, hot_fault], samples)
    assert [r.recovery_s for r in results] == [None, 0.0, None, 0.0]  # 30 ms is quiet at 90%, not at 50%
    assert all(r.met for r in results)


def test_a_fault_phase_without_a_quiet_baseline_is_not_recovered() -> None:
    r = assess(phase(), steady(0, 20, 50), None)
    assert r.recovery_s is None and not r.met


def figures(whole: int, sent: int, p99_s: float, lost: int = 0) -> Figures:
    return Figures(sent=sent, whole=whole, lost=lost, p50_s=p99_s / 2, p99_s=p99_s)


def test_p99_bound_is_a_multiple_of_the_light_steps_median_with_a_floor() -> None:
    assert p99_bound_s(0.030) == pytest.approx(0.300)
    assert p99_bound_s(0.002) == pytest.approx(0.250)
    assert p99_bound_s(None) == pytest.approx(0.250)
    assert p99_bound_s(0.050, factor=6) == pytest.approx(0.300)


def test_a_step_holds_with_99_percent_whole_nothing_lost_and_a_bounded_p99() -> None:
    assert step_holds(figures(99, 100, 0.04), 0.05)
    assert not step_holds(figures(98, 100, 0.04), 0.05)
    assert not step_holds(figures(100, 100, 0.06), 0.05)
    assert not step_holds(figures(100, 101, 0.04, lost=1), 0.05)
    assert not step_holds(Figures(), 0.05)


def test_capacity_is_the_highest_rate_below_the_first_step_that_fails() -> None:
    steps = [
        (16.0, figures(80, 80, 0.02)),
        (20.8, figures(104, 104, 0.03)),
        (27.0, figures(120, 135, 0.03)),  # fails
        (23.7, figures(118, 118, 0.04)),  # the step between, run last
        (35.0, figures(175, 175, 0.03)),  # above a failure: not capacity
    ]
    assert capacity(steps, 0.08) == 23.7
    assert capacity(steps[:1], 0.01) is None


def test_a_rate_holds_when_its_second_chance_does() -> None:
    blip = figures(98, 100, 0.02)  # two answers of 100 degraded: the first try at 27 req/s
    steps = [(16.0, figures(100, 100, 0.02)), (27.0, blip), (27.0, figures(135, 135, 0.02)), (35.0, blip)]
    assert capacity(steps, 0.08) == 27.0
    assert capacity([*steps[:2], (35.0, figures(175, 175, 0.02))], 0.08) == 16.0  # a rate that never held stops it


def test_timeline_bins_the_phase_by_second() -> None:
    samples = steady(10, 12, 10) + steady(12, 12.5, 10, kind=LOST)
    bins = timeline(samples, 10.0, 12.5)
    assert [b[:3] for b in bins] == [(0.0, 10, 10), (1.0, 10, 10), (2.0, 5, 0)]
    assert bins[0][3] == pytest.approx(0.010) and bins[2][3] is None
