"""Per model-version statistics: Triton-style counters for ModelStatistics plus the Prometheus metrics."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS, trace_exemplar

REQUESTS = Counter(
    "meshserve_model_requests_total",
    "Inference requests by model, version and gRPC code.",
    ["model", "version", "code"],
)
INFERENCES = Counter(
    "meshserve_model_inferences_total", "Rows inferred (a request of 8 rows counts 8).", ["model", "version"]
)
EXECUTIONS = Counter(
    "meshserve_model_executions_total",
    "Model executions (one batched forward counts 1); inferences/executions = average batch size.",
    ["model", "version"],
)
REQUEST_SECONDS = Histogram(
    "meshserve_model_request_duration_seconds",
    "Inference request time inside the model service.",
    ["model", "version"],
    buckets=LATENCY_BUCKETS,
)
QUEUE_SECONDS = Histogram(
    "meshserve_model_queue_duration_seconds",
    "Time a request waited in the batch queue.",
    ["model", "version"],
    buckets=LATENCY_BUCKETS,
)
COMPUTE_SECONDS = Histogram(
    "meshserve_model_compute_duration_seconds",
    "Time of one batched forward pass (input gather included).",
    ["model", "version"],
    buckets=LATENCY_BUCKETS,
)
BATCH_SIZE = Histogram(
    "meshserve_model_batch_size",
    "Rows per executed batch (before padding).",
    ["model", "version"],
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
PENDING = Gauge("meshserve_model_pending_requests", "Requests queued or computing.", ["model", "version"])
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


class VersionStats:
    """Cumulative statistics of one model version, updated on the event loop thread only."""

    def __init__(self, model: str, version: int) -> None:
        labels = (model, str(version))
        self.model = model
        self.version = version
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batches: dict[int, BatchDurations] = {}
        self._inferences = INFERENCES.labels(*labels)
        self._executions = EXECUTIONS.labels(*labels)
        self._request_s = REQUEST_SECONDS.labels(*labels)
        self._queue_s = QUEUE_SECONDS.labels(*labels)
        self._compute_s = COMPUTE_SECONDS.labels(*labels)
        self._batch = BATCH_SIZE.labels(*labels)
        self.pending = PENDING.labels(*labels)
        self._ok = REQUESTS.labels(model, str(version), "OK")

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
        for q in queue_ns:
            self.queue.add(q)
            self._queue_s.observe(q / 1e9)
        self._inferences.inc(rows)
        self._executions.inc()
        self._compute_s.observe((input_ns + infer_ns) / 1e9)
        self._batch.observe(rows)

    def record_request(self, ok: bool, ns: int, code: str = "OK") -> None:
        if ok:
            self.success.add(ns)
            self._ok.inc()
        else:
            self.fail.add(ns)
            REQUESTS.labels(self.model, str(self.version), code).inc()
        self._request_s.observe(ns / 1e9, trace_exemplar())
