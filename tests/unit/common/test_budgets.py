"""A LatencyBudget follows recent healthy latency between its floor and its ceiling."""

from __future__ import annotations

import pytest

from services.common.budgets import REFRESH_EVERY, LatencyBudget


def test_an_idle_machine_keeps_the_configured_budget() -> None:
    budget = LatencyBudget(0.020)
    for _ in range(100):
        budget.observe(0.002)
    assert budget.value_s == 0.020


def test_a_busy_machine_stretches_the_budget_with_its_latency() -> None:
    budget = LatencyBudget(0.020)
    for _ in range(200):
        budget.observe(0.015)  # healthy answers, but slow: a fixed 20 ms budget would trip on the tail
    assert budget.value_s == pytest.approx(0.045)


def test_the_stretch_is_bounded() -> None:
    budget = LatencyBudget(0.020, stretch_max=4.0)
    for _ in range(200):
        budget.observe(1.0)
    assert budget.value_s == pytest.approx(0.080)


def test_the_budget_comes_back_when_latency_falls() -> None:
    budget = LatencyBudget(0.010, window=64)
    for _ in range(64):
        budget.observe(0.020)
    assert budget.value_s == pytest.approx(0.040)
    for _ in range(64 + REFRESH_EVERY):
        budget.observe(0.001)
    assert budget.value_s == 0.010


@pytest.mark.parametrize(
    "kwargs", [{"floor_s": 0.0}, {"floor_s": 0.01, "stretch_max": 0.5}, {"floor_s": 0.01, "window": 0}]
)
def test_nonsense_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="a budget needs"):
        LatencyBudget(**kwargs)  # type: ignore[arg-type]


def test_another_floor_is_stretched_by_the_same_latency() -> None:
    budget = LatencyBudget(0.005)
    for _ in range(100):
        budget.observe(0.010)
    assert budget.stretched(0.020) == pytest.approx(0.030)  # 3 x p99
    assert budget.stretched(0.002) == pytest.approx(0.008)  # at most 4 x its own floor
    assert budget.stretched(0.050) == 0.050  # never below it
