"""The edge's keep decision under always-on recording: at the end of each request (its server span ending), whether
its trace is kept, and why: `error` (any non-OK status), `degraded` (a degraded answer), `sampled` (the caller's
traceparent had the sampled flag), `latency` (slower than the pipeline's fixed bound or rolling percentile) and
`baseline` (a random share). Pipelines set their bounds in `tracing:`; other calls take MESHSERVE_TRACING_*."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping

from opentelemetry.trace import StatusCode

from services.common.recording import DEGRADED, PIPELINE, RecordedSpan, RecordingSettings
from services.gateway.pipeline import PipelineSpec

WINDOW = 2000  # recent successful requests the rolling percentile is read from
RECOMPUTE_EVERY = 100  # requests between two readings of it
MIN_SAMPLES = 200  # before this many, no rolling bound (a cold start's first requests are all "slow")


class LatencyBound:
    """`slow(ns)`: above the fixed bound, or above the rolling percentile of recent successful requests."""

    def __init__(self, slow_ms: float | None, percentile: float | None) -> None:
        self.fixed_ns = int(slow_ms * 1e6) if slow_ms else None
        self.percentile = percentile or None
        self._window: list[int] = []
        self._next = 0  # where the next sample goes once the window is full
        self._seen = 0
        self.rolling_ns = math.inf

    def slow(self, duration_ns: int) -> bool:
        if self.percentile is not None:
            self._observe(duration_ns)
        if self.fixed_ns is not None and duration_ns > self.fixed_ns:
            return True
        return duration_ns > self.rolling_ns

    def _observe(self, duration_ns: int) -> None:
        window = self._window
        if len(window) < WINDOW:
            window.append(duration_ns)
        else:
            window[self._next] = duration_ns
            self._next = (self._next + 1) % WINDOW
        self._seen += 1
        if self._seen % RECOMPUTE_EVERY == 0 and len(window) >= MIN_SAMPLES:
            assert self.percentile is not None
            ordered = sorted(window)
            self.rolling_ns = ordered[min(len(ordered) - 1, int(len(ordered) * self.percentile / 100))]


class EdgeTriggers:
    """The gateway's `Recorder.edge`: the triggers of one ended request (empty: its trace is not kept)."""

    def __init__(self, pipelines: Mapping[str, PipelineSpec], defaults: RecordingSettings) -> None:
        self.defaults = defaults
        self.bounds: dict[str, tuple[LatencyBound, float]] = {}
        for name, spec in pipelines.items():
            t = spec.tracing
            slow_ms = defaults.slow_ms if t.slow_ms is None else t.slow_ms
            percentile = defaults.slow_percentile if t.slow_percentile is None else t.slow_percentile
            baseline = defaults.baseline if t.baseline is None else t.baseline
            self.bounds[name] = (LatencyBound(slow_ms, percentile), baseline)
        self._random = random.random

    def _bound(self, key: str) -> tuple[LatencyBound, float]:
        """The pipeline's bound, or one per other RPC (built on first use, from the defaults)."""
        bound = self.bounds.get(key)
        if bound is None:
            bound = self.bounds[key] = (
                LatencyBound(self.defaults.slow_ms, self.defaults.slow_percentile),
                self.defaults.baseline,
            )
        return bound

    def __call__(self, root: RecordedSpan) -> list[str]:
        attributes = root.attributes
        triggers = []
        failed = attributes.get("rpc.grpc.status_code", 0) != 0 or root.status_code is StatusCode.ERROR
        if failed:
            triggers.append("error")
        if attributes.get(DEGRADED):
            triggers.append("degraded")
        if root.sampled:
            triggers.append("sampled")
        latency, baseline = self._bound(str(attributes.get(PIPELINE) or root.name))
        if not failed and latency.slow(root.end_ns - root.start_ns):
            triggers.append("latency")
        if baseline and self._random() < baseline:
            triggers.append("baseline")
        return triggers
