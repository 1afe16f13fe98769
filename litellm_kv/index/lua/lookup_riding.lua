-- The lookup with a rider (see ScriptRider). KEYS: blocks, ids, names, then the rider's keys.
-- ARGV: packed hashes, n = number of filter names, the n names, then the rider's args.
-- Returns {lookup's flat list, rider's result}.
local filter = {}
local n = tonumber(ARGV[2])
for i = 1, n do filter[i] = ARGV[2 + i] end
local rkeys, rargs = {}, {}
for i = 4, #KEYS do rkeys[i - 3] = KEYS[i] end
for i = 3 + n, #ARGV do rargs[i - 2 - n] = ARGV[i] end
local m = lkv_lookup(KEYS[1], KEYS[2], KEYS[3], ARGV[1], filter)
return {m, rider(rkeys, rargs)}
