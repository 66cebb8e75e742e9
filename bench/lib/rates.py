"""In-process throughput: the median rows per second of a callable, after a warm-up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def rows_per_second(fn: Callable[[], Any], rows: int, repeats: int = 7, min_window_s: float = 0.3) -> float:
    """Median rows/s of `fn` over `repeats` windows, after at least a second (and 20 calls) of warmup."""
    started = time.perf_counter()
    calls = 0
    while calls < 20 or time.perf_counter() - started < 1.0:
        fn()
        calls += 1
    per_call = (time.perf_counter() - started) / calls
    iters = max(1, int(min_window_s / per_call))
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        rates.append(rows * iters / (time.perf_counter() - t0))
    return statistics.median(rates)
