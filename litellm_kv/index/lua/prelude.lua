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

local function holds(v, id)
  for t = 0, 2 do
    if string.find(v, ';' .. (id * 4 + t) .. ':', 1, true) then return true end
  end
  return false
end

-- +delta references of hash h by code (replica id * 4 + tier); removing an absent one is a no-op.
local function bump(blocks, rev, h, id, tier, delta)
  local v = redis.call('HGET', blocks, h) or ''
  local code = id * 4 + tier
  local s, e, n = string.find(v, ';' .. code .. ':(%d+)')
  local count = tonumber(n or 0) + delta
  if count < 0 then count = 0 end
  if not s and count == 0 then return 0 end
  local entry = ''
  if count > 0 then entry = ';' .. code .. ':' .. count end
  if s then v = string.sub(v, 1, s - 1) .. entry .. string.sub(v, e + 1) else v = v .. entry end
  if v == '' then redis.call('HDEL', blocks, h) else redis.call('HSET', blocks, h, v) end
  if count > 0 then
    redis.call('SADD', rev, h)
  elseif not holds(v, id) then
    redis.call('SREM', rev, h)
  end
  return 1
end

-- True when every packed hash has a count > 0 for code (replica id * 4 + tier).
local function holds_chain(blocks, packed, code)
  local needle = ';' .. code .. ':'
  for k = 1, #packed, 8 do
    local v = redis.call('HGET', blocks, string.sub(packed, k, k + 7))
    if not v or not string.find(v, needle, 1, true) then return false end
  end
  return true
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
