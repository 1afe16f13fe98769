-- One lease round of one indexer over one group's replicas (services/indexer/lease.py says why).
-- KEYS: leases (hash: replica -> "<owner>|<deadline ms>|<offered 0/1>"), indexers (zset: owner -> deadline ms)
-- ARGV: owner, ttl_ms, grace_ms, replica...
-- Returns {live indexers, {owner of each replica after the round, '' for none},
--          {how this round claimed each replica: new, takeover, handoff; '' when it did not}}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me, ttl, grace = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + ttl, me)
local live = redis.call('ZCARD', KEYS[2])
local n = #ARGV - 3
local quota = math.ceil(n / live)

local owners, kinds, mine, free, offered = {}, {}, {}, {}, {}
for i = 1, n do
  owners[i], kinds[i] = '', ''
  local v = redis.call('HGET', KEYS[1], ARGV[i + 3])
  local owner, deadline, off
  if v then owner, deadline, off = string.match(v, '^(.*)|(%d+)|([01])$') end
  if not owner then
    free[#free + 1] = {i, 'new', math.huge}  -- never held (or released): nobody follows it
  elseif owner == me then
    mine[#mine + 1] = i  -- ours, even if it expired while nobody else claimed it
  elseif tonumber(deadline) <= now then
    free[#free + 1] = {i, 'takeover', now - tonumber(deadline)}  -- its indexer stopped renewing
  else
    owners[i] = owner
    if off == '1' then offered[#offered + 1] = i end
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
-- Then leases their owners offer (they hold more than their share) while below ours.
for _, i in ipairs(offered) do
  if held < quota then
    mine[#mine + 1] = i
    kinds[i] = 'handoff'
    held = held + 1
  end
end
-- Renew ours. Those past the share are offered: the owner keeps following them until another takes them,
-- so handing over never leaves a replica unfollowed.
for j, i in ipairs(mine) do
  local off = '0'
  if j > quota then off = '1' end
  redis.call('HSET', KEYS[1], ARGV[i + 3], me .. '|' .. (now + ttl) .. '|' .. off)
  owners[i] = me
end

-- Leases of replicas no config lists any more: dropped once long expired.
if redis.call('HLEN', KEYS[1]) > n then
  local listed = {}
  for i = 4, #ARGV do listed[ARGV[i]] = true end
  local all = redis.call('HGETALL', KEYS[1])
  for k = 1, #all, 2 do
    local deadline = tonumber(string.match(all[k + 1], '|(%d+)|[01]$') or 0)
    if not listed[all[k]] and deadline + 10 * ttl < now then redis.call('HDEL', KEYS[1], all[k]) end
  end
end
return {live, owners, kinds}
