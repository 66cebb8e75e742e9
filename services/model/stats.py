"""Per model-version statistics: Triton-style counters for ModelStatistics, exported to Prometheus at scrape time.

The serving path only adds to plain counters and bucket counts (a bisect and two additions per observation); a
collector turns every live version's counts into the `meshserve_model_*` series when /metrics is read. Measured on
the fraud model: the prometheus_client children this replaces cost 6-7 µs per single-row request (a request counter,
a latency histogram with exemplar, queue, compute and batch-size histograms, two counters and a pending gauge), the
plain counts under 1 µs, and a scrape of a few versions well under a millisecond.
"""

from __future__ import annotations

import time
import weakref
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import REGISTRY, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

from services.common.metrics import LATENCY_BUCKETS, trace_exemplar

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
STATE = Gauge(
    "meshserve_model_state", "1 for the current load state of a model version.", ["model", "version", "state"]
)
STATES = ("LOADING", "READY", "UNLOADING", "UNAVAILABLE")


def set_state_metric(model: str, version: int, state: str | None) -> None:
    """Record the load state (None removes the version's series)."""
    for s in STATES:
        if state is None:
            try:
                STATE.remove(model, str(version), s)
            except KeyError:
                pass
        else:
            STATE.labels(model, str(version), s).set(1 if s == state else 0)


@dataclass
class Duration:
    """A StatisticDuration: how many and how long in total (nanoseconds)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass
class BatchDurations:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class Buckets:
    """A histogram's counts: one per upper bound (inclusive, as Prometheus' `le`) plus +Inf, their sum, and the
    latest exemplar seen per bucket."""

    __slots__ = ("bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.exemplars: dict[int, tuple[dict[str, str], float]] = {}

    def observe(self, value: float, exemplar: dict[str, str] | None = None) -> None:
        i = bisect_left(self.bounds, value)
        self.counts[i] += 1
        self.sum += value
        if exemplar is not None:
            self.exemplars[i] = (exemplar, value)

    def cumulative(self) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
        """(le, count of observations at or below it[, exemplar]) per bound and +Inf, as HistogramMetricFamily
        takes them."""
        out: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
        total = 0
        for i, count in enumerate(self.counts):
            total += count
            le = floatToGoString(self.bounds[i]) if i < len(self.bounds) else "+Inf"
            seen = self.exemplars.get(i)
            out.append((le, total) if seen is None else (le, total, Exemplar(seen[0], seen[1])))
        return out


class VersionStats:
    """Cumulative statistics of one model version, updated on the event loop thread only; while it lives, the
    collector exports it (a reloaded version's new stats replace the old series)."""

    def __init__(self, model: str, version: int) -> None:
        self.model = model
        self.version = version
        self.success = Duration()
        self.fail = Duration()
        self.failures: dict[str, int] = {}  # gRPC code name -> failed requests
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.pending = 0  # requests queued or computing
        self.batches: dict[int, BatchDurations] = {}
        self.request_s = Buckets(LATENCY_BUCKETS)
        self.queue_s = Buckets(LATENCY_BUCKETS)
        self.compute_s = Buckets(LATENCY_BUCKETS)
        self.batch_rows = Buckets(BATCH_BUCKETS)
        _LIVE[(model, str(version))] = self

    def record_batch(self, rows: int, input_ns: int, infer_ns: int, output_ns: int, queue_ns: list[int]) -> None:
        """One executed batch of `rows` rows made of len(queue_ns) requests."""
        n = len(queue_ns)
        self.execution_count += 1
        self.inference_count += rows
        self.last_inference_ms = int(time.time() * 1000)
        # As in Triton: every request of a batch is charged the whole batch's compute time.
        self.compute_input.add(input_ns * n, n)
        self.compute_infer.add(infer_ns * n, n)
        self.compute_output.add(output_ns * n, n)
        per_batch = self.batches.get(rows)
        if per_batch is None:
            per_batch = self.batches[rows] = BatchDurations()
        per_batch.compute_input.add(input_ns)
        per_batch.compute_infer.add(infer_ns)
        per_batch.compute_output.add(output_ns)
        observe = self.queue_s.observe
        for q in queue_ns:
            self.queue.add(q)
            observe(q / 1e9)
        self.compute_s.observe((input_ns + infer_ns) / 1e9)
        self.batch_rows.observe(rows)

    def record_request(self, ok: bool, ns: int, code: str = "OK") -> None:
        if ok:
            self.success.add(ns)
        else:
            self.fail.add(ns)
            self.failures[code] = self.failures.get(code, 0) + 1
        self.request_s.observe(ns / 1e9, trace_exemplar())


_LIVE: weakref.WeakValueDictionary[tuple[str, str], VersionStats] = weakref.WeakValueDictionary()
_LABELS = ["model", "version"]


class StatsCollector(Collector):
    """The `meshserve_model_*` request, batch and pending series of every live version, read at scrape time."""

    def collect(self) -> Iterator[Metric]:
        live = list(_LIVE.items())
        requests = CounterMetricFamily(
            "meshserve_model_requests", "Inference requests by model, version and gRPC code.", labels=[*_LABELS, "code"]
        )
        inferences = CounterMetricFamily(
            "meshserve_model_inferences", "Rows inferred (a request of 8 rows counts 8).", labels=_LABELS
        )
        executions = CounterMetricFamily(
            "meshserve_model_executions",
            "Model executions (one batched forward counts 1); inferences/executions = average batch size.",
            labels=_LABELS,
        )
        pending = GaugeMetricFamily("meshserve_model_pending_requests", "Requests queued or computing.", labels=_LABELS)
        histograms = [
            (
                HistogramMetricFamily(
                    "meshserve_model_request_duration_seconds",
                    "Inference request time inside the model service.",
                    labels=_LABELS,
                ),
                "request_s",
            ),
            (
                HistogramMetricFamily(
                    "meshserve_model_queue_duration_seconds",
                    "Time a request waited in the batch queue.",
                    labels=_LABELS,
                ),
                "queue_s",
            ),
            (
                HistogramMetricFamily(
                    "meshserve_model_compute_duration_seconds",
                    "Time of one batched forward pass (input gather included).",
                    labels=_LABELS,
                ),
                "compute_s",
            ),
            (
                HistogramMetricFamily(
                    "meshserve_model_batch_size", "Rows per executed batch (before padding).", labels=_LABELS
                ),
                "batch_rows",
            ),
        ]
        for labels, stats in live:
            requests.add_metric([*labels, "OK"], stats.success.count)
            for code, count in stats.failures.items():
                requests.add_metric([*labels, code], count)
            inferences.add_metric(list(labels), stats.inference_count)
            executions.add_metric(list(labels), stats.execution_count)
            pending.add_metric(list(labels), stats.pending)
            for family, attr in histograms:
                buckets: Buckets = getattr(stats, attr)
                family.add_metric(list(labels), buckets.cumulative(), buckets.sum)
        yield from (requests, inferences, executions, pending, *(family for family, _ in histograms))


REGISTRY.register(StatsCollector())
