-- KEYS: names, hb   ARGV: rev_prefix   Returns {name, entries, alive(0/1)} flattened.
local out = {}
local seen = {}
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now_ms(), '+inf')
for _, name in ipairs(live) do seen[name] = 0 end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= '#next' then
    local n = redis.call('SCARD', ARGV[1] .. all[i])
    if n > 0 or seen[all[i + 1]] ~= nil then seen[all[i + 1]] = n end
  end
end
for name, n in pairs(seen) do table.insert(out, name); table.insert(out, n) end
return out
