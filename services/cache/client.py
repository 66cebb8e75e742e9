"""The gateway's way into the cache service: a CacheService client in domain types that raises only the project's
errors (lookups and stores fail open; bad input, invalidate, stats and a failed Watch raise MeshserveError)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Sequence

import grpc

from services.cache import converters
from services.cache.domain import CachedValue, CacheStats, Invalidation, Lookup, Removed, StoreItem
from services.common.errors import Unavailable, from_rpc_error
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE = "cache service"  # how the errors this client raises name the service
ADMIN_TIMEOUT_S = 1.0  # least time allowed to invalidate and stats (not on a request's critical path)


class CacheClient:
    """CacheService over one grpc.aio channel.

    `lookup` and `store` fail open: an unreachable, slow or failing cache is all misses and nothing stored,
    never an error, except bad input (INVALID_ARGUMENT), which raises InvalidArgument since retrying or
    ignoring it cannot help. `invalidate`, `stats` and `watch` raise the MeshserveError of the status they got.
    """

    def __init__(self, target: str, timeout_s: float = 0.05, channel: grpc.aio.Channel | None = None) -> None:
        self.channel = channel or grpc.aio.insecure_channel(target)
        self._stub = pb_grpc.CacheServiceStub(self.channel)
        self.timeout_s = timeout_s

    async def lookup(
        self,
        keys: Sequence[bytes],
        pipeline: str = "",
        allow_stale: bool = False,
        budget_ms: float = 0.0,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> list[CachedValue | None]:
        """One result per key, in order (None: a miss, or the cache could not answer in time)."""
        request = converters.lookup_to_pb(Lookup(list(keys), pipeline, allow_stale, budget_ms))
        try:
            response = await self._stub.Lookup(request, timeout=timeout_s or self.timeout_s, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise from_rpc_error(SERVICE, exc) from exc
            log.debug("cache lookup failed open: %s", exc.code().name)
            return [None] * len(keys)
        return converters.cached_values_from_pb(response)

    async def store(
        self,
        key: bytes,
        value: bytes,
        *,
        pipeline: str,
        model_name: str,
        model_version: str,
        ttl_s: float,
        stale_ttl_s: float = 0.0,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> bool:
        """Store one entry; False when it was not written to Redis (or the cache did not answer)."""
        item = StoreItem(key, value, pipeline, model_name, model_version, ttl_s, stale_ttl_s)
        return await self.store_many([item], timeout_s=timeout_s, metadata=metadata) == 1

    async def store_many(
        self, items: Sequence[StoreItem], *, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()
    ) -> int:
        """Store entries in one call; how many were written to Redis (0 when the cache did not answer)."""
        timeout = timeout_s or self.timeout_s * 4
        try:
            response = await self._stub.Store(converters.store_to_pb(items), timeout=timeout, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise from_rpc_error(SERVICE, exc) from exc
            log.debug("cache store failed open: %s", exc.code().name)
            return 0
        return converters.stored_from_pb(response).stored

    async def invalidate(
        self,
        pipeline: str = "",
        model_name: str = "",
        model_version: str = "",
        *,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> Removed:
        """Drop a pipeline's entries, or a model version's (every version when model_version is empty), on every
        replica; returns what the answering replica removed (from its L1, from Redis)."""
        request = converters.invalidate_to_pb(Invalidation(False, pipeline, model_name, model_version))
        try:
            response = await self._stub.Invalidate(
                request, timeout=self._admin_timeout(timeout_s), metadata=tuple(metadata)
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(SERVICE, exc) from exc
        return converters.removed_from_pb(response)

    async def stats(self, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()) -> CacheStats:
        """The answering replica's counters."""
        try:
            response = await self._stub.Stats(
                pb.StatsRequest(), timeout=self._admin_timeout(timeout_s), metadata=tuple(metadata)
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(SERVICE, exc) from exc
        return converters.stats_from_pb(response)

    async def watch(
        self, metadata: Sequence[tuple[str, str]] = (), *, heartbeat_timeout_s: float | None = None
    ) -> AsyncGenerator[Invalidation, None]:
        """Every invalidation one cache replica applies, as it applies them, for a near cache of the caller's own.

        The first event is a reset (`event.reset`: the stream is live, start from empty); a later reset means
        invalidations may have been missed (drop everything); an event with nothing set is a heartbeat
        (`event.heartbeat`); any other is an invalidation to apply (`event.matches(entry)`). The iteration ends
        when the replica drains (the stream completes OK), and raises MeshserveError when the stream fails, or
        Unavailable when no event came for `heartbeat_timeout_s` (None: wait for ever). Either way, what comes
        after is not followed: the caller reconnects. Leaving the iteration (or cancelling it) ends the stream.
        """
        call = self._stub.Watch(pb.WatchRequest(), metadata=tuple(metadata))
        try:
            while True:
                try:
                    async with asyncio.timeout(heartbeat_timeout_s):
                        event = await call.read()
                except TimeoutError:
                    raise Unavailable(f"{SERVICE}: Watch stream silent for {heartbeat_timeout_s} s") from None
                except grpc.aio.AioRpcError as exc:
                    raise from_rpc_error(SERVICE, exc) from exc
                if event is grpc.aio.EOF:
                    return
                yield converters.event_from_pb(event)
        finally:
            call.cancel()

    def _admin_timeout(self, timeout_s: float | None) -> float:
        return timeout_s if timeout_s is not None else max(ADMIN_TIMEOUT_S, self.timeout_s)

    async def close(self) -> None:
        await self.channel.close()
