-- KEYS: hb, groups   ARGV: group, replica, ttl_ms
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[3]), ARGV[2])
return 1
