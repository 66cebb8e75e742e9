"""bench.chaos.outcomes: every answer is whole, degraded by its cause, refused (with a pushback), failed or lost."""

from __future__ import annotations

import pytest

from bench.chaos.outcomes import DEGRADED, FAILED, LOST, REFUSED, WHOLE, Outcome, answered, errored, has_pushback


def test_an_ok_answer_is_whole_unless_it_names_a_degradation() -> None:
    assert answered("") == Outcome(WHOLE)
    assert answered("features_unavailable:default") == Outcome(DEGRADED, "features_unavailable:default")


@pytest.mark.parametrize("code", ["RESOURCE_EXHAUSTED", "UNAVAILABLE"])
def test_a_refusal_code_with_a_pushback_is_refused_and_without_one_failed(code: str) -> None:
    assert errored(code, pushback=True, elapsed_s=0.001, deadline_s=2.0) == Outcome(REFUSED, code)
    assert errored(code, pushback=False, elapsed_s=0.001, deadline_s=2.0) == Outcome(FAILED, code)


def test_the_deadline_passing_is_lost_but_a_server_timeout_well_before_it_failed() -> None:
    assert errored("DEADLINE_EXCEEDED", False, elapsed_s=2.0, deadline_s=2.0).kind == LOST
    assert errored("DEADLINE_EXCEEDED", False, elapsed_s=1.96, deadline_s=2.0).kind == LOST
    assert errored("DEADLINE_EXCEEDED", False, elapsed_s=1.0, deadline_s=2.0) == Outcome(FAILED, "DEADLINE_EXCEEDED")


@pytest.mark.parametrize("code", ["INTERNAL", "UNKNOWN", "INVALID_ARGUMENT", "UNAUTHENTICATED", "NOT_FOUND"])
def test_other_codes_fail_even_with_a_pushback(code: str) -> None:
    assert errored(code, pushback=True, elapsed_s=0.01, deadline_s=2.0) == Outcome(FAILED, code)


def test_pushback_is_read_from_the_trailers() -> None:
    assert has_pushback((("grpc-retry-pushback-ms", "50"),))
    assert not has_pushback((("x-envoy-overloaded", "true"),))
    assert not has_pushback(None)
