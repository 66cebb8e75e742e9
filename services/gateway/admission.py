"""Admission control: bounded in-flight work per pipeline and in total, an adaptive limit, priorities.

Beyond its limit a request is refused at once (RESOURCE_EXHAUSTED with a retry hint) rather than
queued into a timeout. Each pipeline's limit adapts to latency: past a latency target the limit shrinks, under
it the limit grows again, always between `min_limit` and the pipeline's `max_inflight`. Lower priorities may use
only a share of the limit, so under overload they are shed first.
"""

from __future__ import annotations

import enum
import math
import statistics
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from services.common.errors import InvalidArgument, ResourceExhausted


class Priority(enum.IntEnum):
    HIGH = 1
    NORMAL = 2
    LOW = 3


_PRIORITY_NAMES = {"high": Priority.HIGH, "normal": Priority.NORMAL, "low": Priority.LOW}


MAX_PRIORITY_LEVEL = 2**32  # the largest Triton-style priority level accepted (3 and above are low)


def parse_priority(value: str | float | None) -> Priority:
    """`priority` request parameter: high/normal/low, or Triton-style levels (1 highest, 0 the default)."""
    if value is None or value == "" or value == 0:
        return Priority.NORMAL
    if isinstance(value, str):
        found = _PRIORITY_NAMES.get(value.strip().lower())
        if found is None:
            raise InvalidArgument(f"parameter priority={value!r}: use high, normal or low (or 1, 2, 3)")
        return found
    if not (isinstance(value, int) or float(value).is_integer()) or not 0 <= value <= MAX_PRIORITY_LEVEL:
        raise InvalidArgument(
            f"parameter priority={value!r}: must be a whole number, 0 (default), 1 (high), 2 (normal) or 3 to "
            f"{MAX_PRIORITY_LEVEL} (low)"
        )
    return Priority(min(int(value), Priority.LOW))


TARGET_LATENCY_S = 0.25
"""The latency a pipeline's admitted requests are kept under by default: a quarter of the default 1 s deadline."""


class GradientLimit:
    """A concurrency limit that keeps the median latency of admitted requests under a target:
    limit = limit * clamp(target / median, 0.5, 1) + sqrt(limit), smoothed, between `min_limit` and `max_limit`.

    Under the target the limit grows (the sqrt term) while the pool uses it; past the target it shrinks, so the
    excess is refused at once instead of queueing. It follows what the machine serves within the target: at
    light load the limit is never reached; near capacity it settles where latency meets the target, by Little's
    law at about throughput x target. A target rather than a baseline relative to past latency, because healthy
    latency here rises with load (bigger micro-batches): a relative baseline either takes a sustained overload's
    queueing for normal or healthy 90% load for overload (measured in the chaos runs, bench/README).
    """

    def __init__(
        self,
        initial: int,
        min_limit: int,
        max_limit: int,
        *,
        target_s: float = TARGET_LATENCY_S,
        smoothing: float = 0.2,
        window: int = 16,
    ) -> None:
        if not target_s > 0:
            raise ValueError("an admission latency target must be above 0")
        self.min_limit = min_limit
        self.max_limit = max_limit
        self.limit = float(max(min_limit, min(initial, max_limit)))
        self.target_s = target_s
        self.smoothing = smoothing
        self.window = window
        self._window: list[float] = []
        self._max_inflight = 0

    @property
    def value(self) -> int:
        return int(self.limit)

    def on_sample(self, rtt_s: float, inflight: int) -> None:
        """A whole answer's latency. A window's latency is its median, not its mean: queueing delays every request,
        while a sick replica or a stopped dependency delays only the share of requests it serves, which is a
        matter for retries and degradation, not a reason to refuse the healthy rest."""
        self._window.append(rtt_s)
        self._max_inflight = max(self._max_inflight, inflight)
        if len(self._window) >= self.window:
            self._update(statistics.median(self._window), self._max_inflight)
            self._window.clear()
            self._max_inflight = 0

    def on_drop(self) -> None:
        """A downstream overload or the caller's deadline passing: back off at once (multiplicative decrease)."""
        self.limit = max(float(self.min_limit), self.limit * 0.9)

    def _update(self, median_s: float, inflight: int) -> None:
        if median_s <= self.target_s and inflight < self.limit / 2:  # app-limited: nothing says a larger limit helps
            return
        gradient = max(0.5, min(1.0, self.target_s / median_s))
        target = self.limit * gradient + math.sqrt(self.limit)
        self.limit = (1 - self.smoothing) * self.limit + self.smoothing * target
        self.limit = max(float(self.min_limit), min(float(self.max_limit), self.limit))


