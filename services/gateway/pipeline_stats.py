"""Triton-style statistics per pipeline (successes, failures, the time in features and in the model), which
ModelStatistics answers with and perf_analyzer reads for its server-side breakdown."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from services.gateway.domain import Answer


@dataclass
class PipelineStats:
    """The counters of one pipeline, in Triton's terms (ns totals, counts)."""

    success_count: int = 0
    success_ns: int = 0
    fail_count: int = 0
    fail_ns: int = 0
    features_ns: int = 0
    model_ns: int = 0
    model_count: int = 0  # answers that called the model (a cache hit does not)
    inferences: int = 0  # rows answered
    last_ms: int = 0  # wall-clock ms of the last success


class Statistics:
    """The counters of every pipeline of one gateway."""

    def __init__(self, pipelines: Iterable[str]) -> None:
        self.pipelines = {name: PipelineStats() for name in pipelines}

    def succeeded(self, pipeline: str, answer: Answer, rows: int, elapsed_s: float) -> None:
        stats = self.pipelines[pipeline]
        stats.success_count += 1
        stats.success_ns += int(elapsed_s * 1e9)
        stats.inferences += rows
        stats.last_ms = int(time.time() * 1000)
        if "model" in answer.stages_ms:
            stats.model_count += 1
            stats.model_ns += int(answer.stages_ms["model"] * 1e6)
            stats.features_ns += int(answer.stages_ms.get("features", 0.0) * 1e6)

    def failed(self, pipeline: str, elapsed_s: float) -> None:
        stats = self.pipelines[pipeline]
        stats.fail_count += 1
        stats.fail_ns += int(elapsed_s * 1e9)

    def of(self, pipeline: str | None = None) -> dict[str, PipelineStats]:
        """One pipeline's counters, or every pipeline's (by name)."""
        names = [pipeline] if pipeline else sorted(self.pipelines)
        return {name: self.pipelines[name] for name in names}
