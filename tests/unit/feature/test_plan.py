"""The store's plan compiler and key layout, in process: groups, bands, script plans, reply layout, keys."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.feature.featureset import load_feature_sets
from services.feature.settings import ROOT
from services.feature.store import BAND, BucketGroup, DistinctGroup
from services.feature.store.layout import (
    LAST_SEEN_KEEP,
    MAX_BANDS,
    MIN_LAST_SEEN_TTL_S,
    bucket_head,
    key_base,
    last_seen_head,
    score,
)
from services.feature.store.plan import AggregatePlan
from tests.helpers.fixtures import AGG_YAML
from tests.unit.feature.specs import agg_plan, spec_of

BASE = key_base("meshserve:feature:", "agg_v1")


def test_key_names_and_scores() -> None:
    assert BASE == "meshserve:feature:agg_v1:"
    assert bucket_head(BASE, "user") == "meshserve:feature:agg_v1:b:user:"
    assert last_seen_head(BASE, "user") == "meshserve:feature:agg_v1:l:user:"
    d = DistinctGroup("user", "merchant", 3600, 24)
    assert d.rollup == 5  # ceil(sqrt(24))
    assert d.bucket_parts(BASE) == ("meshserve:feature:agg_v1:h:user:", ":merchant:3600:")
    assert d.block_parts(BASE) == ("meshserve:feature:agg_v1:H:user:", ":merchant:3600:5:")
    assert DistinctGroup("user", "merchant", 60, 11).rollup == 1  # short windows keep no blocks
    # even bands count up from their base, odd ones down from their top: newest first
    assert score(0, 7) == 7 and score(2, 7) == 2 * BAND + 7
    assert score(1, 7) == 2 * BAND - 1 - 7 and score(3, 0) == 4 * BAND - 1


@given(first=st.integers(0, 500), n=st.integers(1, 60), buckets=st.integers(1, 60))
def test_distinct_keys_cover_the_window_once(first: int, n: int, buckets: int) -> None:
    """Whole blocks plus the buckets left over name every bucket of the window exactly once (and nothing else)."""
    d = DistinctGroup("user", "merchant", 60, buckets)
    keys = d.keys(BASE, "u1", first, n)
    (head, middle), (block_head, block_middle) = d.bucket_parts(BASE), d.block_parts(BASE)
    bucket, block = f"{head}u1{middle}", f"{block_head}u1{block_middle}"
    covered: list[int] = []
    for key in keys:
        if key.startswith(block):
            j = int(key[len(block) :])
            covered += range(j * d.rollup, (j + 1) * d.rollup)
        else:
            assert key.startswith(bucket)
            covered.append(int(key[len(bucket) :]))
    assert sorted(covered) == list(range(first, first + n))
    if d.rollup == 1:
        assert len(keys) == n
    else:
        assert len(keys) <= n and len(keys) <= 2 * (d.rollup - 1) + n // d.rollup + 1


def test_groups_bands_and_ranges() -> None:
    plan = agg_plan()
    assert plan.groups == [
        BucketGroup("user", 10, 6, (), ("amount",)),
        BucketGroup("user", 60, 5, ("amount",), ()),
        BucketGroup("merchant", 12, 10, (), ("amount",)),  # 2m with the default bucket: window / 10
    ]
    assert [plan.band_of(gi) for gi in range(3)] == [0, 1, 0]
    assert plan.entity_order == ["merchant", "user"]
    assert plan.ranges == [("merchant", [2]), ("user", [0, 1])]  # user's two bands in one range
    assert plan.distinct == [DistinctGroup("user", "merchant", 60, 5)]
    assert plan.last_seen == ["user"] and plan.last_seen_ttl_s == MIN_LAST_SEEN_TTL_S
    assert plan.entity_width("user") == 2 and plan.entity_ttl_s("user") == (5 + 2) * 60
    spec = plan.aggregates
    names = {f.name: f for _, f in spec}
    assert plan.column_of(names["u_max_1m"]) == 1 and plan.column_of(names["u_sum_5m"]) == 1
    assert plan.column_of(names["u_count_5m"]) == 0
    assert plan.covering_group(names["u_merchants_5m"]) == 2  # the user group of 1 min buckets (1-based)
    assert plan.score_of(1, 3) == score(1, 3)


def test_too_many_bucket_lengths_for_one_entity() -> None:
    lines = [
        f"  - {{name: c{i}, kind: aggregate, entity: user, op: count, window: {i + 1}s, bucket: 1s}}"
        for i in range(MAX_BANDS + 1)
    ]
    text = "\n".join(
        [
            "name: many",
            "version: 1",
            "timestamp_field: ts",
            "inputs: {ts: int64, user: string}",
            "entities: {user: user}",
            "features:",
            *[line.replace("bucket: 1s", f"bucket: {i + 1}s") for i, line in enumerate(lines)],
        ]
    )
    with pytest.raises(ValueError, match=f"over {MAX_BANDS} bucket lengths"):
        AggregatePlan.of(spec_of(text))


def test_ingest_plan_names_the_layout() -> None:
    plan = agg_plan()
    got = json.loads(plan.ingest_plan(BASE))
    assert got["entities"] == ["merchant", "user"] and got["band"] == BAND
    assert got["last"] == [{"e": "user", "head": last_seen_head(BASE, "user")}]
    assert (got["last_ttl"], got["last_keep"]) == (MIN_LAST_SEEN_TTL_S, LAST_SEEN_KEEP)
    odd = got["groups"][1]
    assert odd["head"] == bucket_head(BASE, "user") and odd["band"] == BAND and odd["down"] is True
    assert (odd["fmt"], odd["size"], odd["pad"], odd["sums"], odd["maxes"]) == ("<dd", 16, 0, ["amount"], [])
    assert (odd["ttl"], odd["prune_len"]) == (plan.entity_ttl_s("user"), 4 * (5 + 2))
    [distinct] = got["distinct"]
    assert distinct["head"] + "u1" + distinct["mid"] + "7" == plan.distinct[0].keys(BASE, "u1", 7, 1)[0]
    assert plan.ingest_plan(BASE) is plan.ingest_plan(BASE)  # compiled once per key base


def test_read_plan_ranges_span_the_windows() -> None:
    """A row as of t reads, per range, from its first band's window start to its last band's window end."""
    plan = agg_plan()
    ranges, scalars, nent = json.loads(plan.read_plan(BASE))
    assert nent == 2
    t = 1_700_000_003
    for (entity, bands), (slot, head, lo_base, b0, n0, hi_base, b1, sign, offset, size) in zip(
        plan.ranges, ranges, strict=True
    ):
        assert slot == 1 + plan.entity_order.index(entity) and head == bucket_head(BASE, entity)
        assert size == 8 * (1 + plan.entity_width(entity))
        first, last = plan.groups[bands[0]], plan.groups[bands[-1]]
        lo = lo_base + t // b0 - n0
        hi = hi_base + sign * (t // b1) + offset
        assert lo == plan.score_of(bands[0], t // first.bucket_s - first.buckets)
        if len(bands) == 2:  # the odd band's oldest bucket has its highest score
            assert hi == plan.score_of(bands[1], t // last.bucket_s - last.buckets)
        else:
            assert hi == plan.score_of(bands[0], t // first.bucket_s - 1)
    distinct, since_last = scalars
    d = plan.distinct[0]
    assert distinct == [False, 2, *d.bucket_parts(BASE), 60, 5, 2, *d.block_parts(BASE), 1]
    assert since_last == [True, 2, last_seen_head(BASE, "user")]


def test_reply_layout() -> None:
    plan = agg_plan()
    reply = plan.reply
    assert [(w.feature, w.op, w.group, w.first, w.column) for w in reply.windowed] == [
        (0, "count", 0, 0, 0),
        (1, "count", 1, 0, 0),
        (2, "sum", 1, 0, 1),
        (3, "mean", 1, 0, 1),
        (4, "max", 0, 0, 1),
        (7, "count", 2, 0, 0),
        (8, "max", 2, 0, 1),
    ]
    assert [(s.feature, s.default) for s in reply.scalars] == [(5, 0.0), (6, -1.0)]
    assert [(r.width, r.groups) for r in reply.ranges] == [(2, [(2, 0)]), (2, [(0, 0), (1, 1)])]
    assert plan.reply is reply


def test_fraud_v1_plan() -> None:
    """The demo set: 3 device, 2 merchant and 4 user groups read in 2 + 1 + 2 ranges; long distinct counts roll up."""
    plan = load_feature_sets(ROOT / "features")["fraud_v1"].plan
    assert [(e, len(bands)) for e, bands in plan.ranges] == [
        ("device", 2),
        ("device", 1),
        ("merchant", 2),
        ("user", 2),
        ("user", 2),
    ]
    assert {(d.entity, d.field, d.buckets, d.rollup) for d in plan.distinct} == {
        ("user", "merchant_id", 24, 5),
        ("merchant", "user_id", 24, 5),
        ("user", "device_id", 28, 6),
        ("device", "user_id", 28, 6),
    }
    assert sorted(plan.last_seen) == ["device", "merchant", "user"]


def test_ingest_plan_caps_bucket_sums_so_windows_stay_finite_in_fp32() -> None:
    """A bucket's sum of a field that a sum aggregate reads over n buckets is capped at FP32_MAX / n (so any window
    of them fits FP32); a field only averaged needs its sum finite as a double; each event's value must fit too."""
    fp32_max = float(np.finfo(np.float32).max)
    plan = agg_plan()
    odd = json.loads(plan.ingest_plan(BASE))["groups"][1]  # user, 1 min buckets: u_sum_5m and u_mean_5m
    assert odd["sums"] == ["amount"] and odd["caps"] == [fp32_max / 5]
    averaged = spec_of(AGG_YAML.replace("  - {name: u_sum_5m", "  # "))
    [group] = [g for g in json.loads(AggregatePlan.of(averaged).ingest_plan(BASE))["groups"] if g["sums"]]
    assert group["caps"] == [sys.float_info.max]
    assert plan.value_limits == {"amount": fp32_max / 5}  # summed over 5 buckets, averaged, maxed
    assert AggregatePlan.of(averaged).value_limits == {"amount": fp32_max}
