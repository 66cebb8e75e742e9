"""Prometheus metrics of the gateway: requests by pipeline/code/cache, stage latencies, admission, degradation."""

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
