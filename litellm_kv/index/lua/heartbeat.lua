-- KEYS: hb   ARGV: replica, ttl_ms   (lkv:groups is another slot: RedisIndex adds the group to it itself)
redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[2]), ARGV[1])
return 1
