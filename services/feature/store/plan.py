"""The plan compiler: what a feature set's aggregates need from the store, derived once from its spec.

AggregatePlan.of groups the aggregates into bucket groups and HyperLogLog families (see layout.py), then
encodes that as the Lua scripts take it (ingest_plan, read_plan: JSON in ARGV[1]) and as the decoder reads
the read script's reply (reply).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from services.feature.bounds import DOUBLE_MAX, FP32_MAX
from services.feature.spec import Aggregate, FeatureSetSpec
from services.feature.store.generation import lookback_s
from services.feature.store.layout import (
    BAND,
    LAST_SEEN_KEEP,
    MAX_BANDS,
    MIN_LAST_SEEN_TTL_S,
    BucketGroup,
    DistinctGroup,
    bucket_head,
    last_seen_head,
    score,
)


class Windowed(NamedTuple):
    """A count / sum / mean / max aggregate as the decoder computes it from its group's bucket records."""

    feature: int  # index of the feature in the spec
    op: str
    default: float
    group: int  # index into the plan's groups
    first: int  # its window's first bucket within the group's span (0: the span's oldest)
    column: int  # where it reads in a record (count: 0)


class ScriptValue(NamedTuple):
    """A distinct / since_last aggregate: the read script returns its value (-1: take the default)."""

    feature: int
    default: float


class RangeRead(NamedTuple):
    """One ZRANGEBYSCORE a row of the read script: the record width and the (group, band) pairs windowed from it."""

    width: int
    groups: list[tuple[int, int]]


@dataclass(frozen=True)
class ReplyLayout:
    """How the decoder turns the read script's reply into aggregates."""

    groups: list[BucketGroup]
    windowed: list[Windowed]
    scalars: list[ScriptValue]  # in reply order
    ranges: list[RangeRead]  # in reply order