@dataclass
class _Pool:
    name: str
    cap: int
    limit: GradientLimit | None
    inflight: int = 0
    shed: dict[Priority, int] = field(default_factory=lambda: dict.fromkeys(Priority, 0))

    def current_limit(self) -> int:
        return self.cap if self.limit is None else min(self.cap, self.limit.value)


@dataclass(slots=True)
class Permit:
    """One admitted request; `release` exactly once (success with its latency, or a drop). A request parked for a
    cold model (services/gateway/activator.py) steps out of its pool while it waits (`step_out`, then `step_in`): it
    uses no capacity meanwhile, and its latency, which is the cold start's, says nothing about load."""

    admission: Admission
    pool: _Pool
    started: float
    released: bool = False
    outside: bool = False  # stepped out now: not counted in flight
    parked: bool = False  # stepped out at some point: no latency sample, no drop

    def release(self, *, sample: bool = True, dropped: bool = False) -> None:
        if self.released:
            return
        self.released = True
        self.admission._release(self, sample=sample and not self.parked, dropped=dropped and not self.parked)

    def step_out(self) -> None:
        """The request waits outside the gateway's capacity: its slot is free for others until `step_in`."""
        if self.released or self.outside:
            return
        self.outside = self.parked = True
        self.admission._count(self.pool, -1)

    def step_in(self) -> None:
        """Back in flight (admitted already: never refused, even above the limit)."""
        if not self.outside:
            return
        self.outside = False
        if not self.released:
            self.admission._count(self.pool, 1)


_PERMIT: ContextVar[Permit | None] = ContextVar("meshserve_gateway_permit", default=None)


def current_permit() -> Permit | None:
    """The permit `Admission.acquire` gave the request this task (or the task it was started from) serves."""
    return _PERMIT.get()


class Admission:
    """All pools of one gateway: one per pipeline (or forwarded model) under one total cap."""

    SHARES = {Priority.HIGH: 1.0, Priority.NORMAL: 0.9}

    def __init__(
        self,
        total_cap: int,
        min_limit: int,
        low_priority_share: float,
        retry_after_ms: int,
        target_s: float = TARGET_LATENCY_S,
    ) -> None:
        self.target_s = target_s
        self.total_cap = total_cap
        self.total_inflight = 0
        self.min_limit = min_limit
        self.shares = {**self.SHARES, Priority.LOW: low_priority_share}
        self.retry_after_ms = retry_after_ms
        self.pools: dict[str, _Pool] = {}

    def add_pool(self, name: str, cap: int, adaptive: bool) -> None:
        limit = GradientLimit(cap, min(self.min_limit, cap), cap, target_s=self.target_s) if adaptive else None
        self.pools[name] = _Pool(name, cap, limit)

    def pool(self, name: str) -> _Pool:
        found = self.pools.get(name)
        if found is None:  # a forwarded model: fixed cap, the model service has its own queue
            self.add_pool(name, self.total_cap, adaptive=False)
            found = self.pools[name]
        return found

    def acquire(self, name: str, priority: Priority = Priority.NORMAL) -> Permit:
        """Admit now or raise ResourceExhausted (never waits); the permit is also `current_permit()` in this task."""
        pool = self.pool(name)
        share = self.shares[priority]
        limit = pool.current_limit()
        allowed = max(1, math.floor(limit * share)) if priority != Priority.HIGH else limit
        total_allowed = max(1, math.floor(self.total_cap * share))
        if pool.inflight >= allowed or self.total_inflight >= total_allowed:
            pool.shed[priority] += 1
            which = (
                f"{name!r} has {pool.inflight} in flight (limit {limit}"
                + (f", {share:.0%} of it for {priority.name.lower()} priority" if share < 1 else "")
                + ")"
                if pool.inflight >= allowed
                else f"the gateway has {self.total_inflight} requests in flight (limit {self.total_cap})"
            )
            error = ResourceExhausted(f"overloaded: {which}; retry after {self.retry_after_ms} ms")
            error.trailers = (("grpc-retry-pushback-ms", str(self.retry_after_ms)),)
            raise error
        self._count(pool, 1)
        permit = Permit(self, pool, time.perf_counter())
        _PERMIT.set(permit)  # for the activator, should the request park (current_permit)
        return permit

    def _count(self, pool: _Pool, delta: int) -> None:
        pool.inflight += delta
        self.total_inflight += delta

    def _release(self, permit: Permit, *, sample: bool, dropped: bool) -> None:
        pool = permit.pool
        inflight = pool.inflight
        if not permit.outside:
            self._count(pool, -1)
        if pool.limit is None:
            return
        if dropped:
            pool.limit.on_drop()
        elif sample:
            pool.limit.on_sample(time.perf_counter() - permit.started, inflight)
