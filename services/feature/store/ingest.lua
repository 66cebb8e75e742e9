-- Apply a request's events to a feature set's online aggregates (key layout: layout.py): all of them or none.
--
-- ARGV[1]: the plan (AggregatePlan.ingest_plan, JSON):
--   entities   entity kinds in the order an event lists its ids
--   band       BAND, the score range of one bucket group
--   groups     bucket groups {e: entity, head: sorted set key before the id, b: bucket s, n: buckets of the
--              longest window, band: first score of its band, down: odd band (newest first), fmt / size / pad:
--              the record's struct format, byte length and padding doubles, sums / maxes: fields summed and
--              maxed, caps: the most |sum| a bucket may hold of each summed field (AggregatePlan.sum_cap),
--              ttl: the sorted set's TTL, prune_len: members the band holds before it is pruned}
--   distinct   HyperLogLog families {e: entity, f: field, b: bucket s, head / mid: bucket key around the id,
--              r: buckets a block (1: no blocks), bhead / bmid: block key around the id, ttl}
--   last       since_last sets {e: entity, head: key before the id}; last_ttl, last_keep: their TTL and length
-- ARGV[2]: the events, JSON [[t, id of each plan entity, {field: value as text}], ...]. Values are parsed by
--   Lua's tonumber (exact for the client's repr text).
-- Returns the number of events applied. When an event would bring a bucket's sum past its cap it returns
-- {that event's index (0-based), the field, the sum it would make, the cap} and writes nothing: every event is
-- checked before the first write (a script is not rolled back when it stops half way).

local plan = cjson.decode(ARGV[1])
local events = cjson.decode(ARGV[2])
local BAND = plan.band
local nent = #plan.entities

-- A bucket record as struct.pack(g.fmt, count, sums..., maxes..., padding zeros); an absent bucket reads as this.
local function empty_record(g)
  local rec = {0}
  for _ = 1, #g.sums do rec[#rec + 1] = 0 end
  for _ = 1, #g.maxes do rec[#rec + 1] = -math.huge end
  for _ = 1, g.pad do rec[#rec + 1] = 0 end
  return rec
end

-- The bucket of time t in group g: its number and its score (newest first in odd bands), as text.
local function bucket_of(g, t)
  local k = math.floor(t / g.b)
  local at = g.band + k
  if g.down then at = g.band + BAND - 1 - k end
  return k, at, string.format('%d', at)
end

-- The record stored for a bucket (an empty one when there is none), and the members found at its score.
local function stored(g, key, score)
  local old = redis.call('ZRANGEBYSCORE', key, score, score)
  if #old == 1 and #old[1] == g.size + 8 then
    local rec = {struct.unpack(g.fmt, old[1], 9)}
    rec[#rec] = nil  -- struct.unpack also returns the next position
    return rec, old
  end
  return empty_record(g), old
end

-- An event's ids by entity kind.
local function ids_of(ev)
  local ids = {}
  for i, e in ipairs(plan.entities) do ids[e] = ev[i + 1] end
  return ids
end

-- Check: the sums each bucket would hold, event after event, against their caps (reads only).
local sums = {}  -- key -> score -> the bucket's sums so far
for r = 1, #events do
  local ev = events[r]
  local ids, vals = ids_of(ev), ev[nent + 2]
  for _, g in ipairs(plan.groups) do
    if #g.sums > 0 then
      local _, _, score = bucket_of(g, ev[1])
      local key = g.head .. ids[g.e]
      local byscore = sums[key]
      if byscore == nil then byscore = {}; sums[key] = byscore end
      local cur = byscore[score]
      if cur == nil then
        local rec = stored(g, key, score)
        cur = {}
        for i = 1, #g.sums do cur[i] = rec[1 + i] end
        byscore[score] = cur
      end
      for i, f in ipairs(g.sums) do
        local s = cur[i] + tonumber(vals[f])
        if not (math.abs(s) <= g.caps[i]) then  -- (NaN too)
          return {r - 1, f, string.format('%.17g', s), string.format('%.17g', g.caps[i])}
        end
        cur[i] = s
      end
    end
  end
end

-- Apply.
for r = 1, #events do
  local ev = events[r]
  local t = ev[1]
  local ids, vals = ids_of(ev), ev[nent + 2]
  for _, g in ipairs(plan.groups) do
    local k, at, score = bucket_of(g, t)
    local key = g.head .. ids[g.e]
    local rec, old = stored(g, key, score)
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
    local k = math.floor(t / d.b)
    local key = d.head .. ids[d.e] .. d.mid .. k
    redis.call('PFADD', key, vals[d.f])
    redis.call('EXPIRE', key, d.ttl)
    if d.r > 1 then  -- the block of d.r buckets holding it (the block key lives until its last bucket's expiry)
      key = d.bhead .. ids[d.e] .. d.bmid .. math.floor(k / d.r)
      redis.call('PFADD', key, vals[d.f])
      redis.call('EXPIRE', key, d.ttl)
    end
  end
  for _, l in ipairs(plan.last) do
    local key = l.head .. ids[l.e]
    redis.call('ZADD', key, t, string.format('%d', t))
    redis.call('ZREMRANGEBYRANK', key, 0, -(plan.last_keep + 1))
    redis.call('EXPIRE', key, plan.last_ttl)
  end
end
return #events
