"""The online store: per-entity aggregates in Redis as time-bucketed structures with TTLs.

Layout (under `<prefix><feature set id>:`), for entity kind E with id I:

- `b:E:I`  one sorted set of every bucket group of E (its aggregates sharing a bucket length B): a member per
  bucket k = floor(t / B) that holds events, scored in the group's own score range (its band: its place among
  E's groups): band * BAND + k for even bands, band * BAND + BAND - 1 - k (newest first) for odd ones. So
  the windows of two neighbouring bands (even then odd) are one contiguous score range holding nothing else
  older: one ZRANGEBYSCORE reads both. A member is the packed little-endian doubles of its score, then the
  event count, the sum of each summed field, the max of each maxed field, zero-padded to E's widest record
  (all of E's members are one size). Each band is pruned of buckets past its retention as events arrive, and
  the key lives as long as E's longest-lived group. A distinct aggregate has a group too (its entity and
  bucket length), which tells whether its window holds any event (else the count is 0 without a PFCOUNT).
- `h:E:I:F:B:k`  a HyperLogLog of the values of F seen in bucket k.
- `H:E:I:F:B:R:j`  (windows of ROLLUP_MIN_BUCKETS buckets or more) a HyperLogLog of the values of F seen in
  the R buckets jR .. jR + R - 1 (R = ceil(sqrt(buckets)); e.g. 5 for 24 h of 1 h buckets): ingest adds each
  value to its bucket's and its block's HyperLogLog (same TTL). A distinct count is one PFCOUNT over the
  keys of the whole blocks inside the window plus the buckets left over at its ends (24 h of 1 h buckets:
  at most 8 keys, not 24); a union of HyperLogLogs is their register-wise maximum, so this equals PFCOUNT
  over every bucket's key. R is part of the key: a feature set whose longest window changes R starts
  its blocks afresh (a new version of the set, as for any change of values).
- `l:E:I`  a sorted set of the most recent event times (score = member = unix seconds), for as-of
  "seconds since last event".

Ingest writes a whole batch in one MULTI/EXEC transaction of ingest-script calls. A read (Compute)
runs the feature set's read script (its static read plan written into the source) once per chunk of rows,
in one round trip whatever the batch size. Per row and pair of bands the script fetches, with one
ZRANGEBYSCORE, the members of both windows (only buckets that hold events: no field names to send, no absent
buckets to fill; with them only buckets after the windows, which a read as of now has none of) and returns
them as one binary string per pair; the client sums each window's members into their rows in numpy (counts,
sums, means, maxima). Distinct counts and since-last values come back as integers.
A window of W = n * B seconds as of time t is the n whole buckets before the bucket holding t, so
later events (and the row's own) never leak into its features; since_last counts events strictly
before t. Ids are put in keys as they are (an id containing ':' could alias another entity's keys).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from services.feature.spec import Aggregate, FeatureSetSpec

FAILURES = (RedisError, OSError, TimeoutError)
LAST_SEEN_KEEP = 256  # event times kept per entity for since_last (older as-of reads fall back to the default)
MIN_LAST_SEEN_TTL_S = 7 * 86400
READ_CHUNK_ROWS = 128  # rows per read-script call: bounds how long one call holds Redis
INGEST_CHUNK_EVENTS = 128  # events per ingest-script call
ROLLUP_MIN_BUCKETS = 12  # distinct counts over this many buckets or more also keep block HyperLogLogs
BAND = 2**38  # score range of one bucket group in its entity's sorted set (> any bucket number: times < 2**37)
MAX_BANDS = 256  # bucket groups an entity may have (scores stay integers Lua prints exactly)

# A bucket record as struct.pack(g.fmt, count, sums..., maxes..., padding zeros); an absent bucket reads as `empty`.
_RECORD = """
local function empty_record(g)
  local rec = {0}
  for _ = 1, #g.sums do rec[#rec + 1] = 0 end
  for _ = 1, #g.maxes do rec[#rec + 1] = -math.huge end
  for _ = 1, g.pad do rec[#rec + 1] = 0 end
  return rec
end
"""

# ARGV[1]: the plan (AggregatePlan.script_plan), ARGV[2]: events as JSON [[t, id of each plan entity,
# {field: value as text}], ...]. Values are parsed by Lua's tonumber (exact for the client's repr text).
_INGEST = (
    _RECORD
    + """
local plan = cjson.decode(ARGV[1])
local events = cjson.decode(ARGV[2])
local BAND = plan.band
local prefix = plan.prefix
local nent = #plan.entities
for r = 1, #events do
  local ev = events[r]
  local t = ev[1]
  local ids = {}
  for i, e in ipairs(plan.entities) do ids[e] = ev[i + 1] end
  local vals = ev[nent + 2]
  for _, g in ipairs(plan.groups) do
    local k = math.floor(t / g.b)
    local key = prefix .. 'b:' .. g.e .. ':' .. ids[g.e]
    local at = g.band + k  -- the bucket's score: newest first in odd bands
    if g.down then at = g.band + BAND - 1 - k end
    local score = string.format('%d', at)
    local old = redis.call('ZRANGEBYSCORE', key, score, score)
    local rec
    if #old == 1 and #old[1] == g.size + 8 then
      rec = {struct.unpack(g.fmt, old[1], 9)}
      rec[#rec] = nil  -- struct.unpack also returns the next position
    else
      rec = empty_record(g)
    end
    rec[1] = rec[1] + 1
    local ns = #g.sums
    for i, f in ipairs(g.sums) do rec[1 + i] = rec[1 + i] + tonumber(vals[f]) end
    for i, f in ipairs(g.maxes) do
      local x = tonumber(vals[f])
      if x > rec[1 + ns + i] then rec[1 + ns + i] = x end
    end
    if #old > 0 then redis.call('ZREMRANGEBYSCORE', key, score, score) end
    redis.call('ZADD', key, score, struct.pack('<d', at) .. struct.pack(g.fmt, unpack(rec)))
    local band_lo, band_hi = string.format('%d', g.band), string.format('%d', g.band + BAND - 1)
    if redis.call('ZCOUNT', key, band_lo, band_hi) > g.prune_len then  -- drop buckets before k - n - 1
      if g.down then
        redis.call('ZREMRANGEBYSCORE', key, string.format('(%d', g.band + BAND - 1 - (k - g.n - 1)), band_hi)
      else
        redis.call('ZREMRANGEBYSCORE', key, band_lo, string.format('(%d', g.band + k - g.n - 1))
      end
    end
    redis.call('EXPIRE', key, g.ttl)
  end
  for _, d in ipairs(plan.distinct) do
    local key = prefix .. 'h:' .. d.e .. ':' .. ids[d.e] .. ':' .. d.f .. ':' .. d.b .. ':' .. math.floor(t / d.b)
    redis.call('PFADD', key, vals[d.f])
    redis.call('EXPIRE', key, d.ttl)
    if d.r > 1 then  -- the block of d.r buckets holding it (the block key lives until its last bucket's expiry)
      key = prefix .. 'H:' .. d.e .. ':' .. ids[d.e] .. ':' .. d.f .. ':' .. d.b .. ':' .. d.r .. ':'
        .. math.floor(math.floor(t / d.b) / d.r)
      redis.call('PFADD', key, vals[d.f])
      redis.call('EXPIRE', key, d.rttl)
    end
  end
  for _, e in ipairs(plan.last) do
    local key = prefix .. 'l:' .. e .. ':' .. ids[e]
    redis.call('ZADD', key, t, string.format('%d', t))
    redis.call('ZREMRANGEBYRANK', key, 0, -(plan.last_keep + 1))
    redis.call('EXPIRE', key, plan.last_ttl)
  end
end
return #events
"""
)

# The read script of a feature set is this template with its static read plan filled in (read_script_source):
# no plan to decode per call. ARGV (_chunk_args; three arguments whatever the rows, so little to encode and
# parse): the rows' times as decimal text joined by ','; the byte lengths of their ids, row after row in the
# plan's (sorted) entity order, likewise; those ids concatenated.
# Returns {members, counts, values}: members[p] is one binary string of the members read for pair of bands p
# (score and record), row after row; counts lists, row after row and pair after pair, how many members each
# row has;
# values lists, row after row, each distinct / since_last aggregate's value (plan order), an integer (-1 where
# it takes its default). The windowed count / sum / mean / max are computed by the client (numpy). One
# ZRANGEBYSCORE per pair of bands and row, from the first band's window start to the second's: rows of a call
# that share an entity and as-of buckets share it (a popular merchant; the unit tests count them). A
# distinct count is merged once per entity and window in a call, over the window's block and left-over bucket
# HyperLogLogs, and not at all when the entity has no bucket in the range read (an event writes its bucket
# records and its HyperLogLogs together). Each redis.call costs Lua a few microseconds, and each member
# returned a fraction of one: one range per pair of bands, holding just their windows, reads fraud_v1 in 5
# ranges a row instead of 9 (one a bucket group); a range per entity (3) returned whole middle bands
# (retained buckets older than their windows) and saved nothing.
_READ_TEMPLATE = """
-- E: pairs of bands (or a last band alone) {id slot in a row, key head, first band's base score, its bucket s,
--    its buckets, last score base, last band's bucket s, its sign, offset, member bytes}: a row as of t reads
--    base + floor(t / bucket s) - buckets .. last score base + sign * floor(t / last bucket s) + offset
local E = {$entities}
-- A: distinct / since_last in reply order. since_last: {true, id slot, key head};
-- distinct: {false, id slot, key head, key middle, bucket s, buckets, the range in E covering its window or 0,
--            block key head, block key middle, buckets a block (1: no blocks)}
local A = {$aggs}
local NENT = $nent
local floor, unpack, call, concat, format = math.floor, unpack, redis.call, table.concat, string.format
local digits = {}  -- bucket number -> its decimal text
local function text(k)
  local s = digits[k]
  if s == nil then s = format('%d', k); digits[k] = s end
  return s
end
local function records(e, key, lo, hi)  -- {members, how many}
  local size = e[10]
  local got = call('ZRANGEBYSCORE', key, format('%d', lo), format('%d', hi))
  local all = concat(got)
  if #all == #got * size then return {all, #got, hi} end
  local ok = {}
  for i = 1, #got do if #got[i] == size then ok[#ok + 1] = got[i] end end
  return {concat(ok), #ok, hi}
end
local memo = {}  -- [entity][id][lo] -> records: rows sharing an entity and as-of buckets share the read
for ei = 1, #E do memo[ei] = {} end
local seen = {}  -- [agg][id][first] -> distinct count
for ai = 1, #A do seen[ai] = {} end
local recs, counts, vals = {}, {}, {}
for ei = 1, #E do recs[ei] = {} end
local ncounts, nvals = 0, 0
local times, ids = {}, {}
for x in string.gmatch(ARGV[1], '%d+') do times[#times + 1] = x end
local blob, pos = ARGV[3], 1
for x in string.gmatch(ARGV[2], '%d+') do
  local next_pos = pos + tonumber(x)
  ids[#ids + 1] = string.sub(blob, pos, next_pos - 1)
  pos = next_pos
end
for r = 1, #times do
  local ttext = times[r]
  local t = tonumber(ttext)
  local base = (r - 1) * NENT
  local present = {}
  for ei = 1, #E do
    local e = E[ei]
    local id = ids[base + e[1]]
    local lo = e[3] + floor(t / e[4]) - e[5]
    local hi = e[6] + e[8] * floor(t / e[7]) + e[9]
    local byid = memo[ei][id]
    if byid == nil then byid = {}; memo[ei][id] = byid end
    local hit = byid[lo]
    if hit == nil or hit[3] ~= hi then hit = records(e, e[2] .. id, lo, hi); byid[lo] = hit end
    present[ei] = hit[2]
    local out = recs[ei]
    out[#out + 1] = hit[1]
    ncounts = ncounts + 1
    counts[ncounts] = hit[2]
  end
  for ai = 1, #A do
    local a = A[ai]
    local v = -1
    if a[1] then
      local got = call('ZREVRANGEBYSCORE', a[3] .. ids[base + a[2]], '(' .. ttext, '-inf', 'LIMIT', 0, 1)
      if #got > 0 then v = t - tonumber(got[1]) end  -- member = score = the event time
    else
      local id = ids[base + a[2]]
      local first = floor(t / a[5]) - a[6]
      local byid = seen[ai][id]
      if byid == nil then byid = {}; seen[ai][id] = byid end
      v = byid[first]
      if v == nil then
        local keys, nkeys = {}, 0
        if a[7] == 0 or present[a[7]] > 0 then  -- (no events in a range covering it: 0, no PFCOUNT)
          local head, R, last = a[3] .. id .. a[4], a[10], first + a[6] - 1
          local lo, hi = last + 1, last  -- the whole blocks inside the window: lo .. hi (none: R == 1)
          if R > 1 then lo = floor((first + R - 1) / R); hi = floor((last + 1) / R) - 1 end
          if lo > hi then
            for k = first, last do nkeys = nkeys + 1; keys[nkeys] = head .. text(k) end
          else
            for k = first, lo * R - 1 do nkeys = nkeys + 1; keys[nkeys] = head .. text(k) end
            local bhead = a[8] .. id .. a[9]
            for j = lo, hi do nkeys = nkeys + 1; keys[nkeys] = bhead .. text(j) end
            for k = hi * R + R, last do nkeys = nkeys + 1; keys[nkeys] = head .. text(k) end
          end
        end
        if nkeys == 0 then v = 0 else v = call('PFCOUNT', unpack(keys)) end
        byid[first] = v
      end
    end
    nvals = nvals + 1
    vals[nvals] = v
  end
end
for ei = 1, #E do recs[ei] = concat(recs[ei]) end
return {recs, counts, vals}
"""


def _lua_bytes(data: bytes) -> str:
    """A Lua string literal of data (every byte outside a safe set escaped as decimal)."""
    safe = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:_-.{}"
    return "'" + "".join(chr(b) if b in safe else f"\\{b:03d}" for b in data) + "'"


def _lua_text(s: str) -> str:
    """A Lua string literal of s (every byte outside a safe set escaped as decimal)."""
    return _lua_bytes(s.encode())


@dataclass(frozen=True)
class BucketGroup:
    """The aggregates of one entity kind sharing one bucket length: one hash per entity id."""

    entity: str
    bucket_s: int
    buckets: int  # most buckets any of its windows spans
    sum_fields: tuple[str, ...]
    max_fields: tuple[str, ...]

    @property
    def width(self) -> int:
        return 1 + len(self.sum_fields) + len(self.max_fields)


@dataclass(frozen=True)
class DistinctGroup:
    entity: str
    field: str
    bucket_s: int
    buckets: int

    @property
    def rollup(self) -> int:
        """Buckets a block HyperLogLog covers (`H:` keys), or 1 (none): about sqrt(buckets), fewest keys a window."""
        return math.isqrt(self.buckets - 1) + 1 if self.buckets >= ROLLUP_MIN_BUCKETS else 1


def distinct_keys(base: str, d: DistinctGroup, entity_id: str, first: int, n: int) -> list[str]:
    """The keys whose PFCOUNT is the distinct count over buckets first .. first + n - 1 (every bucket's HyperLogLog
    or, where d keeps blocks, those of the whole blocks inside the window and of the buckets left over)."""
    head = f"{base}h:{d.entity}:{entity_id}:{d.field}:{d.bucket_s}:"
    r = d.rollup
    if r == 1:
        return [f"{head}{k}" for k in range(first, first + n)]
    lo, hi = -(-first // r), (first + n) // r - 1  # the whole blocks lo .. hi
    if lo > hi:
        return [f"{head}{k}" for k in range(first, first + n)]
    block = f"{base}H:{d.entity}:{entity_id}:{d.field}:{d.bucket_s}:{r}:"
    return ([f"{head}{k}" for k in range(first, lo * r)] + [f"{block}{j}" for j in range(lo, hi + 1)]
            + [f"{head}{k}" for k in range((hi + 1) * r, first + n)])  # fmt: skip


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
    _script_plans: dict[str, str] = field(default_factory=dict)
    _windowing: _Windowing | None = None

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
            if a.op == "max":
                maxes.add(a.field or "")
            groups[(a.entity, a.bucket_s)] = (max(buckets, n), sums, maxes)
        plan.groups = [BucketGroup(e, b, n, tuple(sorted(s)), tuple(sorted(m)))
                       for (e, b), (n, s, m) in groups.items()]  # fmt: skip
        for e in plan.entity_order:
            if len(plan.entity_groups(e)) > MAX_BANDS:
                raise ValueError(f"entity {e!r} has over {MAX_BANDS} bucket lengths")
        plan.distinct = [DistinctGroup(e, f, b, n) for (e, f, b), n in distinct.items()]
        windows = [a.window_s for _, a in aggs]
        plan.last_seen_ttl_s = max([MIN_LAST_SEEN_TTL_S, *windows])
        return plan

    def distinct_of(self, a: Aggregate) -> DistinctGroup:
        return next(d for d in self.distinct
                    if d.entity == a.entity and d.field == (a.field or "") and d.bucket_s == a.bucket_s)  # fmt: skip

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

    @property
    def entity_order(self) -> list[str]:
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
        band = self.band_of(gi)
        return band * BAND + (BAND - 1 - bucket if band % 2 else bucket)

    def entity_width(self, entity: str) -> int:
        """Doubles in a record of the entity's sorted set: its widest group's (the others are zero-padded)."""
        return max(self.groups[gi].width for gi in self.entity_groups(entity))

    def entity_ttl_s(self, entity: str) -> int:
        """How long the entity's sorted set lives past its last event: as long as its longest-lived group needs."""
        return max((g.buckets + 2) * g.bucket_s for g in self.groups if g.entity == entity)

    def script_plan(self, key_prefix: str) -> str:
        """The plan as the read and ingest scripts take it (JSON; group indexes 1-based as in Lua)."""
        cached = self._script_plans.get(key_prefix)
        if cached is not None:
            return cached
        groups = []
        for gi, g in enumerate(self.groups):
            width = self.entity_width(g.entity)
            groups.append({"e": g.entity, "b": g.bucket_s, "n": g.buckets, "band": self.band_of(gi) * BAND,
                           "down": self.band_of(gi) % 2 == 1,
                           "fmt": "<" + "d" * width, "size": 8 * width, "pad": width - g.width,
                           "sums": list(g.sum_fields), "maxes": list(g.max_fields),
                           "ttl": self.entity_ttl_s(g.entity), "prune_len": 4 * (g.buckets + 2)})  # fmt: skip
        distinct = [{"e": d.entity, "f": d.field, "b": d.bucket_s, "ttl": (d.buckets + 2) * d.bucket_s,
                     "r": d.rollup, "rttl": (d.buckets + 2) * d.bucket_s}
                    for d in self.distinct]  # fmt: skip
        aggs = []
        for _, a in self.aggregates:
            item: dict[str, object] = {"op": a.op, "e": a.entity}
            if a.op == "distinct":
                item |= {"f": a.field, "b": a.bucket_s, "n": a.window_s // a.bucket_s}
            aggs.append(item)
        text = json.dumps({"prefix": key_prefix, "entities": self.entity_order, "groups": groups, "aggs": aggs,
                           "distinct": distinct, "last": self.last_seen, "last_ttl": self.last_seen_ttl_s, "band": BAND,
                           "last_keep": LAST_SEEN_KEEP})  # fmt: skip
        self._script_plans[key_prefix] = text
        return text

    def read_script_source(self, key_prefix: str) -> str:
        """The read script of this feature set: _READ_TEMPLATE with the static read plan written in as Lua."""
        slot = {e: 1 + i for i, e in enumerate(self.entity_order)}  # where an entity's id is among a row's ids
        aggs = []
        for _, a in self.aggregates:
            if a.op == "since_last":
                aggs.append(f"{{true, {slot[a.entity]}, {_lua_text(f'{key_prefix}l:{a.entity}:')}}}")
            elif a.op == "distinct":
                gi = self.covering_group(a) - 1
                covered = next(1 + i for i, (_, bands) in enumerate(self.ranges) if gi in bands) if gi >= 0 else 0
                r = self.distinct_of(a).rollup
                aggs.append(f"{{false, {slot[a.entity]}, {_lua_text(f'{key_prefix}h:{a.entity}:')}, "
                            f"{_lua_text(f':{a.field}:{a.bucket_s}:')}, {a.bucket_s}, {a.window_s // a.bucket_s}, "
                            f"{covered}, {_lua_text(f'{key_prefix}H:{a.entity}:')}, "
                            f"{_lua_text(f':{a.field}:{a.bucket_s}:{r}:')}, {r}}}")  # fmt: skip
        ranges = []
        for e, bands in self.ranges:
            first, last = self.groups[bands[0]], self.groups[bands[-1]]
            if len(bands) == 2:  # down to the odd band's window start: score base + BAND - 1 - (now - buckets)
                hi = f"{self.band_of(bands[1]) * BAND + BAND - 1}, {last.bucket_s}, -1, {last.buckets}"
            else:  # up to the even band's window end: score base + now - 1
                hi = f"{self.band_of(bands[0]) * BAND}, {last.bucket_s}, 1, -1"
            ranges.append(f"{{{slot[e]}, {_lua_text(f'{key_prefix}b:{e}:')}, {self.band_of(bands[0]) * BAND}, "
                          f"{first.bucket_s}, {first.buckets}, {hi}, {8 * (1 + self.entity_width(e))}}}")  # fmt: skip
        return (_READ_TEMPLATE.replace("$entities", ", ".join(ranges)).replace("$aggs", ", ".join(aggs))
                .replace("$nent", str(len(self.entity_order))))  # fmt: skip

    def covering_group(self, a: Aggregate) -> int:
        """The bucket group (1-based) of a distinct aggregate's entity and bucket length spanning its window, or 0.

        An event writes its bucket record and its HyperLogLogs together, so such a group tells whether the
        window holds events at all (when not, the count is 0 without a PFCOUNT).
        """
        n = a.window_s // a.bucket_s
        return next((gi + 1 for gi, g in enumerate(self.groups)
                     if g.entity == a.entity and g.bucket_s == a.bucket_s and g.buckets >= n), 0)  # fmt: skip


@dataclass
class AggregateResult:
    """Per aggregate feature (by feature index): values for every row, and where the default was taken."""

    values: dict[int, np.ndarray]
    defaulted: np.ndarray  # (rows,) bool


@dataclass(frozen=True)
class _Windowing:
    """How the client turns the read script's reply into aggregates (derived once per plan)."""

    groups: list[BucketGroup]
    bucketed: list[tuple[int, str, float, int, int, int]]  # (feature index, op, default, group, first bucket, col)
    others: list[tuple[int, float]]  # distinct / since_last in reply order: (feature index, default)
    ranges: list[tuple[int, list[tuple[int, int]]]]  # per range read: (record width, [(group, band) windowed])


def _windowing(plan: AggregatePlan) -> _Windowing:
    cached = plan._windowing
    if cached is None:
        bucketed, others = [], []
        for fi, a in plan.aggregates:
            if a.op in ("since_last", "distinct"):
                others.append((fi, a.default))
                continue
            g = plan.group_of(a)
            first = g.buckets - a.window_s // a.bucket_s
            bucketed.append((fi, a.op, a.default, plan.groups.index(g), first, plan.column_of(a)))
        read = {gi for _, _, _, gi, _, _ in bucketed}  # groups only telling distinct counts need no table
        ranges = [(plan.entity_width(e), [(gi, plan.band_of(gi)) for gi in bands if gi in read])
                  for e, bands in plan.ranges]  # fmt: skip
        cached = plan._windowing = _Windowing(list(plan.groups), bucketed, others, ranges)
    return cached


def _decoded(w: _Windowing, members: list[bytes], counts: np.ndarray,
             ts: np.ndarray) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:  # fmt: skip
    """Per windowed group: (owner row, bucket index in the row's window span, record) of each member read.

    A member is its score (see score_of) then its record (doubles, zero-padded); row r owns counts[r, p] of range
    p's members, in row order. The bucket index is 0 for the span's oldest bucket, buckets - 1 for the newest
    (the span is the group's longest window); buckets after it (read with it) index past the end.
    """
    rows = len(ts)
    decoded = {}
    for p, (width, groups) in enumerate(w.ranges):
        if not groups:
            continue
        got = np.frombuffer(members[p], dtype="<f8").reshape(-1, 1 + width)
        owner = np.repeat(np.arange(rows), counts[:, p])
        score = got[:, 0].astype(np.int64)
        band = score // BAND
        offset = score - band * BAND
        for gi, b in groups:
            g = w.groups[gi]
            mine = band == b
            number = BAND - 1 - offset[mine] if b % 2 else offset[mine]
            o = owner[mine]
            decoded[gi] = (o, number - (ts // g.bucket_s - g.buckets)[o], got[mine, 1:])
    return decoded


def _windowed(plan: AggregatePlan, ts: np.ndarray, members: list[bytes], counts: np.ndarray,
              numbers: list[int]) -> AggregateResult:  # fmt: skip
    """Every aggregate of every row from the read script's replies: bucket records windowed in numpy.

    A window's members are summed into their rows with bincount (maxima with maximum.at): no per-row loop and
    no (rows, buckets) table to fill.
    """
    w = _windowing(plan)
    rows = len(ts)
    decoded = _decoded(w, members, counts.reshape(rows, len(w.ranges)), ts)
    windows: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # (group, first) -> inside
    values: dict[int, np.ndarray] = {}
    defaulted = np.zeros(rows, dtype=bool)
    for fi, op, default, gi, first, col in w.bucketed:
        window = windows.get((gi, first))
        if window is None:
            owner, at, records = decoded[gi]
            inside = (at >= first) & (at < w.groups[gi].buckets)
            owner, records = owner[inside], records[inside]
            window = windows[(gi, first)] = (owner, records, np.bincount(owner, records[:, 0], minlength=rows))
        owner, records, count = window
        if op == "count":
            values[fi] = count
            continue
        if op == "sum":
            values[fi] = np.bincount(owner, records[:, col], minlength=rows)
            continue
        empty = count == 0
        if op == "max":
            best = np.full(rows, -np.inf)
            np.maximum.at(best, owner, records[:, col])
            values[fi] = np.where(empty, default, best)
        else:  # mean
            total = np.bincount(owner, records[:, col], minlength=rows)
            values[fi] = np.where(empty, default, total / np.where(empty, 1.0, count))
        defaulted |= empty
    if w.others:
        others = np.array(numbers, dtype=np.float64).reshape(rows, len(w.others))
        empty = others < 0
        for j, (fi, default) in enumerate(w.others):
            values[fi] = np.where(empty[:, j], default, others[:, j])
        defaulted |= empty.any(axis=1)
    return AggregateResult(values, defaulted)


def _id_table(plan: AggregatePlan, columns: Mapping[str, np.ndarray], rows: int) -> np.ndarray:
    """(rows, entities) the rows' ids as str, entities in the plan's (sorted) order."""
    table = np.empty((rows, len(plan.entities)), dtype=object)
    for i, e in enumerate(plan.entity_order):
        ids = columns[plan.entities[e]]
        table[:, i] = ids if ids.dtype == object else ids.astype(str)
    return table


def _chunk_args(ts: np.ndarray, ids: np.ndarray) -> list[bytes]:
    """The read script's ARGV for some rows: their times, their ids' byte lengths (both ','-joined) and the ids."""
    encoded = list(map(str.encode, ids.ravel().tolist()))
    return [
        ",".join(map(str, ts.tolist())).encode(),
        ",".join(map(str, map(len, encoded))).encode(),
        b"".join(encoded),
    ]


class OnlineStore:
    """Reads and writes the aggregates of feature sets in one Redis (or Valkey)."""

    def __init__(self, url: str, prefix: str, max_connections: int = 64,
                 plans: Iterable[AggregatePlan] = ()) -> None:  # fmt: skip
        self.prefix = prefix
        pool = aioredis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=1.0,
            socket_connect_timeout=0.5,
            socket_timeout=2.0,
            retry=Retry(NoBackoff(), 0),
        )
        self.client = aioredis.Redis(connection_pool=pool)
        self.ingest_script = self.client.register_script(_INGEST)
        self.read_scripts: dict[str, AsyncScript] = {}  # feature set id -> its read script (static plan inside)
        self.round_trips = 0  # requests sent by `read` (one per Compute that has aggregates)
        for plan in plans:
            self.read_script(plan)

    def read_script(self, plan: AggregatePlan) -> AsyncScript:
        """The read script of a feature set (prepare() loads those of the plans given at construction)."""
        script = self.read_scripts.get(plan.set_id)
        if script is None:
            source = plan.read_script_source(f"{self.prefix}{plan.set_id}:")
            script = self.read_scripts[plan.set_id] = self.client.register_script(source)
        return script

    # -- ingest -----------------------------------------------------------------------------------

    async def ingest(self, plan: AggregatePlan, columns: Mapping[str, np.ndarray], ts_field: str,
                     timeout_s: float) -> int:  # fmt: skip
        """Apply a batch of events (validated columns) atomically: one MULTI/EXEC of ingest-script calls.

        Each script call applies INGEST_CHUNK_EVENTS events (hash fields, HyperLogLogs, last-seen sets,
        pruning and TTLs); all the calls run in one transaction, so a batch is applied whole or not at all.
        """
        rows = len(columns[ts_field])
        if not rows or not plan.aggregates:
            return rows
        ts = columns[ts_field].astype(np.int64).tolist()
        id_columns = [[str(v) for v in columns[plan.entities[e]].tolist()] for e in plan.entity_order]
        numeric = sorted({f for g in plan.groups for f in (*g.sum_fields, *g.max_fields)})
        texts = {f: [repr(float(v)) for v in columns[f].tolist()] for f in numeric}
        for d in plan.distinct:
            texts.setdefault(d.field, [str(v) for v in columns[d.field].tolist()])
        events = [[t, *ids, {f: texts[f][i] for f in texts}]
                  for i, (t, *ids) in enumerate(zip(ts, *id_columns, strict=True))]  # fmt: skip
        chunks = [json.dumps(events[i : i + INGEST_CHUNK_EVENTS]) for i in range(0, rows, INGEST_CHUNK_EVENTS)]
        script_plan = plan.script_plan(f"{self.prefix}{plan.set_id}:")
        async with asyncio.timeout(timeout_s):
            try:
                await self._run_ingest(script_plan, chunks)
            except NoScriptError:  # nothing was applied (every call failed alike): load it and retry once
                self.ingest_script.sha = await self.client.script_load(_INGEST)
                await self._run_ingest(script_plan, chunks)
        return rows

    async def _run_ingest(self, script_plan: str, chunks: list[str]) -> None:
        pipe = self.client.pipeline(transaction=True)
        for chunk in chunks:
            pipe.evalsha(self.ingest_script.sha, 0, script_plan, chunk)
        await pipe.execute()

    # -- read -------------------------------------------------------------------------------------

    async def read(self, plan: AggregatePlan, columns: Mapping[str, np.ndarray], ts_field: str,
                   budget_s: float) -> AggregateResult:  # fmt: skip
        """Every aggregate of every row as of the row's event time, in one pipelined round trip.

        The feature set's read script walks the rows inside Redis (one ZRANGEBYSCORE of bucket records per
        pair of bucket groups, PFCOUNT over the HyperLogLogs of the window's blocks and left-over buckets,
        ZREVRANGEBYSCORE for the last event before t) and returns the bucket records of all its rows as one
        binary string per pair of groups (windowed here with numpy) and one integer per row and distinct / since_last
        aggregate. One script call per READ_CHUNK_ROWS rows, all sent at once (one command, or one pipeline).
        Raises FAILURES (or TimeoutError past the budget): the caller degrades.
        """
        rows = len(columns[ts_field])
        ts = columns[ts_field].astype(np.int64)
        ids = _id_table(plan, columns, rows)
        chunks = [_chunk_args(ts[i : i + READ_CHUNK_ROWS], ids[i : i + READ_CHUNK_ROWS])
                  for i in range(0, rows, READ_CHUNK_ROWS)]  # fmt: skip
        script = self.read_script(plan)
        async with asyncio.timeout(budget_s):
            try:
                replies = await self._run_read(script, chunks, use_sha=True)
            except NoScriptError:  # a restarted or different server: send the script itself (rarely)
                replies = await self._run_read(script, chunks, use_sha=False)
        nranges = len(_windowing(plan).ranges)
        members = [b"".join(reply[0][ri] for reply in replies) for ri in range(nranges)]
        counts = np.fromiter(chain.from_iterable(reply[1] for reply in replies), dtype=np.int64, count=rows * nranges)
        numbers = list(chain.from_iterable(reply[2] for reply in replies))
        return _windowed(plan, ts, members, counts, numbers)

    async def _run_read(self, script: AsyncScript, chunks: list[list[bytes]], use_sha: bool) -> list[list[Any]]:
        """One round trip: a read script call per chunk of rows (so Redis serves others in between)."""
        if len(chunks) == 1:  # the usual case: one plain command (less client work than a pipeline of one)
            self.round_trips += 1
            if use_sha:
                return [await self.client.evalsha(script.sha, 0, *chunks[0])]
            return [await self.client.eval(script.script, 0, *chunks[0])]
        pipe = self.client.pipeline(transaction=False)
        for chunk in chunks:
            if use_sha:
                pipe.evalsha(script.sha, 0, *chunk)
            else:
                pipe.eval(script.script, 0, *chunk)
        self.round_trips += 1
        return await pipe.execute()

    async def prepare(self) -> bool:
        """Load the scripts (so the first Compute is one round trip too); False when the store does not answer."""
        try:
            async with asyncio.timeout(2.0):
                for script in (*self.read_scripts.values(), self.ingest_script):
                    script.sha = await self.client.script_load(script.script)
            return True
        except FAILURES:
            return False

    async def ping(self) -> bool:
        try:
            async with asyncio.timeout(1.0):
                return bool(await self.client.ping())
        except FAILURES:
            return False

    async def close(self) -> None:
        await self.client.aclose()
