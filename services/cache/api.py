"""The cache service's public surface: what another service may import from it (the gateway does).

A client that fails open, the key derivation both sides must agree on, and the in-process near cache with
the invalidation events that keep it correct. Nothing here imports Redis.
"""

from __future__ import annotations

from services.cache.client import CacheClient, CachedValue, SingleFlight
from services.cache.entry import Entry
from services.cache.fanout import Invalidation
from services.cache.keys import request_digest, request_key, versioned_key
from services.cache.l1 import L1Cache

__all__ = [
    "CacheClient",
    "CachedValue",
    "Entry",
    "Invalidation",
    "L1Cache",
    "SingleFlight",
    "request_digest",
    "request_key",
    "versioned_key",
]
