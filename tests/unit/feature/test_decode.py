"""The numpy decoder, in process: replies shaped as read.lua returns them (built here from bucket records kept in
Python, read over the read plan's score ranges) decode to the documented window semantics."""

from __future__ import annotations

import json
import math
import struct
from collections import defaultdict
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from services.feature.spec import Aggregate
from services.feature.store import AggregatePlan
from services.feature.store.decode import decode
from services.feature.store.layout import key_base
from tests.unit.feature.specs import agg_plan

BASE_T = 1_700_000_003
KEYS = key_base("p:", "agg_v1")
Event = tuple[int, str, str, float]  # (ts, user, merchant, amount)


def bucket_members(plan: AggregatePlan, events: list[Event]) -> dict[tuple[str, str], dict[int, bytes]]:
    """What ingest.lua leaves in each `b:E:I` sorted set: score -> member (score, then the padded record)."""
    records: dict[tuple[str, str, int, int], list[float]] = {}
    for ts, user, merchant, amount in events:
        ids = {"user": user, "merchant": merchant}
        for gi, g in enumerate(plan.groups):
            key = (g.entity, ids[g.entity], gi, ts // g.bucket_s)
            rec = records.setdefault(key, [0.0] + [0.0] * len(g.sum_fields) + [-math.inf] * len(g.max_fields))
            rec[0] += 1
            for i in range(len(g.sum_fields)):
                rec[1 + i] += amount
            for i in range(len(g.max_fields)):
                rec[1 + len(g.sum_fields) + i] = max(rec[1 + len(g.sum_fields) + i], amount)
    sets: dict[tuple[str, str], dict[int, bytes]] = defaultdict(dict)
    for (entity, entity_id, gi, k), rec in records.items():
        width = plan.entity_width(entity)
        at = plan.score_of(gi, k)
        padded = rec + [0.0] * (width - len(rec))
        sets[(entity, entity_id)][at] = struct.pack("<d", at) + struct.pack("<" + "d" * width, *padded)
    return sets


def read_reply(
    plan: AggregatePlan, sets: dict[tuple[str, str], dict[int, bytes]], rows: list[dict[str, Any]], numbers: list[int]
) -> list[Any]:
    """read.lua's reply for rows: per range its members row after row, each row's member count, the numbers."""
    ranges, _, _ = json.loads(plan.read_plan(KEYS))
    members: list[list[bytes]] = [[] for _ in ranges]
    counts: list[int] = []
    for row in rows:
        t = row["ts"]
        for p, (slot, _head, lo_base, b0, n0, hi_base, b1, sign, offset, _size) in enumerate(ranges):
            entity = plan.entity_order[slot - 1]
            lo, hi = lo_base + t // b0 - n0, hi_base + sign * (t // b1) + offset
            got = [m for at, m in sorted(sets.get((entity, row[entity]), {}).items()) if lo <= at <= hi]
            members[p] += got
            counts.append(len(got))
    return [[b"".join(m) for m in members], counts, numbers]


def reference(events: list[Event], a: Aggregate, row: dict[str, Any]) -> float:
    """The documented window: the whole buckets before the bucket holding the row's time."""
    b, n = a.bucket_s, a.window_s // a.bucket_s
    now = row["ts"] // b
    index = 1 if a.entity == "user" else 2
    amounts = [e[3] for e in events if e[index] == row[a.entity] and now - n <= e[0] // b < now]
    if a.op == "count":
        return float(len(amounts))
    if a.op == "sum":
        return float(sum(amounts))
    if not amounts:
        return a.default
    return sum(amounts) / len(amounts) if a.op == "mean" else max(amounts)


events_strategy = st.lists(
    st.tuples(
        st.integers(BASE_T, BASE_T + 420),
        st.sampled_from(["u0", "u1", "u2"]),
        st.sampled_from(["m0", "m1", "m2"]),
        st.floats(-50, 1000, allow_nan=False).map(lambda x: round(x, 2)),
    ),
    max_size=80,
)


@settings(max_examples=60, deadline=None)
@given(events=events_strategy, times=st.lists(st.integers(BASE_T - 30, BASE_T + 900), min_size=1, max_size=20))
def test_windows_decode_to_the_reference(events: list[Event], times: list[int]) -> None:
    plan = agg_plan()
    sets = bucket_members(plan, events)
    rows = [{"ts": t, "user": f"u{i % 4}", "merchant": f"m{i % 4}"} for i, t in enumerate(times)]  # u3 / m3: unseen
    scalars = len(plan.reply.scalars)
    numbers = [(-1 if (r + j) % 3 == 0 else 10 * r + j) for r in range(len(rows)) for j in range(scalars)]
    ts = np.array(times, dtype=np.int64)
    half = len(rows) // 2  # two read.lua calls (chunks) give the same answer as one
    chunked = [
        read_reply(plan, sets, rows[:half], numbers[: half * scalars]),
        read_reply(plan, sets, rows[half:], numbers[half * scalars :]),
    ]
    for replies in ([read_reply(plan, sets, rows, numbers)], chunked):
        result = decode(plan.reply, ts, replies)
        defaulted = np.zeros(len(rows), dtype=bool)
        for fi, a in plan.aggregates:
            got = result.values[fi]
            if a.op in ("distinct", "since_last"):
                j = [s.feature for s in plan.reply.scalars].index(fi)
                want = [
                    a.default if numbers[r * scalars + j] < 0 else numbers[r * scalars + j] for r in range(len(rows))
                ]
                defaulted |= np.array([numbers[r * scalars + j] < 0 for r in range(len(rows))])
            else:
                want = [reference(events, a, row) for row in rows]
                if a.op in ("mean", "max"):
                    defaulted |= np.array([reference(events, _count(a), row) == 0 for row in rows])
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=a.name)
        assert result.defaulted.tolist() == defaulted.tolist()


def _count(a: Aggregate) -> Aggregate:
    """The count over the same window (an empty window is where mean and max take their defaults)."""
    return a.model_copy(update={"op": "count", "field": None})


def test_no_rows_with_history() -> None:
    """Unknown ids read no members: counts and sums are 0, means and maxima their defaults, every row defaulted."""
    plan = agg_plan()
    rows = [{"ts": BASE_T, "user": "nobody", "merchant": "nowhere"}] * 3
    numbers = [-1] * (3 * len(plan.reply.scalars))
    result = decode(plan.reply, np.full(3, BASE_T), [read_reply(plan, {}, rows, numbers)])
    by_name = {a.name: result.values[fi].tolist() for fi, a in plan.aggregates}
    assert by_name["u_count_1m"] == [0.0] * 3 and by_name["u_sum_5m"] == [0.0] * 3
    assert by_name["u_mean_5m"] == [-1.0] * 3 and by_name["u_max_1m"] == [-7.0] * 3
    assert by_name["u_since_last"] == [-1.0] * 3 and by_name["u_merchants_5m"] == [0.0] * 3
    assert result.defaulted.all()
