"""Protobuf <-> domain conversions of the CacheService messages, both ways (servicer and client; pure mapping)."""

from __future__ import annotations

from collections.abc import Sequence

from services.cache.domain import (
    L1,
    REDIS,
    CachedValue,
    CacheStats,
    Hit,
    Invalidation,
    Lookup,
    Removed,
    Stored,
    StoreItem,
)
from services.protos import cache_pb2 as pb

_TIERS = {L1: pb.TIER_L1, REDIS: pb.TIER_REDIS}

# -- Lookup ---------------------------------------------------------------------------------------------------


def lookup_to_pb(lookup: Lookup) -> pb.LookupRequest:
    return pb.LookupRequest(
        keys=lookup.keys, pipeline=lookup.pipeline, allow_stale=lookup.allow_stale, budget_ms=lookup.budget_ms
    )


def lookup_from_pb(request: pb.LookupRequest) -> Lookup:
    return Lookup(list(request.keys), request.pipeline, request.allow_stale, request.budget_ms)


def hits_to_pb(hits: Sequence[Hit | None]) -> pb.LookupResponse:
    return pb.LookupResponse(results=[_result(hit) for hit in hits])


def _result(hit: Hit | None) -> pb.LookupResult:
    if hit is None:
        return pb.LookupResult()
    return pb.LookupResult(
        hit=True,
        value=hit.value,
        model_version=hit.model_version,
        age_s=hit.age_s,
        stale=hit.stale,
        tier=_TIERS[hit.tier],
    )


def cached_values_from_pb(response: pb.LookupResponse) -> list[CachedValue | None]:
    """One per key, None for a miss (the tier that answered is the service's business, not the caller's)."""
    return [CachedValue(r.value, r.model_version, r.age_s, r.stale) if r.hit else None for r in response.results]


# -- Store ----------------------------------------------------------------------------------------------------


def store_to_pb(items: Sequence[StoreItem]) -> pb.StoreRequest:
    return pb.StoreRequest(
        entries=[
            pb.StoreEntry(
                key=i.key,
                value=i.value,
                pipeline=i.pipeline,
                model_name=i.model_name,
                model_version=i.model_version,
                ttl_s=i.ttl_s,
                stale_ttl_s=i.stale_ttl_s,
            )
            for i in items
        ]
    )


def store_from_pb(request: pb.StoreRequest) -> list[StoreItem]:
    return [
        StoreItem(e.key, e.value, e.pipeline, e.model_name, e.model_version, e.ttl_s, e.stale_ttl_s)
        for e in request.entries
    ]


def stored_to_pb(stored: Stored) -> pb.StoreResponse:
    return pb.StoreResponse(stored=stored.stored, dropped=stored.dropped)


def stored_from_pb(response: pb.StoreResponse) -> Stored:
    return Stored(response.stored, response.dropped)


# -- Invalidate and Watch -------------------------------------------------------------------------------------


def invalidate_to_pb(invalidation: Invalidation) -> pb.InvalidateRequest:
    return pb.InvalidateRequest(
        pipeline=invalidation.pipeline, model_name=invalidation.model_name, model_version=invalidation.model_version
    )


def invalidate_from_pb(request: pb.InvalidateRequest) -> Invalidation:
    return Invalidation(pipeline=request.pipeline, model_name=request.model_name, model_version=request.model_version)


def removed_to_pb(removed: Removed) -> pb.InvalidateResponse:
    return pb.InvalidateResponse(l1_removed=removed.l1_removed, redis_removed=removed.redis_removed)


def removed_from_pb(response: pb.InvalidateResponse) -> Removed:
    return Removed(response.l1_removed, response.redis_removed)


def event_to_pb(event: Invalidation) -> pb.InvalidationEvent:
    return pb.InvalidationEvent(
        reset=event.reset, pipeline=event.pipeline, model_name=event.model_name, model_version=event.model_version
    )


def event_from_pb(event: pb.InvalidationEvent) -> Invalidation:
    return Invalidation(event.reset, event.pipeline, event.model_name, event.model_version)


# -- Stats ----------------------------------------------------------------------------------------------------


def stats_to_pb(stats: CacheStats) -> pb.StatsResponse:
    return pb.StatsResponse(**stats)


def stats_from_pb(response: pb.StatsResponse) -> CacheStats:
    return CacheStats(
        l1_entries=response.l1_entries,
        l1_bytes=response.l1_bytes,
        l1_max_bytes=response.l1_max_bytes,
        l1_evictions=response.l1_evictions,
        l1_hits=response.l1_hits,
        redis_hits=response.redis_hits,
        misses=response.misses,
        redis_errors=response.redis_errors,
        circuit_open=response.circuit_open,
        stores=response.stores,
        stores_dropped=response.stores_dropped,
    )
