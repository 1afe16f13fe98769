-- Apply event batches of one replica's stream in order, each deduplicated by (stream, seq): what one
-- call per batch would do, in one round trip.
-- KEYS: blocks, ids, names, streams, retired (one group's keys: one Redis Cluster slot)
-- ARGV: rev_prefix, replica, then per batch: stream, seq, ts, force, n, and its n op arguments:
--   'C' (all blocks cleared) | 'L' (events lost: purge) | 'S' (a store skipped) | 'o<delta>,<tier>' or
--   'r<delta>,<tier>' (a root store: skipped when the replica already holds the whole chain on that tier),
--   followed by its hashes packed (8 bytes each, big-endian)
-- Returns per batch status, last_seq, touched, purged, reannounced (5 values each, batches in order);
-- status: applied | duplicate | gap | restart
--
-- Writes are gathered: the entries of the hashes an op touches are read with one HMGET, changed in a
-- table, and written back with one HSET / HDEL and one SADD / SREM of the replica's reverse set per
-- flush (at the end, and before a purge, which reads the reverse set). Reads within the script see the
-- table, so each op sees the ones before it, as the one-command-per-hash form did.
local blocks, ids, names, streams, retired = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local rev_prefix, replica = ARGV[1], ARGV[2]
local CHUNK = 2000  -- hashes per command: far below Lua's argument limit (unpack)
local id = replica_id(ids, names, replica, true)
local rev = rev_prefix .. id

local cache = {}    -- hash -> its entries as Redis holds them after this script's changes ('' = none)
local dirty = {}    -- hashes changed since the last flush, in order
local member = {}   -- hash -> whether the replica (its current id) holds it on any tier after the changes

-- The op's hashes (8-byte fields) in order; entries of those not yet in the cache read with HMGET.
local function load(packed)
  local hs, miss, n, m = {}, {}, 0, 0
  for k = 1, #packed, 8 do
    local h = string.sub(packed, k, k + 7)
    n = n + 1
    hs[n] = h
    if cache[h] == nil then
      cache[h] = ''
      m = m + 1
      miss[m] = h
    end
  end
  for s = 1, m, CHUNK do
    local e = math.min(s + CHUNK - 1, m)
    local vals = redis.call('HMGET', blocks, unpack(miss, s, e))
    for j = 1, #vals do
      if vals[j] then cache[miss[s + j - 1]] = vals[j] end
    end
  end
  return hs
end

local function chunked(cmd, key, list, step)
  for s = 1, #list, step do
    redis.call(cmd, key, unpack(list, s, math.min(s + step - 1, #list)))
  end
end

local function flush()
  if #dirty == 0 then return end
  local set, del, add, rem = {}, {}, {}, {}
  for _, h in ipairs(dirty) do
    local v = cache[h]
    if v == '' then del[#del + 1] = h else set[#set + 1] = h; set[#set + 1] = v end
    if member[h] then add[#add + 1] = h else rem[#rem + 1] = h end
  end
  chunked('HSET', blocks, set, 2 * CHUNK)
  chunked('HDEL', blocks, del, CHUNK)
  chunked('SADD', rev, add, CHUNK)
  chunked('SREM', rev, rem, CHUNK)
  dirty, member = {}, {}
end

local function holds(v, id)
  for t = 0, 2 do
    if string.find(v, ';' .. (id * 4 + t) .. ':', 1, true) then return true end
  end
  return false
end

-- +delta references of each hash (loaded) by code (replica id * 4 + tier), in order; removing an absent
-- one is a no-op. Returns the number of hashes whose count changed.
local function bump_all(hs, tier, delta)
  local code = id * 4 + tier
  local pat, head = ';' .. code .. ':(%d+)', ';' .. code .. ':'
  local changed, nd = 0, #dirty
  for j = 1, #hs do
    local h = hs[j]
    local v = cache[h]
    local s, e, c
    if v ~= '' then s, e, c = string.find(v, pat) end
    local count = (c and tonumber(c) or 0) + delta
    if count < 0 then count = 0 end
    if s or count > 0 then
      local entry = ''
      if count > 0 then entry = head .. count end
      if s then v = string.sub(v, 1, s - 1) .. entry .. string.sub(v, e + 1) else v = v .. entry end
      if member[h] == nil then
        nd = nd + 1
        dirty[nd] = h
      end
      cache[h] = v
      member[h] = count > 0 or holds(v, id)
      changed = changed + 1
    end
  end
  return changed
end

-- True when every hash (loaded) has a count > 0 for code (replica id * 4 + tier).
local function holds_chain(hs, code)
  local needle = ';' .. code .. ':'
  for j = 1, #hs do
    if not string.find(cache[hs[j]], needle, 1, true) then return false end
  end
  return true
end

-- Drop what the replica held; later ops go to its fresh id.
local function purge()
  flush()
  local n = retire(ids, names, retired, rev_prefix, replica, id)
  id = replica_id(ids, names, replica, true)
  rev = rev_prefix .. id
  return n
end

-- A stream's state is '<last seq>|<its ts>', with '|w' after it while the stream is whole: followed from the
-- engine's first batch or its last AllBlocksCleared, no batch lost and no store skipped, so the index holds
-- every block the engine reported. Not whole, only re-announced hits teach what the index missed.
local function apply_batch(stream, seq, ts_text, force, first, stop)
  local ts = tonumber(ts_text)
  local status, purged = 'applied', 0
  local last = -1
  local whole = false
  if seq >= 0 then
    local st = redis.call('HGET', streams, stream)
    if st then
      local sep = string.find(st, '|', 1, true)
      local sep2 = string.find(st, '|', sep + 1, true)
      last = tonumber(string.sub(st, 1, sep - 1))
      local last_ts = tonumber(string.sub(st, sep + 1, sep2 and sep2 - 1 or -1))
      whole = sep2 ~= nil and string.sub(st, sep2 + 1) == 'w'
      if seq <= last then
        if ts <= last_ts then return {'duplicate', last, 0, 0, 0} end
        -- Lower seq, newer time: the engine restarted; its old blocks are gone.
        purged = purge()
        status = 'restart'
        last = -1
        if seq ~= 0 and not force then
          redis.call('HSET', streams, stream, '-1|' .. ts_text)
          return {'gap', -1, 0, purged, 0}
        end
      elseif seq > last + 1 and not force then
        return {'gap', last, 0, 0, 0}
      end
    elseif seq ~= 0 and not force then
      return {'gap', -1, 0, 0, 0}
    end
    if force and seq ~= last + 1 then
      -- The missing batches are gone: forget what we knew and re-learn from here.
      purged = purged + purge()
      status = 'restart'
      whole = false
    elseif seq == 0 and last == -1 then
      whole = true  -- the engine's first batch
    end
  end
  local touched, reannounced = 0, 0
  local i = first
  while i <= stop do
    local mark = ARGV[i]
    if mark == 'C' or mark == 'L' then
      purged = purged + purge()
      whole = mark == 'C'  -- after AllBlocksCleared the engine holds nothing from before either
      i = i + 1
    elseif mark == 'S' then
      whole = false
      i = i + 1
    else
      local kind, d, t = string.match(ARGV[i], '^([or])(-?%d+),(%d+)$')
      d, t = tonumber(d), tonumber(t)
      local hs = load(ARGV[i + 1])
      -- A root store (parent None, from block 0) of a chain the replica already holds is the engine
      -- re-announcing a prefix-cache hit (kv_cache_report_mode=full), not a new copy.
      if kind == 'r' and holds_chain(hs, id * 4 + t) then
        reannounced = reannounced + 1
      else
        touched = touched + bump_all(hs, t, d)
      end
      i = i + 2
    end
  end
  if seq >= 0 then
    last = seq
    redis.call('HSET', streams, stream, seq .. '|' .. ts_text .. (whole and '|w' or ''))
  end
  return {status, last, touched, purged, reannounced}
end

local out = {}
local i = 3
while i <= #ARGV do
  local n = tonumber(ARGV[i + 4])
  local res = apply_batch(ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], ARGV[i + 3] == '1', i + 5, i + 4 + n)
  for _, x in ipairs(res) do out[#out + 1] = x end
  i = i + 5 + n
end
flush()
return out
