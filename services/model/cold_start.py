"""The model service's cold start: seconds from its spawn to SERVING, per model, as a histogram and a log line.

The clock starts at the spawn itself: the kernel's start time of this process (`starttime` in /proc/self/stat, in
clock ticks since boot) against CLOCK_BOOTTIME, the clock it is counted on. A timestamp taken at the top of
`__main__` would miss the interpreter's start and the imports of `services` and `services.model` that run before it,
which are part of what a scale-from-zero waits for. Where /proc is not there (not Linux) the clock starts when this
module is imported, which is later than the spawn, and says so in the log.

The time is split so an operator sees where it goes: `import` (spawn until `main()` runs: the interpreter and the
imports), `load+warm` (this model's versions, read and warmed up on a worker thread), the rest (server start,
other models) being the difference. Only the models ready when health first says SERVING count: a model loaded
later (the Load RPC, a repository change) is not a cold start of the process. The process's start time itself is
prometheus_client's own `process_start_time_seconds`, so no gauge of ours repeats it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Histogram

log = logging.getLogger(__name__)

COLD_START_SECONDS = Histogram(
    "meshserve_model_cold_start_seconds",
    "Seconds from the model service process's spawn until it said SERVING with this model loaded and warmed "
    "(one observation per model per process).",
    ["model"],
    buckets=(0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0),
)
STARTTIME_FIELD = 22  # /proc/<pid>/stat, man 5 proc: the process's start, in clock ticks since boot
_IMPORTED_AT = time.monotonic()


def spawn_age(stat: str, ticks_per_s: float, boot_now_s: float) -> float:
    """Seconds since the spawn of the process whose /proc/<pid>/stat is `stat`, at `boot_now_s` on CLOCK_BOOTTIME.

    The command name (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
    """
    fields = stat[stat.rindex(")") + 2 :].split()
    start_ticks = int(fields[STARTTIME_FIELD - 3])
    return boot_now_s - start_ticks / ticks_per_s


def process_age() -> float:
    """Seconds since this process was spawned (since this module's import where /proc cannot say)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        return spawn_age(stat, os.sysconf("SC_CLK_TCK"), time.clock_gettime(time.CLOCK_BOOTTIME))
    except (OSError, ValueError, AttributeError):
        return time.monotonic() - _IMPORTED_AT


def from_proc() -> bool:
    """Whether the spawn is the kernel's (else this module's import)."""
    return Path("/proc/self/stat").is_file() and hasattr(time, "CLOCK_BOOTTIME")


@dataclass(frozen=True, slots=True)
class ColdStart:
    """One model's cold start: seconds after the spawn that health said SERVING, and its two known parts."""

    model: str
    versions: tuple[int, ...]
    serving_s: float  # spawn -> SERVING
    import_s: float  # spawn -> main(): interpreter and imports
    load_warm_s: float  # this model's versions: load and warm-up

    def line(self) -> str:
        versions = "+".join(f"v{v}" for v in self.versions)
        return (
            f"cold start: {self.model} {versions} serving {self.serving_s:.2f} s after spawn "
            f"(import {self.import_s:.2f} s, load+warm {self.load_warm_s:.2f} s)"
        )


def cold_starts(serving_s: float, import_s: float, loads: Mapping[str, Mapping[int, float]]) -> list[ColdStart]:
    """The cold start of each model in `loads` (model -> version -> load and warm-up seconds), by model name;
    a model with no ready version is left out."""
    return [
        ColdStart(model, tuple(sorted(versions)), serving_s, import_s, sum(versions.values()))
        for model, versions in sorted(loads.items())
        if versions
    ]


class ColdStartClock:
    """Started as the first step of `main()` (which fixes the import part); `serving` observes and logs once.

    Args:
        since_spawn: seconds since the spawn, read now (process_age; a test gives its own).

    Example:
        clock = ColdStartClock()  # first line of main()
        ...
        clock.serving({"fraud_mlp": {1: 0.21}})  # right after health turned SERVING
    """

    def __init__(self, since_spawn: Callable[[], float] = process_age) -> None:
        self.since_spawn = since_spawn
        self.import_s = since_spawn()
        self.done = False

    def serving(self, loads: Mapping[str, Mapping[int, float]]) -> list[ColdStart]:
        """Observe each served model's cold start and log its line; later calls do nothing."""
        if self.done:
            return []
        self.done = True
        starts = cold_starts(self.since_spawn(), self.import_s, loads)
        if not from_proc():
            log.info("cold start counted from the import of %s (no /proc/self/stat)", __name__)
        for start in starts:
            COLD_START_SECONDS.labels(start.model).observe(start.serving_s)
            log.info("%s", start.line())
        return starts
