"""The online store: per-entity aggregates in Redis as time-bucketed structures with TTLs.

Layout (under `<prefix><feature set id>:`), for entity kind E with id I and bucket length B seconds:

- `a:E:I:B`  a hash with fields per bucket k = floor(t / B): `k:c` (event count), `k:s:F` (sum of field F),
  `k:m:F` (max of F), pruned of buckets past retention as events arrive.
- `h:E:I:F:B:k`  a HyperLogLog of the values of F seen in bucket k; read with one PFCOUNT over the
  window's bucket keys (merged at read).
- `l:E:I`  a sorted set of the most recent event times (score = member = unix seconds), for as-of
  "seconds since last event".

Ingest writes a whole batch in one MULTI/EXEC transaction of ingest-script calls. A read (Compute)
runs a read script per chunk of rows, all in one pipeline executed once: one round trip, whatever the
batch size; the scripts return one value per row and aggregate.
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

# ARGV[1]: the plan (AggregatePlan.script_plan), ARGV[2]: events as JSON [[t, id of each plan entity,
# {field: value as text}], ...]. Sums and maxima keep the client's decimal text (no precision lost in Lua).
_INGEST = """
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
    local k = math.floor(t / g.b)
    local key = prefix .. 'a:' .. g.e .. ':' .. ids[g.e] .. ':' .. g.b
    redis.call('HINCRBY', key, k .. ':c', 1)
    for _, f in ipairs(g.sums) do redis.call('HINCRBYFLOAT', key, k .. ':s:' .. f, vals[f]) end
    for _, f in ipairs(g.maxes) do
      local mk = k .. ':m:' .. f
      local cur = redis.call('HGET', key, mk)
      if (not cur) or tonumber(vals[f]) > tonumber(cur) then redis.call('HSET', key, mk, vals[f]) end
    end
    if redis.call('HLEN', key) > g.prune_len then
      local keep = k - g.n - 1
      for _, f in ipairs(redis.call('HKEYS', key)) do
        if tonumber(string.match(f, '^(-?%d+):')) < keep then redis.call('HDEL', key, f) end
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

# ARGV[1]: the plan (AggregatePlan.script_plan), ARGV[2]: rows as JSON [[t, id of each plan entity], ...].
# Returns one string per row and aggregate ("" where the aggregate takes its default).
_READ = """
local plan = cjson.decode(ARGV[1])
local rows = cjson.decode(ARGV[2])
local prefix = plan.prefix
local out = {}
local field_cache = {}  -- rows of a batch mostly share their buckets: build each field list once
for gi = 1, #plan.groups do field_cache[gi] = {} end
for r = 1, #rows do
  local row = rows[r]
  local t = row[1]
  local ids = {}
  for i, e in ipairs(plan.entities) do ids[e] = row[i + 1] end
  local hashes = {}
  for gi, g in ipairs(plan.groups) do
    local first = math.floor(t / g.b) - g.n
    local fields = field_cache[gi][first]
    if fields == nil then
      fields = {}
      for k = first, first + g.n - 1 do
        for _, name in ipairs(g.names) do fields[#fields + 1] = k .. ':' .. name end
      end
      field_cache[gi][first] = fields
    end
    hashes[gi] = redis.call('HMGET', prefix .. 'a:' .. g.e .. ':' .. ids[g.e] .. ':' .. g.b, unpack(fields))
  end
  for _, a in ipairs(plan.aggs) do
    local v = nil
    if a.op == 'since_last' then
      local key = prefix .. 'l:' .. a.e .. ':' .. ids[a.e]
      local got = redis.call('ZREVRANGEBYSCORE', key, '(' .. t, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if #got > 0 then v = t - tonumber(got[2]) end
    elseif a.op == 'distinct' then
      local now = math.floor(t / a.b)
      local base = prefix .. 'h:' .. a.e .. ':' .. ids[a.e] .. ':' .. a.f .. ':' .. a.b .. ':'
      local keys = {}
      for k = now - a.n, now - 1 do keys[#keys + 1] = base .. k end
      v = redis.call('PFCOUNT', unpack(keys))
    else
      local g = plan.groups[a.g]
      local vals = hashes[a.g]
      local w = #g.names
      local count, total, best = 0, 0, nil
      for k = g.n - a.n, g.n - 1 do
        local c = vals[k * w + 1]
        if c then count = count + tonumber(c) end
        if a.col > 0 then
          local x = vals[k * w + 1 + a.col]
          if x then
            x = tonumber(x)
            if a.op == 'max' then
              if best == nil or x > best then best = x end
            else
              total = total + x
            end
          end
        end
      end
      if a.op == 'count' then v = count
      elseif a.op == 'sum' then v = total
      elseif a.op == 'mean' then if count > 0 then v = total / count end
      else v = best end
    end
    if v == nil then out[#out + 1] = '' else out[#out + 1] = string.format('%.17g', v) end
  end
end
return out
"""


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

    @property
    def entity_order(self) -> list[str]:
        return sorted(self.entities)

    def script_plan(self, key_prefix: str) -> str:
        """The plan as the read and ingest scripts take it (JSON; group indexes 1-based as in Lua)."""
        cached = self._script_plans.get(key_prefix)
        if cached is not None:
            return cached
        groups = [{"e": g.entity, "b": g.bucket_s, "n": g.buckets,
                   "names": ["c", *(f"s:{f}" for f in g.sum_fields), *(f"m:{f}" for f in g.max_fields)],
                   "sums": list(g.sum_fields), "maxes": list(g.max_fields), "ttl": (g.buckets + 2) * g.bucket_s,
                   "prune_len": 4 * (g.buckets + 2) * g.width}
                  for g in self.groups]  # fmt: skip
        distinct = [{"e": d.entity, "f": d.field, "b": d.bucket_s, "ttl": (d.buckets + 2) * d.bucket_s}
                    for d in self.distinct]  # fmt: skip
        aggs = []
        for _, a in self.aggregates:
            item: dict[str, object] = {"op": a.op, "e": a.entity}
            if a.op == "distinct":
                item |= {"f": a.field, "b": a.bucket_s, "n": a.window_s // a.bucket_s}
            elif a.op != "since_last":
                g = self.group_of(a)
                names = groups[self.groups.index(g)]["names"]
                col = 0 if a.op == "count" else names.index(("m:" if a.op == "max" else "s:") + (a.field or ""))
                item |= {"g": self.groups.index(g) + 1, "n": a.window_s // a.bucket_s, "col": col}
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

        A read script walks the rows inside Redis (HMGET per bucket group, PFCOUNT over the window's
        HyperLogLogs, ZREVRANGEBYSCORE for the last event before t) and returns one value per row and
        aggregate, so client-side packing and parsing stay proportional to the answer, not to the
        buckets read. One script call per READ_CHUNK_ROWS rows, all in one pipeline and one execute.
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
        raw = [v for reply in replies for v in reply]
        width = len(plan.aggregates)
        text = np.array(raw, dtype=object).reshape(rows, width) if width else np.empty((rows, 0), dtype=object)
        empty = text == b""
        numbers = np.where(empty, b"0", text).astype(np.float64)
        values: dict[int, np.ndarray] = {}
        for j, (fi, a) in enumerate(plan.aggregates):
            values[fi] = np.where(empty[:, j], a.default, numbers[:, j])
        return AggregateResult(values, empty.any(axis=1))

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