@dataclass
class AggregatePlan:
    """What the aggregates of a feature set need from the store, derived once from its spec."""

    set_id: str
    entities: dict[str, str]  # entity kind -> input field holding its id
    aggregates: list[tuple[int, Aggregate]]  # (feature index, spec)
    groups: list[BucketGroup] = field(default_factory=list)
    distinct: list[DistinctGroup] = field(default_factory=list)
    last_seen: list[str] = field(default_factory=list)  # entity kinds with a since_last aggregate
    last_seen_ttl_s: int = MIN_LAST_SEEN_TTL_S
    # (entity kind, bucket s, field) -> buckets of the longest sum aggregate of that field over such buckets
    summed: dict[tuple[str, int, str], int] = field(default_factory=dict)
    _ingest_plans: dict[str, str] = field(default_factory=dict, repr=False)  # by key base
    _read_plans: dict[str, bytes] = field(default_factory=dict, repr=False)  # by key base

    @classmethod
    def of(cls, spec: FeatureSetSpec) -> AggregatePlan:
        aggs = [(i, f) for i, f in enumerate(spec.features) if isinstance(f, Aggregate)]
        plan = cls(spec.id, dict(spec.entities), aggs)
        groups: dict[tuple[str, int], tuple[int, set[str], set[str]]] = {}
        distinct: dict[tuple[str, str, int], int] = {}
        for _, a in aggs:
            if a.op == "since_last":
                if a.entity not in plan.last_seen:
                    plan.last_seen.append(a.entity)
                continue
            n = a.window_s // a.bucket_s
            buckets, sums, maxes = groups.get((a.entity, a.bucket_s), (0, set(), set()))
            if a.op == "distinct":  # its bucket group too: which buckets hold events (see covering_group)
                key = (a.entity, a.field or "", a.bucket_s)
                distinct[key] = max(distinct.get(key, 0), n)
            if a.op in ("sum", "mean"):
                sums.add(a.field or "")
            if a.op == "sum":
                summed = (a.entity, a.bucket_s, a.field or "")
                plan.summed[summed] = max(plan.summed.get(summed, 0), n)
            if a.op == "max":
                maxes.add(a.field or "")
            groups[(a.entity, a.bucket_s)] = (max(buckets, n), sums, maxes)
        plan.groups = [BucketGroup(e, b, n, tuple(sorted(s)), tuple(sorted(m))) for (e, b), (n, s, m) in groups.items()]
        for e in plan.entity_order:
            if len(plan.entity_groups(e)) > MAX_BANDS:
                raise ValueError(f"entity {e!r} has over {MAX_BANDS} bucket lengths")
        plan.distinct = [DistinctGroup(e, f, b, n) for (e, f, b), n in distinct.items()]
        plan.last_seen_ttl_s = max([MIN_LAST_SEEN_TTL_S, *(a.window_s for _, a in aggs)])
        return plan

    @cached_property
    def lookback_s(self) -> int:
        """How far back before a row's time its aggregates read (the longest window and its bucket, or the since_last
        TTL): after a loss of the store's data, rows are marked until this much time has passed."""
        windows = [(a.window_s, a.bucket_s) for _, a in self.aggregates if a.op != "since_last"]
        return lookback_s(windows, self.last_seen_ttl_s if self.last_seen else 0)

    # -- lookups ------------------------------------------------------------------------------------

    def distinct_of(self, a: Aggregate) -> DistinctGroup:
        return next(
            d for d in self.distinct if d.entity == a.entity and d.field == (a.field or "") and d.bucket_s == a.bucket_s
        )

    def group_of(self, a: Aggregate) -> BucketGroup:
        return next(g for g in self.groups if g.entity == a.entity and g.bucket_s == a.bucket_s)

    def column_of(self, a: Aggregate) -> int:
        """Where a count / sum / mean / max aggregate reads in its group's bucket record (count: 0)."""
        g = self.group_of(a)
        if a.op == "count":
            return 0
        if a.op == "max":
            return 1 + len(g.sum_fields) + g.max_fields.index(a.field or "")
        return 1 + g.sum_fields.index(a.field or "")

    def sum_cap(self, g: BucketGroup, name: str) -> float:
        """The most |sum| of field `name` a bucket of g may hold (ingest.lua refuses an event past it).

        A sum aggregate over n buckets is sent as FP32, so each bucket may hold FP32_MAX / n (any window of them
        then fits); a field g only averages needs its sum finite as the double it is stored in (each value
        fits FP32, see value_limits, so the mean does).
        """
        n = self.summed.get((g.entity, g.bucket_s, name))
        return DOUBLE_MAX if n is None else FP32_MAX / n

    @cached_property
    def value_limits(self) -> dict[str, float]:
        """Field -> the largest |value| one event may carry: what its sum, mean and max aggregates can hold."""
        limits: dict[str, float] = {}
        for _, a in self.aggregates:
            if a.op in ("sum", "mean", "max") and a.field is not None:
                limit = FP32_MAX / (a.window_s // a.bucket_s) if a.op == "sum" else FP32_MAX
                limits[a.field] = min(limits.get(a.field, limit), limit)
        return limits

    @property
    def entity_order(self) -> list[str]:
        """Entity kinds in the order the scripts take a row's ids."""
        return sorted(self.entities)

    def entity_groups(self, entity: str) -> list[int]:
        """The indexes (into groups) of an entity's bucket groups, in band order (their place in its sorted set)."""
        return [gi for gi, g in enumerate(self.groups) if g.entity == entity]

    def band_of(self, gi: int) -> int:
        return self.entity_groups(self.groups[gi].entity).index(gi)

    @property
    def ranges(self) -> list[tuple[str, list[int]]]:
        """What the read script reads a row in: each entity's groups two bands at a time (an even one, an odd one)."""
        pairs = []
        for e in self.entity_order:
            bands = self.entity_groups(e)
            pairs += [(e, bands[i : i + 2]) for i in range(0, len(bands), 2)]
        return pairs

    def score_of(self, gi: int, bucket: int) -> int:
        """A bucket's score in its entity's sorted set (newest first in odd bands)."""
        return score(self.band_of(gi), bucket)

    def entity_width(self, entity: str) -> int:
        """Doubles in a record of the entity's sorted set: its widest group's (the others are zero-padded)."""
        return max(self.groups[gi].width for gi in self.entity_groups(entity))

    def entity_ttl_s(self, entity: str) -> int:
        """How long the entity's sorted set lives past its last event: as long as its longest-lived group needs."""
        return max(g.ttl_s for g in self.groups if g.entity == entity)

    def covering_group(self, a: Aggregate) -> int:
        """The bucket group (1-based) of a distinct aggregate's entity and bucket length spanning its window, or 0.

        An event writes its bucket record and its HyperLogLogs together, so such a group tells whether the
        window holds events at all (when not, the count is 0 without a PFCOUNT).
        """
        n = a.window_s // a.bucket_s
        return next(
            (
                gi + 1
                for gi, g in enumerate(self.groups)
                if g.entity == a.entity and g.bucket_s == a.bucket_s and g.buckets >= n
            ),
            0,
        )

    # -- what the scripts take ----------------------------------------------------------------------

    def ingest_plan(self, base: str) -> str:
        """ARGV[1] of ingest.lua for keys under `base` (JSON; the fields are described there)."""
        cached = self._ingest_plans.get(base)
        if cached is not None:
            return cached
        groups = []
        for gi, g in enumerate(self.groups):
            width, band = self.entity_width(g.entity), self.band_of(gi)
            groups.append(
                {
                    "e": g.entity,
                    "head": bucket_head(base, g.entity),
                    "b": g.bucket_s,
                    "n": g.buckets,
                    "band": band * BAND,
                    "down": band % 2 == 1,
                    "fmt": "<" + "d" * width,
                    "size": 8 * width,
                    "pad": width - g.width,
                    "sums": list(g.sum_fields),
                    "caps": [self.sum_cap(g, f) for f in g.sum_fields],
                    "maxes": list(g.max_fields),
                    "ttl": self.entity_ttl_s(g.entity),
                    "prune_len": g.prune_len,
                }
            )
        distinct = []
        for d in self.distinct:
            (head, middle), (block_head, block_middle) = d.bucket_parts(base), d.block_parts(base)
            distinct.append(
                {
                    "e": d.entity,
                    "f": d.field,
                    "b": d.bucket_s,
                    "head": head,
                    "mid": middle,
                    "r": d.rollup,
                    "bhead": block_head,
                    "bmid": block_middle,
                    "ttl": d.ttl_s,
                }
            )
        text = json.dumps(
            {
                "entities": self.entity_order,
                "band": BAND,
                "groups": groups,
                "distinct": distinct,
                "last": [{"e": e, "head": last_seen_head(base, e)} for e in self.last_seen],
                "last_ttl": self.last_seen_ttl_s,
                "last_keep": LAST_SEEN_KEEP,
            }
        )
        self._ingest_plans[base] = text
        return text

    def read_plan(self, base: str) -> bytes:
        """ARGV[1] of read.lua for keys under `base`: JSON [ranges, scalars, entities] (described there)."""
        cached = self._read_plans.get(base)
        if cached is not None:
            return cached
        slot = {e: 1 + i for i, e in enumerate(self.entity_order)}  # where an entity's id is among a row's ids
        ranges: list[list[object]] = []
        for e, bands in self.ranges:
            first, last = self.groups[bands[0]], self.groups[bands[-1]]
            lo_base = self.band_of(bands[0]) * BAND
            if len(bands) == 2:  # down to the odd band's window start: score base + BAND - 1 - (now - buckets)
                hi: list[object] = [self.band_of(bands[1]) * BAND + BAND - 1, last.bucket_s, -1, last.buckets]
            else:  # up to the even band's window end: score base + now - 1
                hi = [lo_base, last.bucket_s, 1, -1]
            size = 8 * (1 + self.entity_width(e))
            ranges.append([slot[e], bucket_head(base, e), lo_base, first.bucket_s, first.buckets, *hi, size])
        scalars: list[list[object]] = []
        for _, a in self.aggregates:
            if a.op == "since_last":
                scalars.append([True, slot[a.entity], last_seen_head(base, a.entity)])
            elif a.op == "distinct":
                gi = self.covering_group(a) - 1
                covered = next(1 + i for i, (_, bands) in enumerate(self.ranges) if gi in bands) if gi >= 0 else 0
                d = self.distinct_of(a)
                (head, middle), (block_head, block_middle) = d.bucket_parts(base), d.block_parts(base)
                n = a.window_s // a.bucket_s
                scalars.append(
                    [False, slot[a.entity], head, middle, a.bucket_s, n, covered, block_head, block_middle, d.rollup]
                )
        text = json.dumps([ranges, scalars, len(self.entity_order)], separators=(",", ":")).encode()
        self._read_plans[base] = text
        return text

    # -- what the decoder reads ---------------------------------------------------------------------

    @cached_property
    def reply(self) -> ReplyLayout:
        """The layout of read.lua's reply for this plan."""
        windowed, scalars = [], []
        for fi, a in self.aggregates:
            if a.op in ("since_last", "distinct"):
                scalars.append(ScriptValue(fi, a.default))
                continue
            g = self.group_of(a)
            first = g.buckets - a.window_s // a.bucket_s
            windowed.append(Windowed(fi, a.op, a.default, self.groups.index(g), first, self.column_of(a)))
        read = {w.group for w in windowed}  # groups only telling distinct counts need no decoding
        ranges = [
            RangeRead(self.entity_width(e), [(gi, self.band_of(gi)) for gi in bands if gi in read])
            for e, bands in self.ranges
        ]
        return ReplyLayout(list(self.groups), windowed, scalars, ranges)
