"""What the gateway uses: an async CacheService client that fails open, and single-flight coalescing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import grpc

from services.cache.fanout import Invalidation
from services.common.errors import from_rpc_error
from services.protos import cache_pb2 as pb
from services.protos import cache_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True, frozen=True)
class CachedValue:
    """A hit as the client sees it."""

    value: bytes
    model_version: str
    age_s: float
    stale: bool


class SingleFlight(Generic[T]):
    """N concurrent calls with the same key run `compute` once; every caller gets its result (or its error).

    The computation runs in its own task, so a caller that is cancelled does not cancel it for the others.
    """

    def __init__(self) -> None:
        self._inflight: dict[Hashable, asyncio.Task[T]] = {}

    def __len__(self) -> int:
        return len(self._inflight)

    def __contains__(self, key: Hashable) -> bool:
        """A computation for `key` is in flight (a `do` now joins it)."""
        return key in self._inflight

    async def do(self, key: Hashable, compute: Callable[[], Awaitable[T]]) -> T:
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(compute())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._forget(key, t))
        return await asyncio.shield(task)

    def _forget(self, key: Hashable, task: asyncio.Task[T]) -> None:
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved here so that an error every caller saw is not logged as unhandled


class CacheClient:
    """CacheService over one grpc.aio channel. Lookups never raise: an unreachable cache is all misses."""

    def __init__(self, target: str, timeout_s: float = 0.05, channel: grpc.aio.Channel | None = None) -> None:
        self.channel = channel or grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.CacheServiceStub(self.channel)
        self.timeout_s = timeout_s
        self.flights: SingleFlight[bytes] = SingleFlight()

    async def lookup(
        self,
        keys: Sequence[bytes],
        pipeline: str = "",
        allow_stale: bool = False,
        budget_ms: float = 0.0,
        timeout_s: float | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> list[CachedValue | None]:
        request = pb.LookupRequest(keys=keys, pipeline=pipeline, allow_stale=allow_stale, budget_ms=budget_ms)
        try:
            response = await self.stub.Lookup(request, timeout=timeout_s or self.timeout_s, metadata=tuple(metadata))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise from_rpc_error("cache service", exc) from exc
            log.debug("cache lookup failed open: %s", exc.code().name)
            return [None] * len(keys)
        return [CachedValue(r.value, r.model_version, r.age_s, r.stale) if r.hit else None for r in response.results]

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
        entry = pb.StoreEntry(key=key, value=value, pipeline=pipeline, model_name=model_name,
                              model_version=model_version, ttl_s=ttl_s, stale_ttl_s=stale_ttl_s)  # fmt: skip
        try:
            response = await self.stub.Store(
                pb.StoreRequest(entries=[entry]), timeout=timeout_s or self.timeout_s * 4, metadata=tuple(metadata)
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise from_rpc_error("cache service", exc) from exc
            return False
        return response.stored == 1

    async def get_or_compute(
        self,
        key: bytes,
        compute: Callable[[], Awaitable[bytes]],
        *,
        pipeline: str,
        model_name: str,
        model_version: str,
        ttl_s: float,
        stale_ttl_s: float = 0.0,
    ) -> tuple[bytes, bool]:
        """(value, was_cached): a hit, or one coalesced compute per key whose result is stored after."""

        async def once() -> tuple[bytes, bool]:
            (hit,) = await self.lookup([key], pipeline)
            if hit is not None:
                return hit.value, True
            value = await compute()
            await self.store(key, value, pipeline=pipeline, model_name=model_name, model_version=model_version,
                             ttl_s=ttl_s, stale_ttl_s=stale_ttl_s)  # fmt: skip
            return value, False

        return await self.flights.do(key, once)

    async def invalidate(self, pipeline: str = "", model_name: str = "", model_version: str = "") -> tuple[int, int]:
        request = pb.InvalidateRequest(pipeline=pipeline, model_name=model_name, model_version=model_version)
        response = await self.stub.Invalidate(request, timeout=max(1.0, self.timeout_s))
        return response.l1_removed, response.redis_removed

    async def watch(self, metadata: Sequence[tuple[str, str]] = ()) -> AsyncIterator[Invalidation]:
        """Every invalidation a cache replica applies (a reset first, heartbeats while quiet) until the stream
        ends; a failed stream raises MeshserveError."""
        call = self.stub.Watch(pb.WatchRequest(), metadata=tuple(metadata))
        try:
            async for event in call:
                yield Invalidation(event.reset, event.pipeline, event.model_name, event.model_version)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error("cache service", exc) from exc
        finally:
            call.cancel()

    async def stats(self, timeout_s: float | None = None, metadata: Sequence[tuple[str, str]] = ()) -> pb.StatsResponse:
        """The replica's counters; a failed call raises MeshserveError (the gateway's warm-up uses it as a ping)."""
        try:
            return await self.stub.Stats(
                pb.StatsRequest(), timeout=timeout_s or max(1.0, self.timeout_s), metadata=tuple(metadata)
            )
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error("cache service", exc) from exc

    async def close(self) -> None:
        await self.channel.close()
