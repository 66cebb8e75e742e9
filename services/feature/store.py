"""The online store: per-entity aggregates in Redis as time-bucketed structures with TTLs.

Layout (under `<prefix><feature set id>:`), for entity kind E with id I and bucket length B seconds:

- `a:E:I:B`  a hash with one field per bucket k = floor(t / B), named `k`: a packed little-endian record of
  doubles (event count, the sum of each summed field, the max of each maxed field), pruned of buckets
  past retention as events arrive.
- `h:E:I:F:B:k`  a HyperLogLog of the values of F seen in bucket k; read with one PFCOUNT over the
  window's bucket keys (merged at read).
- `l:E:I`  a sorted set of the most recent event times (score = member = unix seconds), for as-of
  "seconds since last event".

Ingest writes a whole batch in one MULTI/EXEC transaction of ingest-script calls. A read (Compute)
runs a read script per chunk of rows, all in one pipeline executed once: one round trip, whatever the
batch size. The script returns, per row, the window's bucket records of each bucket group as one binary
string (counts, sums and maxima are then windowed in numpy on the client) and the distinct counts and
since-last values as text. Keeping one field per bucket (not one per bucket and column) and doing the
arithmetic in numpy is what keeps the server-side read cheap (see bench/feature_service.py).
A window of W = n * B seconds as of time t is the n whole buckets before the bucket holding t, so
later events (and the row's own) never leak into its features; since_last counts events strictly
before t. Ids are put in keys as they are (an id containing ':' could alias another entity's keys).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, RedisError

from services.feature.spec import Aggregate, FeatureSetSpec

FAILURES = (RedisError, OSError, TimeoutError)
LAST_SEEN_KEEP = 256  # event times kept per entity for since_last (older as-of reads fall back to the default)
MIN_LAST_SEEN_TTL_S = 7 * 86400
READ_CHUNK_ROWS = 128  # rows per read-script call: bounds how long one call holds Redis
INGEST_CHUNK_EVENTS = 128  # events per ingest-script call

# A bucket record as struct.pack(g.fmt, count, sums..., maxes...); an absent bucket reads as `empty`.
_RECORD = """
local function empty_record(g)
  local rec = {0}
  for _ = 1, #g.sums do rec[#rec + 1] = 0 end
  for _ = 1, #g.maxes do rec[#rec + 1] = -math.huge end
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
local prefix = plan.prefix
local nent = #plan.entities
for r = 1, #events do
  local ev = events[r]
  local t = ev[1]
  local ids = {}
  for i, e in ipairs(plan.entities) do ids[e] = ev[i + 1] end
  local vals = ev[nent + 2]
  for _, g in ipairs(plan.groups) do
    local k = string.format('%d', math.floor(t / g.b))
    local key = prefix .. 'a:' .. g.e .. ':' .. ids[g.e] .. ':' .. g.b
    local old = redis.call('HGET', key, k)
    local rec
    if old and #old == g.size then
      rec = {struct.unpack(g.fmt, old)}
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
    redis.call('HSET', key, k, struct.pack(g.fmt, unpack(rec)))
    if redis.call('HLEN', key) > g.prune_len then
      local keep = tonumber(k) - g.n - 1
      for _, f in ipairs(redis.call('HKEYS', key)) do
        if tonumber(string.match(f, '^(-?%d+)')) < keep then redis.call('HDEL', key, f) end
      end
    end
    redis.call('EXPIRE', key, g.ttl)
  end
  for _, d in ipairs(plan.distinct) do
    local key = prefix .. 'h:' .. d.e .. ':' .. ids[d.e] .. ':' .. d.f .. ':' .. d.b .. ':' .. math.floor(t / d.b)
    redis.call('PFADD', key, vals[d.f])
    redis.call('EXPIRE', key, d.ttl)
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

