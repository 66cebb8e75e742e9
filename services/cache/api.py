"""The cache service's public surface: what another service may import from it (the gateway does).

A client that fails open and raises only the project's errors, the key derivation both sides must agree on,
and the in-process near cache with the invalidation events (from `CacheClient.watch`) that keep it correct.
Nothing here imports Redis.
"""

from __future__ import annotations

from services.cache.client import CacheClient
from services.cache.domain import CachedValue, CacheStats, Invalidation, Removed, StoreItem
from services.cache.entry import Entry
from services.cache.keys import (
    Canonical,
    bytes_canonical,
    canonical_digest,
    request_digest,
    request_key,
    versioned_key,
    wire_digest,
)
from services.cache.l1 import L1Cache
from services.cache.singleflight import SingleFlight

__all__ = [
    "CacheClient",
    "CacheStats",
    "CachedValue",
    "Canonical",
    "Entry",
    "Invalidation",
    "L1Cache",
    "Removed",
    "SingleFlight",
    "StoreItem",
    "bytes_canonical",
    "canonical_digest",
    "request_digest",
    "request_key",
    "versioned_key",
    "wire_digest",
]
