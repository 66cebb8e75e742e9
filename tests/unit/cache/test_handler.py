"""The cache handler in process: L1 only, on a Redis that refuses connections (misses, a circuit that opens),
liveness and readiness from the lifecycle, Watch streams that end when the replica drains, its metrics."""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import REGISTRY
from prometheus_client.metrics import MetricWrapperBase

from services.cache import metrics
from services.cache.domain import L1, RESET, Invalidation, Stored, StoreItem
from services.cache.handler import CacheHandler
from services.common.server import Lifecycle

MakeHandler = Callable[..., CacheHandler]


def item(key: bytes, value: bytes = b"answer", pipeline: str = "fraud", version: str = "1") -> StoreItem:
    return StoreItem(key, value, pipeline, "fraud_mlp", version, 60.0)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_l1_only_stores_and_hits_in_process(make_handler: MakeHandler) -> None:
    h = make_handler()
    hits_before = sample("meshserve_cache_hits_total", tier="l1", pipeline="unit-l1")
    assert await h.store([item(b"k1", b"v1", pipeline="unit-l1")]) == Stored(0, 1)  # no Redis: kept in L1 only
    (hit,) = await h.lookup([b"k1"], "unit-l1")
    assert hit is not None and (hit.value, hit.tier, hit.stale) == (b"v1", L1, False)
    assert await h.lookup([b"k2"], "unit-l1") == [None]
    assert sample("meshserve_cache_hits_total", tier="l1", pipeline="unit-l1") == hits_before + 1
    assert sample("meshserve_cache_hit_ratio", pipeline="unit-l1") == 0.5
    assert await h.invalidate(pipeline="unit-l1") == (1, 0)
    assert h.stats()["l1_entries"] == 0 and h.stats()["stores_dropped"] == 1
    assert not await h.ping()


async def test_a_refused_redis_is_a_fast_miss_then_an_open_circuit(
    make_handler: MakeHandler, refused_redis_url: str
) -> None:
    h = make_handler(refused_redis_url, l1_max_bytes=0, circuit_failures=3, circuit_probe_interval_s=30)
    assert h.redis is not None
    start = time.monotonic()
    for _ in range(3):
        assert await h.lookup([b"k"], budget_ms=1000) == [None]
    assert time.monotonic() - start < 3.0  # only to catch a hang: a refused connection fails at once
    assert h.stats()["circuit_open"] and h.stats()["redis_errors"] == 3
    assert sample("meshserve_cache_circuit_open") == 1  # the gauge says so too
    assert sample("meshserve_cache_redis_errors_total", op="lookup", kind="ConnectionError") >= 3
    assert await h.store([item(b"k")]) == Stored(0, 1)  # the circuit is open: Redis is not even tried
    assert h.stats()["redis_errors"] == 3
    assert not await h.ping()


async def test_liveness_and_readiness_come_from_the_lifecycle(make_handler: MakeHandler) -> None:
    lifecycle = Lifecycle()
    h = CacheHandler(make_handler().settings, None, lifecycle)
    try:
        assert (h.live(), h.ready()) == (True, False)  # started, not yet SERVING
        lifecycle.ready = True
        assert (h.live(), h.ready()) == (True, True)
        lifecycle.ready, lifecycle.draining = False, True
        assert (h.live(), h.ready()) == (False, False)
        assert [e async for e in h.watch()] == []  # a watcher arriving while draining is sent elsewhere at once
    finally:
        await h.close()
    standalone = make_handler()
    assert standalone.live() and not standalone.ready()  # a handler on its own has a lifecycle of its own


async def test_watch_starts_with_a_reset_follows_invalidations_and_ends_at_drain(make_handler: MakeHandler) -> None:
    h = make_handler(watch_heartbeat_s=30)
    events = h.watch().__aiter__()
    assert await anext(events) == RESET
    await h.invalidate(model_name="fraud_mlp", model_version="2")
    assert await anext(events) == Invalidation(model_name="fraud_mlp", model_version="2")
    h.drain()
    assert [e async for e in events] == []
    assert [e async for e in h.watch()] == []  # drained: new watchers end at once too


def test_every_metric_is_named_for_the_cache() -> None:
    names = [c.describe()[0].name for c in vars(metrics).values() if isinstance(c, MetricWrapperBase)]
    assert len(names) == 10 and all(n.startswith("meshserve_cache_") for n in names), names
