"""Prometheus metrics of the feature service (`meshserve_feature_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from services.common.metrics import LATENCY_BUCKETS

COMPUTE_SECONDS = Histogram(
    "meshserve_feature_compute_seconds",
    "Time to compute one batch, by feature set.",
    ["feature_set"],
    buckets=LATENCY_BUCKETS,
)
ROWS = Counter("meshserve_feature_rows_total", "Rows computed, by feature set.", ["feature_set"])
REDIS_ROUND_TRIPS = Histogram(
    "meshserve_feature_redis_round_trips",
    "Redis round trips per Compute call, by feature set.",
    ["feature_set"],
    buckets=(0, 1, 2, 3, 5, 10),
)
DEGRADED_ROWS = Counter(
    "meshserve_feature_degraded_rows_total",
    "Rows whose aggregates took defaults (store down or slow).",
    ["feature_set"],
)
DEFAULTED_ROWS = Counter(
    "meshserve_feature_defaulted_rows_total", "Rows with some feature at its declared default.", ["feature_set"]
)
INGESTED = Counter("meshserve_feature_ingested_events_total", "Events applied to the online store.", ["feature_set"])
REDIS_ERRORS = Counter(
    "meshserve_feature_redis_errors_total",
    "Online store operations that failed or ran past their budget.",
    ["op", "kind"],
)
NONFINITE = Counter(
    "meshserve_feature_nonfinite_aggregates_total",
    "Aggregate values the online store returned that FP32 cannot hold (NaN, Inf, beyond its range); each one's "
    "row took its defaults and was degraded. By feature set and feature.",
    ["feature_set", "feature"],
)
