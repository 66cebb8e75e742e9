"""bench.lib.load_phases: what each phase of an open-loop run adds up to (sent, answered, failed by code, lost,
p50/p99, the first answer after a start from zero), the p99 over several phases, and which phases are steps up."""

from __future__ import annotations

import pytest

from bench.chaos.outcomes import DEGRADED, FAILED, LOST, REFUSED, WHOLE
from bench.chaos.phases import Sample
from bench.lib.load_phases import Phase, account, account_all, failed_text, first_answer_s, p99_of, up_steps


def steady(
    start: float, end: float, rate: float, latency: float = 0.01, kind: str = WHOLE, reason: str = ""
) -> list[Sample]:
    n = round((end - start) * rate)
    return [Sample(start + i / rate, latency, kind, reason) for i in range(n)]


def test_a_phase_counts_what_was_sent_in_it_by_outcome() -> None:
    odd = [
        Sample(1.05, 0.02, DEGRADED, "model_unavailable:default"),
        Sample(2.05, 0.001, REFUSED, "RESOURCE_EXHAUSTED"),
        Sample(3.05, 0.001, FAILED, "UNAVAILABLE"),
        Sample(4.05, 0.003, FAILED, "UNAVAILABLE"),
        Sample(5.05, 10.0, LOST, "DEADLINE_EXCEEDED"),
    ]
    # 100 whole, the odd ones, then the next phase's
    samples = sorted([*steady(0.0, 10.0, 10.0), *odd, *steady(10.0, 12.0, 10.0)], key=lambda s: s.sent_s)
    f = account(Phase("low", 0.0, 10.0, rate=10.0), samples)
    assert f.sent == 105
    assert f.answered == 101 and f.degraded == 1
    assert f.failed == {"RESOURCE_EXHAUSTED": 1, "UNAVAILABLE": 2} and f.failed_total == 3
    assert f.lost == 1
    assert f.p50_s == pytest.approx(0.01)
    assert failed_text(f.failed) == "UNAVAILABLE 2, RESOURCE_EXHAUSTED 1"
    assert failed_text(f.failed, f.failed_after_s) == "UNAVAILABLE 2 after 0.00 s, RESOURCE_EXHAUSTED 1 after 0.00 s"
    assert f.failed_after_s["UNAVAILABLE"] == pytest.approx(0.002)
    assert failed_text({}) == "-"


def test_the_first_answer_waits_for_the_cold_start_whichever_request_it_answers() -> None:
    # sent from 0 s on, nothing answered before 1.5 s (a replica serving), then everything parked is answered
    samples = [Sample(t, 1.5 - t if t < 1.5 else 0.01, WHOLE) for t in (0.0, 0.5, 1.0, 2.0)]
    assert first_answer_s(samples) == pytest.approx(1.5)
    assert first_answer_s([Sample(0.0, 10.0, LOST)]) is None
    assert first_answer_s([]) is None
    f = account(Phase("low", 0.0, 5.0, rate=2.0, from_zero=True), samples)
    assert f.first_answer_s == pytest.approx(1.5)


def test_p99_spans_the_answers_of_several_phases_and_leaves_out_errors() -> None:
    samples = steady(0.0, 10.0, 10.0, latency=0.01) + steady(10.0, 20.0, 10.0, latency=0.05)
    samples += [Sample(5.0, 10.0, LOST)]
    samples.sort(key=lambda s: s.sent_s)
    phases = [Phase("a", 0.0, 10.0, rate=10.0), Phase("b", 10.0, 20.0, rate=10.0)]
    assert p99_of(phases[:1], samples) == pytest.approx(0.01)
    assert p99_of(phases, samples) == pytest.approx(0.05)
    assert [f.sent for f in account_all(phases, samples)] == [101, 100]


def test_steady_phases_are_loaded_and_entered_with_replicas_up() -> None:
    assert Phase("low", 0, 1, rate=20.0).steady
    assert not Phase("low", 0, 1, rate=20.0, from_zero=True).steady
    assert not Phase("idle", 0, 1).steady and not Phase("idle", 0, 1).loaded
    assert Phase("burst", 0, 1, burst=100).loaded
    assert Phase("burst", 0, 1, burst=100).load == "100 at once"
    assert Phase("low", 0, 1, rate=20.0).load == "20/s"


def test_steps_up_are_rises_in_load_and_every_start_from_zero() -> None:
    phases = [
        Phase("zero", 0, 5),
        Phase("low", 5, 20, rate=20, from_zero=True),
        Phase("high", 20, 40, rate=150),
        Phase("low again", 40, 55, rate=20),
        Phase("idle", 55, 80),
        Phase("burst", 80, 92, burst=100, from_zero=True),
        Phase("to zero 1", 92, 110, compared=False),
        Phase("from zero 1", 110, 113, rate=20, from_zero=True, compared=False),
        Phase("from zero 2", 120, 123, rate=20, from_zero=True, compared=False),
    ]
    steps = up_steps(phases)
    assert [(p.name, until) for p, until in steps] == [
        ("low", 20),
        ("high", 40),
        ("burst", 92),
        ("from zero 1", 113),
        ("from zero 2", 123),
    ]
