"""The cold-start clock: the process's age from /proc/<pid>/stat, the split per model, one observation per model."""

from __future__ import annotations

import os
import time

import pytest
from prometheus_client import REGISTRY

from services.model.cold_start import ColdStart, ColdStartClock, cold_starts, process_age, spawn_age

# A real /proc/<pid>/stat line, its command name holding a space and a ')': starttime (field 22) is 4200 ticks.
STAT = "1234 (py) thon) S 1 1234 1234 0 -1 4194560 900 0 0 0 12 3 0 0 20 0 5 0 4200 123456789 4000 " + " ".join(
    ["0"] * 30
)


def test_spawn_age_counts_fields_after_the_last_parenthesis() -> None:
    assert spawn_age(STAT, 100, 50.0) == pytest.approx(8.0)  # 50 s of uptime minus 42 s
    assert spawn_age(STAT, 1000, 5.0) == pytest.approx(0.8)


def test_process_age_is_this_process_age() -> None:
    age = process_age()
    assert 0 < age < time.monotonic()  # this interpreter started after boot and before now
    if os.path.exists("/proc/self/stat"):
        assert age > 0.01  # the interpreter and pytest's imports took longer than a clock tick


def test_cold_starts_split_per_model_and_leave_out_models_with_nothing_ready() -> None:
    starts = cold_starts(2.5, 0.75, {"b": {2: 0.25, 1: 0.5}, "a": {1: 1.0}, "broken": {}})
    assert starts == [ColdStart("a", (1,), 2.5, 0.75, 1.0), ColdStart("b", (1, 2), 2.5, 0.75, 0.75)]
    assert starts[0].line() == "cold start: a v1 serving 2.50 s after spawn (import 0.75 s, load+warm 1.00 s)"
    assert starts[1].line().startswith("cold start: b v1+v2 serving 2.50 s")


def _count(model: str) -> float:
    return REGISTRY.get_sample_value("meshserve_model_cold_start_seconds_count", {"model": model}) or 0.0


def test_the_clock_observes_each_model_once_at_serving(caplog: pytest.LogCaptureFixture) -> None:
    ages = iter([0.4, 1.9, 7.0])
    clock = ColdStartClock(lambda: next(ages))
    assert clock.import_s == 0.4
    before = _count("unit_cold_a")
    with caplog.at_level("INFO", logger="services.model.cold_start"):
        starts = clock.serving({"unit_cold_a": {3: 1.2}})
        assert clock.serving({"unit_cold_a": {3: 1.2}}) == []  # once per process
    assert [s.serving_s for s in starts] == [1.9]
    assert _count("unit_cold_a") == before + 1
    assert REGISTRY.get_sample_value("meshserve_model_cold_start_seconds_sum", {"model": "unit_cold_a"}) == 1.9
    assert "cold start: unit_cold_a v3 serving 1.90 s after spawn (import 0.40 s, load+warm 1.20 s)" in caplog.text
