"""Prometheus metrics of the feature service (`meshserve_feature_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
STORE_DURABLE = Gauge(
    "meshserve_feature_store_durable",
    "1 when the online store confirms each Ingest in its append-only file on disk before it is answered (WAITAOF); "
    "0 when it cannot (no WAITAOF before Redis 7.2 / Valkey 7.2, or no append-only file): Ingest answers "
    "unconfirmed. Unset until the first Ingest.",
)
STORE_RESETS = Counter(
    "meshserve_feature_store_resets_total",
    "Losses of the online store's data this process learnt of (its generation marker was gone: a restart without "
    "the append-only file, a FLUSHALL), by who noticed it: `here`, or `peer` (another replica wrote the new marker).",
    ["noticed"],
)
STORE_RESET_TIME = Gauge(
    "meshserve_feature_store_reset_timestamp_seconds",
    "Unix time of the latest loss of the online store's data known (0: none); rows whose windows reach back before "
    "it are degraded with reason features_store_reset.",
)
RESET_ROWS = Counter(
    "meshserve_feature_store_reset_rows_total",
    "Rows degraded because the online store lost its data within their longest window (features_store_reset).",
    ["feature_set"],
)
STORE_FULL = Counter(
    "meshserve_feature_store_full_total",
    "Ingest requests refused because the online store is full (maxmemory with noeviction): RESOURCE_EXHAUSTED.",
    ["feature_set"],
)
