"""The autoscaler's decisions as a pure function of the demand it observed: how many replicas a group should run,
up at once, down only after a stabilisation window (the HPA's rules), with no process, clock or network involved."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from services.cli.stack.topology import ModelGroup


@dataclass(frozen=True, slots=True)
class ScalePolicy:
    """How a group follows its demand: between `min_replicas` and `max_replicas`, one replica per
    `target_per_replica` of demand, down only after `window_s` of wanting fewer.

    Example:
        policy = ScalePolicy(min_replicas=0, max_replicas=3, target_per_replica=16, window_s=30)
        policy.desired(40, active=True)  # 3: ceil(40 / 16)
        policy.desired(0, active=True)  # 1: a request parked with no replica still needs one
    """

    min_replicas: int
    max_replicas: int
    target_per_replica: float
    window_s: float

    @classmethod
    def of(cls, group: ModelGroup) -> ScalePolicy:
        return cls(group.min_replicas, group.max_replicas, group.target_per_replica, group.scale_down_window_s)

    def desired(self, demand: float, active: bool) -> int:
        """ceil(demand / target), at least 1 while the scaler says active, clamped to [min, max]."""
        count = math.ceil(demand / self.target_per_replica) if demand > 0 else 0
        if active:
            count = max(count, 1)
        return max(self.min_replicas, min(self.max_replicas, count))


@dataclass(frozen=True, slots=True)
class Sample:
    """One observation of a group's demand: when (monotonic seconds), the scaler's metric, and whether it said
    active (StreamIsActive; also true whenever the metric is above 0)."""

    at: float
    demand: float
    active: bool


@dataclass(frozen=True, slots=True)
class Step:
    """A change of a group's replica count and why."""

    to: int
    reason: str


def decide(current: int, history: Sequence[Sample], policy: ScalePolicy) -> Step | None:
    """The step a group running `current` replicas takes now, or None to stay.

    `history` is oldest first, its last sample the latest (its time is "now"), its first the start of what has been
    observed; a sample holds until the next one. Up: at once to the latest sample's desired count. Down: to the
    largest desired count over the last `window_s` (the HPA's stabilisation; the sample in force when the window
    opened counts, so a gap in sampling cannot hide demand), only once the history covers the whole window and that
    count is below `current`; with no demand in the window the group goes back to min_replicas (0 allowed).
    """
    if not history:
        return None
    latest = history[-1]
    want = policy.desired(latest.demand, latest.active)
    if want > current:
        return Step(want, up_reason(current, latest, policy))
    start = latest.at - policy.window_s
    if want == current or history[0].at > start:
        return None
    opened = max(i for i, s in enumerate(history) if s.at <= start)  # the sample in force when the window opened
    recent = [s for i, s in enumerate(history) if i >= opened and (s.at > start or i == opened)]
    stable = max(policy.desired(s.demand, s.active) for s in recent)
    if stable >= current:
        return None
    peak = max(s.demand for s in recent)
    window = f"{policy.window_s:g} s"
    if peak <= 0 and not any(s.active for s in recent):
        return Step(stable, f"idle for {window}")
    return Step(stable, f"demand at most {peak:g} for {window}: {stable} x {policy.target_per_replica:g} carry it")


def up_reason(current: int, latest: Sample, policy: ScalePolicy) -> str:
    demand = f"{latest.demand:g}"
    if current == 0:
        return f"activated: demand {demand}"
    if latest.demand > current * policy.target_per_replica:
        return f"demand {demand} > {current} x {policy.target_per_replica:g}"
    return f"below min_replicas {policy.min_replicas}"


def trim(history: deque[Sample], window_s: float) -> None:
    """Drop samples older than the window before the latest, keeping the one just before it (it shows the history
    covers the window)."""
    if not history:
        return
    start = history[-1].at - window_s
    while len(history) >= 2 and history[1].at <= start:
        history.popleft()


@dataclass(frozen=True, slots=True)
class Decision:
    """A scaling decision as `<log_dir>/autoscale.json` and `meshserve status` show it: when (epoch seconds), the
    group's subset, the replica count from and to, and why."""

    at: float
    subset: str
    before: int
    after: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": datetime.fromtimestamp(self.at, UTC).isoformat(timespec="milliseconds"),
            "at": self.at,
            "subset": self.subset,
            "from": self.before,
            "to": self.after,
            "reason": self.reason,
        }

    def describe(self) -> str:
        return f"{self.subset}: {self.before} -> {self.after} replicas ({self.reason})"
