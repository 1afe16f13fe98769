-- Shared helpers, prepended to each script (Redis 7 runs Lua 5.1: no goto, no integer type).
local function replica_id(ids, names, name, create)
  local id = redis.call('HGET', ids, name)
  if id then return tonumber(id) end
  if not create then return nil end
  id = redis.call('HINCRBY', names, '#next', 1)
  redis.call('HSET', ids, name, id)
  redis.call('HSET', names, id, name)
  return id
end

-- Purge in O(1): the replica's id is retired (unmapped from its name: lookups ignore it, the
-- name gets a fresh id on its next write) and queued in the retired set; the entries it leaves in
-- the blocks hash are stripped later in small steps by the sweep script. Returns the entry count.
local function retire(ids, names, retired, rev_prefix, name, id)
  redis.call('HDEL', ids, name)
  redis.call('HDEL', names, id)
  local n = redis.call('SCARD', rev_prefix .. id)
  if n > 0 then redis.call('SADD', retired, id) end
  return n
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
