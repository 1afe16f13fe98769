-- KEYS: blocks, retired   ARGV: rev_prefix, max entries
-- One bounded step of the physical cleanup after purges: strips retired ids' entries from the
-- blocks hash. Returns {entries stripped, retired ids still queued}.
local blocks, retired, rev_prefix = KEYS[1], KEYS[2], ARGV[1]
local budget = tonumber(ARGV[2])
local done = 0
while budget > 0 do
  local id = redis.call('SRANDMEMBER', retired)
  if not id then break end
  local rev = rev_prefix .. id
  local members = redis.call('SPOP', rev, budget)
  local base = tonumber(id) * 4
  for _, h in ipairs(members) do
    local v = redis.call('HGET', blocks, h)
    if v then
      for t = 0, 2 do v = string.gsub(v, ';' .. (base + t) .. ':%d+', '') end
      if v == '' then redis.call('HDEL', blocks, h) else redis.call('HSET', blocks, h, v) end
    end
  end
  done = done + #members
  budget = budget - #members
  if redis.call('SCARD', rev) == 0 then redis.call('SREM', retired, id) end
end
return {done, redis.call('SCARD', retired)}
