"""The CacheService gRPC servicer: protobuf in, one CacheHandler call, protobuf out."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.cache.handler import L1, REDIS, CacheHandler, Hit, StoreItem
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc

SERVICE_NAME = "meshserve.cache.CacheService"
_TIERS = {L1: pb.TIER_L1, REDIS: pb.TIER_REDIS}


def _result(hit: Hit | None) -> pb.LookupResult:
    if hit is None:
        return pb.LookupResult()
    return pb.LookupResult(hit=True, value=hit.value, model_version=hit.model_version, age_s=hit.age_s,
                           stale=hit.stale, tier=_TIERS[hit.tier])  # fmt: skip


class CacheServicer(pb_grpc.CacheServiceServicer):
    def __init__(self, handler: CacheHandler) -> None:
        self.handler = handler

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        hits = await self.handler.lookup(list(request.keys), request.pipeline, request.allow_stale, request.budget_ms)
        return pb.LookupResponse(results=[_result(h) for h in hits])

    async def Store(self, request: pb.StoreRequest, context: grpc.aio.ServicerContext) -> pb.StoreResponse:
        items = [StoreItem(e.key, e.value, e.pipeline, e.model_name, e.model_version, e.ttl_s, e.stale_ttl_s)
                 for e in request.entries]  # fmt: skip
        stored, dropped = await self.handler.store(items)
        return pb.StoreResponse(stored=stored, dropped=dropped)

    async def Invalidate(self, request: pb.InvalidateRequest, context: grpc.aio.ServicerContext):
        l1, redis = await self.handler.invalidate(request.pipeline, request.model_name, request.model_version)
        return pb.InvalidateResponse(l1_removed=l1, redis_removed=redis)

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        return pb.StatsResponse(**self.handler.stats())

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.InvalidationEvent]:
        async for e in self.handler.fanout.subscribe(self.handler.settings.watch_heartbeat_s):
            yield pb.InvalidationEvent(reset=e.reset, pipeline=e.pipeline, model_name=e.model_name,
                                       model_version=e.model_version)  # fmt: skip
