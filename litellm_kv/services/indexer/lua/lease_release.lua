-- An indexer stops: its leases of one group are freed at once (not after their TTL) and it leaves the group.
-- KEYS: leases, indexers   ARGV: owner, replica...   Returns the leases released.
local released = 0
local prefix = ARGV[1] .. '|'
for i = 2, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v and string.sub(v, 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[1], ARGV[i])
    released = released + 1
  end
end
redis.call('ZREM', KEYS[2], ARGV[1])
return released
