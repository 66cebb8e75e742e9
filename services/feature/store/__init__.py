"""The online store: per-entity aggregates in Redis (or Valkey) as time-bucketed structures with TTLs.

layout.py: the key layout; plan.py: what a feature set needs from the store (compiled from its spec);
ingest.lua / read.lua with scripts.py: the Lua scripts and their arguments; decode.py: read replies -> numpy;
client.py: OnlineStore, the Redis client the feature handler uses; generation.py: the marker that tells a store that
lost its data.
"""

from services.feature.store.client import FAILURES, IngestRefused, NotDurable, OnlineStore, StoreFull
from services.feature.store.decode import AggregateResult
from services.feature.store.layout import BAND, BucketGroup, DistinctGroup
from services.feature.store.plan import AggregatePlan
from services.feature.store.scripts import READ_CHUNK_ROWS

__all__ = [
    "BAND",
    "FAILURES",
    "READ_CHUNK_ROWS",
    "AggregatePlan",
    "AggregateResult",
    "BucketGroup",
    "DistinctGroup",
    "IngestRefused",
    "NotDurable",
    "OnlineStore",
    "StoreFull",
]
