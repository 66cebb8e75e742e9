"""Stage budgets that follow a dependency's recent latency: they trip on a sick dependency, not on a busy machine.

A fixed budget (say 20 ms for an online lookup) is right on an idle machine and wrong on a busy one: under CPU
contention every answer comes later, the budget runs out while the dependency is healthy, and answers degrade
although nothing failed (as measured under concurrent load: bench/README.md, "Figures moved from code comments").
A `LatencyBudget` is the configured budget stretched to `factor` times the p99 of the last `window` successful
calls, never past `stretch_max` times the configured value: a dependency that stops answering still trips it after
a few times its usual latency, while a machine that slows everything down moves the budget with it.
"""

from __future__ import annotations

import numpy as np

DEFAULT_FACTOR = 3.0
DEFAULT_STRETCH_MAX = 4.0
DEFAULT_WINDOW = 512
REFRESH_EVERY = 32  # recompute the p99 after this many samples (about 20 us each time; well under 1 us a call)


class LatencyBudget:
    """A budget in seconds: max(floor, factor x p99 of recent successes), at most stretch_max x floor."""

    def __init__(
        self,
        floor_s: float,
        *,
        factor: float = DEFAULT_FACTOR,
        stretch_max: float = DEFAULT_STRETCH_MAX,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if not floor_s > 0 or factor <= 0 or stretch_max < 1 or window < 1:
            raise ValueError("a budget needs floor_s > 0, factor > 0, stretch_max >= 1 and window >= 1")
        self.floor_s = floor_s
        self.factor = factor
        self.stretch_max = stretch_max
        self._samples = np.zeros(window, dtype=np.float64)
        self._count = 0
        self._since_refresh = 0
        self._p99 = 0.0
        self._value = floor_s

    @property
    def value_s(self) -> float:
        return self._value

    @property
    def value_ms(self) -> float:
        return self._value * 1e3

    def stretched(self, floor_s: float) -> float:
        """Another floor (e.g. one a caller sent) stretched by the same recent latency."""
        return min(floor_s * self.stretch_max, max(floor_s, self.factor * self._p99))

    def observe(self, seconds: float) -> None:
        """A successful call's latency (timeouts and failures are not samples: they would feed a sick dependency's
        slowness back into its own budget)."""
        self._samples[self._count % len(self._samples)] = seconds
        self._count += 1
        self._since_refresh += 1
        if self._since_refresh >= REFRESH_EVERY or self._count == 1:
            self._since_refresh = 0
            self._p99 = _p99(self._samples[: min(self._count, len(self._samples))])
            self._value = self.stretched(self.floor_s)


def _p99(samples: np.ndarray) -> float:
    """`np.percentile(samples, 99)` (linear between the two nearest ranks) from a partial sort: a quarter of its
    cost on 512 samples."""
    at = 0.99 * (len(samples) - 1)
    lo = int(at)
    hi = min(lo + 1, len(samples) - 1)
    ranked = np.partition(samples, (lo, hi))
    return float(ranked[lo] + (ranked[hi] - ranked[lo]) * (at - lo))
