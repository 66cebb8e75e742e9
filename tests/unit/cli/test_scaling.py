"""The autoscaler's decisions as a pure function of the demand history: up at once, down only after the whole window
wanted fewer replicas (the largest desired count over the window), back to min after an idle window, bounded by
min and max, at least one replica while the scaler says active."""

from __future__ import annotations

from collections import deque

import pytest

from services.cli.stack.scaling import Decision, Sample, ScalePolicy, Step, decide, trim
from services.cli.stack.topology import StackTopology

POLICY = ScalePolicy(min_replicas=0, max_replicas=3, target_per_replica=16, window_s=30)


def history(*points: tuple[float, float], active: bool | None = None) -> list[Sample]:
    """Samples from (time, demand); active when the demand is above 0 unless `active` says otherwise."""
    return [Sample(t, d, d > 0 if active is None else active) for t, d in points]


@pytest.mark.parametrize(
    ("demand", "active", "desired"),
    [(0, False, 0), (0, True, 1), (1, True, 1), (16, True, 1), (17, True, 2), (40, True, 3), (500, True, 3)],
)
def test_desired_is_demand_over_target_rounded_up_and_clamped(demand: float, active: bool, desired: int) -> None:
    assert POLICY.desired(demand, active) == desired


def test_min_replicas_hold_without_demand() -> None:
    assert ScalePolicy(2, 4, 16, 30).desired(0, False) == 2


def test_the_policy_of_a_group_is_its_topology() -> None:
    canary = StackTopology.demo().canary
    assert canary is not None
    assert ScalePolicy.of(canary) == ScalePolicy(0, 1, 16, 30)


def test_a_parked_request_wakes_a_group_at_zero_at_once() -> None:
    assert decide(0, history((0, 3)), POLICY) == Step(1, "activated: demand 3")
    # StreamIsActive said active before GetMetrics saw the demand: still one replica
    assert decide(0, [Sample(0, 0, True)], POLICY) == Step(1, "activated: demand 0")


def test_scale_up_is_at_once_to_what_the_latest_demand_wants() -> None:
    assert decide(1, history((0, 5), (0.5, 40)), POLICY) == Step(3, "demand 40 > 1 x 16")
    assert decide(2, history((0, 33)), POLICY) == Step(3, "demand 33 > 2 x 16")
    assert decide(3, history((0, 500)), POLICY) is None  # at max


def test_below_min_is_restored_whatever_the_demand() -> None:
    assert decide(1, history((0, 0)), ScalePolicy(2, 3, 16, 30)) == Step(2, "below min_replicas 2")


def test_no_scale_down_before_the_history_covers_the_window() -> None:
    idle = history(*((t, 0) for t in range(0, 30)))  # 29 s observed
    assert decide(1, idle, POLICY) is None
    assert decide(1, [*idle, Sample(30, 0, False)], POLICY) == Step(0, "idle for 30 s")


def test_scale_down_takes_the_largest_count_the_window_wanted() -> None:
    busy_then_quiet = history((0, 40), (10, 20), (20, 5), (30, 5), (35, 5))
    assert decide(3, busy_then_quiet, POLICY) is None  # 40 held from 0 to 10: inside the window [5, 35]
    assert decide(3, [*busy_then_quiet, Sample(41, 5, True)], POLICY) == Step(
        2, "demand at most 20 for 30 s: 2 x 16 carry it"
    )
    later = [*busy_then_quiet, Sample(51, 5, True)]  # the 20 left the window [21, 51]
    assert decide(3, later, POLICY) == Step(1, "demand at most 5 for 30 s: 1 x 16 carry it")
    assert decide(2, history((0, 20), (30, 20)), POLICY) is None  # still wants 2


def test_one_request_in_the_window_keeps_a_replica() -> None:
    blip = history((0, 0), (12, 1), (13, 0))
    assert decide(1, [*blip, Sample(42.5, 0, False)], POLICY) is None
    assert decide(1, [*blip, Sample(43.5, 0, False)], POLICY) == Step(0, "idle for 30 s")


def test_active_without_demand_counts_as_demand() -> None:
    assert decide(1, history((0, 0), (30, 0), active=True), POLICY) is None


def test_a_gap_in_sampling_cannot_hide_demand() -> None:
    kept: deque[Sample] = deque(history(*((t, 1) for t in range(0, 100, 5))))
    trim(kept, 30)
    assert [s.at for s in kept] == [65, 70, 75, 80, 85, 90, 95]
    assert decide(1, list(kept), POLICY) is None
    kept.append(Sample(200, 0, False))  # nothing sampled from 95 to 200 (the loop was busy): 1 held until 200
    trim(kept, 30)
    assert [s.at for s in kept] == [95, 200]
    assert decide(1, list(kept), POLICY) is None
    for t in (215, 231):
        kept.append(Sample(t, 0, False))
        trim(kept, 30)
    assert [s.at for s in kept] == [200, 215, 231]
    assert decide(1, list(kept), POLICY) == Step(0, "idle for 30 s")


def test_a_decision_reads_as_autoscale_json_and_status_show_it() -> None:
    d = Decision(at=1_700_000_000.25, subset="v2", before=1, after=0, reason="idle for 30 s")
    record = d.to_dict()
    assert record["time"] == "2023-11-14T22:13:20.250+00:00" and record["at"] == 1_700_000_000.25
    assert (record["subset"], record["from"], record["to"], record["reason"]) == ("v2", 1, 0, "idle for 30 s")
    assert d.describe() == "v2: 1 -> 0 replicas (idle for 30 s)"