# ARGV[1]: the plan (AggregatePlan.script_plan), ARGV[2]: rows as JSON [[t, id of each plan entity], ...].
# Returns per row: for each bucket group, its window's n bucket records concatenated (oldest first, absent
# buckets as the empty record); then for each distinct / since_last aggregate (plan order) its value, an
# integer (-1 where it takes its default). The windowed count / sum / mean / max are computed by the client
# (numpy). Lua's number-to-string conversions and string building dominate the script's own time, so key
# parts are built once per call and bucket suffixes once per bucket; a distinct count is merged once per
# entity and window in a call (rows of a batch often share a popular merchant), and only over the buckets
# that hold events where a bucket group of the same entity and bucket length covers its window (an event
# writes its bucket record and its HyperLogLogs together; a bucket pruned from the hash, past retention,
# no longer counts as distinct either). One HMGET per bucket group, entity and as-of bucket in a call: rows of
# a batch that share them (a popular merchant) share the read (the unit tests count them).
_READ = (
    _RECORD
    + """
local plan = cjson.decode(ARGV[1])
local rows = cjson.decode(ARGV[2])
local prefix = plan.prefix
local out = {}
local digits = {}  -- bucket number -> its decimal text
local function text(k)
  local s = digits[k]
  if s == nil then s = string.format('%d', k); digits[k] = s end
  return s
end
local windows = {}  -- [n][first] -> the n bucket numbers from first, as text (field names and key suffixes)
local function window(first, n)
  local byn = windows[n]
  if byn == nil then byn = {}; windows[n] = byn end
  local w = byn[first]
  if w == nil then
    w = {}
    for k = first, first + n - 1 do w[#w + 1] = text(k) end
    byn[first] = w
  end
  return w
end
local groups = {}
for gi, g in ipairs(plan.groups) do
  groups[gi] = {e = g.e, b = g.b, n = g.n, size = g.size, pre = prefix .. 'a:' .. g.e .. ':',
                suf = ':' .. text(g.b), empty = struct.pack(g.fmt, unpack(empty_record(g))), track = false}
end
local others = {}
for _, a in ipairs(plan.aggs) do
  if a.op == 'since_last' then
    others[#others + 1] = {last = true, e = a.e, pre = prefix .. 'l:' .. a.e .. ':'}
  elseif a.op == 'distinct' then
    local d = {e = a.e, b = a.b, n = a.n, pre = prefix .. 'h:' .. a.e .. ':',
               mid = ':' .. a.f .. ':' .. text(a.b) .. ':', seen = {}}
    for gi, g in ipairs(groups) do  -- a bucket group covering the same buckets tells which hold events
      if d.gi == nil and g.e == a.e and g.b == a.b and g.n >= a.n then
        d.gi, d.off, g.track = gi, g.n - a.n, true
      end
    end
    others[#others + 1] = d
  end
end
local entities = plan.entities
local memo = {}  -- rows of a batch that share an entity and an as-of bucket share its HMGET
for r = 1, #rows do
  local row = rows[r]
  local t = row[1]
  local ids = {}
  for i = 1, #entities do ids[entities[i]] = row[i + 1] end
  local present = {}
  for gi = 1, #groups do
    local g = groups[gi]
    local key = g.pre .. ids[g.e] .. g.suf
    local first = math.floor(t / g.b) - g.n
    local memo_key = key .. '#' .. text(first)
    local hit = memo[memo_key]
    if hit == nil then
      local got = redis.call('HMGET', key, unpack(window(first, g.n)))
      local e, size = g.empty, g.size
      local p = {}
      for i = 1, g.n do
        local v = got[i]
        if not v or #v ~= size then got[i] = e; p[i] = false else p[i] = true end
      end
      hit = {table.concat(got), p}
      memo[memo_key] = hit
    end
    if g.track then present[gi] = hit[2] end
    out[#out + 1] = hit[1]
  end
  local before = nil
  for oi = 1, #others do
    local a = others[oi]
    local v = -1
    if a.last then
      before = before or ('(' .. text(t))
      local got = redis.call('ZREVRANGEBYSCORE', a.pre .. ids[a.e], before, '-inf', 'LIMIT', 0, 1)
      if #got > 0 then v = t - tonumber(got[1]) end  -- member = score = the event time
    else
      local base = a.pre .. ids[a.e] .. a.mid
      local first = math.floor(t / a.b) - a.n
      local seen = a.seen[base]
      if seen == nil then seen = {}; a.seen[base] = seen end
      v = seen[first]
      if v == nil then
        local suffixes = window(first, a.n)
        local keys = {}
        if a.gi then  -- only the buckets that hold events have a HyperLogLog
          local p, off = present[a.gi], a.off
          for i = 1, a.n do
            if p[off + i] then keys[#keys + 1] = base .. suffixes[i] end
          end
        else
          for i = 1, a.n do keys[i] = base .. suffixes[i] end
        end
        if #keys == 0 then v = 0 else v = redis.call('PFCOUNT', unpack(keys)) end
        seen[first] = v
      end
    end
    out[#out + 1] = v
  end
end
return out
"""
)


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
            if a.op == "distinct":
                key = (a.entity, a.field or "", a.bucket_s)
                distinct[key] = max(distinct.get(key, 0), n)
                continue
            buckets, sums, maxes = groups.get((a.entity, a.bucket_s), (0, set(), set()))
            if a.op in ("sum", "mean"):
                sums.add(a.field or "")
            if a.op == "max":
                maxes.add(a.field or "")
            groups[(a.entity, a.bucket_s)] = (max(buckets, n), sums, maxes)
        plan.groups = [BucketGroup(e, b, n, tuple(sorted(s)), tuple(sorted(m)))
                       for (e, b), (n, s, m) in groups.items()]  # fmt: skip
        plan.distinct = [DistinctGroup(e, f, b, n) for (e, f, b), n in distinct.items()]
        windows = [a.window_s for _, a in aggs]
        plan.last_seen_ttl_s = max([MIN_LAST_SEEN_TTL_S, *windows])
        return plan

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

    def script_plan(self, key_prefix: str) -> str:
        """The plan as the read and ingest scripts take it (JSON; group indexes 1-based as in Lua)."""
        cached = self._script_plans.get(key_prefix)
        if cached is not None:
            return cached
        groups = [{"e": g.entity, "b": g.bucket_s, "n": g.buckets, "fmt": "<" + "d" * g.width, "size": 8 * g.width,
                   "sums": list(g.sum_fields), "maxes": list(g.max_fields), "ttl": (g.buckets + 2) * g.bucket_s,
                   "prune_len": 4 * (g.buckets + 2)}
                  for g in self.groups]  # fmt: skip
        distinct = [{"e": d.entity, "f": d.field, "b": d.bucket_s, "ttl": (d.buckets + 2) * d.bucket_s}
                    for d in self.distinct]  # fmt: skip
        aggs = []
        for _, a in self.aggregates:
            item: dict[str, object] = {"op": a.op, "e": a.entity}
            if a.op == "distinct":
                item |= {"f": a.field, "b": a.bucket_s, "n": a.window_s // a.bucket_s}
            aggs.append(item)
        text = json.dumps({"prefix": key_prefix, "entities": self.entity_order, "groups": groups, "aggs": aggs,
                           "distinct": distinct, "last": self.last_seen, "last_ttl": self.last_seen_ttl_s,
                           "last_keep": LAST_SEEN_KEEP})  # fmt: skip
        self._script_plans[key_prefix] = text
        return text


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
        cached = plan._windowing = _Windowing(list(plan.groups), bucketed, others)
    return cached


def _windowed(plan: AggregatePlan, raw: list[bytes | int], rows: int) -> AggregateResult:
    """Every aggregate of every row from the read script's replies: bucket records windowed in numpy."""
    w = _windowing(plan)
    ngroups = len(w.groups)
    reply = np.array(raw, dtype=object).reshape(rows, ngroups + len(w.others))
    values: dict[int, np.ndarray] = {}
    defaulted = np.zeros(rows, dtype=bool)
    records = [
        np.frombuffer(b"".join(reply[:, gi].tolist()), dtype="<f8").reshape(rows, g.buckets, g.width)
        for gi, g in enumerate(w.groups)
    ]
    for fi, op, default, gi, first, col in w.bucketed:
        window = records[gi][:, first:, :]
        column = window[:, :, col]
        if op == "count" or op == "sum":
            values[fi] = column.sum(axis=1)
            continue
        if op == "max":
            best = column.max(axis=1)
            empty = best == -np.inf
            values[fi] = np.where(empty, default, best)
        else:  # mean
            count = window[:, :, 0].sum(axis=1)
            empty = count == 0
            values[fi] = np.where(empty, default, column.sum(axis=1) / np.where(empty, 1.0, count))
        defaulted |= empty
    if w.others:
        numbers = reply[:, ngroups:].astype(np.float64)
        empty = numbers < 0
        for j, (fi, default) in enumerate(w.others):
            values[fi] = np.where(empty[:, j], default, numbers[:, j])
        defaulted |= empty.any(axis=1)
    return AggregateResult(values, defaulted)


class OnlineStore:
    """Reads and writes the aggregates of feature sets in one Redis (or Valkey)."""

    def __init__(self, url: str, prefix: str, max_connections: int = 64) -> None:
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
        self.read_script = self.client.register_script(_READ)
        self.round_trips = 0  # requests sent by `read` (one per Compute that has aggregates)

    def _base(self, plan: AggregatePlan, entity: str, eid: str) -> str:
        return f"{self.prefix}{plan.set_id}:{{}}:{entity}:{eid}"

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

        A read script walks the rows inside Redis (one HMGET of the window's buckets per bucket group,
        PFCOUNT over the window's HyperLogLogs, ZREVRANGEBYSCORE for the last event before t) and returns
        per row one binary string of bucket records per group (windowed here with numpy) and one integer
        per distinct / since_last aggregate. One script call per READ_CHUNK_ROWS rows, all in one
        pipeline and one execute.
        Raises FAILURES (or TimeoutError past the budget): the caller degrades.
        """
        ts = columns[ts_field].astype(np.int64)
        rows = len(ts)
        id_columns = [[str(v) for v in columns[plan.entities[e]].tolist()] for e in plan.entity_order]
        table = [[int(t), *ids] for t, *ids in zip(ts.tolist(), *id_columns, strict=True)]
        chunks = [json.dumps(table[i : i + READ_CHUNK_ROWS]) for i in range(0, rows, READ_CHUNK_ROWS)]
        script_plan = plan.script_plan(f"{self.prefix}{plan.set_id}:")
        async with asyncio.timeout(budget_s):
            try:
                replies = await self._run_read(script_plan, chunks, self.read_script.sha)
            except NoScriptError:  # a restarted or different server: send the script itself (rarely)
                replies = await self._run_read(script_plan, chunks, None)
        return _windowed(plan, [v for reply in replies for v in reply], rows)

    async def _run_read(self, script_plan: str, chunks: list[str], sha: str | None) -> list[list[bytes]]:
        """One pipeline, one execute: a read script call per chunk of rows (so Redis serves others in between)."""
        pipe = self.client.pipeline(transaction=False)
        for chunk in chunks:
            if sha is None:
                pipe.eval(_READ, 0, script_plan, chunk)
            else:
                pipe.evalsha(sha, 0, script_plan, chunk)
        self.round_trips += 1
        return await pipe.execute()

    async def prepare(self) -> bool:
        """Load the scripts (so the first Compute is one round trip too); False when the store does not answer."""
        try:
            async with asyncio.timeout(2.0):
                for script in (self.read_script, self.ingest_script):
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
