-- One lease round of one indexer over one group's replicas (services/indexer/lease.py says why).
-- KEYS: leases (hash: replica -> "<owner>|<deadline ms>|<offered 0/1>"), indexers (zset: owner -> deadline ms),
--       unreachable (hash: replica -> "<indexer>|<until ms>|<indexer>|<until ms>...": the indexers that gave the
--       replica up because they could not follow it, each until its cooldown ends)
-- ARGV: owner, ttl_ms, grace_ms, cooldown_ms, n, replica 1..n, then the replicas among them this indexer gives up
-- Returns {live indexers, {owner of each replica after the round, '' for none},
--          {how this round claimed each replica: new, takeover, handoff, unreachable; '' when it did not},
--          {what became of each replica this indexer gives up: offered, kept; '' for the others}}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl, grace, cooldown = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = tonumber(ARGV[5])
local R = 5  -- ARGV[R + i] is replica i
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + ttl, me)
local live = redis.call('ZCARD', KEYS[2])
local quota = math.ceil(n / live)
local giving = {}
for k = R + n + 1, #ARGV do giving[ARGV[k]] = true end

local live_set
local function live_ids()  -- read once, and only in a round that needs it
  if not live_set then
    live_set = {}
    for _, x in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do live_set[x] = true end
  end
  return live_set
end
-- gaveup[i]: indexer -> until, for replica i (cooldowns still running); dirty[i]: its record needs writing.
local gaveup, dirty, has_record, recorded = {}, {}, {}, 0
-- Whether a live indexer other than this one has not given replica i up (it may still reach the engine).
local function others_left(i)
  for id, _ in pairs(live_ids()) do
    if id ~= me and not gaveup[i][id] then return true end
  end
  return false
end
-- Whether another live indexer gave replica i up (it would not take the replica back).
local function tried_by_others(i)
  for id, _ in pairs(gaveup[i]) do
    if id ~= me and live_ids()[id] then return true end
  end
  return false
end

local owners, kinds, outs, mine, free, offered, unreachable = {}, {}, {}, {}, {}, {}, {}
for i = 1, n do
  local replica = ARGV[R + i]
  owners[i], kinds[i], outs[i], gaveup[i] = '', '', '', {}
  local g = redis.call('HGET', KEYS[3], replica)
  if g then
    has_record[i], recorded = true, recorded + 1
    for id, until_ms in string.gmatch(g, '([^|]+)|(%d+)') do
      if tonumber(until_ms) > now then gaveup[i][id] = tonumber(until_ms) else dirty[i] = true end
    end
  end
  local v = redis.call('HGET', KEYS[1], replica)
  local owner, deadline, off
  if v then owner, deadline, off = string.match(v, '^(.*)|(%d+)|([01])$') end
  -- Given up by this indexer within its cooldown: left to a live one that has not given it up, if any.
  local leave = gaveup[i][me] ~= nil and others_left(i)
  if not owner then
    if not leave then free[#free + 1] = {i, 'new', math.huge} end  -- never held (or released): nobody follows it
  elseif owner == me then
    mine[#mine + 1] = i  -- ours, even if it expired while nobody else claimed it
  elseif tonumber(deadline) <= now then
    if not leave then free[#free + 1] = {i, 'takeover', now - tonumber(deadline)} end  -- its indexer stopped renewing
  else
    owners[i] = owner
    if not gaveup[i][me] then
      if gaveup[i][owner] then
        unreachable[#unreachable + 1] = i  -- its owner cannot follow it and gives it up
      elseif off == '1' then
        offered[#offered + 1] = i
      end
    end
  end
end

-- Uncovered replicas first: up to the share, or any one nobody below its share took within the grace.
local held = #mine
for _, f in ipairs(free) do
  if held < quota or f[3] >= grace then
    mine[#mine + 1] = f[1]
    kinds[f[1]] = f[2]
    held = held + 1
  end
end
-- Then leases given up by owners that cannot follow their replica, whatever the share: being followed comes first.
for _, i in ipairs(unreachable) do
  mine[#mine + 1] = i
  kinds[i] = 'unreachable'
  held = held + 1
end
-- Then leases their owners offer (they hold more than their share) while below ours.
for _, i in ipairs(offered) do
  if held < quota then
    mine[#mine + 1] = i
    kinds[i] = 'handoff'
    held = held + 1
  end
end
-- Renew ours. Those past the share are offered: the owner keeps following them until another takes them,
-- so handing over never leaves a replica unfollowed. Replicas other live indexers gave up come first, so the
-- ones offered are those the others may follow.
local order = {}
for _, i in ipairs(mine) do if tried_by_others(i) then order[#order + 1] = i end end
for _, i in ipairs(mine) do if not tried_by_others(i) then order[#order + 1] = i end end
for j, i in ipairs(order) do
  local replica = ARGV[R + i]
  local off = '0'
  if j > quota then off = '1' end
  redis.call('HSET', KEYS[1], replica, me .. '|' .. (now + ttl) .. '|' .. off)
  owners[i] = me
  -- Given up: any live indexer that has not given it up itself takes it (the owner keeps following it until
  -- then), and this one does not take it back for the cooldown; 'kept' when no such indexer is live now.
  -- Not given up (followed, or not failing long enough): no record, so nobody takes it.
  local was = gaveup[i][me]
  if giving[replica] then
    gaveup[i][me] = now + cooldown
    if others_left(i) then outs[i] = 'offered' else outs[i] = 'kept' end
  else
    gaveup[i][me] = nil
  end
  if gaveup[i][me] ~= was then dirty[i] = true end
end

for i = 1, n do
  if dirty[i] then
    local ids = {}
    for id, _ in pairs(gaveup[i]) do ids[#ids + 1] = id end
    table.sort(ids)
    local parts = {}
    for _, id in ipairs(ids) do parts[#parts + 1] = id .. '|' .. gaveup[i][id] end
    if #parts > 0 then
      redis.call('HSET', KEYS[3], ARGV[R + i], table.concat(parts, '|'))
      if not has_record[i] then recorded = recorded + 1 end
    elseif has_record[i] then
      redis.call('HDEL', KEYS[3], ARGV[R + i])
      recorded = recorded - 1
    end
  end
end

-- Leases of replicas no config lists any more: dropped once long expired; so are their records once run out.
local listed
local function unlisted(replica)
  if not listed then
    listed = {}
    for i = 1, n do listed[ARGV[R + i]] = true end
  end
  return not listed[replica]
end
if redis.call('HLEN', KEYS[1]) > n then
  local all = redis.call('HGETALL', KEYS[1])
  for k = 1, #all, 2 do
    local deadline = tonumber(string.match(all[k + 1], '|(%d+)|[01]$') or 0)
    if unlisted(all[k]) and deadline + 10 * ttl < now then redis.call('HDEL', KEYS[1], all[k]) end
  end
end
if redis.call('HLEN', KEYS[3]) > recorded then
  local all = redis.call('HGETALL', KEYS[3])
  for k = 1, #all, 2 do
    local running = false
    for _, until_ms in string.gmatch(all[k + 1], '([^|]+)|(%d+)') do
      if tonumber(until_ms) > now then running = true end
    end
    if unlisted(all[k]) and not running then redis.call('HDEL', KEYS[3], all[k]) end
  end
end
return {live, owners, kinds, outs}
