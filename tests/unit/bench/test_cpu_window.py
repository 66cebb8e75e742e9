"""bench.experiments.cpu_window's in-process part: requests per call from two readings of the batch histogram."""

from __future__ import annotations

from bench.experiments.cpu_window import requests_per_call


def test_requests_per_call_is_the_mean_over_the_calls_between_two_readings() -> None:
    before = {("model", "sum"): 100.0, ("model", "count"): 20.0, ("cache", "sum"): 5.0, ("cache", "count"): 5.0}
    after = {("model", "sum"): 170.0, ("model", "count"): 30.0, ("cache", "sum"): 5.0, ("cache", "count"): 5.0}
    assert requests_per_call(before, after) == {"model": 7.0}  # no cache call in between: left out
