"""Prometheus metrics of the gateway: requests by pipeline/code/cache, stage latencies, admission, degradation,
requests parked for cold models, and a two-tier gateway's answers per tier, bytes sent to the cloud and edge_only
answers."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

REQUESTS = Counter(
    "meshserve_gateway_requests_total",
    "Pipeline requests answered, by pipeline, gRPC code and cache outcome (hit, miss, stale, none).",
    ["pipeline", "code", "cache"],
)
REQUEST_SECONDS = Histogram(
    "meshserve_gateway_request_duration_seconds",
    "End-to-end time of a pipeline request inside the gateway.",
    ["pipeline"],
    buckets=LATENCY_BUCKETS,
)
STAGE_SECONDS = Histogram(
    "meshserve_gateway_stage_duration_seconds",
    "Time of one stage of a pipeline request (cache, features, preprocess, model).",
    ["pipeline", "stage"],
    buckets=LATENCY_BUCKETS,
)
WIRE_HITS = Counter(
    "meshserve_gateway_wire_hits_total",
    "Pipeline requests the near cache answered from the request's raw bytes, before decoding or admission (also "
    "counted as hits in meshserve_gateway_requests_total).",
    ["pipeline"],
)
INFLIGHT = Gauge("meshserve_gateway_inflight_requests", "Requests in flight, by pipeline (or model).", ["pipeline"])
LIMIT = Gauge("meshserve_gateway_concurrency_limit", "Current (adaptive) concurrency limit.", ["pipeline"])
SHED = Counter(
    "meshserve_gateway_shed_total", "Requests refused with RESOURCE_EXHAUSTED, by priority.", ["pipeline", "priority"]
)
DEGRADED = Counter(
    "meshserve_gateway_degraded_total", "Degraded answers, by reason (cause:remedy).", ["pipeline", "reason"]
)
MODEL_FAILURES = Counter(
    "meshserve_gateway_model_failures_total", "Failed model calls, by cause.", ["pipeline", "reason"]
)
COALESCED = Counter(
    "meshserve_gateway_coalesced_total", "Requests that shared an identical in-flight computation.", ["pipeline"]
)
BATCH_MEMBERS = Histogram(
    "meshserve_gateway_batch_requests",
    "Requests in one micro-batched downstream call, by pipeline and stage (cache, features, model, store).",
    ["pipeline", "stage"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256),
)
BATCH_ROWS = Histogram(
    "meshserve_gateway_batch_rows",
    "Rows (keys for the cache) in one micro-batched downstream call, by pipeline and stage.",
    ["pipeline", "stage"],
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256),
)
BATCH_RESENT = Counter(
    "meshserve_gateway_batch_resent_total",
    "Batched calls the callee refused as a caller's fault (a bad row), sent again member by member.",
    ["pipeline", "stage"],
)
PARKED_SECONDS = Histogram(
    "meshserve_gateway_parked_seconds",
    "Time a request waited parked for a model with no serving replica (one observation per wait), by model.",
    ["model"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0),
)
PARKED = Gauge(
    "meshserve_gateway_parked_requests", "Requests parked now for a model with no serving replica.", ["model"]
)
PARK_OUTCOMES = Counter(
    "meshserve_gateway_park_outcomes_total",
    "How parked requests left, by model and outcome: released (a replica serves the model), deadline (the "
    "request's own), cap (cold_start_wait_s), full (refused: park_limit reached), cancelled (the caller left).",
    ["model", "outcome"],
)
TIER_ANSWERS = Counter(
    "meshserve_gateway_tier_answers_total",
    "Pipeline requests answered by a two-tier gateway, by pipeline, the tier whose model answered (edge, cloud) and "
    "the request's data class (sensitive, general).",
    ["pipeline", "tier", "data_class"],
)
CLOUD_BYTES = Counter(
    "meshserve_gateway_cloud_bytes_total",
    "Bytes the edge gateway sent to the cloud tier (each tensor's contents, name, datatype and shape), by pipeline and "
    "what crossed (request, derived_features).",
    ["pipeline", "leave_edge"],
)
EDGE_ONLY = Counter(
    "meshserve_gateway_edge_only_total",
    "General requests answered at the edge because the cloud call failed, by pipeline and reason (the cloud's "
    "status code, e.g. UNAVAILABLE or DEADLINE_EXCEEDED).",
    ["pipeline", "reason"],
)
CLOUD_REFUSED = Counter(
    "meshserve_gateway_cloud_refused_total",
    "Requests a cloud-tier gateway refused with PERMISSION_DENIED for carrying the sensitive class, by what said so "
    "(header, input).",
    ["reason"],
)


class PipelineMeters:
    """One pipeline's label children of the per-request metrics, bound once: a `labels()` lookup costs more than the
    observation it leads to, and every request makes several."""

    def __init__(self, pipeline: str) -> None:
        self.pipeline = pipeline
        self.request_seconds = REQUEST_SECONDS.labels(pipeline)
        self._stages: dict[str, Histogram] = {}
        self._requests: dict[tuple[str, str], Counter] = {}

    def stage(self, stage: str) -> Histogram:
        """The stage-duration child of `stage`."""
        child = self._stages.get(stage)
        if child is None:
            child = self._stages[stage] = STAGE_SECONDS.labels(self.pipeline, stage)
        return child

    def requests(self, code: str, cache: str) -> Counter:
        """The requests-answered child of (gRPC code, cache outcome)."""
        child = self._requests.get((code, cache))
        if child is None:
            child = self._requests[(code, cache)] = REQUESTS.labels(self.pipeline, code, cache)
        return child
