"""Prometheus metrics of the cache service (`meshserve_cache_*`)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics import LATENCY_BUCKETS

HITS = Counter(
    "meshserve_cache_hits_total", "Keys answered from the cache, by tier and pipeline.", ["tier", "pipeline"]
)
MISSES = Counter(
    "meshserve_cache_misses_total", "Keys a tier could not answer, by tier and pipeline.", ["tier", "pipeline"]
)
HIT_RATIO = Gauge(
    "meshserve_cache_hit_ratio", "Hits over keys looked up since start (any tier), by pipeline.", ["pipeline"]
)
L1_BYTES = Gauge("meshserve_cache_l1_bytes", "Bytes held by the in-process L1.")
L1_ENTRIES = Gauge("meshserve_cache_l1_entries", "Entries held by the in-process L1.")
L1_EVICTIONS = Counter("meshserve_cache_l1_evictions_total", "L1 entries evicted to keep within the byte budget.")
REDIS_ERRORS = Counter(
    "meshserve_cache_redis_errors_total", "Redis operations that failed or ran past their budget.", ["op", "kind"]
)
CIRCUIT_OPEN = Gauge("meshserve_cache_circuit_open", "1 while the Redis circuit is open (Redis skipped), else 0.")
STORES = Counter("meshserve_cache_stores_total", "Entries stored, by outcome (stored, dropped).", ["outcome"])
LOOKUP_SECONDS = Histogram(
    "meshserve_cache_lookup_seconds", "Time to answer one batched lookup.", ["pipeline"], buckets=LATENCY_BUCKETS
)
