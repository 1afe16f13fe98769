-- Resolve one request's prefix keys against the pins, atomically on the server.
-- Step for step the algorithm of pins._plan (the in-process store runs that one), so both
-- stores decide alike.
-- KEYS: the prefix keys, longest first. ARGV[1]: JSON {ttl: {deployment: ms}, busy: {deployment: true},
-- failed: {deployment: true}, proposal: deployment}.
-- Answers {deployment, outcome, 1-based index of the followed key or 0, why a stale pin moved}.
local c = cjson.decode(ARGV[1])
local values, stale, hit = {}, '', 0
for i, k in ipairs(KEYS) do
  local v = redis.call('GET', k)
  values[i] = v
  if v and hit == 0 then
    if c.ttl[v] and not c.failed[v] then
      if c.busy[v] then return {c.proposal, 'overloaded', i, ''} end
      hit = i
    elseif stale == '' then
      if c.failed[v] then stale = 'failed' else stale = 'unhealthy' end
    end
  end
end
local winner, outcome = c.proposal, 'new'
if hit > 0 then winner = values[hit]; outcome = 'hit'; stale = ''
elseif stale ~= '' then outcome = 'repin' end
local ttl = c.ttl[winner]
for i, k in ipairs(KEYS) do
  local v = values[i]
  if hit == 0 or i < hit then
    redis.call('SET', k, winner, 'PX', ttl)
  elseif i == hit or v == winner then
    redis.call('PEXPIRE', k, ttl)
  elseif (not v) or (not c.ttl[v]) or c.failed[v] then
    redis.call('SET', k, winner, 'PX', ttl)
  end
end
return {winner, outcome, hit, stale}
