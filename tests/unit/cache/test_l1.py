"""The in-process L1: LRU order, expiry, and a byte budget that holds under churn."""

from __future__ import annotations

import random

from services.cache.entry import Entry
from services.cache.l1 import L1Cache


def entry(size: int, now: float = 0.0, ttl: float = 100.0, stale: float = 0.0, pipeline: str = "p") -> Entry:
    return Entry(b"v" * size, pipeline, "m", "1", now, now + ttl, now + ttl + stale)


def test_byte_budget_holds_under_churn() -> None:
    l1 = L1Cache(max_bytes=50_000, max_ttl_s=1000)
    rng = random.Random(7)
    for i in range(5000):
        l1.put(f"k{rng.randrange(2000)}".encode(), entry(rng.randrange(0, 2000)), now=0.0)
        assert l1.bytes <= l1.max_bytes
        if i % 7 == 0:
            l1.get(f"k{rng.randrange(2000)}".encode(), now=0.0)
    assert l1.evictions > 0
    assert l1.bytes == sum(e.size() + len(k) for k, (e, _) in l1._entries.items())


def test_lru_evicts_least_recently_used_and_refuses_oversized() -> None:
    one = entry(100).size() + 2
    l1 = L1Cache(max_bytes=3 * one, max_ttl_s=1000)
    for k in (b"k1", b"k2", b"k3"):
        l1.put(k, entry(100), now=0)
    assert l1.get(b"k1", now=0) is not None  # k2 is now the oldest
    l1.put(b"k4", entry(100), now=0)
    assert l1.get(b"k2", now=0) is None
    assert all(l1.get(k, now=0) is not None for k in (b"k1", b"k3", b"k4"))
    assert not l1.put(b"big", entry(10 * one), now=0)
    assert len(l1) == 3 and l1.evictions == 1


def test_expiry_fresh_then_stale_then_gone_and_l1_ttl_cap() -> None:
    l1 = L1Cache(max_bytes=10_000, max_ttl_s=1000)
    l1.put(b"k", entry(10, now=0, ttl=10, stale=5), now=0)
    assert l1.get(b"k", now=9).fresh(9)
    stale = l1.get(b"k", now=12)
    assert stale is not None and not stale.fresh(12)
    assert l1.get(b"k", now=15) is None and l1.bytes == 0
    capped = L1Cache(max_bytes=10_000, max_ttl_s=1)
    capped.put(b"k", entry(10, now=0, ttl=10), now=0)
    assert capped.get(b"k", now=0.5) is not None and capped.get(b"k", now=1.5) is None


def test_remove_where() -> None:
    l1 = L1Cache(max_bytes=10_000, max_ttl_s=1000)
    l1.put(b"a", entry(10, pipeline="x"), now=0)
    l1.put(b"b", entry(10, pipeline="y"), now=0)
    assert l1.remove_where(lambda e: e.pipeline == "x") == 1
    assert l1.get(b"a", now=0) is None and l1.get(b"b", now=0) is not None


def test_entry_roundtrip_and_garbage() -> None:
    e = Entry(b"\x00value", "pipe", "model", "v7", 1.5, 2.5, 3.5)
    assert Entry.decode(e.encode()) == e
    assert Entry.decode(b"junk") is None
