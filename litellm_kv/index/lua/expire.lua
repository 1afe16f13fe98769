-- KEYS: ids, names, hb, retired   ARGV: rev_prefix   Returns names purged.
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms())
for _, name in ipairs(dead) do
  local id = replica_id(KEYS[1], KEYS[2], name, false)
  if id then retire(KEYS[1], KEYS[2], KEYS[4], ARGV[1], name, id) end
  redis.call('ZREM', KEYS[3], name)
end
return dead
