-- Read every aggregate of a chunk of rows, each as of its own time (key layout: layout.py).
--
-- ARGV[1]: the plan (AggregatePlan.read_plan, JSON [E, A, NENT]):
--   E  the ranges read per row: each entity's bucket groups two bands at a time (or a last band alone),
--      {id slot in a row, key head, first band's base score, its bucket s, its buckets, last score base, last
--      band's bucket s, its sign, offset, member bytes}: a row as of t reads
--      base + floor(t / bucket s) - buckets .. last score base + sign * floor(t / last bucket s) + offset
--   A  distinct / since_last aggregates in reply order. since_last: {true, id slot, key head};
--      distinct: {false, id slot, key head, key middle, bucket s, buckets, the range in E covering its window
--      or 0, block key head, block key middle, buckets a block (1: no blocks)}
--   NENT  ids a row has (one per entity kind, in the plan's sorted order)
-- ARGV[2]: the rows' times as decimal text joined by ','; ARGV[3]: the byte lengths of their ids, row after row
--   in slot order, likewise; ARGV[4]: those ids concatenated.
--
-- Returns {members, counts, values}: members[p] is one binary string of the members read for range p (score and
-- record), row after row; counts lists, row after row and range after range, how many members each row has;
-- values lists, row after row, each A aggregate's value, an integer (-1 where it takes its default). The
-- windowed count / sum / mean / max are computed by the client (numpy).
--
-- Rows of a call that share an entity and as-of buckets share one ZRANGEBYSCORE (a popular merchant). A
-- distinct count is merged once per entity and window in a call, over the window's block and left-over bucket
-- HyperLogLogs, and not at all when the entity has no bucket in the range covering it (an event writes its
-- bucket records and its HyperLogLogs together).

local plan = cjson.decode(ARGV[1])
local E, A, NENT = plan[1], plan[2], plan[3]
local floor, unpack, call, concat, format = math.floor, unpack, redis.call, table.concat, string.format
local digits = {}  -- bucket number -> its decimal text
local function text(k)
  local s = digits[k]
  if s == nil then s = format('%d', k); digits[k] = s end
  return s
end
local function records(e, key, lo, hi)  -- {members, how many, hi}
  local size = e[10]
  local got = call('ZRANGEBYSCORE', key, format('%d', lo), format('%d', hi))
  local all = concat(got)
  if #all == #got * size then return {all, #got, hi} end
  local ok = {}
  for i = 1, #got do if #got[i] == size then ok[#ok + 1] = got[i] end end
  return {concat(ok), #ok, hi}
end
local memo = {}  -- [range][id][lo] -> records: rows sharing an entity and as-of buckets share the read
for ei = 1, #E do memo[ei] = {} end
local seen = {}  -- [agg][id][first] -> distinct count
for ai = 1, #A do seen[ai] = {} end
local recs, counts, vals = {}, {}, {}
for ei = 1, #E do recs[ei] = {} end
local ncounts, nvals = 0, 0
local times, ids = {}, {}
for x in string.gmatch(ARGV[2], '%d+') do times[#times + 1] = x end
local blob, pos = ARGV[4], 1
for x in string.gmatch(ARGV[3], '%d+') do
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
