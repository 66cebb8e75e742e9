"""The CacheService gRPC servicer: protobuf in, one CacheHandler call, protobuf out (the Watch stream too;
Invalidate after the operator check)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.cache import converters
from services.cache.handler import CacheHandler
from services.common.operator_check import OPEN, OperatorCheck
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc

SERVICE_NAME = "meshserve.cache.CacheService"
OPERATOR_RPCS = ("Invalidate",)
"""The RPCs that drop what every replica holds: only the operator may call them (`operator`)."""


class CacheServicer(pb_grpc.CacheServiceServicer):
    """Each RPC converts its request, calls the handler once and converts the answer; errors are the handler's
    domain errors, which the shared interceptor turns into gRPC status codes. `operator` guards OPERATOR_RPCS
    (default: open to every caller)."""

    def __init__(self, handler: CacheHandler, operator: OperatorCheck = OPEN) -> None:
        self.handler = handler
        self.operator = operator

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        lookup = converters.lookup_from_pb(request)
        hits = await self.handler.lookup(lookup.keys, lookup.pipeline, lookup.allow_stale, lookup.budget_ms)
        return converters.hits_to_pb(hits)

    async def Store(self, request: pb.StoreRequest, context: grpc.aio.ServicerContext) -> pb.StoreResponse:
        return converters.stored_to_pb(await self.handler.store(converters.store_from_pb(request)))

    async def Invalidate(
        self, request: pb.InvalidateRequest, context: grpc.aio.ServicerContext
    ) -> pb.InvalidateResponse:
        self.operator.require(context, "Invalidate")
        what = converters.invalidate_from_pb(request)
        removed = await self.handler.invalidate(what.pipeline, what.model_name, what.model_version)
        return converters.removed_to_pb(removed)

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        return converters.stats_to_pb(self.handler.stats())

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.InvalidationEvent]:
        async for event in self.handler.watch():
            yield converters.event_to_pb(event)
