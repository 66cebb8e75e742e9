"""The cache service's domain handler: validated, fail-open lookups over L1 then Redis; stores; invalidation; watch.

The servicer only converts protobuf to these calls and back (services/cache/converters.py); tests and the
benchmark use this directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from prometheus_client import Counter

from services.cache import metrics
from services.cache.domain import L1, REDIS, RESET, CacheStats, Hit, Invalidation, Removed, Stored, StoreItem
from services.cache.entry import Entry
from services.cache.fanout import InvalidationFanout
from services.cache.l1 import L1Cache
from services.cache.redis_tier import FAILURES, RedisTier
from services.cache.settings import CacheSettings
from services.common.errors import InvalidArgument
from services.common.redis import redact
from services.common.server import Lifecycle
from services.common.tracing import child_span

log = logging.getLogger(__name__)
tracer = trace.get_tracer("meshserve.cache")


@dataclass(slots=True)
class Counts:
    """Counters of this replica (the Stats RPC)."""

    l1_hits: int = 0
    redis_hits: int = 0
    misses: int = 0
    stores: int = 0
    stores_dropped: int = 0


class CacheHandler:
    """Everything the cache RPCs do, in domain types. A Redis failure is never an error: it is a miss.

    Build it inside the running event loop: it starts a task that applies other replicas' invalidations.
    Liveness and readiness are the serving process's (`lifecycle`, from its GrpcService); a handler used on
    its own (tests, the benchmark) has a lifecycle of its own.
    """

    def __init__(self, settings: CacheSettings, redis_url: str | None, lifecycle: Lifecycle | None = None) -> None:
        self.settings = settings
        self.lifecycle = lifecycle if lifecycle is not None else Lifecycle()
        self.l1 = L1Cache(settings.l1_max_bytes, settings.l1_max_ttl_s)
        self.redis: RedisTier | None = None
        self._redis_address = redact(redis_url) if redis_url else None  # for the log: no password
        if redis_url:
            self.redis = RedisTier(
                redis_url,
                settings.key_prefix,
                settings.circuit_failures,
                settings.circuit_probe_interval_s,
                settings.redis_max_connections,
            )
        self.counts = Counts()
        self.fanout = InvalidationFanout()  # to the Watch streams (gateways' near caches)
        self._watcher: asyncio.Task[None] | None = None
        if self.redis is not None:
            self._watcher = asyncio.get_running_loop().create_task(
                self.redis.watch_invalidations(self._apply_invalidation, self._drop_l1)
            )
        self._seen: dict[str, list[int]] = {}  # pipeline -> [hits, keys], for the hit-ratio gauge
        self._evictions_reported = 0

    # -- liveness and readiness -------------------------------------------------------------------

    def live(self) -> bool:
        return self.lifecycle.live

    def ready(self) -> bool:
        return self.lifecycle.ready

    async def ping(self) -> bool:
        """Whether Redis answers now (False when there is none: L1 only)."""
        return self.redis is not None and await self.redis.ping()

    # -- validation -------------------------------------------------------------------------------

    def _check_keys(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise InvalidArgument("no keys given")
        if len(keys) > self.settings.max_batch:
            raise InvalidArgument(f"{len(keys)} keys in one request; at most {self.settings.max_batch}")
        for i, key in enumerate(keys):
            if not key:
                raise InvalidArgument(f"key {i} is empty")
            if len(key) > self.settings.max_key_bytes:
                raise InvalidArgument(f"key {i} has {len(key)} bytes; at most {self.settings.max_key_bytes}")

    @staticmethod
    def _check_names(where: str, **names: str) -> None:
        """Names travel NUL-separated between replicas (redis_tier.encode_invalidation): a NUL inside one would
        make another replica drop other entries than this one."""
        for field, value in names.items():
            if "\0" in value:
                raise InvalidArgument(f"{where}{field} holds a NUL character")

    def _check_item(self, i: int, item: StoreItem) -> None:
        s = self.settings
        self._check_names(
            f"entry {i}: ", pipeline=item.pipeline, model_name=item.model_name, model_version=item.model_version
        )
        if len(item.value) > s.max_value_bytes:
            raise InvalidArgument(f"entry {i}: value of {len(item.value)} bytes; at most {s.max_value_bytes}")
        if not (0 < item.ttl_s <= s.max_ttl_s):
            raise InvalidArgument(f"entry {i}: ttl_s {item.ttl_s} out of range (0, {s.max_ttl_s}]")
        if not (0 <= item.stale_ttl_s <= s.max_stale_ttl_s):
            raise InvalidArgument(f"entry {i}: stale_ttl_s {item.stale_ttl_s} out of range [0, {s.max_stale_ttl_s}]")
        if not item.model_name or not item.model_version:
            raise InvalidArgument(f"entry {i}: model_name and model_version are required")

    # -- lookup -----------------------------------------------------------------------------------

    async def lookup(
        self, keys: Sequence[bytes], pipeline: str = "", allow_stale: bool = False, budget_ms: float = 0.0
    ) -> list[Hit | None]:
        """One result per key: L1, then one batched Redis MGET within the budget; failures are misses."""
        self._check_keys(keys)
        if budget_ms < 0:
            raise InvalidArgument(f"budget_ms {budget_ms} is negative")
        start = time.perf_counter()
        with child_span(tracer, "cache.lookup") as span:
            results = await self._lookup(
                keys, pipeline, allow_stale, (budget_ms or self.settings.lookup_budget_ms) / 1e3
            )
            hits = sum(r is not None for r in results)
            if span.is_recording():
                span.set_attributes({"cache.keys": len(keys), "cache.hits": hits, "cache.pipeline": pipeline})
        self._observe(pipeline, hits, len(keys), time.perf_counter() - start)
        return results

    async def _lookup(
        self, keys: Sequence[bytes], pipeline: str, allow_stale: bool, budget_s: float
    ) -> list[Hit | None]:
        now = time.time()
        results: list[Hit | None] = [None] * len(keys)
        pending: list[int] = []
        for i, key in enumerate(keys):
            entry = self.l1.get(key, now)
            if entry is not None and (allow_stale or entry.fresh(now)):
                results[i] = _hit(entry, now, L1)
            else:
                pending.append(i)
        l1_hits = len(keys) - len(pending)
        self.counts.l1_hits += l1_hits
        _count(metrics.HITS, L1, pipeline, l1_hits)
        _count(metrics.MISSES, L1, pipeline, len(pending))
        if not pending:
            return results
        redis_hits = 0
        if self.redis is not None and self.redis.available():
            try:
                entries = await self.redis.mget([keys[i] for i in pending], budget_s)
            except FAILURES as exc:
                self.redis.failed("lookup", exc)
            else:
                now = time.time()
                use_l1 = self.l1.max_bytes > 0
                for i, entry in zip(pending, entries, strict=True):
                    if entry is None or not entry.alive(now) or not (allow_stale or entry.fresh(now)):
                        continue
                    results[i] = _hit(entry, now, REDIS)
                    if use_l1:
                        self.l1.put(keys[i], entry, now)
                    redis_hits += 1
                if use_l1:
                    self._l1_gauges()
        self.counts.redis_hits += redis_hits
        self.counts.misses += len(pending) - redis_hits
        _count(metrics.HITS, REDIS, pipeline, redis_hits)
        _count(metrics.MISSES, REDIS, pipeline, len(pending) - redis_hits)
        return results

    def _observe(self, pipeline: str, hits: int, keys: int, seconds: float) -> None:
        seen = self._seen.setdefault(pipeline, [0, 0])
        seen[0] += hits
        seen[1] += keys
        metrics.HIT_RATIO.labels(pipeline).set(seen[0] / seen[1])
        metrics.LOOKUP_SECONDS.labels(pipeline).observe(seconds)

    # -- store and invalidate ---------------------------------------------------------------------

    async def store(self, items: Sequence[StoreItem]) -> Stored:
        """Write to L1 and (best effort, one round trip) to Redis; returns (stored in Redis, dropped)."""
        if not items:
            raise InvalidArgument("no entries given")
        self._check_keys([item.key for item in items])
        for i, item in enumerate(items):
            self._check_item(i, item)
        with child_span(tracer, "cache.store") as span:
            now = time.time()
            pairs = []
            for item in items:
                fresh_until = now + item.ttl_s
                stale_until = fresh_until + item.stale_ttl_s
                entry = Entry(
                    item.value, item.pipeline, item.model_name, item.model_version, now, fresh_until, stale_until
                )
                self.l1.put(item.key, entry, now)
                pairs.append((item.key, entry))
            self._l1_gauges()
            stored = 0
            if self.redis is not None and self.redis.available():
                try:
                    ttl_cap = self.settings.max_ttl_s + self.settings.max_stale_ttl_s
                    await self.redis.set_many(pairs, ttl_cap, self.settings.store_timeout_ms / 1e3)
                    stored = len(pairs)
                except FAILURES as exc:
                    self.redis.failed("store", exc)
            dropped = len(pairs) - stored
            if span.is_recording():
                span.set_attributes({"cache.entries": len(pairs), "cache.dropped": dropped})
        self.counts.stores += stored
        self.counts.stores_dropped += dropped
        metrics.STORES.labels("stored").inc(stored)
        metrics.STORES.labels("dropped").inc(dropped)
        return Stored(stored, dropped)

    async def invalidate(self, pipeline: str = "", model_name: str = "", model_version: str = "") -> Removed:
        """Drop a pipeline's entries, or a model version's (every version when model_version is empty)."""
        if bool(pipeline) == bool(model_name):
            raise InvalidArgument("give either pipeline or model_name (with an optional model_version)")
        self._check_names("", pipeline=pipeline, model_name=model_name, model_version=model_version)
        invalidation = Invalidation(pipeline=pipeline, model_name=model_name, model_version=model_version)
        l1_removed = self._apply_invalidation(invalidation)
        redis_removed = 0
        if self.redis is not None and self.redis.available():
            try:
                redis_removed = await self.redis.invalidate(pipeline, model_name, model_version)
                await self.redis.publish_invalidation(invalidation)
            except FAILURES as exc:
                self.redis.failed("invalidate", exc)
        return Removed(l1_removed, redis_removed)

    def _apply_invalidation(self, invalidation: Invalidation) -> int:
        """Drop the L1 entries an invalidation names (this replica's or another's) and tell the watchers."""
        removed = self.l1.remove_where(invalidation.matches)
        self.fanout.publish(invalidation)
        self._l1_gauges()
        return removed

    def _drop_l1(self) -> None:
        """After a gap in the invalidation channel: drop L1, and tell the watchers to drop theirs."""
        self.l1.remove_where(lambda e: True)
        self.fanout.publish(RESET)
        self._l1_gauges()

    # -- watch ------------------------------------------------------------------------------------

    async def watch(self) -> AsyncIterator[Invalidation]:
        """Every invalidation this replica applies from now on: a reset first, heartbeats while idle; it ends
        when the replica drains (at once for a watcher that arrives after that: it should go elsewhere)."""
        if not self.live():
            return
        async for event in self.fanout.subscribe(self.settings.watch_heartbeat_s):
            yield event

    def drain(self) -> None:
        """End every Watch stream (a drain hook: the watchers reconnect to another replica)."""
        self.fanout.close()

    # -- stats -----------------------------------------------------------------------------------

    def stats(self) -> CacheStats:
        c = self.counts
        return CacheStats(
            l1_entries=len(self.l1),
            l1_bytes=self.l1.bytes,
            l1_max_bytes=self.l1.max_bytes,
            l1_evictions=self.l1.evictions,
            l1_hits=c.l1_hits,
            redis_hits=c.redis_hits,
            misses=c.misses,
            redis_errors=0 if self.redis is None else self.redis.errors,
            circuit_open=self.redis is not None and not self.redis.available(),
            stores=c.stores,
            stores_dropped=c.stores_dropped,
        )

    def _l1_gauges(self) -> None:
        metrics.L1_BYTES.set(self.l1.bytes)
        metrics.L1_ENTRIES.set(len(self.l1))
        if self.l1.evictions > self._evictions_reported:
            metrics.L1_EVICTIONS.inc(self.l1.evictions - self._evictions_reported)
            self._evictions_reported = self.l1.evictions

    async def start(self) -> None:
        """Check that Redis answers. One that does not is a warning, not a failure: the cache serves from L1 alone
        until it answers."""
        if self.redis is not None and not await self.ping():
            log.warning("redis at %s does not answer; serving from L1 only until it does", self._redis_address)

    async def close(self) -> None:
        self.fanout.close()
        if self._watcher is not None:
            self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
        if self.redis is not None:
            await self.redis.close()


def _hit(entry: Entry, now: float, tier: str) -> Hit:
    return Hit(entry.value, entry.model_version, max(0.0, now - entry.stored_at), not entry.fresh(now), tier)


def _count(counter: Counter, tier: str, pipeline: str, n: int) -> None:
    if n:
        counter.labels(tier, pipeline).inc(n)
