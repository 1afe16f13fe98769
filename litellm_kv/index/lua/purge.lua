-- KEYS: ids, names, hb, streams, retired   ARGV: rev_prefix, replica, forget_streams (0/1)
-- Purge and (optionally) forget the replica's stream positions atomically, so no batch can land
-- between the two and then be applied again by the replay that follows.
local id = replica_id(KEYS[1], KEYS[2], ARGV[2], false)
redis.call('ZREM', KEYS[3], ARGV[2])
if ARGV[3] == '1' then
  local prefix = ARGV[2] .. '#'
  for _, s in ipairs(redis.call('HKEYS', KEYS[4])) do
    if s == ARGV[2] or string.sub(s, 1, #prefix) == prefix then redis.call('HDEL', KEYS[4], s) end
  end
end
if id == nil then return 0 end
return retire(KEYS[1], KEYS[2], KEYS[5], ARGV[1], ARGV[2], id)
