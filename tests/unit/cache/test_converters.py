"""Protobuf <-> domain conversions of the CacheService: each message both ways, the tier, misses, events."""

from __future__ import annotations

from services.cache import converters
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


def test_lookup_request_both_ways() -> None:
    lookup = Lookup([b"k1", b"k2"], "fraud", allow_stale=True, budget_ms=2.5)
    message = converters.lookup_to_pb(lookup)
    assert (list(message.keys), message.pipeline, message.allow_stale, message.budget_ms) == (
        [b"k1", b"k2"],
        "fraud",
        True,
        2.5,
    )
    assert converters.lookup_from_pb(message) == lookup
    assert converters.lookup_from_pb(pb.LookupRequest()) == Lookup([], "", False, 0.0)  # proto3 defaults


def test_hits_become_results_with_their_tier_and_come_back_as_cached_values() -> None:
    hits = [Hit(b"a", "1", 0.5, False, L1), None, Hit(b"c", "2", 9.0, True, REDIS)]
    response = converters.hits_to_pb(hits)
    assert [r.hit for r in response.results] == [True, False, True]
    assert [r.tier for r in response.results] == [pb.TIER_L1, pb.TIER_NONE, pb.TIER_REDIS]
    assert response.results[1] == pb.LookupResult()  # a miss carries nothing
    assert converters.cached_values_from_pb(response) == [
        CachedValue(b"a", "1", 0.5, False),
        None,
        CachedValue(b"c", "2", 9.0, True),
    ]


def test_store_both_ways() -> None:
    items = [
        StoreItem(b"k", b"v", "fraud", "fraud_mlp", "3", 60.0, 5.0),
        StoreItem(b"j", b"", "", "m", "1", 1.0),
    ]
    message = converters.store_to_pb(items)
    assert message.entries[0].stale_ttl_s == 5.0 and message.entries[1].stale_ttl_s == 0.0
    assert converters.store_from_pb(message) == items
    assert converters.stored_from_pb(converters.stored_to_pb(Stored(3, 1))) == Stored(3, 1)
    assert converters.stored_to_pb(Stored(stored=2, dropped=0)) == pb.StoreResponse(stored=2, dropped=0)


def test_invalidate_both_ways() -> None:
    for what in (Invalidation(pipeline="fraud"), Invalidation(model_name="m", model_version="2")):
        assert converters.invalidate_from_pb(converters.invalidate_to_pb(what)) == what
    assert converters.invalidate_to_pb(Invalidation(model_name="m")) == pb.InvalidateRequest(model_name="m")
    removed = converters.removed_to_pb(Removed(4, 7))
    assert (removed.l1_removed, removed.redis_removed) == (4, 7)
    assert converters.removed_from_pb(removed) == Removed(4, 7) == (4, 7)


def test_watch_events_both_ways_reset_and_heartbeat_included() -> None:
    events = [
        Invalidation(reset=True),
        Invalidation(pipeline="fraud"),
        Invalidation(model_name="m", model_version="2"),
        Invalidation(),
    ]
    messages = [converters.event_to_pb(e) for e in events]
    assert messages[0] == pb.InvalidationEvent(reset=True)
    assert messages[3] == pb.InvalidationEvent()  # a heartbeat: nothing set
    back = [converters.event_from_pb(m) for m in messages]
    assert back == events
    assert [e.reset for e in back] == [True, False, False, False]
    assert [e.heartbeat for e in back] == [False, False, False, True]


def test_stats_both_ways() -> None:
    stats = CacheStats(
        l1_entries=1,
        l1_bytes=2,
        l1_max_bytes=3,
        l1_evictions=4,
        l1_hits=5,
        redis_hits=6,
        misses=7,
        redis_errors=8,
        circuit_open=True,
        stores=10,
        stores_dropped=11,
    )
    message = converters.stats_to_pb(stats)
    assert (message.l1_hits, message.circuit_open, message.stores_dropped) == (5, True, 11)
    assert converters.stats_from_pb(message) == stats
    assert set(stats) == {f.name for f in pb.StatsResponse.DESCRIPTOR.fields}  # no counter lost on the way
