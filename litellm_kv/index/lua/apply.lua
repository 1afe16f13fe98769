-- Apply one event batch, deduplicated by (stream, seq).
-- KEYS: blocks, ids, names, streams, retired (one group's keys: one Redis Cluster slot)
-- ARGV: rev_prefix, replica, stream, seq, ts, force, then ops:
--   'C' (all blocks cleared) | 'o<delta>,<tier>' or 'r<delta>,<tier>' (a root store: skipped when the
--   replica already holds the whole chain on that tier), followed by its hashes packed (8 bytes each,
--   big-endian)
-- Returns {status, last_seq, touched, purged, reannounced}; status: applied | duplicate | gap | restart
local blocks, ids, names, streams, retired = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local rev_prefix, replica, stream = ARGV[1], ARGV[2], ARGV[3]
local seq, ts, force = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6] == '1'
local id = replica_id(ids, names, replica, true)
local rev = rev_prefix .. id
local status, purged = 'applied', 0
-- Drop what the replica held; later ops of the batch go to its fresh id.
local function purge()
  local n = retire(ids, names, retired, rev_prefix, replica, id)
  id = replica_id(ids, names, replica, true)
  rev = rev_prefix .. id
  return n
end
local last = -1
if seq >= 0 then
  local st = redis.call('HGET', streams, stream)
  if st then
    local sep = string.find(st, '|', 1, true)
    last = tonumber(string.sub(st, 1, sep - 1))
    local last_ts = tonumber(string.sub(st, sep + 1))
    if seq <= last then
      if ts <= last_ts then return {'duplicate', last, 0, 0, 0} end
      -- Lower seq, newer time: the engine restarted; its old blocks are gone.
      purged = purge()
      status = 'restart'
      last = -1
      if seq ~= 0 and not force then
        redis.call('HSET', streams, stream, '-1|' .. ARGV[5])
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
  end
  redis.call('HSET', streams, stream, seq .. '|' .. ARGV[5])
end
local touched, reannounced = 0, 0
local i = 7
while i <= #ARGV do
  if ARGV[i] == 'C' then
    purged = purged + purge()
    i = i + 1
  else
    local kind, d, t = string.match(ARGV[i], '^([or])(-?%d+),(%d+)$')
    d, t = tonumber(d), tonumber(t)
    local packed = ARGV[i + 1]
    -- A root store (parent None, from block 0) of a chain the replica already holds is the engine
    -- re-announcing a prefix-cache hit (kv_cache_report_mode=full), not a new copy.
    if kind == 'r' and holds_chain(blocks, packed, id * 4 + t) then
      reannounced = reannounced + 1
    else
      for k = 1, #packed, 8 do touched = touched + bump(blocks, rev, string.sub(packed, k, k + 7), id, t, d) end
    end
    i = i + 2
  end
end
if seq >= 0 then last = seq end
return {status, last, touched, purged, reannounced}
