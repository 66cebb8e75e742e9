"""The cache's domain types, shared by the handler, the converters and the client (no protobuf, no Redis here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, TypedDict

from services.cache.entry import Entry

L1 = "l1"
REDIS = "redis"


@dataclass(slots=True)
class Hit:
    """A cached answer as the cache service finds it, with the tier that answered (L1 or REDIS)."""

    value: bytes
    model_version: str
    age_s: float
    stale: bool
    tier: str


@dataclass(slots=True, frozen=True)
class CachedValue:
    """A hit as a client of the cache service sees it."""

    value: bytes
    model_version: str
    age_s: float
    stale: bool


@dataclass(slots=True, frozen=True)
class Lookup:
    """One batched lookup: a result per key, in order."""

    keys: list[bytes]
    pipeline: str = ""  # a metrics label only
    allow_stale: bool = False  # also answer with entries past their fresh time, within their stale window
    budget_ms: float = 0.0  # time budget of the Redis tier; 0: the server's default


@dataclass(slots=True, frozen=True)
class StoreItem:
    """One entry to store, as the caller gives it."""

    key: bytes
    value: bytes
    pipeline: str
    model_name: str
    model_version: str
    ttl_s: float
    stale_ttl_s: float = 0.0


class Stored(NamedTuple):
    """What a store did: entries written to Redis, entries kept only in L1."""

    stored: int
    dropped: int


class Removed(NamedTuple):
    """What an invalidation removed: entries from this replica's L1, entries from Redis."""

    l1_removed: int
    redis_removed: int


class CacheStats(TypedDict):
    """Counters of one cache replica (the Stats RPC)."""

    l1_entries: int
    l1_bytes: int
    l1_max_bytes: int
    l1_evictions: int
    l1_hits: int
    redis_hits: int
    misses: int
    redis_errors: int
    circuit_open: bool
    stores: int
    stores_dropped: int


@dataclass(frozen=True, slots=True)
class Invalidation:
    """What a watcher must drop: everything (reset), a pipeline's entries, or a model version's ("": all).

    With nothing set it is a heartbeat: the stream is alive, nothing to drop.
    """

    reset: bool = False
    pipeline: str = ""
    model_name: str = ""
    model_version: str = ""

    @property
    def heartbeat(self) -> bool:
        return not (self.reset or self.pipeline or self.model_name)

    def matches(self, entry: Entry) -> bool:
        """Whether the entry is one this invalidation drops (the cache's L1 and the gateways' near caches alike)."""
        if self.reset:
            return True
        if self.pipeline:
            return entry.pipeline == self.pipeline
        return (
            bool(self.model_name)
            and entry.model_name == self.model_name
            and self.model_version in ("", entry.model_version)
        )


RESET = Invalidation(reset=True)
HEARTBEAT = Invalidation()
